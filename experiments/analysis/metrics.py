"""Metrics of a PDD experiment, per variant, from the per-request records (pure functions).

Responsible for: latency statistics named as in vLLM's and SGLang's serving
benchmarks (TTFT, TPOT, ITL, E2E: mean, p50, p90, p95, p99, max; and the same
under vLLM's own result names, `vllm_names`), goodput under the spec's SLOs,
WAN bytes (per request, total, and from the pcap), DRC hit rate overall and
per hit-rate bucket, the RLD's share of output tokens, handoff latency and the
largest inter-token gap around it, extend time, singular requests and the WAN
bytes they saved, fallbacks, token streams compared across variants, 95%
intervals (experiments.analysis.confidence) and pdd's ratios to each baseline; the
summary as JSON.
Not responsible for: reading raw logs (experiments.analysis.records), rendering it
(experiments.analysis.summary_md) or plotting.

TTFT is the first token at the client. P samples it, but it reaches the
client from the decode side once that side holds the prompt's KV (as in PD
serving), so a WAN transfer on the path (pd-cross, P->MD) is part of TTFT and
PDD's fast path to the RLD is what keeps it low. `ttft_decode` is the first
token a decode worker sampled itself (index 1).
"""

from __future__ import annotations

import math
from collections import Counter
from statistics import mean, stdev

import numpy as np

from experiments.analysis import confidence
from experiments.analysis.records import RequestRecord
from experiments.spec.workload import bucket_names, bucket_of
from workers.roles.routing import Route

PERCENTILES = (50, 90, 95, 99)


def percentile(xs: list[float], p: float) -> float:
    """Linear-interpolated percentile (numpy's default), p in 0..100; +inf (a failed request) ranks last and a
    percentile that reaches it is +inf."""
    return _sorted_percentile(sorted(xs), p)


def _sorted_percentile(s: list[float], p: float) -> float:
    """percentile of values already sorted (one sort serves every percentile of a sample)."""
    if not s:
        return math.nan
    k = (len(s) - 1) * p / 100
    lo, hi = math.floor(k), math.ceil(k)
    if math.isinf(s[lo]) or (math.isinf(s[hi]) and k > lo):
        return math.inf
    return s[lo] + (s[hi] - s[lo]) * (k - lo) if k > lo else s[lo]


def _ends(ci) -> list[float | None] | None:
    """An interval for summary.json: an end at +inf (failed requests) is None ("failed"); None stays None."""
    return None if ci is None else [None if math.isinf(x) else float(x) for x in ci]


def stats(xs: list[float], clusters: list | None = None) -> dict:
    """n, failed, mean, std (sample), p50, p90, p95, p99, max, and `ci95`: the 95% interval of the mean and of
    each percentile (experiments.analysis.confidence; None where the sample cannot support it: too few values
    or clusters). xs: one value per unit, +inf for a failed request (ranked worst: a percentile that lands on
    failures is None, named in beyond_completed), None dropped; mean and std over the finite values.
    clusters: each value's cluster (a request's session, an ITL gap's request), None: independent values.
    Empty -> n=0 only."""
    keep = [(x, c) for x, c in zip(xs, clusters if clusters is not None else range(len(xs))) if x is not None]
    if not keep:
        return {"n": 0}
    vals = [x for x, _ in keep]
    finite = [x for x in vals if math.isfinite(x)]
    out: dict = {"n": len(finite), "failed": len(vals) - len(finite), "beyond_completed": []}
    out["mean"] = mean(finite) if finite else None
    out["std"] = stdev(finite) if len(finite) > 1 else (0.0 if finite else None)
    ordered = sorted(vals)
    for p in PERCENTILES:
        q = _sorted_percentile(ordered, p)
        out[f"p{p}"] = None if math.isinf(q) else q
        if math.isinf(q):
            out["beyond_completed"].append(f"p{p}")
    out["max"] = max(finite) if finite and len(finite) == len(vals) else None
    if out["max"] is None:
        out["beyond_completed"].append("max")
    sample = confidence.Sample(np.asarray(vals, float), _cluster_ids([c for _, c in keep]), np.arange(len(vals)))
    out["ci95"] = {
        "mean": _ends(confidence.mean_interval(sample)) if finite and len(finite) == len(vals) else None,
        **{f"p{p}": _ends(confidence.quantile_interval(sample, p)) for p in PERCENTILES},
    }
    return out


