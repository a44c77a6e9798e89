"""Unit tests of topology.netem_model: netem's decisions without root or sockets.

Statistical checks use fixed seeds and tolerances named below, each sized from
the sampling error of the sample size (so a correct model passes for any seed
with overwhelming probability, and a wrong formula fails).
"""

from __future__ import annotations

import math
import statistics

import pytest

from topology.netem_model import (
    NS_PER_MS,
    CorrelatedRandom,
    NetemQueue,
    load_dist_table,
    pct_to_u32,
    periodic_delays_ns,
    tabledist,
)
from topology.profiles import GilbertElliott, LinkParams

N = 20_000
SPACING_NS = 10 * NS_PER_MS  # arrivals far apart: no rate interaction
FRAME = bytes(1514)
# Queue limit for tests that enqueue everything before popping.
BIG_LIMIT = 10_000_000
# Sample mean of N draws has standard error sd/sqrt(N); allow 5 standard errors.
MEAN_SIGMAS = 5
# Sample std of N draws: relative error ~ 1/sqrt(2N) = 0.5%; allow 3%.
STD_REL_TOL = 0.03
# Two-sided 99.99% normal quantile, for binomial intervals in the model tests.
Z = 3.89


def delays_ms(params: LinkParams, n: int = N, seed: int = 1) -> list[float]:
    """One-way delays (ms) of n frames arriving SPACING_NS apart."""
    q = NetemQueue(params, seed)
    out = []
    for i in range(n):
        now = i * SPACING_NS
        q.pop_due(now)
        (d,) = q.enqueue(now, FRAME)
        out.append((d.time_to_send_ns - now) / NS_PER_MS)
    return out


def binomial_ok(hits: int, n: int, p: float) -> bool:
    """hits within Z standard deviations of n*p."""
    sd = math.sqrt(n * p * (1 - p))
    return abs(hits - n * p) <= Z * sd + 1


def test_pct_scaling_matches_iproute2():
    assert pct_to_u32(100) == 0xFFFFFFFF
    assert pct_to_u32(0) == 0
    assert pct_to_u32(50) == round(0.5 * 0xFFFFFFFF)


def test_no_jitter_is_exact_delay():
    assert set(delays_ms(LinkParams(delay_ms=30), n=100)) == {30.0}


def test_uniform_delay_mean_and_std():
    # Uniform on [mu - j, mu + j): sd = j / sqrt(3).
    d = delays_ms(LinkParams(delay_ms=30, jitter_ms=5))
    sd = 5 / math.sqrt(3)
    assert abs(statistics.fmean(d) - 30) < MEAN_SIGMAS * sd / math.sqrt(N)
    assert abs(statistics.pstdev(d) / sd - 1) < STD_REL_TOL
    assert 25 <= min(d) and max(d) < 35


@pytest.mark.parametrize("dist", ["normal", "pareto", "paretonormal"])
def test_table_delay_mean_and_std(dist):
    # netem scales the table by sigma: delay = mu + sigma * t / 8192, so the
    # expected moments are the table's own (normal: 0 and 1; pareto: about -0.03 and 0.82).
    table = load_dist_table(dist)
    t_mean = statistics.fmean(table) / 8192
    t_sd = statistics.pstdev(table) / 8192
    d = delays_ms(LinkParams(delay_ms=30, jitter_ms=5, delay_distribution=dist))
    assert abs(statistics.fmean(d) - (30 + 5 * t_mean)) < MEAN_SIGMAS * 5 * t_sd / math.sqrt(N)
    assert abs(statistics.pstdev(d) / (5 * t_sd) - 1) < STD_REL_TOL
    if dist == "normal":
        assert abs(statistics.pstdev(d) / 5 - 1) < STD_REL_TOL


