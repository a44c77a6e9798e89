"""The goodput judgement of link calibration: the best of up to GOODPUT_TRIES tests is checked."""

import pytest

from experiments.run import calibration
from experiments.analysis.linkstats import GOODPUT_TRIES
from experiments.run.calibration import CalibrationConfig, DirectionResult, _judge_goodput

RATE = 100.0


@pytest.fixture
def goodputs(monkeypatch):
    """Feed the judgement a sequence of measured goodputs (Mbit/s) in place of iperf3 tests."""
    queue: list[float] = []
    monkeypatch.setattr(calibration, "iperf3", lambda testbed, direction, seconds: {})
    monkeypatch.setattr(calibration, "tcp_goodput", lambda report, seconds: queue.pop(0))
    return queue


def result(capacity: float = 1000.0) -> DirectionResult:
    # The probe statistics play no part in the goodput judgement.
    return DirectionResult("a_to_b", {}, expected=None, measured=None, checks=[], capacity_mbit=capacity)


def judge(goodputs, values, capacity=1000.0):
    goodputs.extend(values)
    r = result(capacity)
    _judge_goodput(None, CalibrationConfig(), RATE, r)
    return r


def test_a_goodput_in_band_is_measured_once(goodputs):
    r = judge(goodputs, [93.0, 10.0])
    assert r.tcp_goodput_tries == [93.0] and r.ok


def test_a_low_goodput_is_measured_again_and_the_best_counts(goodputs):
    r = judge(goodputs, [70.0, 92.0, 10.0])
    assert r.tcp_goodput_tries == [70.0, 92.0] and r.tcp_goodput_mbit == 92.0 and r.ok


def test_a_link_slow_on_every_test_fails(goodputs):
    r = judge(goodputs, [70.0] * GOODPUT_TRIES)
    assert len(r.tcp_goodput_tries) == GOODPUT_TRIES and not r.ok


def test_a_link_faster_than_its_rate_fails_at_once(goodputs):
    r = judge(goodputs, [99.0, 93.0])
    assert r.tcp_goodput_tries == [99.0] and not r.ok


def test_a_starved_path_is_measured_once_and_not_judged(goodputs):
    r = judge(goodputs, [50.0, 93.0], capacity=100.0)
    assert r.tcp_goodput_tries == [50.0] and r.goodput_skipped and r.checks == []


def test_a_goodput_the_caller_does_not_judge_is_measured_once_and_printed_with_the_reason(goodputs):
    goodputs.extend([50.0, 93.0])
    r = result()
    _judge_goodput(None, CalibrationConfig(unjudged_goodput="qemu TCG"), RATE, r)
    assert r.tcp_goodput_tries == [50.0] and r.goodput_skipped == "qemu TCG" and r.checks == []
