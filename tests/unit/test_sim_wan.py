"""The simulator's WAN (experiments/sim/wan.py): fair sharing of a rate-limited line, TCP's loss bound (Mathis),
slow start, and the calibration table."""

import math
import random

import pytest

from experiments.sim import clock
from experiments.sim.wan import (
    CALIBRATION_FILE,
    Calibration,
    CalibrationError,
    CalibrationPoint,
    Line,
    LineParams,
    fair_share,
    load_calibration,
    mathis_bps,
    slow_start,
)

MB = 1_000_000


def arrivals(params: LineParams, sizes: list[float], **line_kw) -> list[float]:
    """Arrival time (s) of transfers of these sizes (bytes) all started at 0 on one line."""
    env = clock.Environment()
    line = Line(env, params, **line_kw)
    done = [None] * len(sizes)

    def go(i, n):
        yield line.transfer(n)
        done[i] = env.now

    for i, n in enumerate(sizes):
        env.process(go(i, n))
    env.run()
    return done


def test_two_equal_transfers_take_twice_as_long_as_one_on_a_rate_limited_line():
    line = LineParams(rate_bps=8e6, rtt_s=0.0)  # 1 MB/s, no delay, no loss
    (alone,) = arrivals(line, [MB])
    both = arrivals(line, [MB, MB])
    assert alone == pytest.approx(1.0)
    assert both == pytest.approx([2.0, 2.0])


def test_a_short_transfer_finishes_first_then_the_long_one_gets_the_whole_line():
    line = LineParams(rate_bps=8e6, rtt_s=0.0)
    short, long_ = arrivals(line, [MB, 3 * MB])
    assert short == pytest.approx(2.0)  # half the line until it is done
    assert long_ == pytest.approx(4.0)  # 2 MB left at the full line


def test_a_lossy_line_caps_a_flow_at_mathis():
    rtt, loss = 0.1, 0.01
    cap = mathis_bps(rtt, loss)
    assert cap == pytest.approx(1448 * 8 / rtt * 1.22 / math.sqrt(loss))  # ~1.41 Mbit/s
    line = LineParams(rate_bps=10e9, rtt_s=rtt, loss=loss)
    (t,) = arrivals(line, [MB], slow_start=False)
    assert t == pytest.approx(rtt / 2 + MB * 8 / cap)
    # two flows do not share a fat line they cannot fill: each keeps its own cap
    assert arrivals(line, [MB, MB], slow_start=False) == pytest.approx([t, t])


def test_bbr_is_not_capped_by_loss():
    line = LineParams(rate_bps=100e6, rtt_s=0.1, loss=0.01)
    (t,) = arrivals(line, [10 * MB], slow_start=False, congestion="bbr")
    assert t == pytest.approx(0.05 + 10 * MB * 8 / (100e6 * 0.99))


def test_fair_share_is_max_min():
    assert fair_share([1.0, 10.0, 10.0], 9.0) == pytest.approx([1.0, 4.0, 4.0])
    assert fair_share([math.inf, math.inf], math.inf) == [math.inf, math.inf]


def test_slow_start_a_transfer_within_the_first_window_takes_only_the_one_way_delay():
    assert slow_start(10_000, 1e9, 0.1) == (0.0, 10_000)
    seconds, sent = slow_start(100 * MB, 1e9, 0.1)  # 12.5 MB per RTT at 1 Gbit/s: 10 rounds to get there
    assert seconds == pytest.approx(1.0) and sent == 14_480 * (2**10 - 1)
    (t,) = arrivals(LineParams(rate_bps=1e9, rtt_s=0.1), [10_000])
    assert t == pytest.approx(0.05 + 10_000 * 8 / 1e9)  # and its burst's time on the line
    (t,) = arrivals(LineParams(rate_bps=math.inf, rtt_s=0.1), [10_000])  # unlimited: the rounds in closed form
    assert t == pytest.approx(0.05)


