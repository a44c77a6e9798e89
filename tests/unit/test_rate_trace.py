"""Trace-driven links: Mahimahi traces read (and refused naming the line), delivered exactly by the userspace model
(throughput per 100 ms window equals the trace's), the tc backend's per-window netem rates with their stated error,
and the shipped traces and profile."""

import time

import pytest

from topology.netem_model import NetemQueue
from topology.profiles import PROFILE_DIR, LinkParams, ProfileError, link_params_from_dict, load_profile
from topology.rate_trace import (
    MTU_BYTES,
    TraceClock,
    TraceError,
    load_trace,
    parse_trace,
    rate_schedule,
    window_rates_mbit,
)
from topology.trace_player import window_params

MS = 1_000_000
TRACES = PROFILE_DIR / "traces"


@pytest.mark.parametrize(
    "text, needle",
    [
        ("1\n2\nx\n", "t.trace:3: 'x' is not a whole number of milliseconds"),
        ("1\n-2\n", "t.trace:2: '-2' is not a whole number"),
        ("5\n3\n", "t.trace:2: 3 ms goes back in time (previous 5 ms)"),
        ("", "t.trace: a trace needs at least one opportunity"),
        ("0\n0\n", "t.trace: a trace needs at least one opportunity and a last timestamp > 0 ms"),
    ],
)
def test_a_bad_trace_is_refused_naming_the_line(text, needle):
    with pytest.raises(TraceError) as err:
        parse_trace(text, "t.trace")
    assert needle in str(err.value)


def test_opportunities_carry_1500_bytes_split_across_frames_and_loop():
    clock = TraceClock(parse_trace("1\n1\n4\n"), start_ns=0)  # two at 1 ms, one at 4 ms; period 4 ms
    assert [clock.depart_ns(0, 1000) for _ in range(4)] == [1 * MS, 1 * MS, 1 * MS, 4 * MS]
    # 3000 bytes at 1 ms: three frames fit (1000 + 1000 + 1000); the fourth waits for 4 ms. The period loops:
    assert clock.depart_ns(0, 1500) == 5 * MS  # 500 left at 4 ms, the rest at 4 + 1 ms
    assert clock.depart_ns(0, 1500) == 5 * MS  # the second opportunity at 5 ms (two at 1 ms in each period)
    assert clock.depart_ns(0, 600) == 8 * MS  # 500 bytes left at 5 ms, the other 100 at 4 + 4 ms


def test_an_opportunity_with_nothing_queued_is_lost():
    clock = TraceClock(parse_trace("1\n2\n3\n10\n"), start_ns=0)
    assert clock.depart_ns(2_500_000, 100) == 3 * MS  # 1 and 2 ms went unused
    assert clock.depart_ns(3 * MS, 100) == 3 * MS  # ready at the opportunity's ms: the 1,400 bytes left of it
    assert clock.depart_ns(3 * MS + 1, 100) == 10 * MS


