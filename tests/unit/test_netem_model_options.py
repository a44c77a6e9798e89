"""The userspace backend's netem model applies the new options: 4-state loss rates and bursts, correlated duplicate /
corrupt / reorder, slot delivery times and budgets, rate with packet overhead and cells, a user's .dist table; each
checked against the option's own statistics (analytic values, binomial or chain-aware intervals, fixed seeds)."""

import json
import math
import statistics

import pytest

from topology.netem_grammar import parse_netem
from topology.netem_model import NetemQueue
from topology.profiles import LinkParams, link_params_from_dict
from topology.userspace import _params_arg

MS = 1_000_000


def params(line: str) -> LinkParams:
    return link_params_from_dict(parse_netem(line), "<line>")


def outcomes(line: str, n: int, seed: int = 1, size: int = 100) -> list[int]:
    """Per offered frame (1 ms apart): how many copies were queued."""
    q = NetemQueue(params(line).replace(limit_pkts=10 * n + 10), seed)
    return [sum(d.outcome == "queued" for d in q.enqueue(i * MS, bytes(size))) for i in range(n)]


def runs(flags: list[bool]) -> list[int]:
    """Lengths of the runs of True."""
    out, length = [], 0
    for f in flags:
        if f:
            length += 1
        elif length:
            out.append(length)
            length = 0
    return out + ([length] if length else [])


# ---- 4-state loss ----


def test_four_state_loss_rate_and_burst_length_are_the_chains():
    # p13 1%, p31 30%, p32 0, p23 100%, p14 0: the chain is good -> burst of losses, leaving each loss with p 30%.
    # Loss rate pi3 = p13 / (p13 + p31) = 1/31; a burst's length is geometric with mean 1 / p31 = 3.33.
    n = 200_000
    lost = [c == 0 for c in outcomes("loss state 1% 30%", n)]
    rate = sum(lost) / n
    # Losses come in bursts: the variance of their count is ~ (1 + lambda) / (1 - lambda) that of a binomial
    # (lambda = 1 - p13 - p31 = 0.69, the chain's second eigenvalue): 5.5x; a 4-sigma interval of that.
    sd = math.sqrt((1 / 31) * (30 / 31) / n * (1.69 / 0.31))
    assert abs(rate - 1 / 31) < 4 * sd, rate
    bursts = runs(lost)
    mean_burst, sd_burst = statistics.mean(bursts), math.sqrt(0.7) / 0.3 / math.sqrt(len(bursts))
    assert abs(mean_burst - 1 / 0.3) < 4 * sd_burst, mean_burst
    assert max(bursts) > 10  # geometric bursts, not the isolated losses of loss random


def test_four_state_with_every_transition_loses_at_the_stationary_rate():
    p = params("loss state 1% 30% 10% 60% 2%")
    n = 200_000
    lost = sum(c == 0 for c in outcomes("loss state 1% 30% 10% 60% 2%", n, seed=7)) / n
    expected = p.expected_loss_pct / 100  # 5.04 %, the chain's stationary share of states 3 and 4
    assert abs(lost - expected) < 4 * math.sqrt(expected * (1 - expected) / n * 6), (lost, expected)


def test_four_state_isolated_losses_alternate():
    # p14 100%: state 1 always goes to 4 (lost), state 4 always back to 1 (passes): every other frame, exactly.
    assert outcomes("loss state 0% 0% 0% 0% 100%", 10) == [0, 1] * 5


# ---- correlation of duplicate, corrupt and reorder ----


def _events(line: str, n: int, counter: str) -> list[bool]:
    q = NetemQueue(params(line).replace(limit_pkts=10 * n + 10), 3)
    out = []
    for i in range(n):
        before = getattr(q.counters, counter)
        q.enqueue(i * MS, bytes(100))
        out.append(getattr(q.counters, counter) > before)
    return out


@pytest.mark.parametrize(
    "option, counter",
    [("duplicate", "duplicated"), ("corrupt", "corrupted"), ("delay 10ms reorder", "reordered")],
)
def test_a_correlation_makes_runs_longer_at_the_same_rate(option, counter):
    n = 40_000
    plain = _events(f"{option} 50%", n, counter)
    correlated = _events(f"{option} 50% 90%", n, counter)
    # netem's correlated draw averages toward the last one: the rate stays near 50 %, the runs grow.
    assert abs(sum(plain) / n - 0.5) < 4 * math.sqrt(0.25 / n)
    assert 0.4 < sum(correlated) / n < 0.6
    assert statistics.mean(runs(plain)) == pytest.approx(2, rel=0.1)  # geometric with p 1/2
    assert statistics.mean(runs(correlated)) > 4


# ---- slot ----