def test_tabledist_truncates_toward_zero_like_c():
    class Fixed(CorrelatedRandom):
        def __init__(self, value):
            self.value = value

        def next(self):
            return self.value

    table = (-12345, 12345)
    sigma = 5_000_123  # not a multiple of 8192: exercises the rounding branch
    neg = tabledist(0, sigma, Fixed(0), table)
    pos = tabledist(0, sigma, Fixed(1), table)
    assert neg == -pos  # C division is symmetric; Python's // would be off by one
    x = (sigma % 8192) * 12345 + 4096
    assert pos == x // 8192 + (sigma // 8192) * 12345


def test_rate_serializes_back_to_back_frames():
    # 100 Mbit/s = 12.5e6 B/s; a 1514-byte frame takes 1514e9 / 12.5e6 = 121120 ns.
    q = NetemQueue(LinkParams(rate_mbit=100, delay_ms=10), seed=1)
    tts = [q.enqueue(0, FRAME)[0].time_to_send_ns for _ in range(50)]
    assert tts[0] == 10 * NS_PER_MS + 121_120
    assert {b - a for a, b in zip(tts, tts[1:])} == {121_120}


def test_rate_with_jitter_never_reorders():
    q = NetemQueue(LinkParams(rate_mbit=100, delay_ms=20, jitter_ms=5), seed=3)
    for i in range(5000):
        q.enqueue(i * 50_000, i.to_bytes(4, "big") + bytes(1496))  # 240 Mbit/s offered
    sent = [int.from_bytes(f[:4], "big") for f in q.pop_due(10**12)]
    dropped = q.counters.dropped_limit
    assert sent == sorted(sent) and len(sent) + dropped == 5000


def test_jitter_without_rate_reorders():
    q = NetemQueue(LinkParams(delay_ms=20, jitter_ms=5, limit_pkts=BIG_LIMIT), seed=3)
    for i in range(2000):
        q.enqueue(i * 100_000, i.to_bytes(4, "big"))
    sent = [int.from_bytes(f[:4], "big") for f in q.pop_due(10**12)]
    assert sorted(sent) == list(range(2000))
    assert sum(1 for a, b in zip(sent, sent[1:]) if b < a) > 100


def test_pop_due_respects_time_and_order():
    q = NetemQueue(LinkParams(delay_ms=5), seed=1)
    q.enqueue(0, b"a")
    q.enqueue(1, b"b")
    assert q.next_departure_ns() == 5 * NS_PER_MS
    assert q.pop_due(5 * NS_PER_MS - 1) == []
    assert q.pop_due(5 * NS_PER_MS) == [b"a"]
    assert q.pop_due(10 * NS_PER_MS) == [b"b"]
    assert q.next_departure_ns() is None and q.counters.sent == 2


@pytest.mark.parametrize("loss_pct", [0.1, 1.0, 10.0])
def test_random_loss_rate(loss_pct):
    q = NetemQueue(LinkParams(loss_pct=loss_pct, limit_pkts=BIG_LIMIT), seed=7)
    n = 100_000
    for i in range(n):
        q.offer(i, b"x")
    assert binomial_ok(q.counters.dropped_loss, n, loss_pct / 100)


def test_loss_extremes():
    q = NetemQueue(LinkParams(loss_pct=100), seed=1)
    for i in range(1000):
        q.offer(i, b"x")
    assert q.counters.dropped_loss == 1000 and len(q) == 0


def loss_runs(params: LinkParams, n: int, seed: int = 5) -> tuple[float, float]:
    """(loss fraction, mean length of loss bursts) over n frames."""
    q = NetemQueue(params.replace(limit_pkts=BIG_LIMIT), seed)
    lost, bursts, prev = 0, 0, False
    for i in range(n):
        (d,) = q.enqueue(i, b"x")
        is_lost = d.outcome == "dropped_loss"
        lost += is_lost
        bursts += is_lost and not prev
        prev = is_lost
    return lost / n, lost / max(bursts, 1)


