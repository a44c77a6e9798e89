"""Cross traffic's results: iperf3's JSON read back, per flow run and variant, with Jain's fairness index.

Responsible for: reading one iperf3 client JSON (per-interval throughput, mean throughput, retransmits or
loss; `parse_result`), Jain's fairness index, and `summarize`, which turns a run directory's cross flows
(metadata.json's entries) into numbers.
Not responsible for: what a cross flow is or how it runs (experiments.spec.crosstraffic, experiments.run.window).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from experiments.rundir.metadata import RunMetadata


@dataclass(frozen=True)
class FlowResult:
    """What one iperf3 run measured.

    mean_mbit: mean throughput (Mbit/s): the receiver's where iperf3 reported it, else the sender's intervals
    retransmits: TCP retransmitted segments (None for udp); lost_pct: UDP datagrams lost (%, None for tcp)
    intervals: (start_s, end_s, mbit) per reporting interval, sender side; error: iperf3's error, if any
    stream_mbit: each stream's mean throughput (Mbit/s), receiver side where reported
    """

    mean_mbit: float | None
    retransmits: int | None
    lost_pct: float | None
    intervals: tuple[tuple[float, float, float], ...]
    error: str | None
    stream_mbit: tuple[float, ...] = ()


def intervals(doc: dict) -> tuple[tuple[float, float, float], ...]:
    """(start_s, end_s, Mbit/s) of every reporting interval (iperf3's `intervals[].sum`)."""
    out = []
    for iv in doc.get("intervals", []):
        s = iv.get("sum", {})
        if "start" in s and "end" in s:
            out.append((float(s["start"]), float(s["end"]), s.get("bits_per_second", 0.0) / 1e6))
    return tuple(out)


def _interval_mean_mbit(ivs: tuple[tuple[float, float, float], ...]) -> float | None:
    """The intervals' time-weighted mean Mbit/s; None without intervals (iperf3 reported none: not measured)."""
    span = sum(e - s for s, e, _ in ivs)
    return sum((e - s) * m for s, e, m in ivs) / span if span > 0 else None


def parse_result(doc: dict, kind: str) -> FlowResult:
    """One iperf3 client JSON (possibly cut short: then only its intervals count) as a FlowResult."""
    ivs, end = intervals(doc), doc.get("end", {})
    received = end.get("sum_received") or {}
    mean = received.get("bits_per_second", 0.0) / 1e6 if received.get("bytes") else _interval_mean_mbit(ivs)
    streams = tuple(_stream_mbit(s) for s in end.get("streams", []))
    if kind == "tcp":
        retrans = (end.get("sum_sent") or {}).get("retransmits")
        return FlowResult(mean, retrans, None, ivs, doc.get("error"), streams)
    lost = received.get("lost_percent", (end.get("sum") or {}).get("lost_percent"))
    return FlowResult(mean, None, lost, ivs, doc.get("error"), streams)


def _stream_mbit(stream: dict) -> float:
    side = (
        stream.get("udp")
        or (stream.get("receiver") if (stream.get("receiver") or {}).get("bytes") else stream.get("sender"))
        or {}
    )
    return side.get("bits_per_second", 0.0) / 1e6


def jain_index(shares: list[float]) -> float:
    """Jain's fairness index (sum x)^2 / (n sum x^2): 1.0 for equal shares, 1/n when one flow has it all;
    nan for no flows or all zero (nothing to share)."""
    if any(x < 0 for x in shares):
        raise ValueError(f"shares must be >= 0, got {shares}")
    total, squares = sum(shares), sum(x * x for x in shares)
    return total * total / (len(shares) * squares) if squares > 0 else math.nan


def summarize(run_dir: Path, meta: RunMetadata) -> dict:
    """Per variant and flow run: mean Mbit/s, retransmits (tcp) or lost % (udp), Jain's index of its streams,
    error; per direction with two or more runs, Jain's index of their mean throughputs. {} when the run had
    no cross traffic."""
    out: dict = {}
    for variant, window in meta.variants.items():
        if not window.cross_traffic:
            continue
        flows, by_direction = {}, {}
        for e in window.cross_traffic:
            r = _read_result(Path(run_dir) / e.iperf_json, e.kind)
            flows[f"{e.name}-{e.direction}"] = {
                "kind": e.kind,
                "direction": e.direction,
                "mean_mbit": r.mean_mbit if r else None,
                "retransmits": r.retransmits if r else None,
                "lost_pct": r.lost_pct if r else None,
                "streams_jain_index": _finite(jain_index(list(r.stream_mbit))) if r and r.stream_mbit else None,
                "error": (r.error if r else f"no iperf3 output at {e.iperf_json}"),
            }
            if r:
                if r.mean_mbit is not None:
                    by_direction.setdefault(e.direction, []).append(r.mean_mbit)
        out[variant] = {
            "flows": flows,
            "jain_index": {d: _finite(jain_index(x)) for d, x in by_direction.items() if len(x) >= 2},
        }
    return out


def _finite(x: float) -> float | None:
    return None if math.isnan(x) else x  # summary.json stays strict JSON


def _read_result(path: Path, kind: str) -> FlowResult | None:
    try:
        return parse_result(json.loads(path.read_text()), kind)
    except (OSError, json.JSONDecodeError):
        return None
