"""What the schedule's impairments did to TCP: WAN retransmissions inside vs outside them, per variant.

Responsible for: the impaired intervals of a variant's window (from its link
changes in metadata.json: a schedule step's change to its revert, on the A->B
direction the KV crosses) and the retransmitted segments per second of the
WAN KV connections inside and outside them, from their TCP_INFO samples (the
rise of each connection's total_retrans between consecutive samples, counted
at the later sample). Pure functions over events and metadata.
Not responsible for: playing the schedule (experiments.run.window) or the per-path
totals (experiments.analysis.transfers).
"""

from __future__ import annotations

from collections import defaultdict

from experiments.rundir.metadata import LinkChange, VariantRecord

DIRECTION = "a_to_b"  # the KV's way across the WAN


def impaired_intervals(changes: list[LinkChange], window_end_ns: int | None) -> list[tuple[int, int]]:
    """[start_ns, end_ns) of each stretch during which a schedule step had changed the A->B link."""
    out, start = [], None
    for c in sorted((c for c in changes if c.direction == DIRECTION), key=lambda c: c.t_ns):
        ends = c.cause.endswith(" ends") or c.cause.startswith("restore")
        if not ends and start is None:
            start = c.t_ns
        elif ends and start is not None:
            out.append((start, c.t_ns))
            start = None
    if start is not None and window_end_ns:
        out.append((start, window_end_ns))
    return out


def retrans_rates(samples: list[dict], intervals: list[tuple[int, int]], window: tuple[int, int]) -> dict | None:
    """Retransmitted segments per second inside and outside the intervals (over window), or None when the
    variant had no schedule or no WAN samples."""
    if not intervals or not samples:
        return None
    by_conn: dict[tuple, list[dict]] = defaultdict(list)
    for s in samples:
        by_conn[(s.get("request_id"), s.get("attempt"), s.get("conn"), s.get("worker"))].append(s)
    inside = outside = 0
    for conn in by_conn.values():
        conn.sort(key=lambda s: s["t_ns"])
        for a, b in zip(conn, conn[1:]):
            rise = max(0, (b.get("total_retrans") or 0) - (a.get("total_retrans") or 0))
            if any(lo <= b["t_ns"] < hi for lo, hi in intervals):
                inside += rise
            else:
                outside += rise
    impaired_s = sum(min(hi, window[1]) - max(lo, window[0]) for lo, hi in intervals) / 1e9
    clear_s = (window[1] - window[0]) / 1e9 - impaired_s
    return {
        "impaired_s": round(impaired_s, 3),
        "retrans_segs_impaired": inside,
        "retrans_segs_clear": outside,
        "retrans_per_s_impaired": round(inside / impaired_s, 2) if impaired_s > 0 else None,
        "retrans_per_s_clear": round(outside / clear_s, 2) if clear_s > 0 else None,
    }


def variant_retrans(events: list[dict], window: VariantRecord) -> dict | None:
    """The WAN KV connections' retransmissions inside vs outside the variant's schedule impairments (None
    where its window never opened)."""
    start, end = window.window_start_ns, window.window_end_ns
    if start is None or end is None:
        return None
    samples = [e for e in events if e["event"] == "kv_tcp_info" and e.get("path") == "wan" and start <= e["t_ns"] < end]
    return retrans_rates(samples, impaired_intervals(window.link_changes, end), (start, end))