def test_gilbert_elliott_mean_and_bursts():
    # p=1%, r=25%, lose everything in BAD, nothing in GOOD: stationary loss
    # p/(p+r) = 3.85%, bursts geometric with mean 1/r = 4 frames.
    ge = LinkParams(loss_ge=GilbertElliott(p_pct=1, r_pct=25, bad_loss_pct=100, good_loss_pct=0))
    frac, burst = loss_runs(ge, 200_000)
    assert abs(frac / ge.expected_loss_pct * 100 - 1) < 0.1
    assert 3.6 < burst < 4.4
    # Same mean loss from independent drops: bursts of about 1/(1-p) = 1.04.
    frac_r, burst_r = loss_runs(LinkParams(loss_pct=ge.expected_loss_pct), 200_000)
    assert abs(frac_r - frac) < 0.005 and burst_r < 1.1


def test_gilbert_elliott_partial_losses():
    # bad_loss 50%, good_loss 1%: loss = bad_share*0.5 + good_share*0.01.
    ge = LinkParams(loss_ge=GilbertElliott(p_pct=5, r_pct=20, bad_loss_pct=50, good_loss_pct=1))
    frac, _ = loss_runs(ge, 200_000)
    assert abs(frac / (ge.expected_loss_pct / 100) - 1) < 0.1


def test_duplicate_rate():
    q = NetemQueue(LinkParams(duplicate_pct=5, limit_pkts=BIG_LIMIT), seed=2)
    n = 50_000
    copies = sum(len(q.enqueue(i, b"x")) for i in range(n))
    assert binomial_ok(q.counters.duplicated, n, 0.05)
    assert copies == n + q.counters.duplicated
    assert len(q.pop_due(10**12)) == copies


def test_duplicate_and_loss_follow_kernel_order():
    # 100% duplicate, 50% loss. netem draws the original's loss first: a loss
    # cancels the copy (count 2 -> 1); otherwise the copy re-enters with its
    # own 50% loss. Copies per frame: 0.5*1 + 0.5*(1 + 0.5) = 1.25, never 0.
    q = NetemQueue(LinkParams(duplicate_pct=100, loss_pct=50, limit_pkts=BIG_LIMIT), seed=2)
    n = 40_000
    copies = [len([d for d in q.enqueue(i, b"x") if d.outcome == "queued"]) for i in range(n)]
    assert min(copies) == 1
    assert abs(sum(copies) / n - 1.25) < Z * math.sqrt(0.1875 / n)


def test_corrupt_flips_exactly_one_bit():
    q = NetemQueue(LinkParams(corrupt_pct=10, limit_pkts=BIG_LIMIT), seed=4)
    n = 20_000
    frame = bytes(range(100))
    flipped = 0
    for i in range(n):
        (d,) = q.enqueue(i, frame)
        if d.corrupt_at:
            flipped += 1
    assert flipped == q.counters.corrupted and binomial_ok(flipped, n, 0.10)
    diffs = [sum(bin(a ^ b).count("1") for a, b in zip(f, frame)) for f in q.pop_due(10**12)]
    assert diffs.count(1) == flipped and diffs.count(0) == n - flipped


def test_reorder_with_gap_pattern():
    # reorder 100% gap 5: frames 5, 10, 15 ... jump the queue (counter reaches gap-1).
    q = NetemQueue(LinkParams(delay_ms=10, reorder_pct=100, reorder_gap=5), seed=1)
    flags = [q.enqueue(i, b"x")[0].reordered for i in range(20)]
    assert [i + 1 for i, f in enumerate(flags) if f] == [5, 10, 15, 20]
    assert q.counters.reordered == 4


def test_reorder_without_gap_is_gap_one():
    q = NetemQueue(LinkParams(delay_ms=10, reorder_pct=25, limit_pkts=BIG_LIMIT), seed=1)
    n = 40_000
    for i in range(n):
        q.offer(i * 1000, b"x")
    assert binomial_ok(q.counters.reordered, n, 0.25)


def test_reordered_frame_leaves_first():
    q = NetemQueue(LinkParams(delay_ms=10, reorder_pct=100, reorder_gap=2), seed=1)
    q.enqueue(0, b"1")
    d = q.enqueue(1, b"2")[0]
    assert d.reordered and d.time_to_send_ns == 1
    assert q.next_departure_ns() == 1
    assert q.pop_due(10 * NS_PER_MS) == [b"2", b"1"]


