"""Per-line figures of a topology file's run (experiments.analysis.lines): each line's captures give its bytes
per direction (a frame from the line's first side, B's included on the way to C, crosses it forward), the
KV transfers are grouped by the line their target is reached over, and summary.md's table shows both."""

from types import SimpleNamespace

from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw
from scapy.utils import wrpcap

from experiments.analysis import lines
from topology import routes
from topology.topofile import host_specs, line_specs, load_topology

T0 = 1_700_000_000.0


def _topo():
    topo = load_topology("three-sites")
    specs = host_specs(topo, {"md": 4})
    return routes.record(topo, specs, line_specs(topo)), [vars(h) for h in specs]


def _frame(src, dst, payload, t):
    pkt = Ether() / IP(src=src, dst=dst) / UDP(sport=1, dport=2) / Raw(b"x" * payload)
    pkt.time = t
    return pkt


def test_each_line_counts_what_it_delivered_per_direction(tmp_path):
    topo, hosts = _topo()
    pcap = tmp_path / "pcap"
    pcap.mkdir()
    fwd = _frame("10.1.0.21", "10.3.0.63", 958, T0 + 1)  # p1 -> md3: 1000 B on the wire, a -> c
    via_a = _frame("10.2.0.61", "10.3.0.64", 458, T0 + 2)  # md1 -> md4 through A: 500 B, b's side is a's
    back = _frame("10.3.0.63", "10.1.0.21", 158, T0 + 3)  # md3 -> p1: 200 B, c -> a
    late = _frame("10.1.0.21", "10.3.0.63", 958, T0 + 20)  # after the window
    # wanc-a.pcap at gwa (sends forward, receives reverse), wanc-c.pcap at gwc: frames at their receiver
    wrpcap(str(pcap / "wanc-a.pcap"), [fwd, via_a, back, late])
    wrpcap(str(pcap / "wanc-c.pcap"), [fwd, via_a, back, late])
    wrpcap(str(pcap / "wanb-a.pcap"), [_frame("10.1.0.21", "10.2.0.61", 58, T0 + 1)])
    wrpcap(str(pcap / "wanb-b.pcap"), [_frame("10.1.0.21", "10.2.0.61", 58, T0 + 1)])
    windows = {"pdd": SimpleNamespace(wall_start=T0, wall_end=T0 + 10)}
    got = lines.per_line(tmp_path, topo, hosts, windows, [])
    assert got["pdd"]["bytes"] == {"wanb": {"a_to_b": 100, "b_to_a": 0}, "wanc": {"a_to_c": 1500, "c_to_a": 200}}


def _transfer(rid, sender, target, ms, outcome="kv_send_end", path="wan"):
    start = {"event": "kv_send_start", "request_id": rid, "path": path, "target": target, "t_ns": 0, "variant": "pdd"}
    end = {"event": outcome, "request_id": rid, "path": path, "worker": sender, "t_ns": int(ms * 1e6)}
    end.update(kv_bytes=1_000_000 if outcome == "kv_send_end" else 0, wire_bytes=1_000_000, variant="pdd")
    return [start, end]


def test_kv_transfers_are_grouped_by_the_line_their_target_is_behind():
    topo, hosts = _topo()
    events = (
        _transfer("r1", "p1", "10.2.0.61:50063", 100)
        + _transfer("r2", "p1", "10.2.0.62:50063", 120)
        + _transfer("r3", "p1", "10.3.0.63:50063", 900)
        + _transfer("r4", "rld1", "10.3.0.64:50063", 0, outcome="kv_send_failed", path="handoff")
        + _transfer("r5", "p1", "10.1.0.41:50062", 5, path="fast")  # the same-site fast path: no line
    )
    got = lines.kv_by_line(events, topo, hosts)
    assert set(got) == {"wanb", "wanc"}
    assert (got["wanb"]["transfers"], got["wanb"]["ok"], got["wanb"]["kv_bytes"]) == (2, 2, 2_000_000)
    assert got["wanb"]["by_target"] == {"md1": 1, "md2": 1} and got["wanb"]["time_ms"]["p50"] == 110
    assert (got["wanc"]["transfers"], got["wanc"]["ok"]) == (2, 1) and got["wanc"]["time_ms"]["failed"] == 1
    md = "\n".join(lines.markdown({"pdd": {"bytes": {"wanb": {"a_to_b": 2e6, "b_to_a": 0}}, "kv": got}}))
    assert "| pdd | wanb | a_to_b 2.0 MB, b_to_a 0.0 MB | 2 (2) | 2.0 | 110" in md
    assert "| pdd | wanc | – | 2 (1) | 1.0 |" in md and "md3 1, md4 1" in md


def test_a_run_without_a_topology_record_or_with_one_line_has_no_line_figures(tmp_path):
    assert lines.per_line(tmp_path, None, [], {}, []) == {} and lines.markdown({}) == []
    topo = load_topology("two-clusters")
    specs = host_specs(topo)
    record = routes.record(topo, specs, line_specs(topo))
    windows = {"pdd": SimpleNamespace(wall_start=T0, wall_end=T0 + 10)}
    assert lines.per_line(tmp_path, record, [vars(h) for h in specs], windows, []) == {}


def test_the_routers_line_per_request_is_counted_by_reason():
    route = [
        {"event": "route", "line": "fast", "picks": {"md": {"reason": "line"}}},
        {"event": "route", "line": "fast", "picks": {"md": {"reason": "line"}}},
        {"event": "route", "line": "cheap", "picks": {"md": {"reason": "explore"}}},
        {"event": "route", "line": None},  # colocated, pd-intra, singular: no line crossed
    ]
    assert lines.choices(route) == {"cheap": {"explore": 1}, "fast": {"line": 2}}
    md = "\n".join(lines.markdown({"pdd": {"bytes": {}, "kv": {}, "routed": lines.choices(route)}}))
    assert "- pdd: cheap 1 (explore 1); fast 2 (line 2)" in md
