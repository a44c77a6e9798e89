"""experiments.progress: a bar on a terminal, plain lines at intervals in a log."""

import io
import logging

from experiments.progress import Progress


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_plain_lines_at_most_every_interval_and_at_the_end(caplog):
    log = logging.getLogger("test.progress")
    with caplog.at_level(logging.INFO, logger="test.progress"):
        p = Progress("[pdd] requests", 5, log, every_s=3600, stream=io.StringIO())
        for done in range(1, 5):
            p.update(done, "failed=1" if done > 2 else "")
        assert caplog.messages == []  # within the interval: nothing yet
        p.update(5, "failed=1")
        p.close()
    assert caplog.messages == ["[pdd] requests: 5/5 (failed=1)"]  # the end, once


def test_every_update_past_the_interval_is_a_line(caplog):
    log = logging.getLogger("test.progress2")
    with caplog.at_level(logging.INFO, logger="test.progress2"):
        p = Progress("sweep", 3, log, every_s=0, stream=io.StringIO())
        p.update(1)
        p.update(2)
        p.close()
    assert caplog.messages == ["sweep: 1/3", "sweep: 2/3"]


def test_on_a_terminal_a_bar(caplog):
    tty = _Tty()
    with caplog.at_level(logging.INFO):
        p = Progress("[pdd] requests", 4, logging.getLogger("test.progress3"), unit="req", stream=tty)
        p.update(3, "failed=1")
        p.close()
    out = tty.getvalue()
    assert "[pdd] requests" in out and "3/4" in out and "failed=1" in out
    assert not [m for m in caplog.messages if "requests" in m]  # the bar, not log lines


def test_a_total_learnt_later_and_a_step_that_never_moves_shows_nothing(caplog):
    log = logging.getLogger("test.progress4")
    with caplog.at_level(logging.INFO, logger="test.progress4"):
        idle = Progress("worker image build", None, log, every_s=0, stream=io.StringIO())
        idle.close()  # the image was up to date: no build, no line
        p = Progress("worker image build", None, log, every_s=3600, stream=io.StringIO())
        p.update(2, "RUN pip install", total=6)
        p.update(6, "done")
        p.close()
    assert caplog.messages == ["worker image build: 6/6 (done)"]


def test_bytes_are_lines_in_megabytes(caplog):
    log = logging.getLogger("test.progress5")
    with caplog.at_level(logging.INFO, logger="test.progress5"):
        p = Progress("pcap wan-a.pcap", 200_000_000, log, every_s=0, stream=io.StringIO(), as_bytes=True)
        p.update(50_000_000)
        p.close()
    assert caplog.messages == ["pcap wan-a.pcap: 50/200 MB"]
