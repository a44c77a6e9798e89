"""What the RLD took on: its open decode sessions over time, per variant (pure functions over events).

Responsible for: the step function "decode sessions open on the RLD workers"
from their decode_open / decode_close events, its time-weighted mean and its
maximum over the variant's window, and the series for a plot.
Not responsible for: the RLD's token share (experiments.metrics) or the
fallback causes (experiments.records.fallback_cause).

A session is the RLD's copy of one request (one decode_open .. decode_close);
a session still open when the events end is closed at the window's end. The
window is the variant's [t_ready_ns, t_end_ns] from metadata.json where
present, else first to last RLD event.
"""

from __future__ import annotations

RLD_PREFIX = "rld"  # worker names rld1, rld2, ... (topology.naming)


def rld_steps(events: list[dict]) -> list[tuple[int, int]]:
    """[(t_ns, +1 | -1)] of the RLD workers' decode sessions opening and closing, in time order."""
    steps, open_ = [], set()
    for e in events:
        if not str(e.get("worker", "")).startswith(RLD_PREFIX):
            continue
        key = (e.get("worker"), e.get("request_id"))
        if e["event"] == "decode_open" and key not in open_:
            open_.add(key)
            steps.append((e["t_ns"], 1))
        elif e["event"] == "decode_close" and key in open_:
            open_.discard(key)
            steps.append((e["t_ns"], -1))
    return sorted(steps)


def series(steps: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """[(t_ns, sessions open from then on)]."""
    out, n = [], 0
    for t, d in steps:
        n += d
        out.append((t, n))
    return out


def rld_occupancy(events: list[dict], window: dict | None = None) -> dict:
    """{"sessions", "mean", "max"}: RLD decode sessions opened, and how many were open at once (time-weighted
    mean over the window, max); zeros where the RLD opened none."""
    steps = rld_steps(events)
    pts = series(steps)
    if not pts:
        return {"sessions": 0, "mean": 0.0, "max": 0}
    window = window or {}
    t0 = window.get("t_ready_ns") or window.get("t_start_ns") or pts[0][0]
    t1 = window.get("t_end_ns") or pts[-1][0]
    area, prev_t, prev_n = 0, t0, 0
    for t, n in pts:
        t = min(max(t, t0), t1)
        area += prev_n * (t - prev_t)
        prev_t, prev_n = t, n
    area += prev_n * max(0, t1 - prev_t)
    return {
        "sessions": sum(1 for _, d in steps if d > 0),
        "mean": area / (t1 - t0) if t1 > t0 else 0.0,
        "max": max(n for _, n in pts),
    }
