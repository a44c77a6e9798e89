"""Why PDD keeps only P->MD and P->RLD->MD: the hit rates, the RLD's load and TTFT over a run, per variant.

Responsible for: per time bin of a variant's window (by request arrival), the prefix hit P found (its
prefix cache), the hit the MD's DRC offered (what the router routed on), the share of requests that
finished on the RLD, the RLD's open sessions, and TTFT; and the verdict of `pddlab run pdd-ablation`: does
the ablation's MD hit rate fall behind P's while its RLD saturates (PDD.md, point 6), compared with pdd.
Not responsible for: reading the run directory (experiments.analysis.analyze passes records and events in) or the
plot (experiments.analysis.plots).

The mechanism: with `ablation_local_rld`, a low-hit request finishes on the RLD; the MD never sees that
turn, so the session's next turn has a low MD hit too and goes to the RLD again, while P, which prefills
every turn, keeps a high hit. The MD's hit falls behind P's, the RLD takes more and more sessions.
"""

from __future__ import annotations

import math

from experiments.analysis.metrics import percentile
from experiments.analysis.occupancy import rld_steps, series

BIN_S = 20.0  # seconds per bin: a few requests each at the experiment's rates
BEHIND_PP = 10.0  # the MD's hit "falls behind" P's when the last third's mean gap exceeds this (points)
SATURATED_X = 2.0  # the RLD "saturates" when its mean open sessions in the last third exceed pdd's by this factor
ON_RLD = ("p-rld-ablation", "p-rld-singular", "p-rld-fallback")  # routes that finish on the RLD


def over_time(records: list, events: list[dict], variant: str, t0_ns: int, bin_s: float = BIN_S) -> list[dict]:
    """Bins of the variant's window by request send time: {t_s, requests, p_hit, md_hit, on_rld, rld_sessions,
    ttft_p50_ms}; hits in % of the prompt (None where the bin has no such request)."""
    recs = [r for r in records if r.variant == variant and r.issued and r.kind != "warmup"]
    evs = [e for e in events if e.get("variant") == variant]
    p_hit = _p_hits(evs)
    occupancy = series(rld_steps(evs))
    bins: dict[int, list] = {}
    for r in recs:
        bins.setdefault(int((r.t_send_ns - t0_ns) / 1e9 // bin_s), []).append(r)
    out = []
    for b in range(max(bins, default=-1) + 1):
        rs = bins.get(b, [])
        lo, hi = t0_ns + int(b * bin_s * 1e9), t0_ns + int((b + 1) * bin_s * 1e9)
        ph = [p_hit[k] for r in rs if (k := f"{variant}.{r.request_id}") in p_hit]  # the roles' id: <variant>.<id>
        mh = [100 * r.md_cached_tokens / r.prompt_tokens for r in rs if r.route and r.prompt_tokens]
        ttft = [r.ttft_ms for r in rs if r.ok and r.ttft_ms is not None]
        out.append(
            {
                "t_s": b * bin_s,
                "requests": len(rs),
                "p_hit": _mean(ph),
                "md_hit": _mean(mh),
                "on_rld": _mean([100.0 * (r.route in ON_RLD) for r in rs if r.route]),
                "rld_sessions": _time_mean(occupancy, lo, hi),
                "ttft_p50_ms": percentile(ttft, 50) if ttft else None,
            }
        )
    return out


def _p_hits(events: list[dict]) -> dict[str, float]:
    """request -> the share of its prompt P's prefix cache held (%), from P's prefill_done."""
    out = {}
    for e in events:
        if e["event"] == "prefill_done" and e.get("role") == "p":
            total = (e.get("cached_tokens") or 0) + (e.get("computed_tokens") or 0)
            if total:
                out[e["request_id"]] = 100.0 * e["cached_tokens"] / total
    return out


def _time_mean(points: list[tuple[int, int]], lo: int, hi: int) -> float:
    """Time-weighted mean of a step function [(t_ns, value from then on)] over [lo, hi)."""
    area, value, t = 0.0, 0, lo
    for at, v in points:
        if at >= hi:
            break
        if at > lo:
            area += value * (at - t)
            t = at
        value = v
    area += value * (hi - t)
    return area / (hi - lo)


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def last_third(bins: list[dict], key: str) -> float | None:
    """The mean of key over the last third of the bins that have it (the load's highest step)."""
    xs = [b[key] for b in bins if b[key] is not None]
    tail = xs[len(xs) - max(1, math.ceil(len(xs) / 3)) :] if xs else []
    return _mean(tail)


def verdict(pdd: list[dict], ablation: list[dict]) -> dict:
    """The figures of the claim and whether each part holds, whichever way it comes out: in the last third of
    the run, the ablation's MD hit behind P's by more than BEHIND_PP points (and by more than pdd's), its RLD
    holding more than SATURATED_X times pdd's sessions."""
    gap = {name: _gap(bins) for name, bins in (("pdd", pdd), ("ablation", ablation))}
    rld = {name: last_third(bins, "rld_sessions") for name, bins in (("pdd", pdd), ("ablation", ablation))}
    ttft = {name: last_third(bins, "ttft_p50_ms") for name, bins in (("pdd", pdd), ("ablation", ablation))}
    behind = gap["ablation"] is not None and gap["ablation"] > BEHIND_PP and gap["ablation"] > (gap["pdd"] or 0)
    saturates = rld["ablation"] is not None and rld["ablation"] > SATURATED_X * max(rld["pdd"] or 0, 0.1)
    return {
        "md_hit_gap_pp": gap,
        "rld_sessions": rld,
        "ttft_p50_ms": ttft,
        "md_hit_falls_behind": behind,
        "rld_saturates": saturates,
        "claim_holds": behind and saturates,
    }


def _gap(bins: list[dict]) -> float | None:
    p, md = last_third(bins, "p_hit"), last_third(bins, "md_hit")
    return None if p is None or md is None else p - md


def ablation_variants(spec) -> list[str]:
    """The spec's variants that run pdd with ablation_local_rld (variant_defs), in order; spec: metadata.json's
    SpecRecord (or anything with `variants` and `variant_defs`)."""
    defs = spec.variant_defs or {}
    out = []
    for v in spec.variants or ():
        d = defs.get(v) or {}
        policy = (d.get("deployment") or {}).get("policy") or {}
        if d.get("mode") == "pdd" and policy.get("ablation_local_rld"):
            out.append(v)
    return out


def summarize(records: list, events: list[dict], spec, bin_s: float = BIN_S) -> dict | None:
    """summary.json's "ablation": the bins of the pdd variant and of the (first) ablation variant, each from its
    own first request, and the verdict; None unless the spec runs both."""
    abl = ablation_variants(spec)
    if "pdd" not in (spec.variants or ()) or not abl:
        return None
    bins = {}
    for v in ("pdd", abl[0]):
        sends = [r.t_send_ns for r in records if r.variant == v and r.issued and r.kind != "warmup"]
        bins[v] = over_time(records, events, v, min(sends), bin_s) if sends else []
    return {"bin_s": bin_s, "variants": bins, "ablation_variant": abl[0], "verdict": verdict(bins["pdd"], bins[abl[0]])}
