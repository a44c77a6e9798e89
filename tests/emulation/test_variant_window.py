"""A variant's window on the live topology: the schedule on each variant's own clock, and cross traffic.

- Two short "variants" (windows opened one after the other on one topology, as the runner does) meet the
  same schedule: each variant's link_changes lie inside its window at the steps' offsets, and the profile's
  base is back after each window.
- A TCP cross flow xa -> xb on wan-cross-country: its iperf3 JSON is kept, its throughput is above zero and
  below the link's rate, and its metadata entry (experiments.rundir.metadata.CrossTrafficEntry) says what ran.
"""

import dataclasses
import json
import time

from experiments.analysis import crosstraffic as results
from experiments.spec import crosstraffic as ct
from experiments.rundir.metadata import VariantRecord
from experiments.run.window import Impairment, VariantWindow
from topology.net import Testbed, TopologyConfig
from topology.profiles import DIRECTIONS, ScheduleStep, load_profile

# A change is applied within this long of its due time (s): one `tc qdisc change` or one control-socket
# message to the userspace emulator (milliseconds), plus a busy 2-core machine's scheduling delay.
OFFSET_TOL_S = 0.5
# The offset of the window's closing restore is the hold's end plus the restore itself.
CLOSE_TOL_S = 1.0


def test_each_variant_meets_the_schedule_on_its_own_clock(backend, tmp_path):
    steps = (
        ScheduleStep(at_s=0.5, changes={"loss_pct": 5}, direction="both", duration_s=1.0),
        ScheduleStep(at_s=2.0, changes={"delay_ms": 40}, direction="a_to_b"),
    )  # kept: the close restores it
    profile = dataclasses.replace(load_profile("wan-regional"), schedule=steps)
    imp = Impairment(steps, ("profile step 0", "profile step 1"), restore=True)
    records = []
    with Testbed(TopologyConfig(wan_profile=profile, backend=backend, play_schedule=False)) as tb:
        assert tb.link.changes == []  # the topology played nothing itself
        for variant in ("v1", "v2"):
            win = VariantWindow(tb, imp, tmp_path / variant, tmp_path)
            win.open(time.monotonic_ns())
            assert win.hold(variant) > 1.5  # nothing else ran: the window waits for the last event at 2 s
            records.append(win.close(VariantRecord(status="running")))
            tb.check()
            assert tb.link.current == {d: profile.direction(d) for d in DIRECTIONS}
        meta = tb.metadata()
    for rec in records:
        changes = rec.link_changes
        assert all(rec.window_start_ns <= c.t_ns <= rec.window_end_ns for c in changes)
        got = [(c.cause, c.direction) for c in changes]
        assert got == [
            ("profile step 0", "a_to_b"),
            ("profile step 0", "b_to_a"),
            ("profile step 0 ends", "a_to_b"),
            ("profile step 0 ends", "b_to_a"),
            ("profile step 1", "a_to_b"),
            ("restore profile base (window closes)", "a_to_b"),
        ], got
        due = [0.5, 0.5, 1.5, 1.5, 2.0]
        for c, at_s in zip(changes, due):
            assert at_s <= c.offset_s < at_s + OFFSET_TOL_S, (c.cause, c.offset_s, at_s)
        assert changes[4].params["delay_ms"] == 40 and changes[0].params["loss_pct"] == 5
        assert 2.0 <= changes[5].offset_s < 2.0 + CLOSE_TOL_S
        assert rec.window_extended_s > 1.5
    assert len(meta["link_changes"]) == 12 and all(c["t_ns"] for c in meta["link_changes"])


def test_tcp_cross_flow_on_the_wan(backend, tmp_path):
    profile = load_profile("wan-cross-country")
    flow = ct.CrossFlow(
        kind="tcp", duration_s=4, direction="a_to_b", start_s=0.5, name="bulk", streams=2, congestion="reno"
    )
    imp = Impairment(flows=(flow,))
    vdir = tmp_path / "variants" / "v1"
    with Testbed(TopologyConfig(wan_profile=profile, backend=backend, cross_hosts=True)) as tb:
        assert {"xa", "xb"} <= {h["name"] for h in tb.metadata()["hosts"]}
        win = VariantWindow(tb, imp, vdir, tmp_path)
        t0 = time.monotonic_ns()
        win.open(t0)
        win.hold("v1")
        rec = win.close(VariantRecord(status="running"))
        win.check()
    [entry] = rec.cross_traffic
    assert entry.iperf_json == "variants/v1/cross/bulk-a_to_b.json"
    assert (entry.name, entry.kind, entry.direction, entry.streams, entry.congestion) == (
        "bulk",
        "tcp",
        "a_to_b",
        2,
        "reno",
    )
    assert t0 + 0.5e9 <= entry.start_ns < entry.end_ns
    doc = json.loads((tmp_path / entry.iperf_json).read_text())
    assert "error" not in doc, doc.get("error")
    result = results.parse_result(doc, "tcp")
    print(f"cross flow: {result.mean_mbit:.1f} Mbit/s, streams {result.stream_mbit}, retransmits {result.retransmits}")
    assert 0 < result.mean_mbit < profile.a_to_b.rate_mbit
    assert len(result.intervals) >= 3 and len(result.stream_mbit) == 2