def _cluster_ids(clusters: list) -> np.ndarray:
    """Clusters for a confidence.Sample: string ids as their ranks among the distinct ids, which np.unique orders
    as it orders the strings (by code point), so the sample's cluster codes are the same, without numpy
    converting and sorting one string per value (~600,000 ITL gaps a variant at 10,000 requests)."""
    if not all(type(c) is str for c in clusters):
        return np.asarray(clusters)
    rank = {c: i for i, c in enumerate(sorted(set(clusters)))}
    return np.asarray([rank[c] for c in clusters])


def request_stats(recs: list[RequestRecord], value) -> dict:
    """stats of value(request) over a variant's issued requests: a request that did not complete counts as
    +inf (ranked worst), a completed one without the value (a TPOT of one token) is left out; clustered by
    session (a session's turns share a prefix and a queue)."""
    rows = [(value(r) if r.ok else math.inf, r.session) for r in recs if r.issued]
    rows = [(x, c) for x, c in rows if x is not None]
    return stats([x for x, _ in rows], [c for _, c in rows])


def itls(rec: RequestRecord) -> list[float]:
    return [b - a for a, b in zip(rec.token_ms, rec.token_ms[1:])]


def meets_slo(rec: RequestRecord, slo) -> bool:
    if not rec.ok or rec.ttft_ms is None:
        return False
    if rec.ttft_ms > slo.ttft_ms:
        return False
    if rec.tpot_ms is not None and rec.tpot_ms > slo.tpot_ms:
        return False
    return not (slo.e2e_ms and rec.e2e_ms is not None and rec.e2e_ms > slo.e2e_ms)


def _duration_s(recs: list[RequestRecord]) -> float:
    if not recs:
        return 0.0
    return (max(r.t_done_ns for r in recs) - min(r.t_send_ns for r in recs)) / 1e9


def _hits(recs: list[RequestRecord]) -> dict:
    drc = [r for r in recs if r.drc_hit is not None]
    buckets = {}
    for b in bucket_names():
        inb = [r for r in recs if r.expected_hit is not None and bucket_of(r.expected_hit) == b]
        measured = [r for r in drc if bucket_of(r.drc_hit) == b]
        buckets[b] = {
            "requests": len(inb),
            "requests_by_drc_hit": len(measured),
            "ttft_p50_ms": percentile([r.ttft_ms for r in inb if r.ttft_ms is not None], 50) if inb else None,
            "ttft_decode_p50_ms": percentile([r.ttft_decode_ms for r in inb if r.ttft_decode_ms], 50) if inb else None,
            "wan_bytes_mean": mean([r.wan_bytes for r in inb]) if inb else None,
        }
    known = [r.expected_hit for r in recs if r.expected_hit is not None]
    out = {"expected_mean": mean(known) if known else None, "buckets": buckets}
    if drc:
        out["drc_mean"] = mean([r.drc_hit for r in drc])
        out["drc_token_weighted"] = sum(r.md_cached_tokens for r in drc) / max(1, sum(r.prompt_tokens for r in drc))
        out["drc_share_above_95"] = sum(r.drc_hit > 0.95 for r in drc) / len(drc)
    return out


IDS_MODES = ("oneshot", "chunked", "ids", "auto:oneshot", "auto:chunked")  # handoffs by token IDs (recomputed)


def _mode_of(r: RequestRecord) -> str | None:
    """The handoff mode a request asked for or, without one, the mode its handoff ran."""
    return r.handoff_requested or (r.handoff or {}).get("mode")