def test_invalid_combinations_raise_like_tc():
    # tc-netem refuses these; LinkParams refuses to be built with them, so no queue ever sees them.
    with pytest.raises(ValueError, match="reorder_gap: needs reorder_pct"):
        LinkParams(reorder_gap=5, delay_ms=10)
    with pytest.raises(ValueError, match="reordering needs delay_ms"):
        LinkParams(reorder_pct=5)


def test_queue_limit_drops():
    q = NetemQueue(LinkParams(rate_mbit=1, limit_pkts=10), seed=1)
    for _ in range(25):
        q.offer(0, FRAME)
    assert len(q) == 10 and q.counters.dropped_limit == 15


def lag1(values: list[float]) -> float:
    """Lag-1 autocorrelation."""
    m = statistics.fmean(values)
    num = sum((a - m) * (b - m) for a, b in zip(values, values[1:]))
    return num / sum((a - m) ** 2 for a in values)


def test_correlated_source_is_ar1_with_rho():
    import random

    src = CorrelatedRandom(random.Random(1), 75)
    assert abs(lag1([src.next() for _ in range(20_000)]) - 0.75) < 0.03


def test_loss_correlation_lengthens_bursts_and_lowers_rate():
    # A kernel quirk we reproduce: mixing with the last value narrows the
    # distribution around 2^31, so `loss >= rnd` fires less often than loss_pct.
    frac, burst = loss_runs(LinkParams(loss_pct=40, loss_correlation_pct=50), 100_000)
    frac_plain, burst_plain = loss_runs(LinkParams(loss_pct=40), 100_000)
    assert burst > 1.1 * burst_plain
    assert frac < frac_plain - 0.05


def test_delay_correlation_vanishes_in_tabledist_like_the_kernel():
    # netem 6.1 reduces the correlated u32 modulo 2*jitter (uniform) or the
    # table size, which scrambles it: successive delays stay uncorrelated.
    for dist in ("uniform", "normal"):
        d = delays_ms(LinkParams(delay_ms=30, jitter_ms=5, delay_correlation_pct=75, delay_distribution=dist), n=5000)
        assert abs(lag1(d)) < 0.06


def test_set_params_live_keeps_queue():
    q = NetemQueue(LinkParams(delay_ms=50), seed=1)
    q.enqueue(0, b"old")
    q.set_params(LinkParams(delay_ms=10))
    (d,) = q.enqueue(1, b"new")
    assert d.time_to_send_ns == 1 + 10 * NS_PER_MS
    assert q.pop_due(20 * NS_PER_MS) == [b"new"]
    assert q.pop_due(50 * NS_PER_MS) == [b"old"]


def test_same_seed_same_decisions():
    params = LinkParams(delay_ms=20, jitter_ms=3, loss_pct=5, duplicate_pct=2, corrupt_pct=1)
    runs = []
    for _ in range(2):
        q = NetemQueue(params, seed=42)
        runs.append([q.enqueue(i * 1000, bytes(64)) for i in range(2000)])
    assert runs[0] == runs[1]


def test_periodic_delays_model():
    # No jitter: every 106-byte frame at 100 Mbit/s takes delay + 106e9/12.5e6 ns = delay + 8480 ns.
    assert set(periodic_delays_ns(LinkParams(rate_mbit=100, delay_ms=10), 100, NS_PER_MS, 106)) == {
        10 * NS_PER_MS + 8480
    }
    # Rate + jitter: frames queue behind slower predecessors, so the mean grows and the spread shrinks.
    d = periodic_delays_ns(LinkParams(rate_mbit=200, delay_ms=30, jitter_ms=5), 5000, NS_PER_MS, 106)
    assert statistics.fmean(d) > 31 * NS_PER_MS and statistics.pstdev(d) < 2 * NS_PER_MS
