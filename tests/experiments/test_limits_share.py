"""A WAN KV transfer is judged against its share of the line (the line over the WAN transfers in flight beside
it), by the reason that bound it: rate, slow start, loss, the sender, or unclear."""

import pytest

from experiments.analysis import limits

MB = 1_000_000
LINE = 200.0  # Mbit/s


def transfer(rid, kv_bytes, t0_s, seconds, rtt_ms=20.0, retrans_segs=0, app_limited=False):
    """A transfer's start, two TCP_INFO samples and end, as the sender logs them (times in ns)."""
    t0, t1 = int(t0_s * 1e9), int((t0_s + seconds) * 1e9)
    base = {"request_id": rid, "path": "wan", "variant": "pdd", "worker": "p1"}
    info = {**base, "event": "kv_tcp_info", "rtt_us": int(rtt_ms * 1e3), "snd_mss": 1448, "snd_cwnd": 400,
            "unacked": 40 if app_limited else 400, "notsent_bytes": 0 if app_limited else 10**6,
            "app_limited": app_limited, "phase": "sample"}  # fmt: skip
    return [
        {**base, "event": "kv_send_start", "t_ns": t0},
        {**info, "t_ns": t0 + (t1 - t0) // 3},
        {**info, "t_ns": t0 + 2 * (t1 - t0) // 3},
        {**base, "event": "kv_send_end", "t_ns": t1, "kv_bytes": kv_bytes, "wire_bytes": kv_bytes + 4096,
         "retrans_segs": retrans_segs},
    ]  # fmt: skip


def judged(events, loss_pct=0.0):
    lim = limits.variant_limits(events, LINE, rtt_ms=20, loss_pct=loss_pct, kv_scale=50.0)
    return lim, {t["request_id"]: t for t in lim["transfers"]}


def test_two_overlapping_transfers_each_at_half_the_line_are_rate_limited():
    # 20 MB in 1.7 s each, side by side: 94 Mbit/s each, 47% of the line, 94% of the half each could have
    lim, by = judged([*transfer("a", 20 * MB, 0.0, 1.7), *transfer("b", 20 * MB, 0.0, 1.7)])
    assert {r: t["limit"] for r, t in by.items()} == {"a": "rate", "b": "rate"}
    assert by["a"]["concurrency"] == pytest.approx(2.0) and by["a"]["share_mbit"] == pytest.approx(100.0)
    assert "of its share" in by["a"]["reason"]
    assert (lim["rate"], lim["loss"], lim["slow_start"], lim["sender"], lim["unclear"]) == (2, 0, 0, 0, 0)


def test_concurrency_is_time_weighted_over_the_transfers_lifetime():
    # b overlaps a's second half only: a's mean concurrency 1.5, b's (0.5 s of its 1 s) 1.5 too
    _, by = judged([*transfer("a", 10 * MB, 0.0, 1.0), *transfer("b", 10 * MB, 0.5, 1.0)])
    assert by["a"]["concurrency"] == pytest.approx(1.5) and by["b"]["concurrency"] == pytest.approx(1.5)
    assert by["a"]["share_mbit"] == pytest.approx(LINE / 1.5)


def test_a_lossy_lines_transfer_far_below_its_share_is_loss_limited():
    # 1% loss at 20 ms: Mathis 7.1 Mbit/s; 10 MB in 10 s is 8 Mbit/s alone on a 200 Mbit/s line
    _, by = judged(transfer("lossy", 10 * MB, 0.0, 10.0, retrans_segs=69), loss_pct=1.0)
    t = by["lossy"]
    assert t["limit"] == "loss" and t["mathis_mbit"] == pytest.approx(7.1, abs=0.1)
    assert "loss bound" in t["reason"]


def test_mathis_is_not_applied_on_a_lossless_line_without_retransmissions():
    # the same slow transfer on a lossless line, no retransmissions, the sender often idle: not loss
    _, by = judged(transfer("idle", 10 * MB, 0.0, 10.0, app_limited=True))
    assert by["idle"]["mathis_mbit"] is None and by["idle"]["limit"] == "sender"
    _, by = judged(transfer("busy", 10 * MB, 0.0, 10.0))
    assert by["busy"]["limit"] == "unclear"


def test_a_tiny_transfer_is_slow_start_limited():
    # 100 kB in 80 ms: below one BDP (200 Mbit/s x 20 ms = 500 kB), 10 Mbit/s
    lim, by = judged(transfer("tiny", 100_000, 0.0, 0.08))
    assert by["tiny"]["limit"] == "slow_start" and "slow-start/RTT-limited" in by["tiny"]["reason"]
    assert lim["slow_start"] == 1


def test_the_summary_and_warning_give_the_counts_per_reason():
    events = [
        *transfer("tiny", 100_000, 0.0, 0.08),
        *transfer("tiny-2", 100_000, 1.0, 0.08),
        *transfer("rate", 20 * MB, 2.0, 1.0),
    ]
    lim, _ = judged(events)
    w = limits.scaling_warning("pdd", lim)
    assert w is not None and w["count"] == 2
    assert w["message"].startswith("pdd: 2 of 3 WAN KV transfers were loss- or slow-start/RTT-limited (0 loss, 2 slow")
    md = "\n".join(limits.markdown_section({"pdd": {"transfer_limits": lim}}))
    assert "| pdd | 200.0 (50) | 1 | 2 | 0 | 0 | 0 |" in md and "slow-start/RTT-limited" in md


def test_a_small_transfer_that_outlasted_slow_start_is_not_slow_start_limited():
    # 600 kB (1.2 BDPs) in 4.7 s, 235 RTTs against slow start's 6 rounds, the sender idle: it held the pace
    _, by = judged(transfer("trickle", 600_000, 0.0, 4.7, app_limited=True))
    assert by["trickle"]["limit"] == "sender"
