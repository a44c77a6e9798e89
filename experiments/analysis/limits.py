"""Which limit each WAN KV transfer ran into: the line's rate, or TCP's loss and RTT (pure functions over events).

Responsible for: classifying every completed WAN KV transfer (paths wan and handoff) as

    rate      it reached >= RATE_SHARE of the line's rate: the line bound it, and a line scaled down by
              compute.kv_scale s (rate / s, KV bytes / s) gives the published line's transfer time;
    loss_rtt  it did not, and TCP's own bound lies below the line: the Mathis bound for its loss and RTT
              (MSS x C / (RTT x sqrt(p)), C = 1.22), or slow start (a transfer shorter than its slow-start
              rounds of RTT). Neither bound scales with the line: under s > 1 such a transfer's time is
              not the published line's (the scaled run makes it look faster than it would be);
    unclear   neither (e.g. the sender was the bottleneck);

its goodput (delivered KV bytes over the transfer's time), RTT (its TCP_INFO samples' median, else the
profile's 2 x delay) and loss (its retransmitted segments / segments sent, else the profile's loss); the
per-variant counts for summary.json (`transfer_limits`) and a warning where s > 1 and most WAN KV transfers
were loss/RTT-limited; summary.md's section.
Not responsible for: pairing the events (experiments.analysis.transfers) or the line's schedule: a transfer is
judged against the base rate of the applied A->B line (metadata.json's topology.wan_profile).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass
from statistics import median

from experiments.analysis.formats import num as _f
from experiments.analysis.transfers import WAN_PATHS, Transfer, complete_from_samples, pair_transfers, tcp_samples

MATHIS_C = 1.22  # sqrt(3/2): periodic loss, delayed ACKs off (Mathis et al. 1997)
RATE_SHARE = 0.7  # a transfer at >= 70% of the line rate is taken as rate-limited
DEFAULT_MSS = 1448  # bytes: Ethernet MTU less IP and TCP headers with timestamps
INIT_CWND_SEGS = 10  # Linux's initial window (RFC 6928)
LIMITS = ("rate", "loss_rtt", "unclear")


@dataclass(frozen=True)
class TransferLimit:
    """One WAN KV transfer's limit (see the module docstring); Mbit/s are 1e6 bit/s."""

    request_id: str
    path: str
    kv_bytes: int
    time_ms: float
    goodput_mbit: float
    line_mbit: float
    rtt_ms: float
    loss_pct: float
    mathis_mbit: float | None  # None: no loss seen (no loss bound)
    limit: str  # rate | loss_rtt | unclear
    reason: str


def mathis_mbit(mss_bytes: float, rtt_s: float, loss_p: float) -> float | None:
    """TCP's loss-bound throughput, MSS x C / (RTT x sqrt(p)) in Mbit/s; None where p or RTT is 0."""
    if loss_p <= 0 or rtt_s <= 0:
        return None
    return mss_bytes * 8 * MATHIS_C / (rtt_s * math.sqrt(loss_p)) / 1e6


def slow_start_s(n_bytes: int, mss_bytes: float, rtt_s: float) -> float:
    """The RTT rounds slow start needs to send n_bytes from the initial window, in seconds."""
    return math.ceil(math.log2(n_bytes / (INIT_CWND_SEGS * mss_bytes) + 1)) * rtt_s


def classify(goodput_mbit: float, line_mbit: float, mathis: float | None, slow_s: float, line_s: float):
    """(limit, reason) of a transfer: its goodput against the line, the Mathis bound and slow start."""
    if goodput_mbit >= RATE_SHARE * line_mbit:
        return "rate", f"reached {goodput_mbit / line_mbit:.0%} of the line"
    if mathis is not None and mathis < line_mbit:
        return "loss_rtt", f"loss bound {mathis:.3g} Mbit/s below the line"
    if slow_s > line_s:
        return (
            "loss_rtt",
            f"slow start's RTT rounds ({slow_s * 1e3:.0f} ms) outlast the line's time ({line_s * 1e3:.0f} ms)",
        )
    return "unclear", "below the line, with no loss or RTT bound below it"