@pytest.mark.parametrize("congestion", ["cubic", "bbr"])
@pytest.mark.parametrize("n, size", [(50, 2 * MB), (8, 20 * MB), (200, 100_000)])
def test_transfers_started_at_once_never_deliver_more_than_the_line_carries(congestion, n, size):
    # Their slow-start rounds share the line too: by the k-th arrival the line has carried at least k transfers.
    line = LineParams(rate_bps=100e6, rtt_s=0.1, loss=0.0001)  # 12.5 MB/s; a window carries 1.25 MB per RTT
    done = sorted(arrivals(line, [size] * n, congestion=congestion))
    for k, t in enumerate(done, 1):
        assert k * size * 8 <= line.rate_bps * (t - line.one_way_s) * (1 + 1e-9), (k, t)


def test_staggered_transfers_share_the_line_max_min_and_all_arrive():
    # Transfers joining while others are in their rounds: a round's cap empties and comes again (the line keeps
    # its flows by cap, lowest first, as the max-min order), and every one of them still arrives.
    params, rng = LineParams(rate_bps=100e6, rtt_s=0.1, loss=0.0001), random.Random(5)
    env = clock.Environment()
    line, done = Line(env, params, congestion="bbr"), []

    def go(start_s, n):
        yield env.timeout(start_s)
        yield line.transfer(n)
        done.append((env.now, n))

    def shares():  # between events, each flow runs at its max-min fair share of the line
        for _ in range(250):
            yield env.timeout(0.0123)
            caps = [g.cap for g in line.groups.values() for _flow in g.heap]
            rates = [g.rate for g in line.groups.values() for _flow in g.heap]
            assert rates == pytest.approx(fair_share(caps, params.rate_bps), rel=1e-9)

    for _ in range(60):
        env.process(go(rng.uniform(0, 2), rng.choice([20_000, 300_000, 2 * MB, 8 * MB])))
    env.process(shares())
    env.run()
    assert len(done) == 60 and line.flows == 0 and not line.groups
    carried = 0
    for t, n in sorted(done):
        carried += n
        assert carried * 8 <= params.rate_bps * (t - params.one_way_s) * (1 + 1e-9), (t, carried)


def test_jitter_is_drawn_from_the_seed():
    line = LineParams(rate_bps=1e9, rtt_s=0.1, jitter_s=0.01)
    same = [arrivals(line, [1000], rng=random.Random(7)) for _ in range(2)]
    other = arrivals(line, [1000], rng=random.Random(8))
    assert same[0] == same[1] and same[0] != other


def test_the_shipped_table_is_a_placeholder_and_changes_nothing():
    cal = load_calibration(CALIBRATION_FILE)
    assert cal.status == "uncalibrated: formula only" and cal.points == []
    line = LineParams(rate_bps=8e6, rtt_s=0.0)
    assert arrivals(line, [MB], calibration=cal) == pytest.approx([1.0])


def test_a_calibration_point_scales_the_formula_by_what_was_measured():
    # measured: one flow got 4 Mbit/s of an 8 Mbit/s line where the formula says 8
    cal = Calibration([CalibrationPoint(8, 0, 0, 1, 4.0)], "calibrated")
    assert arrivals(LineParams(rate_bps=8e6, rtt_s=0.0), [MB], calibration=cal) == pytest.approx([2.0])


@pytest.mark.parametrize(
    "text, field",
    [
        ("points: []", "status"),
        ("status: x\npoints: [{rate_mbit: 1, rtt_ms: 1, loss_pct: 0, flows: 1}]", "points[0]"),
        ("status: x\npoints: [{rate_mbit: 1, rtt_ms: 1, loss_pct: 0, flows: 0, per_flow_mbit: 1}]", "flows"),
    ],
)
def test_a_bad_calibration_table_is_refused_naming_the_field(tmp_path, text, field):
    path = tmp_path / "cal.yaml"
    path.write_text(text)
    with pytest.raises(CalibrationError, match=field.replace("[", r"\[").replace("]", r"\]")):
        load_calibration(path)