def _handoffs_by_mode(recs: list[RequestRecord]) -> dict:
    """Per handoff mode asked for (requests interleaving modes in one window) or run: the requests that planned a
    handoff (routed P->RLD->MD), those whose handoff finished, the share that never did (censored: failed, the MD
    never ready, the RLD done first; their latency is unknown and would be the longest), and the latency from
    the RLD's decision to the MD ready (ready_ms) with its std and the std's 95% interval (BCa bootstrap: the
    requests are one-turn and independent in the microbenchmark)."""
    out = {}
    planned = [r for r in recs if r.issued and r.route == Route.P_RLD_MD and _mode_of(r)]
    for mode in sorted({_mode_of(r) for r in planned}):
        mine = [r for r in planned if _mode_of(r) == mode]
        ready = [r.handoff["ready_ms"] for r in mine if r.handoff and r.handoff.get("ready_ms") is not None]
        done = sum(1 for r in mine if r.handoff)
        out[mode] = {
            "planned": len(mine),
            "finished": done,
            "censored": len(mine) - done,
            "censored_share": (len(mine) - done) / len(mine),
            "ready_ms": stats(ready),
            "std_ci95": _ends(confidence.std_interval(ready)),
        }
    return out


def _std_ratio(by_mode: dict, recs: list[RequestRecord]) -> dict | None:
    """std(IDs) / std(KV) of ready_ms with its 95% interval, where both an IDs mode and kv ran."""
    ids = next((m for m in by_mode if m in IDS_MODES), None)
    if ids is None or "kv" not in by_mode:
        return None
    xs = [r.handoff["ready_ms"] for r in recs if r.handoff and _mode_of(r) == ids and r.handoff.get("ready_ms")]
    ys = [r.handoff["ready_ms"] for r in recs if r.handoff and _mode_of(r) == "kv" and r.handoff.get("ready_ms")]
    sx, sy = by_mode[ids]["ready_ms"].get("std"), by_mode["kv"]["ready_ms"].get("std")
    if not sx or not sy:
        return None
    return {"ids_mode": ids, "ratio": sx / sy, "ci95": _ends(confidence.std_ratio_interval(xs, ys))}


def _handoffs(recs: list[RequestRecord]) -> dict:
    h = [r.handoff for r in recs if r.handoff]
    by_mode = _handoffs_by_mode(recs)
    return {
        "by_mode": by_mode,
        "std_ratio": _std_ratio(by_mode, recs),
        "ready_ms": stats([x["ready_ms"] for x in h if x.get("ready_ms") is not None]),
        "count": len(h),
        "latency_ms": stats([x["duration_ms"] for x in h if x.get("duration_ms") is not None]),
        "extend_ms": stats([x["extend_ms"] for x in h if x.get("extend_ms") is not None]),
        "gap_ms": stats([x["gap_ms"] for x in h if x.get("gap_ms") is not None]),
        "payload_bytes": stats([x["payload_bytes"] for x in h if x.get("payload_bytes") is not None]),
        "tokens": stats([x["tokens"] for x in h if x.get("tokens") is not None]),
        "modes": dict(Counter(x["mode"] for x in h)),
    }


# vLLM's benchmark names (`vllm bench serve --save-result`): <stat>_<metric>_ms, read from the stats blocks
# above (one computation, two names), so results line up with numbers people already have.
VLLM_METRICS = {"ttft": "ttft_ms", "tpot": "tpot_ms", "itl": "itl_ms", "e2el": "e2e_ms"}
VLLM_STATS = {"mean": "mean", "median": "p50", "std": "std", "p90": "p90", "p99": "p99"}


def vllm_names(v: dict) -> dict:
    """One variant's summary under vLLM's benchmark names (None where a stat has no values)."""
    out = {
        "completed": v["completed"],
        "total_input_tokens": v["input_tokens_total"],
        "total_output_tokens": v["output_tokens_total"],
        "request_throughput": v["throughput_rps"],
        "request_goodput": v["goodput_rps"],
        "output_throughput": v["output_tokens_per_s"],
        "total_token_throughput": v["total_tokens_per_s"],
    }
    for metric, key in VLLM_METRICS.items():
        out.update({f"{name}_{metric}_ms": v[key].get(stat) for name, stat in VLLM_STATS.items()})
    return out