def delivered_per_window(trace_path: str, seconds: int, frame: int = MTU_BYTES, delay_ms: int = 0) -> list[int]:
    """Bytes a backlogged model link delivers per 100 ms window."""
    trace = load_trace(trace_path)
    frames = int(trace.mean_rate_mbit() * 1e6 / 8 * seconds * 2 / frame)
    q = NetemQueue(LinkParams(delay_ms=delay_ms, rate_trace=trace_path, limit_pkts=frames + 1), 1)
    for _ in range(frames):
        q.offer(0, bytes(frame))
    windows = [0] * (seconds * 10)
    while (t := q.next_departure_ns()) is not None and t < seconds * 1000 * MS:
        sent = q.pop_due(t)
        windows[t // (100 * MS)] += len(sent) * frame
    return windows


@pytest.mark.parametrize("name", ["const-12mbit.trace", "cellular-steps.trace"])
def test_the_models_throughput_per_100ms_window_is_the_traces(name):
    path = str(TRACES / name)
    trace = load_trace(path)
    periods = 2
    seconds = periods * trace.period_ms // 1000
    got = delivered_per_window(path, seconds)
    want = [r * 1e6 / 8 / 10 for r in window_rates_mbit(trace)] * periods
    # The first window lacks the opportunities at the period's end that open each later period (the loop).
    at_end = trace.times_ms.count(trace.period_ms) * MTU_BYTES
    assert got[0] == want[0] - at_end
    assert got[1:] == [int(w) for w in want[1:]]


def test_frames_of_any_size_fill_the_trace_within_one_frame_per_window():
    path = str(TRACES / "cellular-steps.trace")
    trace = load_trace(path)
    got = delivered_per_window(path, 10, frame=1000, delay_ms=20)
    want = [r * 1e6 / 8 / 10 for r in window_rates_mbit(trace)]
    # A frame split across a window's edge counts in the later one: at most one frame's bytes either way.
    assert all(abs(g - w) <= 1000 for g, w in zip(got[1:], want[1:])), [(g, w) for g, w in zip(got, want)][:5]
    # In all: the trace's bytes, less the opportunities before the first frame was ready (20 ms) and those at the
    # period's end (they open the next period), within the one frame still in flight at the end.
    unused = sum(t < 20 or t == trace.period_ms for t in trace.times_ms) * MTU_BYTES
    assert 0 <= sum(want) - unused - sum(got) < 1000


def test_the_tc_schedule_is_each_windows_rate_and_states_its_error():
    # 12, 0 and 6 Mbit/s over a 300 ms period (the opportunity at 300 ms opens the next period: window 0).
    trace = parse_trace("".join(f"{t}\n" for t in [*range(1, 100), *range(201, 300, 2), 300]))
    assert window_rates_mbit(trace) == [12.0, 0.0, 6.0]
    schedule = rate_schedule(trace)
    assert schedule.steps == ((0, 12_000_000), (100, 8), (200, 6_000_000))
    # The empty window cannot be rate 0 in netem (no rate at all): 8 bit/s, 8e-6 Mbit/s off a 6 Mbit/s mean.
    assert schedule.max_window_error_pct == pytest.approx(8e-6 / 6 * 100)
    assert rate_schedule(load_trace(str(TRACES / "const-12mbit.trace"))).max_window_error_pct == 0


def test_the_tc_backend_plays_rates_with_one_queue_limit(tmp_path):
    (tmp_path / "t.trace").write_text("".join(f"{t}\n" for t in [*range(1, 100), *range(201, 300, 2), 300]))
    steps = window_params(LinkParams(delay_ms=30, rate_trace=str(tmp_path / "t.trace")))
    assert [(at, p.rate_mbit) for at, p in steps] == [(0, 12.0), (100, 8e-6), (200, 6.0)]
    assert {p.limit_pkts for _, p in steps} == {LinkParams(delay_ms=30, rate_mbit=6.0).effective_limit_pkts}
    assert [p.netem_line().split()[-2:] for _, p in steps] == [["rate", "12000000bit"], ["rate", "8bit"],
                                                               ["rate", "6000000bit"]]  # fmt: skip


def test_the_shipped_traces_and_profile():
    assert load_trace(str(TRACES / "const-12mbit.trace")).mean_rate_mbit() == pytest.approx(12.0)
    cellular = load_trace(str(TRACES / "cellular-steps.trace"))
    rates = window_rates_mbit(cellular)
    assert cellular.period_ms == 10_000 and 2 <= min(rates) < max(rates) < 41
    p = load_profile("wan-cellular-trace")
    assert p.a_to_b.rate_trace == str(TRACES / "cellular-steps.trace") == p.b_to_a.rate_trace
    assert (p.a_to_b.delay_ms, p.a_to_b.rate_mbit) == (20, 0)


def test_a_trace_and_a_rate_are_exclusive():
    with pytest.raises(ProfileError, match="rate_trace and rate_mbit are exclusive"):
        link_params_from_dict({"rate_mbit": 5, "rate_trace": str(TRACES / "const-12mbit.trace")}, "x")


def test_the_tc_backend_changes_the_rate_every_window_and_stops(tmp_path):
    from topology import naming
    from topology.shaping import TcBackend

    (tmp_path / "t.trace").write_text("".join(f"{t}\n" for t in [*range(1, 100), *range(201, 300, 2), 300]))
    ran: list[tuple[str | None, list[str]]] = []
    backend = TcBackend(lambda host, argv: ran.append((host, argv)) or "")  # the commands, not root's tc
    backend.start(LinkParams(delay_ms=5, rate_trace=str(tmp_path / "t.trace")), LinkParams(delay_ms=5))
    host, dev = naming.wan_interfaces()["a_to_b"]
    first = ran[0]
    assert first[0] == host and first[1][:6] == ["tc", "qdisc", "replace", "dev", dev, "root"]
    assert first[1][-2:] == ["rate", "12000000bit"]
    time.sleep(0.45)  # windows at 100 ms (8 bit/s), 200 ms (6 Mbit/s), 300 ms (the period again: 12 Mbit/s)
    backend.stop()
    changes = [argv[argv.index("rate") + 1] for h, argv in ran if h == host and argv[2] == "change"]
    assert changes[:3] == ["8bit", "6000000bit", "12000000bit"]
    count = len(ran)
    time.sleep(0.25)
    assert len(ran) == count  # stopped: no more changes
    assert ran[-1][1][:3] == ["tc", "qdisc", "del"]
