"""What TCP did on the WAN: KV transfers per path, congestion warnings, WAN bytes three ways, fallbacks,
RLD occupancy, flows.json and the TCP plot, on a synthetic run of the newer data plane and on an old one."""

import json
from types import SimpleNamespace

import matplotlib
import pytest

import fake_pcap as fp
import fake_run as fr
from experiments.analysis import analyze, flows, occupancy, plots, runmeta, transfers
from experiments.rundir import metadata
from experiments.rundir.metadata import EmulatorHealth, LinkChange, VariantRecord
from experiments.analysis.records import fallback_cause
from fake_run import make_run

matplotlib.use("Agg")
KV_BPT = 512  # fake_run's KV bytes per token


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run = make_run(tmp_path_factory.mktemp("wan"), tcp=True)
    analyze.analyze(run)
    return run


@pytest.fixture(scope="module")
def summary(run):
    return json.loads((run / "summary.json").read_text())


@pytest.fixture(scope="module")
def old(tmp_path_factory):
    run = make_run(tmp_path_factory.mktemp("old"))
    analyze.analyze(run)
    return json.loads((run / "summary.json").read_text())


def _pdd_kv_bytes():
    from experiments.spec import experiment as specmod, workload as wl

    reqs = wl.build(specmod.load_spec("pdd-smoke", []))
    return sum((r.prompt_len - r.cached_tokens) * KV_BPT for r in reqs)


def test_kv_transfers_per_path(summary):
    wan = summary["variants"]["pdd"]["kv_paths"]["wan"]
    assert (wan["transfers"], wan["ok"], wan["failed"], wan["cancelled"], wan["retried"]) == (11, 10, 1, 0, 2)
    times = sorted(fr._wan_time_ms(i) for i in range(10))
    assert wan["time_ms"]["p50"] == pytest.approx((times[4] + times[5]) / 2)
    assert wan["time_ms"]["max"] == max(times) and wan["time_ms"]["n"] == 10
    assert wan["retrans_segs"] == 40  # 4 reported by each ok transfer
    known_mb = (_pdd_kv_bytes() + 10 * fr.HEADER_BYTES + fr.RETRY_EXTRA_BYTES) / 1e6
    assert wan["retrans_segs_per_mb"] == pytest.approx(40 / known_mb)
    assert (wan["rtt_ms_p50"], wan["cwnd_p50"]) == (40.0, 20)  # samples 30/40/50 ms, 10/20/30 segments
    assert wan["congestion_used"] == ["bbr"] and wan["congestion_requested"] == ["bbr"]
    fast, handoff = (summary["variants"]["pdd"]["kv_paths"][p] for p in ("fast", "handoff"))
    assert fast["ok"] == 10 and fast["rtt_ms_p50"] is None and fast["retrans_segs"] is None
    assert handoff["transfers"] == 0 and handoff["time_ms"] == {"n": 0}


def test_retransmissions_from_samples_when_the_end_event_lacks_them(summary):
    wan = summary["variants"]["pd-cross"]["kv_paths"]["wan"]
    assert wan["retrans_segs"] == 10 * 2 * 2  # per transfer: 2 connections, each +2
    assert wan["congestion_used"] == ["cubic"]


def test_congestion_mismatch_and_refusal_are_warnings(run, summary):
    kinds = {(w["variant"], w["kind"]): w for w in summary["warnings"]}
    assert set(kinds) == {("pd-cross", "congestion_mismatch"), ("pd-cross", "congestion_refused")}
    mism = kinds[("pd-cross", "congestion_mismatch")]
    assert (mism["requested"], mism["used"], mism["count"], mism["path"]) == ("bbr", "cubic,cubic", 10, "wan")
    md = (run / "summary.md").read_text()
    assert "## Warnings" in md and all(w["message"] in md for w in summary["warnings"])