def variant_summary(recs: list[RequestRecord], slo) -> dict:
    """Every metric of one variant (and the same under vLLM's names: `vllm`)."""
    ok = [r for r in recs if r.ok]
    dur = _duration_s(recs)
    good = [r for r in ok if meets_slo(r, slo)]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    singular = [r for r in recs if r.route == Route.P_RLD_SINGULAR]
    issued = [r for r in recs if r.issued]
    out = {
        "requests": len(recs),
        "issued": len(issued),
        "not_issued": len(recs) - len(issued),
        "completed": len(ok),
        "failed": len(issued) - len(ok),
        "completion_ci95": _completion_ci(issued),
        "prompt_from_reference": sum(r.prompt_source == "reference" for r in issued),
        "duration_s": dur,
        "throughput_rps": len(ok) / dur if dur else None,
        "output_tokens_per_s": out_tokens / dur if dur else None,
        "input_tokens_total": in_tokens,
        "output_tokens_total": out_tokens,
        "total_tokens_per_s": (in_tokens + out_tokens) / dur if dur else None,
        "ttft_ms": request_stats(recs, lambda r: r.ttft_ms),
        "ttft_decode_ms": request_stats(recs, lambda r: r.ttft_decode_ms),
        "tpot_ms": request_stats(recs, lambda r: r.tpot_ms),
        "itl_ms": _itl_stats(ok),
        "decode_batch": stats([r.decode_batch for r in ok], [r.session for r in ok]),
        "e2e_ms": request_stats(recs, lambda r: r.e2e_ms),
        "goodput_rps": len(good) / dur if dur else None,
        "slo_attainment": len(good) / len(recs) if recs else None,
        "wan_bytes_total": sum(r.wan_bytes for r in recs),
        "wan_bytes_per_request": stats([r.wan_bytes for r in issued], [r.session for r in issued]),
        "wan_kv_bytes_total": sum(r.wan_kv_bytes for r in recs),
        "wan_handoff_bytes_total": sum(r.wan_handoff_bytes for r in recs),
        "fast_kv_bytes_total": sum(r.fast_kv_bytes for r in recs),
        "hit_rate": _hits(recs),
        "rld_token_share": sum(r.rld_tokens for r in ok) / out_tokens if out_tokens else None,
        "md_token_share": sum(r.md_tokens for r in ok) / out_tokens if out_tokens else None,
        "handoff": _handoffs(recs),
        "singular": {"count": len(singular), "kv_bytes_saved": sum(r.kv_bytes_saved for r in recs)},
        "inflight": {
            "requests": sum(r.inflight_tokens > 0 for r in recs),
            "tokens_not_resent": sum(r.inflight_tokens for r in recs),
            "prefix_lost": sum(f == "prefix_lost" for r in recs for f in r.fallbacks),
        },
        "relay_absorbed": sum(r.relay_absorbed for r in recs),
        "routes": dict(Counter(r.route or "none" for r in recs)),
        "fallbacks": dict(Counter(f for r in recs for f in r.fallbacks)),
        "errors": [f"{r.request_id}: {r.error}" for r in recs if r.error][:20],
    }
    out["vllm"] = vllm_names(out)
    return out


def _itl_stats(ok: list[RequestRecord]) -> dict:
    """stats of the completed requests' inter-token gaps, clustered by request (its gaps share its decode
    worker)."""
    gaps = [itls(r) for r in ok]
    return stats([g for gs in gaps for g in gs], [r.request_id for r, gs in zip(ok, gaps) for _ in gs])


def _completion_ci(issued: list[RequestRecord]) -> list[float] | None:
    """Completed / issued with its 95% interval (Wilson's, n shrunk by the sessions' clustering)."""
    if not issued:
        return None
    done = confidence.Sample(
        np.asarray([float(r.ok) for r in issued]), np.asarray([r.session for r in issued]), np.arange(len(issued))
    )
    return list(confidence.clustered_proportion_interval(done))


def compare_streams(records: list[RequestRecord], variants: list[str]) -> dict:
    """Token streams of every variant against the first (the reference); divergences listed with their index."""
    by = {(r.variant, r.request_id): r for r in records if r.ok}
    ref = variants[0] if variants else None
    out = {"reference": ref, "variants": {}}
    for v in variants[1:]:
        equal, diverged = 0, []
        for (vv, rid), r in by.items():
            if vv != v or (ref, rid) not in by:
                continue
            a, b = by[(ref, rid)].token_ids, r.token_ids
            if a == b:
                equal += 1
            else:
                first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                diverged.append(
                    {
                        "request_id": rid,
                        "index": first,
                        "prompt_differs": by[(ref, rid)].prompt_tokens != r.prompt_tokens or r.turn > 1,
                    }
                )
        out["variants"][v] = {"equal": equal, "diverged": len(diverged), "divergences": diverged[:20]}
    return out