def drain(q: NetemQueue) -> list[int]:
    """Departure times when the caller polls exactly at next_departure_ns() (as the forwarder does)."""
    out = []
    while (t := q.next_departure_ns()) is not None:
        out += [t] * len(q.pop_due(t))
    return out


def test_fixed_slots_carry_their_packet_budget_every_slot():
    q = NetemQueue(params("slot 10ms packets 2"), 1)
    for _ in range(20):
        q.offer(0, bytes(1000))
    assert drain(q) == [i // 2 * 10 * MS for i in range(20)]  # 2 frames at 0, 10, ..., 90 ms


def test_a_slots_byte_budget_counts_bytes():
    q = NetemQueue(params("slot 10ms bytes 3000"), 1)
    for _ in range(9):
        q.offer(0, bytes(1000))
    assert drain(q) == [0] * 3 + [10 * MS] * 3 + [20 * MS] * 3


def test_uniform_slots_are_spaced_uniformly_between_min_and_max():
    q = NetemQueue(params("slot 5ms 15ms packets 1").replace(limit_pkts=5000), 2)
    for _ in range(4000):
        q.offer(0, bytes(100))
    times = drain(q)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert min(gaps) >= 5 * MS and max(gaps) < 15 * MS
    # Uniform on [5, 15) ms: mean 10 ms, sd 10 / sqrt(12) ms.
    assert abs(statistics.mean(gaps) - 10 * MS) < 4 * (10 * MS / math.sqrt(12)) / math.sqrt(len(gaps))
    assert statistics.pstdev(gaps) == pytest.approx(10 * MS / math.sqrt(12), rel=0.05)


def test_slots_from_a_distribution_have_its_mean_and_spread():
    q = NetemQueue(params("slot distribution normal 10ms 2ms packets 1").replace(limit_pkts=5000), 4)
    for _ in range(4000):
        q.offer(0, bytes(100))
    times = drain(q)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert statistics.mean(gaps) == pytest.approx(10 * MS, rel=0.01)
    assert statistics.pstdev(gaps) == pytest.approx(2 * MS, rel=0.05)


def test_a_frame_is_never_held_past_its_slot_for_nothing():
    # A lone frame due later than an open slot waits for the slot drawn when it is looked at: 10 ms after enqueue.
    q = NetemQueue(params("delay 1ms slot 10ms"), 1)
    q.offer(50 * MS, bytes(100))
    assert drain(q) == [60 * MS]


# ---- rate with packet overhead and cells ----


@pytest.mark.parametrize(
    "line, frame, wire_bytes",
    [
        ("rate 8mbit", 1000, 1000),
        ("rate 8mbit 24", 1000, 1024),  # packet overhead
        ("rate 8mbit -14", 1000, 986),  # a negative overhead (e.g. taking the Ethernet header off)
        ("rate 8mbit 0 48 5", 1000, 21 * 53),  # ATM: 21 cells of 48 payload bytes, 53 on the wire
        ("rate 8mbit 8 48 5", 1000, 21 * 53),  # 1008 bytes still fit 21 cells
        ("rate 8mbit 9 48 5", 1000, 22 * 53),  # 1009 need a 22nd
    ],
)
def test_rate_counts_overhead_and_whole_cells(line, frame, wire_bytes):
    q = NetemQueue(params(line).replace(limit_pkts=2000), 1)
    for _ in range(1000):
        q.offer(0, bytes(frame))
    times = drain(q)
    # 8 Mbit/s = 1 byte per us: the backlog leaves one frame per wire_bytes us.
    assert times[:3] == [wire_bytes * 1000, 2 * wire_bytes * 1000, 3 * wire_bytes * 1000]
    assert times[-1] == 1000 * wire_bytes * 1000


# ---- a user's distribution table ----


def test_a_users_dist_table_shapes_the_delay(tmp_path):
    # Every entry +1 sigma (8192 = NETEM_DIST_SCALE): each frame gets delay + jitter exactly.
    (tmp_path / "plus1.dist").write_text("# +1 sigma\n" + "8192 " * 64 + "\n")
    q = NetemQueue(params(f"delay 10ms 2ms distribution {tmp_path}/plus1.dist"), 1)
    assert {d.time_to_send_ns for i in range(100) for d in q.enqueue(0, bytes(100))} == {12 * MS}


# ---- the userspace backend's command line carries every option ----


def test_the_forwarder_takes_every_new_option_as_json():
    line = ("delay 10ms 2ms loss state 1% 30% 10% 60% 2% duplicate 1% 25% corrupt 0.1% 50% reorder 25% 50% gap 3 "
            "rate 100mbit 20 53 5 slot 1ms 5ms packets 10 bytes 3000")  # fmt: skip
    p = params(line)
    assert _params_arg(json.dumps(p.to_dict())) == p