def test_wan_bytes_three_ways(summary):
    b = summary["variants"]["pdd"]["wan_bytes"]
    assert b["delivered"] == _pdd_kv_bytes()
    assert b["wasted"] == fr.FAILED_WIRE_BYTES + fr.HEADER_BYTES + fr.RETRY_EXTRA_BYTES
    assert b["resumed"] == fr.RESUMED_BYTES
    kv_on_wire = fp.frame_len(0) + fp.KV_SEGMENTS * fp.frame_len(fp.MSS)  # SYN + 11 first sends + 1 retransmission
    assert b["on_wire_kv_pcap"] == kv_on_wire
    assert b["on_wire_pcap"] == kv_on_wire + fp.CROSS_DATAGRAMS * fp.frame_len(
        fp.CROSS_PAYLOAD, udp=True
    ) + fp.frame_len(200)
    assert summary["variants"]["pd-cross"]["wan_bytes"]["on_wire_pcap"] == 0  # captured, nothing in its window


def test_fallbacks_by_cause_and_rld_occupancy(run, summary):
    p = summary["variants"]["pdd"]
    assert p["fallbacks"] == {"kv_send_retry": 2, "kv_send_failed": 1, "route_fallback:md1 unavailable": 1}
    occ = p["rld_occupancy"]
    assert (occ["sessions"], occ["max"]) == (10, 2)
    assert occ["mean"] == pytest.approx((9 * fr.RLD_SESSION_MS + 797) / 5000)
    assert summary["variants"]["pd-cross"]["rld_occupancy"] == {"sessions": 0, "mean": 0.0, "max": 0}
    md = (run / "summary.md").read_text()
    assert "## Fallbacks by cause" in md and "route_fallback:md1 unavailable" in md


def test_flows_json(run, summary):
    doc = json.loads((run / "flows.json").read_text())
    kv = next(r for r in doc["flows"] if r["class"] == "kv" and r["direction"] == "a_to_b")
    assert (kv["src"], kv["sport"], kv["dst"], kv["dport"], kv["variant"]) == (fp.A, 40000, fp.B, 50063, "pdd")
    assert (kv["packets_sent"], kv["packets_delivered"], kv["retrans_segs"]) == (
        fp.KV_SEGMENTS + 2,
        fp.KV_SEGMENTS + 1,
        1,
    )
    assert kv["rtt_handshake_ms"] == pytest.approx(fp.HANDSHAKE_RTT_MS, abs=0.01)
    assert kv["rtt_data_ms"]["n"] == 5 and kv["rtt_data_ms"]["p50"] == pytest.approx(fp.DATA_RTT_MS, abs=0.01)
    classes = {(r["class"], r["proto"], r["dport"]) for r in doc["flows"] if r["direction"] == "a_to_b"}
    assert classes == {("kv", "tcp", 50063), ("cross", "udp", fp.CROSS_PORT), ("other", "tcp", 50053)}
    assert doc["kv_ports"] == [50062, 50063] and doc["cross_ports"] == [fp.CROSS_PORT]
    assert summary["variants"]["pdd"]["wan_flows"]["kv"]["retrans_segs"] == 1


def test_sequence_numbers_wrap_without_false_retransmissions():
    f = flows.Flow(flows.TCP, b"\x0a\x01\x00\x15", 1, b"\x0a\x02\x00\x3d", 2, "a_to_b")
    isn = (1 << 32) - 3000
    f.sent(0.0, 60, isn, flows.SYN, 0)
    for k in range(5):  # crosses 2^32 at the third segment
        f.sent(0.001 * k, 1500, (isn + 1 + k * 1448) % (1 << 32), flows.ACK, 1448)
    f.sent(0.01, 1500, (isn + 1 + 2 * 1448) % (1 << 32), flows.ACK, 1448)  # one real retransmission
    assert f.retrans_segs == 1 and f.high == 1 + 5 * 1448


def test_old_run_reports_unknowns_not_errors(old):
    p = old["variants"]["pdd"]
    assert p["kv_paths"]["wan"]["retrans_segs"] is None and p["kv_paths"]["wan"]["rtt_ms_p50"] is None
    assert p["kv_paths"]["wan"]["ok"] == 10 and p["wan_bytes"]["bytes_retrans"] is None
    assert old["warnings"] == [] and p["rld_occupancy"]["sessions"] == 0


