"""What the decode workers took on: their open decode sessions over time, per variant (pure functions over events).

Responsible for: the step function "decode sessions open" on a set of decode
workers (the RLDs, or one worker) from their decode_arrival / decode_open /
decode_close events, with the KV slots those sessions reserve; time-weighted
means and maxima over the variant's window, and the series for a plot.
Not responsible for: the RLD's token share (experiments.analysis.metrics), the fallback
causes (experiments.analysis.records.fallback_cause) or the other per-worker figures
(experiments.analysis.per_worker).

A session is one worker's copy of one request (one decode_open ..
decode_close); a session still open when the events end is closed at the
window's end. Its reserved tokens are its prompt + max_tokens (its
decode_arrival): the KV slots it may fill, as the router accounts a worker's
load (workers.roles.pools) - not the blocks it holds at an instant, which no
event records (a prefix shared in the worker's cache is counted per session).
The window is the variant's [t_ready_ns, t_end_ns] from metadata.json where
present, else first to last step.
"""

from __future__ import annotations

from collections.abc import Callable

from experiments.rundir.metadata import VariantRecord

RLD_PREFIX = "rld"  # worker names rld1, rld2, ... (topology.naming)


def is_rld(worker: str) -> bool:
    return worker.startswith(RLD_PREFIX)


def session_steps(events: list[dict], keep: Callable[[str], bool] = is_rld) -> list[tuple[int, int, int]]:
    """[(t_ns, +1 | -1, +- reserved tokens)] of the decode sessions opening and closing on the workers `keep`
    accepts, in time order (the router's session_open, which names a decode worker, is not one)."""
    steps, asked, open_ = [], {}, {}
    for e in events:
        worker = str(e.get("worker", ""))
        if e.get("role") == "router" or not keep(worker):
            continue
        key = (worker, e.get("request_id"))
        if e["event"] == "decode_arrival":
            asked[key] = (e.get("prompt_tokens") or 0) + (e.get("max_tokens") or 0)
        elif e["event"] == "decode_open" and key not in open_:
            open_[key] = asked.get(key, 0)
            steps.append((e["t_ns"], 1, open_[key]))
        elif e["event"] == "decode_close" and key in open_:
            steps.append((e["t_ns"], -1, -open_.pop(key)))
    return sorted(steps)


def rld_steps(events: list[dict]) -> list[tuple[int, int]]:
    """[(t_ns, +1 | -1)] of the RLD workers' decode sessions opening and closing, in time order."""
    return [(t, d) for t, d, _ in session_steps(events)]


def series(steps: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """[(t_ns, sessions open from then on)] (or, of (t_ns, +-tokens) steps, the tokens held from then on)."""
    out, n = [], 0
    for t, d in steps:
        n += d
        out.append((t, n))
    return out


def time_mean_max(pts: list[tuple[int, int]], window: VariantRecord | None = None) -> tuple[float, int]:
    """The time-weighted mean of a series over the window (see the module docstring), and its maximum; (0, 0)
    for an empty series."""
    if not pts:
        return 0.0, 0
    t0 = _first(window and window.t_ready_ns, window and window.t_start_ns, pts[0][0])
    t1 = _first(window and window.t_end_ns, pts[-1][0])
    area, prev_t, prev_n = 0, t0, 0
    for t, n in pts:
        t = min(max(t, t0), t1)
        area += prev_n * (t - prev_t)
        prev_t, prev_n = t, n
    area += prev_n * max(0, t1 - prev_t)
    return (area / (t1 - t0) if t1 > t0 else 0.0), max(n for _, n in pts)


def rld_occupancy(events: list[dict], window: VariantRecord | None = None) -> dict:
    """{"sessions", "mean", "max"}: RLD decode sessions opened, and how many were open at once (time-weighted
    mean over the window, max); zeros where the RLD opened none."""
    steps = rld_steps(events)
    mean, most = time_mean_max(series(steps), window)
    return {"sessions": sum(1 for _, d in steps if d > 0), "mean": mean, "max": most}


def worker_occupancy(events: list[dict], worker: str, window: VariantRecord | None = None) -> dict:
    """One decode worker: {"sessions_mean", "sessions_max", "reserved_tokens_mean", "reserved_tokens_max"} over
    the window (zeros where it opened none)."""
    steps = session_steps(events, lambda w: w == worker)
    sessions = time_mean_max(series([(t, d) for t, d, _ in steps]), window)
    tokens = time_mean_max(series([(t, n) for t, _, n in steps]), window)
    return {
        "sessions_mean": sessions[0],
        "sessions_max": sessions[1],
        "reserved_tokens_mean": tokens[0],
        "reserved_tokens_max": tokens[1],
    }


def _first(*t_ns: int | None) -> int:
    """The first time recorded (a window's bound where its record has it, else the events')."""
    return next(t for t in t_ns if t is not None)
