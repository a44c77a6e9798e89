"""Topology files built live (topology.net from topology.topofile): three sites with B reaching C through A,
two lines between two sites with each MD on one line both ways, captures on both ends of every line, every
line's own shaper, and teardown leaving nothing behind."""

import re
import time
from pathlib import Path

import pytest

from experiments.rundir.metadata import VariantRecord
from experiments.run.window import Impairment, VariantWindow
from topology.net import Testbed, TopologyConfig
from topology.profiles import load_profile
from topology.topofile import host_specs, load_topology


def _rtt_ms(tb, src, dst_ip, count=5):
    """The median RTT of pings (ms) from a host to an address."""
    out = tb.run(src, ["ping", "-n", "-c", str(count), "-i", "0.2", "-W", "3", dst_ip], timeout_s=30)
    times = sorted(float(t) for t in re.findall(r"time=([0-9.]+) ms", out))
    assert times, out
    return times[len(times) // 2]


def _ip(tb, name):
    return next(h["ip"] for h in tb.metadata()["hosts"] if h["name"] == name)


def test_three_sites_reach_each_other_over_their_own_lines(backend, tmp_path):
    topo = load_topology("three-sites")
    cfg = TopologyConfig(wan_profile=None, topology=topo, backend=backend, capture_dir=tmp_path / "pcap")
    with Testbed(cfg) as tb:
        assert [h.__dict__ for h in host_specs(topo, {"md": 4})] == tb.metadata()["hosts"]
        assert [ln["name"] for ln in tb.metadata()["topology"]["lines"]] == ["wanb", "wanc"]
        assert tb.links["wanb"].current["a_to_b"] == load_profile("wan-regional").a_to_b
        assert tb.links["wanc"].current["a_to_b"] == load_profile("wan-cross-country").a_to_b
        near = _rtt_ms(tb, "p1", _ip(tb, "md1"))  # wan-regional: 5 ms each way
        far = _rtt_ms(tb, "p1", _ip(tb, "md3"))  # wan-cross-country: 30 ms each way
        both = _rtt_ms(tb, "md1", _ip(tb, "md4"))  # b -> a -> c: both lines
        # bounds ~4 sigma of a median of 5 pings under each line's jitter (cross-country: 60 +- 7 ms a ping; 55 failed
        # once in a clean-clone VM tier at 52.7). The near line's upper bound is the far one's less 30 ms, not a fixed
        # 20: a host's own time in each ping (qemu TCG on a slow core: 21.3 ms for regional's 10, 2026-12-07) would
        # fail a fixed bound, while near over the far line (~60) fails this one as it did that
        assert 8 < near < far - 30, (near, far)
        assert 45 < far < 80, far
        assert 55 < both < 100, both
        if backend == "userspace":  # each line its own forwarder, each counting only its own frames
            assert tb.links["wanb"].backend.pid != tb.links["wanc"].backend.pid
    names = sorted(p.name for p in (tmp_path / "pcap").iterdir())
    assert names == ["wanb-a.pcap", "wanb-b.pcap", "wanc-a.pcap", "wanc-c.pcap"]
    assert all(p.stat().st_size > 24 for p in (tmp_path / "pcap").iterdir())  # more than the pcap header


def test_two_lines_put_each_md_on_one_line_both_ways(backend):
    topo = load_topology("two-lines")
    with Testbed(TopologyConfig(wan_profile=None, topology=topo, backend=backend, n_md=2)) as tb:
        fast = _rtt_ms(tb, "p1", _ip(tb, "md1"))  # line fast: 10 ms each way
        cheap = _rtt_ms(tb, "p1", _ip(tb, "md2"))  # line cheap (wan-cross-country): 30 ms each way
        assert 18 < fast < 30, fast
        assert 55 < cheap < 80, cheap
        if backend != "userspace":
            return
        before = {name: tb.links[name].backend.stats() for name in ("fast", "cheap")}
        win = VariantWindow(tb, Impairment((), ()), Path("/nonexistent"), Path("/nonexistent"))
        win.open(time.monotonic_ns())
        _rtt_ms(tb, "md2", _ip(tb, "p1"), count=10)  # started on B's side: replies come back on cheap too
        health = win.close(VariantRecord(status="running")).emulator
        after = {name: tb.links[name].backend.stats() for name in ("fast", "cheap")}
        # The window's emulator health is every line's forwarder's: cheap carried the pings, fast nothing.
        assert set(health.lines) == {"fast", "cheap"} and health.line in ("fast", "cheap")
        assert health.lines["cheap"].a_to_b.frames >= 10 and health.lines["fast"].a_to_b.frames == 0
        moved = {
            name: {d: after[name][d]["received"] - before[name][d]["received"] for d in ("a_to_b", "b_to_a")}
            for name in after
        }
        assert moved["fast"] == {"a_to_b": 0, "b_to_a": 0}, moved
        assert moved["cheap"]["a_to_b"] >= 10 and moved["cheap"]["b_to_a"] >= 10, moved


def test_a_spec_profile_runs_on_the_first_line_only(backend):
    topo = load_topology("three-sites")
    cfg = TopologyConfig(wan_profile=load_profile("wan-lossy"), topology=topo, backend=backend)
    with Testbed(cfg) as tb:
        assert tb.link is tb.links["wanb"]
        assert tb.links["wanb"].current["a_to_b"] == load_profile("wan-lossy").a_to_b
        assert tb.links["wanc"].current["a_to_b"] == load_profile("wan-cross-country").a_to_b
        assert tb.metadata()["wan_profile"]["name"] == "wan-lossy"


@pytest.mark.parametrize("n_md", [3])
def test_a_pool_count_the_file_disagrees_with_is_refused_before_anything_is_built(backend, n_md):
    from topology.topofile import TopologyError

    topo = load_topology("three-sites")
    with pytest.raises(TopologyError, match="pools.md=3: topology 'three-sites' places 4 md workers"):
        with Testbed(TopologyConfig(wan_profile=None, topology=topo, backend=backend, n_md=n_md)):
            pass