# What each comparison takes from a request and which statistic of the variant it compares: name -> (value,
# statistic). Latencies over every issued request (one that did not complete ranks worst).
COMPARED = {
    "ttft_ms.p50": (lambda r: r.ttft_ms, "p50"),
    "ttft_ms.p90": (lambda r: r.ttft_ms, "p90"),
    "tpot_ms.p50": (lambda r: r.tpot_ms, "p50"),
    "e2e_ms.p50": (lambda r: r.e2e_ms, "p50"),
}
WAN_METRIC = "wan_bytes_offered"


def comparison_subject(variants: list[str]) -> str | None:
    """The variant the others are compared against: pdd where it runs, else the last one."""
    return "pdd" if "pdd" in variants else (variants[-1] if variants else None)


def _sample(records: list[RequestRecord], variant: str, value, latency: bool) -> confidence.Sample | None:
    """One variant's issued requests as a Sample clustered by session and keyed by request id; a latency of a
    request that did not complete is +inf."""
    rows = [
        (value(r) if (r.ok or not latency) else math.inf, r.session, r.request_id)
        for r in records
        if r.variant == variant and r.issued
    ]
    rows = [x for x in rows if x[0] is not None]
    if not rows:
        return None
    v, c, k = zip(*rows)
    return confidence.Sample(np.asarray(v, float), np.asarray(c), np.asarray(k))


def _point(s: confidence.Sample, stat: str) -> float:
    if stat == "sum":
        return float(s.values.sum())
    if stat == "mean":
        return float(s.values.mean())
    return percentile(list(s.values), float(stat[1:]))


def _entry(name: str, subject: str, base: str, ratio: float | None, ci, paired: bool) -> dict:
    ci = None if ratio is None else ci
    return {
        "metric": name,
        "variant": subject,
        "baseline": base,
        "ratio": ratio,
        "ci95": _ends(ci),
        "verdict": confidence.verdict(ci),
        "paired": paired,
        "scope": "this run",
    }


def _ratio(x: confidence.Sample, y: confidence.Sample, stat: str) -> tuple[float | None, object, bool]:
    """stat(x) / stat(y) (None where either is undefined: zero, or a percentile on failed requests), its 95%
    interval (paired by request where both variants hold the same requests), and whether it was paired."""
    num, den = _point(x, stat), _point(y, stat)
    ratio = num / den if den and math.isfinite(num) and math.isfinite(den) else None
    paired = confidence._paired(x, y) is not None
    return ratio, confidence.ratio_interval(x, y, stat, paired=True), paired


def comparisons(
    records: list[RequestRecord], variants: list[str], slo=None, offered: dict[str, int | None] | None = None
) -> list[dict]:
    """The subject variant's metrics over each other variant's, as ratios with 95% intervals and a verdict:
    'lower' / 'higher' where the interval excludes 1, else 'no significant difference'. Intervals resample the
    run's sessions (its independent units), paired by request id where both variants replayed the same requests;
    they speak for this run only (scope). Latencies over every issued request, failures ranked worst; WAN bytes as
    offered to the WAN (offered: variant -> the capture's KV bytes before the shaper); with an slo, goodput."""
    subject = comparison_subject(variants)
    by_variant: dict[str, list[RequestRecord]] = {}
    for r in records:
        by_variant.setdefault(r.variant, []).append(r)
    out = []
    for base in (v for v in variants if v != subject):
        pair = by_variant.get(subject, []) + by_variant.get(base, [])  # what each ratio below reads, in order
        if slo is not None:
            out += _goodput_ratio(pair, subject, base, slo)
        for name, (value, stat) in COMPARED.items():
            x, y = (_sample(pair, v, value, latency=True) for v in (subject, base))
            if x is not None and y is not None:
                out.append(_entry(name, subject, base, *_ratio(x, y, stat)))
        out += _wan_ratio(pair, subject, base, offered or {})
    return out


