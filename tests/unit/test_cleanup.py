"""`make clean`'s bookkeeping with real processes: recognised by PID and start time, never by command line.

A run is played by a child Python process that records a process it started (the way the testbed records
`mnexec -a ...`: right after Popen, before the exec changes the command line) and is then SIGKILLed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from topology import cleanup

RUN = """
import subprocess, sys, time
from pathlib import Path
from topology.cleanup import StateFile
state = StateFile(Path(sys.argv[1]))
child = subprocess.Popen(["sh", "-c", "sleep 0.2; exec sleep 60"], start_new_session=True)
state.add(child.pid, "host shell (sh, then sleep)")
print(child.pid, flush=True)
time.sleep(60)
"""


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture
def killed_run(tmp_path):
    """A run that recorded a process and died by SIGKILL: (state dir, the process it left)."""
    run = subprocess.Popen([sys.executable, "-c", RUN, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    pid = int(run.stdout.readline())
    time.sleep(0.5)  # the recorded sh has exec'd sleep by now: another command line
    run.kill()
    run.wait()
    yield tmp_path, pid
    if alive(pid):
        os.kill(pid, signal.SIGKILL)


def test_a_process_that_exec_d_after_it_was_recorded_is_still_killed(killed_run):
    directory, pid = killed_run
    assert Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:2] == [b"sleep", b"60"]
    assert cleanup.leftovers(directory)["live_recorded_pids"] == [pid]
    removed, live = cleanup.kill_leftovers(directory)
    assert live == [] and any(f"pid {pid}" in line for line in removed), removed
    deadline = time.monotonic() + 5
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not alive(pid)
    assert cleanup.leftovers(directory)["state_files"] == []


def test_a_reused_pid_is_left_alone(tmp_path):
    other = subprocess.Popen(["sleep", "60"])
    try:
        started = cleanup.start_time(other.pid)
        state = {"owner": 1, "owner_started": -1, "procs": [{"pid": other.pid, "what": "x", "started": started - 1}]}
        (tmp_path / "testbed-1.json").write_text(json.dumps(state))
        removed, _ = cleanup.kill_leftovers(tmp_path)
        assert removed == [] and other.poll() is None
    finally:
        other.kill()
        other.wait()


@contextmanager
def live_run_with_a_link(state_dir: Path, link: str):
    """A live "run" (a sleeping process) recorded in state_dir, and a root-namespace link with the testbed's
    prefix, as a run's bridge would be; both removed afterwards. Yields the owner process."""
    if os.geteuid() != 0:
        pytest.skip("needs root (creates a link)")
    owner = subprocess.Popen(["sleep", "60"])
    subprocess.run(["ip", "link", "add", link, "type", "bridge"], check=True)
    try:
        state = {"owner": owner.pid, "owner_started": cleanup.start_time(owner.pid), "procs": []}
        (state_dir / f"testbed-{owner.pid}.json").write_text(json.dumps(state))
        yield owner
    finally:
        subprocess.run(["ip", "link", "del", link], capture_output=True)
        owner.kill()
        owner.wait()


def test_a_live_runs_links_are_left_alone(tmp_path):
    if cleanup.live_runs():
        pytest.skip("a testbed run is live on this machine: its links are not this test's to remove")
    link = "pdd-zzclean"
    with live_run_with_a_link(tmp_path, link) as owner:
        removed = cleanup.clean(tmp_path)
        assert link in cleanup.prefixed_links(), removed
        assert any("left alone" in line for line in removed), removed
        owner.kill()
        owner.wait()
        removed = cleanup.clean(tmp_path)  # the run is gone: its leftovers go
        assert f"link {link}" in removed and link not in cleanup.prefixed_links()


def test_clean_of_another_directory_leaves_a_live_run_of_this_machine_alone(tmp_path, monkeypatch):
    """A clean() pointed elsewhere (a test's directory) must still see the machine's live run: this very
    test, run beside an experiment, once removed the experiment's bridges."""
    machine, other = tmp_path / "machine", tmp_path / "other"
    machine.mkdir()
    other.mkdir()
    monkeypatch.setattr(cleanup, "STATE_DIR", machine)
    link = "pdd-zzlive"
    with live_run_with_a_link(machine, link):
        removed = cleanup.clean(other)
        assert link in cleanup.prefixed_links(), removed
        assert any("left alone" in line for line in removed), removed


RUN_WITH_WORKDIR = """
import sys, tempfile, time
from pathlib import Path
from topology.cleanup import WORKDIR_PREFIX, StateFile
work = Path(tempfile.mkdtemp(prefix=WORKDIR_PREFIX))
(work / "emulator.sock").write_text("")
StateFile(Path(sys.argv[1]), workdir=work)
print(work, flush=True)
time.sleep(60)
"""


def test_a_dead_runs_work_directory_is_removed_and_nothing_outside_the_temporary_directory(tmp_path):
    state_dir = tmp_path / "state"
    run = subprocess.Popen([sys.executable, "-c", RUN_WITH_WORKDIR, str(state_dir)], stdout=subprocess.PIPE, text=True)
    work = Path(run.stdout.readline().strip())
    assert work.is_dir() and json.loads(next(state_dir.glob("testbed-*.json")).read_text())["workdir"] == str(work)
    assert cleanup.kill_leftovers(state_dir) == (
        [f"skipped testbed-{run.pid}.json: its run (pid {run.pid}) is still alive"],
        [run.pid],
    )
    assert work.is_dir()  # a live run's directory is its own
    run.kill()
    run.wait()
    removed, live = cleanup.kill_leftovers(state_dir)
    assert f"work directory {work}" in removed and live == [] and not work.exists()
    # A recorded path that is not one of ours is never removed.
    mine = tmp_path / "pddlab-not-in-tmp"
    mine.mkdir()
    assert cleanup._remove_workdir(str(mine)) == [] and mine.is_dir()
    assert cleanup._remove_workdir(None) == []