def test_pairing_in_order_and_unfinished():
    ev = [
        {"t_ns": 1, "event": "kv_send_start", "request_id": "a", "path": "wan", "congestion": "bbr"},
        {"t_ns": 5, "event": "kv_send_end", "request_id": "a", "path": "wan", "kv_bytes": 10, "wire_bytes": 12},
        {"t_ns": 6, "event": "kv_send_start", "request_id": "a", "path": "wan"},
        {"t_ns": 9, "event": "kv_send_cancelled_end", "request_id": "a", "path": "wan", "wire_bytes": 3},
        {"t_ns": 10, "event": "kv_send_start", "request_id": "a", "path": "wan"},
        {"t_ns": 20, "event": "kv_send_failed", "request_id": "b", "path": "wan", "duration_ns": 4_000_000},
    ]
    ts = transfers.pair_transfers(ev)
    assert [(t.outcome, t.time_ms) for t in ts] == [
        ("ok", 4e-6),
        ("cancelled", 3e-6),
        ("failed", 4.0),
        ("unfinished", None),
    ]
    assert [t.wasted_bytes for t in ts] == [0, 3, 0, 0]


def test_fallback_cause_cuts_failure_text():
    assert (
        fallback_cause({"event": "completed_on_rld", "reason": "md_never_ready"}) == "completed_on_rld:md_never_ready"
    )
    long = {"event": "completed_on_rld", "reason": "KV ship failed: failed: deadline 20000 ms passed"}
    assert fallback_cause(long) == "completed_on_rld:KV ship failed"
    assert fallback_cause({"event": "kv_timeout", "reason": "x"}) == "kv_timeout"


def test_occupancy_closes_open_sessions_at_the_window_end():
    ev = [
        {"t_ns": 0, "event": "decode_open", "worker": "rld1", "request_id": "a"},
        {"t_ns": 5, "event": "decode_open", "worker": "md1", "request_id": "a"},
        {"t_ns": 50, "event": "decode_open", "worker": "rld1", "request_id": "b"},
    ]
    occ = occupancy.rld_occupancy(ev, VariantRecord(status="ok", t_ready_ns=0, t_end_ns=100))
    assert occ == {"sessions": 2, "mean": pytest.approx(1.5), "max": 2}


def test_the_plots_clock_and_link_change_markers(run):
    rm = runmeta.load(run, metadata.read(run))
    ((variant, change),) = rm.link_changes
    assert rm.axis_s(variant, change.t_ns) == pytest.approx(22.0)  # pd-cross starts at 20 s, change 1 s after T0
    assert rm.axis_s("pd-cross", fr.T0 + 3 * fr.MS) == pytest.approx(21.003)
    fig, ax = plots.plt.subplots()
    plots._decorate(ax, rm)
    assert [line.get_xdata()[0] for line in ax.get_lines()] == [pytest.approx(22.0)]
    plots.plt.close(fig)
    data = (run / "plots" / "tcp_wan.png").read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) > 20000


def test_asking_for_the_kernel_default_is_not_a_mismatch():
    from experiments.analysis.transfers import Transfer, congestion_warnings

    def ran(asked, used):
        return Transfer("r1", "fast", "ok", 0, 1, 1, congestion_requested=asked, congestion_used=used)

    assert congestion_warnings("pdd", [ran("default", ["bbr"]), ran("bbr", ["bbr"])], []) == []
    assert [w["kind"] for w in congestion_warnings("pdd", [ran("cubic", ["bbr"])], [])] == ["congestion_mismatch"]


def test_a_late_emulator_is_a_warning_and_a_quiet_one_is_not():
    from experiments.analysis.analyze import emulator_health

    quiet = {
        "a_to_b": {"frames": 100, "p50_us": 20, "p99_us": 60, "max_us": 90, "rx_drops": 0, "tx_errors": 0},
        "b_to_a": {"frames": 50, "p50_us": 20, "p99_us": 40, "max_us": 50, "rx_drops": 0, "tx_errors": 0},
        "cpu_share": 0.2,
        "late": False,
    }
    s = {}
    assert emulator_health("pdd", s, EmulatorHealth.model_validate(quiet)) == []
    with_defaults = {d: {**quiet[d], "tx_retries": 0} for d in ("a_to_b", "b_to_a")}
    assert s["emulator"] == {**quiet, **with_defaults, "scheduling": None}
    assert s["emulator_p99_late_ms"] == pytest.approx(0.06)
    late = {**quiet, "a_to_b": {**quiet["a_to_b"], "p99_us": 4000, "max_us": 9000, "rx_drops": 3}, "late": True}
    s = {}
    [w] = emulator_health("pdd", s, EmulatorHealth.model_validate(late))
    assert w["kind"] == "emulator_late" and "p99 lateness 4000.0 us" in w["message"] and w["count"] == 3
    assert s["emulator_p99_late_ms"] == pytest.approx(4.0)
    s = {}
    assert emulator_health("pdd", s, None) == [] and s["emulator_p99_late_ms"] is None  # the tc backend