def _wan_ratio(records: list[RequestRecord], subject: str, base: str, offered: dict) -> list[dict]:
    """WAN bytes as offered, subject over base. The interval: the paired interval of the application's own WAN
    bytes per request (the sum), moved on the log scale by the ratio of the offered totals to the application's
    (the capture cannot tell which request a byte of a kept connection belonged to; headers and retransmissions
    are taken as a fixed share of each variant's bytes). None without the capture's figure for both."""
    ox, oy = offered.get(subject), offered.get(base)
    x, y = (_sample(records, v, lambda r: float(r.wan_bytes), latency=False) for v in (subject, base))
    if not ox or not oy or x is None or y is None:
        return []
    app, ci, paired = _ratio(x, y, "sum")
    ratio = ox / oy
    if ci is not None and app:
        ci = tuple(end * ratio / app for end in ci)
    return [_entry(WAN_METRIC, subject, base, ratio, ci if app else None, paired)]


def _goodput_ratio(records: list[RequestRecord], subject: str, base: str, slo) -> list[dict]:
    """goodput(subject) / goodput(base): each issued request counts 1/duration of its variant if it met the SLO,
    so a sum is that variant's goodput (durations kept fixed). No interval where every request of both variants
    met the SLO: the ratio is then the two windows' (first issue to last end), which resampling requests cannot
    move, and a zero-width interval would claim a certainty the run does not hold (repeats measure it: a
    sweep's REPEAT)."""
    samples = {}
    for v in (subject, base):
        recs = [r for r in records if r.variant == v and r.issued]
        dur = _duration_s(recs)
        if not dur:
            return []
        samples[v] = _sample(records, v, lambda r, d=dur: float(meets_slo(r, slo)) / d, latency=False)
    x, y = samples[subject], samples[base]
    if x is None or y is None or not y.values.sum():
        return []
    ratio, ci, paired = _ratio(x, y, "sum")
    if np.ptp(x.values) == 0 and np.ptp(y.values) == 0:
        ci = None
    return [_entry("goodput_rps", subject, base, ratio, ci, paired)]


def wan_estimate_ms(tokens: float, kv_bytes_per_token: int, rate_mbit: float) -> float:
    """Serialisation time of tokens' KV on the WAN at the profile's rate (ms)."""
    return tokens * kv_bytes_per_token * 8 / (rate_mbit * 1e3)


def summarize(
    records: list[RequestRecord],
    variants: list[str],
    slo,
    kv_bytes_per_token: int,
    rate_mbit: float,
    pcap_bytes: dict | None = None,
    offered: dict[str, int | None] | None = None,
) -> dict:
    """The whole summary.json (as data; experiments.analysis.summary types it). offered: variant -> KV bytes
    offered to the WAN (the capture before the shaper; None without captures)."""
    measured = [r for r in records if r.kind != "warmup"]
    per = {v: variant_summary([r for r in measured if r.variant == v], slo) for v in variants}
    for v, b in (pcap_bytes or {}).items():
        if v in per:
            per[v]["wan_bytes_pcap"] = b
    for v in per:
        per[v]["wan_bytes_offered"] = (offered or {}).get(v)
    uncached = [
        r.prompt_tokens - round(r.expected_hit * r.prompt_tokens)
        for r in measured
        if r.variant == (variants[0] if variants else None) and r.expected_hit is not None
    ]
    med = percentile(uncached, 50) if uncached else None
    return {
        "variants": per,
        "comparisons": comparisons(measured, variants, slo, offered),
        "streams": compare_streams(measured, variants),
        "reference": {
            "kv_bytes_per_token": kv_bytes_per_token,
            "wan_rate_mbit": rate_mbit,
            "median_uncached_tokens": med,
            "wan_estimate_ms_median_uncached": wan_estimate_ms(med, kv_bytes_per_token, rate_mbit)
            if med is not None
            else None,
        },
        "slo": {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms, "e2e_ms": slo.e2e_ms},
    }
