"""The simulator's WAN (experiments/sim/wan.py): fair sharing of a rate-limited line, TCP's loss bound (Mathis),
slow start, and the calibration table."""

import math
import random
from dataclasses import replace

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
    share_weights,
    slow_start,
    solve_factor,
    transfers_goodput_mbit,
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


def test_an_empty_table_changes_nothing(tmp_path):
    path = tmp_path / "cal.yaml"
    path.write_text("status: 'uncalibrated: formula only'\npoints: []\n")
    cal = load_calibration(path)
    line = LineParams(rate_bps=8e6, rtt_s=0.0)
    assert arrivals(line, [MB], calibration=cal) == pytest.approx([1.0])


def test_the_shipped_table_gives_each_measured_line_the_goodput_the_emulator_measured_there():
    """experiments/sim/calibration.yaml (validate_sim.py wan-table over the profile matrices): at each point the
    simulator's transfers take the emulated transfers' median goodput, or, where the formula was already slower
    (factor 1: a line never carries more than its rate), no more than it."""
    cal = load_calibration(CALIBRATION_FILE)
    assert cal.status.startswith("calibrated:") and len(cal.points) >= 10
    for p in cal.points:
        line = LineParams(rate_bps=p.rate_mbit * 1e6, rtt_s=p.rtt_ms / 1e3, loss=p.loss_pct / 100)
        simulated = transfers_goodput_mbit(line, p.congestion, 2, p.flows, p.kv_bytes, p.factor, cal.share_spread)
        if p.factor < 1:
            assert simulated == pytest.approx(p.per_flow_mbit, rel=0.01), p
        else:
            assert simulated <= p.per_flow_mbit * 1.01, p
    # the lossy line's transfers (wan-lossy: 100 Mbit/s, 1.9% bursty loss, bbr) took ~10 Mbit/s alone: the
    # formula's bbr (the line's rate less the loss) would give them ~80
    lossy = [p for p in cal.points if p.loss_pct > 1 and p.flows == 1]
    assert lossy and all(p.per_flow_mbit < 15 and p.factor < 0.2 for p in lossy)


def test_a_calibration_point_scales_the_formula_by_what_was_measured():
    # measured: one flow got 4 Mbit/s of an 8 Mbit/s line where the formula says 8
    point = CalibrationPoint(8, 0, 0, 1, "cubic", MB, 10, 4.0, 0.5)
    cal = Calibration([point], "calibrated")
    assert arrivals(LineParams(rate_bps=8e6, rtt_s=0.0), [MB], calibration=cal) == pytest.approx([2.0])
    # a point measured with another congestion control is not this line's
    assert Calibration([replace(point, congestion="bbr")], "calibrated").factor(LineParams(8e6, 0.0), 1, "cubic") == 1


def test_solve_factor_finds_the_rate_at_which_the_simulated_transfers_take_a_goodput():
    line = LineParams(rate_bps=100e6, rtt_s=0.08, loss=0.019)
    f = solve_factor(line, "bbr", 2, 4, 30e6, 9.5)
    assert transfers_goodput_mbit(line, "bbr", 2, 4, 30e6, f) == pytest.approx(9.5, rel=0.01)
    assert solve_factor(line, "bbr", 2, 1, 30e6, 1e4) == 1.0  # faster than the line: left at 1


POINT = "rate_mbit: 1, rtt_ms: 1, loss_pct: 0, flows: 1, congestion: bbr, kv_bytes: 1, transfers: 5, per_flow_mbit: 1, \
factor: 0.5"


@pytest.mark.parametrize(
    "text, field",
    [
        ("points: []", "status"),
        ("status: x\npoints: [{rate_mbit: 1, rtt_ms: 1, loss_pct: 0, flows: 1}]", "points[0]"),
        (f"status: x\npoints: [{{{POINT.replace('flows: 1', 'flows: 0')}}}]", "flows"),
        (f"status: x\npoints: [{{{POINT.replace('factor: 0.5', 'factor: 1.5')}}}]", "factor"),
        (f"status: x\npoints: [{{{POINT.replace('congestion: bbr', 'congestion: 3')}}}]", "congestion"),
        ("status: x\nshare_spread: -0.1\npoints: []", "share_spread"),
        ("status: x\nshare_spread: wide\npoints: []", "share_spread"),
    ],
)
def test_a_bad_calibration_table_is_refused_naming_the_field(tmp_path, text, field):
    path = tmp_path / "cal.yaml"
    path.write_text(text)
    with pytest.raises(CalibrationError, match=field.replace("[", r"\[").replace("]", r"\]")):
        load_calibration(path)


