"""The userspace emulator's own health: how late frames left against netem's departure times, CPU share
and drops over a window (pure logic: histograms and snapshots built by hand, and one NetemQueue)."""

import dataclasses

from topology.netem_model import Lateness, NetemQueue, lateness_between
from topology.profiles import LinkParams
from topology.emulator import LATE_P99_US, health_between


def test_lateness_percentiles_over_a_window():
    lat = Lateness()
    for _ in range(90):
        lat.add(5_000)  # 5 us late: bucket 0 (0-10 us)
    before = lat.to_dict()
    for _ in range(98):
        lat.add(15_000)  # bucket 1 (10-20 us)
    lat.add(2_500_000)  # 2.5 ms
    lat.add(50_000_000)  # 50 ms: the overflow bucket
    w = lateness_between(before, lat.to_dict())
    assert w["frames"] == 100 and w["p50_us"] == 20 and w["p99_us"] == 2510 and w["max_us"] == 50_000
    assert lateness_between(lat.to_dict(), lat.to_dict())["p99_us"] is None  # nothing sent in between


def test_pop_due_measures_lateness_against_time_to_send():
    q = NetemQueue(LinkParams(delay_ms=1.0), seed=1)
    q.offer(0, b"x" * 100)
    lat = Lateness()
    assert q.pop_due(500_000, lat) == [] and sum(lat.counts) == 0  # not due yet
    assert len(q.pop_due(1_300_000, lat)) == 1  # due at 1.0 ms, popped at 1.3 ms
    assert lat.counts[30] == 1 and lat.max_ns == 300_000
    assert dataclasses.asdict(q.counters)["sent"] == 1  # the forwarder's stats reply serialises them


def test_health_between_flags_a_late_window_and_counts_drops_and_cpu():
    def snap(t_s, cpu_s, late_ns, rx_drops):
        lat = {d: Lateness() for d in ("a_to_b", "b_to_a")}
        for ns in late_ns:
            lat["a_to_b"].add(ns)
        return {
            "t_ns": int(t_s * 1e9),
            "cpu_s": cpu_s,
            "lateness": {d: v.to_dict() for d, v in lat.items()},
            "drops": {"a_to_b": {"rx_drops": rx_drops, "tx_errors": 0}, "b_to_a": {"rx_drops": 0, "tx_errors": 0}},
        }

    quiet = health_between(snap(10, 1.0, [], 3), snap(20, 4.0, [20_000] * 100, 3))
    assert not quiet["late"] and quiet["cpu_share"] == 0.3 and quiet["a_to_b"]["rx_drops"] == 0
    busy = health_between(snap(10, 1.0, [], 3), snap(20, 9.0, [20_000] * 90 + [5_000_000] * 10, 7))
    assert busy["late"] and busy["a_to_b"]["p99_us"] > LATE_P99_US and busy["a_to_b"]["rx_drops"] == 4


def test_a_windows_maximum_is_its_own_not_the_runs():
    lat = Lateness()
    lat.add(80_000_000)  # 80 ms late, in an earlier window
    before = lat.to_dict(reset_recent=True)  # the window opens
    for _ in range(100):
        lat.add(5_000)
    lat.add(20_000_000)  # 20 ms: this window's worst, in the overflow bucket
    w = lateness_between(before, lat.to_dict(reset_recent=True))
    assert w["max_us"] == 20_000 and w["p99_us"] == 10 and lat.max_ns == 80_000_000
