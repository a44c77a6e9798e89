"""Each WAN KV transfer is rate-limited (the scaled line is faithful), slow-start/RTT- or loss-limited (it is not),
sender-limited or unclear; summary.json counts them per variant and a scaled run where most were slow-start or
loss-limited is warned about. One at a time here (each has the whole line); sharing: test_limits_share.py."""

from pathlib import Path
from types import SimpleNamespace

import pytest

from experiments.analysis import limits
from experiments.rundir.metadata import LineScalingRecord, LinkRecord

MB = 1_000_000
LINE = 100.0  # Mbit/s


def transfer(rid, kv_bytes, seconds, rtt_ms, retrans_segs=0, path="wan", outcome="kv_send_end", t0=0):
    """A transfer's start, one TCP_INFO sample and end, as the sender logs them (times in ns)."""
    t1 = t0 + int(seconds * 1e9)
    base = {"request_id": rid, "path": path, "variant": "pdd", "worker": "p1"}
    return [
        {**base, "event": "kv_send_start", "t_ns": t0},
        {**base, "event": "kv_tcp_info", "t_ns": (t0 + t1) // 2, "rtt_us": int(rtt_ms * 1e3), "snd_mss": 1448},
        {**base, "event": outcome, "t_ns": t1, "kv_bytes": kv_bytes, "wire_bytes": kv_bytes + 4096,
         "retrans_segs": retrans_segs},
    ]  # fmt: skip


EVENTS = [
    # 10 MB in 0.9 s: 89 Mbit/s of a 100 Mbit/s line
    *transfer("rate", 10 * MB, 0.9, rtt_ms=60),
    # 10 MB in 4 s with 1% of its segments retransmitted at 60 ms: Mathis 2.4 Mbit/s
    *transfer("lossy", 10 * MB, 4.0, rtt_ms=60, retrans_segs=69, t0=10**9),
    # 100 kB in 0.2 s at 60 ms: 0.13 of the line's bandwidth-delay product (750 kB)
    *transfer("short", 100_000, 0.2, rtt_ms=60, t0=6 * 10**9),
    # 10 MB in 2 s, no loss, 1 ms RTT: nothing bounds it below the line, and no sample tells of its sender
    *transfer("slow-sender", 10 * MB, 2.0, rtt_ms=1, t0=7 * 10**9),
    # not judged: the fast path (inside cluster A) and a failed transfer
    *transfer("fast", 10 * MB, 0.1, rtt_ms=0.1, path="fast"),
    *transfer("failed", 10 * MB, 1.0, rtt_ms=60, outcome="kv_send_failed", t0=20 * 10**9),
]


def test_each_wan_transfer_gets_its_limit_and_reason():
    lim = limits.variant_limits(EVENTS, LINE, rtt_ms=60, loss_pct=0.0, kv_scale=1.0)
    by = {t["request_id"]: t for t in lim["transfers"]}
    assert set(by) == {"rate", "lossy", "short", "slow-sender"}
    assert {r: t["limit"] for r, t in by.items()} == {
        "rate": "rate",
        "lossy": "loss",
        "short": "slow_start",
        "slow-sender": "unclear",
    }
    assert by["rate"]["goodput_mbit"] == pytest.approx(88.9, abs=0.1)
    assert by["lossy"]["mathis_mbit"] == pytest.approx(2.35, abs=0.05) and "loss bound" in by["lossy"]["reason"]
    assert "slow-start/RTT-limited" in by["short"]["reason"] and by["short"]["mathis_mbit"] is None
    assert all(t["concurrency"] == 1.0 and t["share_mbit"] == LINE for t in by.values())
    assert (lim["rate"], lim["slow_start"], lim["loss"], lim["sender"], lim["unclear"]) == (1, 1, 1, 0, 1)


def test_the_mathis_bound():
    # MSS 1448 B, RTT 100 ms, 1% loss: 1448 x 8 x 1.22 / (0.1 x 0.1) = 1.41 Mbit/s
    assert limits.mathis_mbit(1448, 0.1, 0.01) == pytest.approx(1.413, abs=0.001)
    assert limits.mathis_mbit(1448, 0.1, 0.0) is None


def summary_and_meta(kv_scale):
    link = LinkRecord(rate_mbit=LINE, delay_ms=30.0, loss_pct=0.0)
    scaling = LineScalingRecord(
        kv_scale=kv_scale,
        published_rate_mbit={"a_to_b": LINE * kv_scale, "b_to_a": LINE * kv_scale},
        applied_rate_mbit={"a_to_b": LINE, "b_to_a": LINE},
    )
    meta = SimpleNamespace(
        topology=SimpleNamespace(wan_profile=SimpleNamespace(a_to_b=link)),
        line_scaling=scaling if kv_scale > 1 else None,
    )
    return {"variants": {"pdd": {}}, "warnings": []}, meta


def test_a_scaled_run_mostly_loss_limited_is_warned_about():
    summary, meta = summary_and_meta(kv_scale=100)
    limits.add_to(summary, [*EVENTS, *transfer("lossy-2", 10 * MB, 4.0, rtt_ms=60, retrans_segs=69, t0=10**10)], meta)
    lim = summary["variants"]["pdd"]["transfer_limits"]
    assert (lim["line_mbit"], lim["kv_scale"], lim["loss"], lim["slow_start"]) == (LINE, 100, 2, 1)
    [warning] = summary["warnings"]
    assert warning["kind"] == "scaled_line_loss_limited" and warning["message"].startswith(
        "pdd: 3 of 5 WAN KV transfers were loss- or slow-start/RTT-limited (2 loss, 1 slow start) on a line "
        "scaled by kv_scale=100: the scaled line does not represent the published one for these transfers"
    )
    md = "\n".join(limits.markdown_section(summary["variants"]))
    assert "| pdd | 100.0 (100) | 1 | 1 | 2 | 0 | 1 |" in md


def test_no_warning_at_scale_one_or_without_a_majority():
    summary, meta = summary_and_meta(kv_scale=1)
    limits.add_to(summary, EVENTS, meta)
    lim = summary["variants"]["pdd"]["transfer_limits"]
    assert summary["warnings"] == [] and lim["loss"] + lim["slow_start"] == 2
    summary, meta = summary_and_meta(kv_scale=100)
    limits.add_to(summary, EVENTS, meta)  # 2 of 4: no majority
    assert summary["warnings"] == []


def test_a_variant_without_wan_transfers_has_no_row():
    none = limits.variant_limits([], LINE, rtt_ms=60, loss_pct=0.0, kv_scale=4.0)
    assert [none[k] for k in limits.LIMITS] == [0] * 5 and none["transfers"] == []
    assert limits.markdown_section({"colocated": {"transfer_limits": none}}) == []


def test_a_rate_trace_line_is_judged_at_the_trace_mean_rate(tmp_path):
    # A run on a rate trace records rate_mbit 0 and the trace's path: the shares are of the trace's mean rate
    # (one 1500-byte opportunity per ms over a 10 ms period: 12 Mbit/s), found by name where the recorded path
    # (another checkout's) is gone; a trace nowhere to be read leaves the run without transfer_limits.
    def run_on(path):
        link = LinkRecord(rate_mbit=0.0, delay_ms=30.0, loss_pct=0.0, rate_trace=str(path))
        meta = SimpleNamespace(topology=SimpleNamespace(wan_profile=SimpleNamespace(a_to_b=link)), line_scaling=None)
        summary = {"variants": {"pdd": {}}, "warnings": []}
        limits.add_to(summary, EVENTS, meta)
        return summary["variants"]["pdd"].get("transfer_limits")

    trace = tmp_path / "every-ms.trace"
    trace.write_text("".join(f"{t}\n" for t in range(1, 11)))
    lim = run_on(trace)
    assert lim["line_mbit"] == pytest.approx(12.0) and lim["transfers"][0]["share_mbit"] == pytest.approx(12.0)
    shipped = run_on(Path("/elsewhere/netem_profiles/traces/cellular-steps.trace"))
    assert shipped["line_mbit"] == pytest.approx(27.8844, abs=1e-3)
    assert run_on(tmp_path / "gone.trace") is None