def test_few_handoffs_are_explained_with_the_transfer_times():
    from experiments.analysis.summary_pdd import _why_few_handoffs

    p = {
        "md_token_share": 0.0,
        "requests": 42,
        "e2e_ms": {"p50": 2726.0},
        "fallbacks": {"completed_on_rld:md_never_ready": 41, "kv_send_retry": 3},
        "kv_paths": {"wan": {"time_ms": {"p50": 12700.0}, "ok": 1, "transfers": 32, "cancelled": 31, "unfinished": 0}},
    }
    [line] = _why_few_handoffs(p)
    assert "41 of 42 requests" in line and "p50 12,700 ms" in line and "E2E p50 of 2,726 ms" in line
    assert "1 of 32 WAN transfers completed, 31 were cancelled" in line
    assert _why_few_handoffs({**p, "md_token_share": 0.9}) == []
    [line] = _why_few_handoffs({**p, "inflight": {"requests": 37, "tokens_not_resent": 1, "prefix_lost": 0}})
    assert line.endswith(
        "; 37 of the MD's sessions could open only once an earlier turn's copy had landed (in-flight DRC)"
    )


def test_retransmissions_inside_and_outside_the_schedules_impairments():
    from experiments.analysis.impairment import impaired_intervals, retrans_rates

    s = 1_000_000_000
    changes = [
        LinkChange(t_ns=t * s, offset_s=t, direction=d, params={}, cause=cause)
        for t, d, cause in (
            (10, "a_to_b", "profile wan-flaky step 0"),
            (10, "b_to_a", "profile wan-flaky step 0"),
            (15, "a_to_b", "profile wan-flaky step 0 ends"),
            (40, "a_to_b", "profile wan-flaky step 2"),
        )
    ]
    iv = impaired_intervals(changes, window_end_ns=50 * s)
    assert iv == [(10 * s, 15 * s), (40 * s, 50 * s)]

    def sample(t, total):
        return {"request_id": "r", "attempt": 1, "conn": 0, "worker": "p1", "t_ns": t * s, "total_retrans": total}

    r = retrans_rates([sample(5, 0), sample(9, 1), sample(12, 31), sample(20, 31), sample(45, 61)], iv, (0, 50 * s))
    assert r["retrans_segs_impaired"] == 60 and r["retrans_segs_clear"] == 1 and r["impaired_s"] == 15
    assert r["retrans_per_s_impaired"] == 4.0 and r["retrans_per_s_clear"] == round(1 / 35, 2)
    assert retrans_rates([], iv, (0, 50 * s)) is None and impaired_intervals([], 50 * s) == []


def test_the_in_flight_drc_and_recomputed_relay_outputs_are_counted_per_request():
    from experiments.analysis.summary_pdd import _md_cache_lines
    from experiments.analysis.records import _md_cache

    rec = SimpleNamespace(inflight_tokens=0, relay_absorbed=False)
    _md_cache(
        [
            {"event": "drc_inflight", "cached_tokens": 0, "inflight_tokens": 512},
            {"event": "relay_absorbed", "tokens": 23},
            {"event": "kv_imported"},
        ],
        rec,
    )
    assert (rec.inflight_tokens, rec.relay_absorbed) == (512, True)
    p = {"inflight": {"requests": 30, "tokens_not_resent": 18000, "prefix_lost": 2}, "relay_absorbed": 35}
    inflight, absorbed = _md_cache_lines(p)
    assert "30 requests" in inflight and "18000 prompt tokens" in inflight and "2 lost" in inflight
    assert absorbed.endswith(": 35")
    assert _md_cache_lines({}) == []  # a summary made before the in-flight DRC existed