def test_a_schedule_changes_the_rate_at_once_and_a_later_transfer_takes_the_new_delay():
    line = LineParams(rate_bps=8e6, rtt_s=0.0)  # 1 MB/s
    halved = [(1.0, replace(line, rate_bps=4e6))]  # from 1 s on: 0.5 MB/s
    # 1 MB alone at 1 MB/s until 1 s... it is done then; 2 MB: 1 MB by 1 s, the other at 0.5 MB/s: 3 s
    assert arrivals(line, [2 * MB], schedule=halved) == pytest.approx([3.0])
    env = clock.Environment()
    spiked = Line(env, LineParams(rate_bps=math.inf, rtt_s=0.05), schedule=[(0.5, LineParams(math.inf, 0.16))])
    done = []

    def send(at):
        yield at
        yield spiked.transfer(1000)
        done.append(env.now - at)

    env.process(send(0.0))
    env.process(send(1.0))
    env.run()
    assert done == pytest.approx([0.025, 0.08])  # one-way: half the RTT before the change, then the new one's


def test_the_simulated_line_plays_the_profiles_schedule_from_the_workloads_start(tmp_path):
    from experiments.sim.config import load_for_simulation, sim_config
    from experiments.sim.simulate import not_simulated

    loaded = load_for_simulation("pdd-vs-baselines", ["profile=wan-flaky"])
    cfg = sim_config(loaded, "pdd")
    base = cfg.line
    assert [x for t, p in cfg.line_schedule for x in (t, p.loss, p.rtt_s)] == pytest.approx(
        [
            x
            for step in [
                (10, 0.05, base.rtt_s),  # loss 5% for 5 s
                (15, base.loss, base.rtt_s),
                (25, base.loss, 0.080 + 0.025),  # A->B's delay 80 ms for 5 s: the RTT is both ways'
                (30, base.loss, base.rtt_s),
                (40, 0.20, base.rtt_s),
                (42, base.loss, base.rtt_s),
            ]
            for x in step
        ]
    )
    assert any(w.startswith("Simulated in part: the link's schedule") for w in not_simulated(loaded, {"pdd": cfg}))
    link = load_for_simulation("pdd-vs-baselines", ["profile=wan-flaky", "schedule_clock=link"])
    assert sim_config(link, "pdd").line_schedule == ()  # played once from the link's coming up: not simulated
    assert any(w.startswith("Not simulated: the link's schedule") for w in not_simulated(link, {"pdd": cfg}))


def test_share_weights_are_a_lognormal_of_mean_one_and_none_without_spread():
    assert share_weights(0.0) == (1.0,)
    ws = share_weights(0.3)
    assert len(ws) == 8 and list(ws) == sorted(ws) and sum(ws) / len(ws) == pytest.approx(1.0, abs=0.01)
    assert ws[-1] / ws[0] == pytest.approx(math.exp(0.3 * 2 * 1.534), rel=0.01)  # z of 1/16 and 15/16: +-1.534


def test_a_full_line_is_shared_by_each_transfers_drawn_weight():
    # A line the calibration covers (factor 1) with share_spread 0.5: each transfer draws one of the 8 weights (the
    # line's rng, in the order they start); two 1 MB transfers on 1 MB/s: the heavier gets w / (w1 + w2) of the
    # line until it is done, the other the rest and then the whole line, so the last still lands at 2 s.
    point = CalibrationPoint(8, 0, 0, 1, "cubic", MB, 10, 8.0, 1.0)
    cal = Calibration([point], "calibrated", share_spread=0.5)
    ws, draws = share_weights(0.5), random.Random(5)
    w1, w2 = (ws[int(draws.random() * len(ws))] for _ in range(2))
    assert w1 != w2  # this seed draws two levels
    line = LineParams(rate_bps=8e6, rtt_s=0.0)
    first, second = arrivals(line, [MB, MB], calibration=cal, rng=random.Random(5), slow_start=False)
    assert min(first, second) == pytest.approx((w1 + w2) / max(w1, w2))
    assert max(first, second) == pytest.approx(2.0)
    assert (first < second) == (w1 > w2)
    # a line the table does not cover keeps equal shares
    assert arrivals(LineParams(rate_bps=8e9, rtt_s=0.0), [MB, MB], calibration=cal, rng=random.Random(5)) == (
        pytest.approx([0.002, 0.002])
    )