def transfer_limit(t: Transfer, samples: list[dict], line_mbit: float, rtt_ms: float, loss_pct: float):
    """t's TransferLimit (samples: its own kv_tcp_info; rtt_ms, loss_pct: the profile's, where t has none);
    None unless t completed with KV and a time."""
    if t.outcome != "ok" or not t.kv_bytes or not t.time_ms:
        return None
    rtts = [s["rtt_us"] / 1e3 for s in samples if s.get("rtt_us")]
    mss = median([s["snd_mss"] for s in samples if s.get("snd_mss")] or [DEFAULT_MSS])
    rtt = median(rtts) if rtts else rtt_ms
    segs = t.wire_bytes / mss if t.wire_bytes else t.kv_bytes / mss
    loss = 100 * t.retrans_segs / segs if t.retrans_segs is not None and segs else loss_pct
    goodput = t.kv_bytes * 8 / (t.time_ms / 1e3) / 1e6
    mathis = mathis_mbit(mss, rtt / 1e3, loss / 100)
    line_s = t.kv_bytes * 8 / (line_mbit * 1e6)
    limit, reason = classify(goodput, line_mbit, mathis, slow_start_s(t.kv_bytes, mss, rtt / 1e3), line_s)
    return TransferLimit(
        t.request_id, t.path, t.kv_bytes, t.time_ms, goodput, line_mbit, rtt, loss, mathis, limit, reason
    )


def variant_limits(events: list[dict], line_mbit: float, rtt_ms: float, loss_pct: float, kv_scale: float) -> dict:
    """One variant's `transfer_limits`: {line_mbit, kv_scale, rate, loss_rtt, unclear, transfers: [...]}."""
    transfers, samples = pair_transfers(events), tcp_samples(events)
    complete_from_samples(transfers, samples)
    judged = []
    for t in transfers:
        if t.path in WAN_PATHS:
            mine = [s for s in samples if (s.get("request_id"), s.get("path")) == (t.request_id, t.path) and _in(t, s)]
            judged.append(transfer_limit(t, mine, line_mbit, rtt_ms, loss_pct))
    judged = [j for j in judged if j is not None]
    counts = Counter(j.limit for j in judged)
    return {
        "line_mbit": line_mbit,
        "kv_scale": kv_scale,
        **{k: counts[k] for k in LIMITS},
        "transfers": [asdict(j) for j in judged],
    }


def _in(t: Transfer, s: dict) -> bool:
    lo = t.t_start_ns if t.t_start_ns is not None else -1
    return lo <= s["t_ns"] <= (t.t_end_ns if t.t_end_ns is not None else float("inf"))


def scaling_warning(variant: str, lim: dict) -> dict | None:
    """The warning where s > 1 and most of the variant's WAN KV transfers were loss/RTT-limited."""
    judged = sum(lim[k] for k in LIMITS)
    if lim["kv_scale"] <= 1 or not judged or 2 * lim["loss_rtt"] <= judged:
        return None
    return {
        "variant": variant,
        "kind": "scaled_line_loss_limited",
        "count": lim["loss_rtt"],
        "message": f"{variant}: {lim['loss_rtt']} of {judged} WAN KV transfers were loss/RTT-limited on a line "
        f"scaled by kv_scale={lim['kv_scale']:g}: the scaled line does not represent the published one for "
        "these transfers (TCP's loss-bound throughput does not scale with the line)",
    }


def add_to(summary: dict, events: list[dict], meta) -> None:
    """Into summary, in place: each variant's transfer_limits and the warnings (meta: the run's RunMetadata;
    nothing where the line was unlimited or never up)."""
    wan = meta.topology.wan_profile.a_to_b if meta.topology else None
    if wan is None or not wan.rate_mbit:
        return
    extra = wan.model_extra or {}
    rtt_ms, loss_pct = 2 * float(extra.get("delay_ms") or 0), float(extra.get("loss_pct") or 0)
    s = meta.line_scaling.kv_scale if getattr(meta, "line_scaling", None) else 1.0
    for v, per in summary["variants"].items():
        lim = per["transfer_limits"] = variant_limits(
            [e for e in events if e.get("variant") == v], wan.rate_mbit, rtt_ms, loss_pct, s
        )
        if (w := scaling_warning(v, lim)) is not None:
            summary.setdefault("warnings", []).append(w)


def markdown_section(per: dict) -> list[str]:
    """summary.md's 'WAN KV transfers: what limited them' (per: variant -> its summary as a mapping)."""
    rows = [(v, lim) for v, s in per.items() if (lim := s.get("transfer_limits")) and sum(lim[k] for k in LIMITS)]
    if not rows:
        return []
    lines = [
        "",
        "## WAN KV transfers: what limited them",
        "",
        "| variant | line Mbit/s (kv_scale) | rate-limited | loss/RTT-limited | unclear |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {v} | {_f(lim['line_mbit'], 1)} ({lim['kv_scale']:g}) | {lim['rate']} | {lim['loss_rtt']} | "
        f"{lim['unclear']} |"
        for v, lim in rows
    ]
    return lines + [
        "",
        f"rate-limited: at >= {RATE_SHARE:.0%} of the applied line (a line scaled by kv_scale is faithful for "
        "these); loss/RTT-limited: the Mathis bound MSS x 1.22 / (RTT x sqrt(loss)) or slow start below the "
        "line (not scaled with it: under kv_scale > 1 their times are not the published line's). Per transfer: "
        "summary.json's transfer_limits.",
    ]