def test_with_several_lines_the_worst_line_is_the_figure_and_each_late_line_a_warning():
    from experiments.analysis.analyze import emulator_health
    from experiments.run.window import lines_health
    from topology.netem_model import Lateness

    def snapshot(late_us: int, drops: int) -> dict:
        """A forwarder's health() after 100 frames, each late_us late (its lateness histogram, its drops)."""
        lat = Lateness()
        for _ in range(100):
            lat.add(late_us * 1000)
        drop = {"rx_drops": drops, "tx_errors": 0, "tx_retries": 0}
        return {"lateness": {d: lat.to_dict() for d in ("a_to_b", "b_to_a")}, "drops": {d: drop for d in
                ("a_to_b", "b_to_a")}, "t_ns": 10**9, "cpu_s": 0.5, "scheduling": "other"}  # fmt: skip

    one = lines_health(None, {"wan": snapshot(60, 0)})
    assert "lines" not in one and "line" not in one  # one line: the record as before
    h = lines_health(None, {"fast": snapshot(60, 2), "cheap": snapshot(5400, 0), "tc": None})
    assert h["line"] == "cheap" and h["late"] and h["a_to_b"]["p99_us"] == 5410 and set(h["lines"]) == {"fast", "cheap"}
    s = {}
    warnings = emulator_health("pdd", s, EmulatorHealth.model_validate(h))
    assert [w["message"].split(" fell")[0] for w in warnings] == [
        "pdd: the userspace emulator (line fast)",  # dropped 4 frames, on time
        "pdd: the userspace emulator (line cheap)",  # late
    ]
    assert s["emulator_p99_late_ms"] == pytest.approx(5.41) and s["emulator"]["line"] == "cheap"


def test_the_lan_is_read_where_it_held_a_copy_back_and_a_slow_one_is_a_warning():
    from experiments.analysis.analyze import lan_health

    ms = 1_000_000

    def copy(rid, start_ms, end_ms, done_ms, kv=25_000_000):
        return [
            {"t_ns": start_ms * ms, "event": "kv_send_start", "request_id": rid, "path": "fast"},
            {"t_ns": done_ms * ms, "event": "prefill_done", "request_id": rid},
            {"t_ns": end_ms * ms, "event": "kv_send_end", "request_id": rid, "path": "fast", "kv_bytes": kv},
        ]

    ev = (
        copy("a", 0, 100, 50)  # ended 50 ms after its prefill: the LAN bound it, 25 MB in 100 ms = 2 Gbit/s
        + copy("b", 0, 200, 150)  # 1 Gbit/s
        + copy("c", 0, 40, 30)  # ended 10 ms after its prefill: the prefill bound it (5 Gbit/s, not read)
        + [{"t_ns": 0, "event": "kv_send_start", "request_id": "d", "path": "wan"}]
        + [{"t_ns": 9 * ms, "event": "kv_send_end", "request_id": "d", "path": "wan", "kv_bytes": 10}]
    )
    ts = transfers.pair_transfers(ev)
    assert sorted(transfers.lan_bound_rates(ts, ev)) == pytest.approx([1000.0, 2000.0])
    lb = transfers.lan_bound(ts, ev)
    assert lb["copies"] == 2 and lb["p50_mbit"] == pytest.approx(1500.0)
    assert (lb["p25_mbit"], lb["p75_mbit"]) == pytest.approx((1250.0, 1750.0))  # metrics.percentile's, interpolated
    s = {"kv_paths": {"fast": {"lan_bound": lb}}}
    [w] = lan_health("pdd", s, 10_000)  # 15% of a 10 Gbit/s LAN
    assert w["kind"] == "lan_slow" and "1,500 Mbit/s (median of 2), 15% of the LAN profile's 10,000" in w["message"]
    assert lan_health("pdd", s, 2_000) == []  # 75% of a 2 Gbit/s one: the LAN ran at its rate
    assert lan_health("pdd", s, 0) == [] and lan_health("pdd", {"kv_paths": None}, 10_000) == []  # unlimited; none
