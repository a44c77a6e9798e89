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
    """Linear-interpolated percentile (numpy's default), p in 0..100."""
    s = sorted(xs)
    if not s:
        return math.nan
    k = (len(s) - 1) * p / 100
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def stats(xs: list[float]) -> dict:
    """mean, std (sample), p50, p90, p95, p99, max, and `ci95`: the 95% interval of the mean (t) and of
    each percentile (bootstrap over the values; experiments.analysis.confidence), absent under two values.
    None-free input; empty -> n=0 only."""
    xs = [x for x in xs if x is not None]
    if not xs:
        return {"n": 0}
    out = {"n": len(xs), "mean": mean(xs), "std": stdev(xs) if len(xs) > 1 else 0.0}
    out.update({f"p{p}": percentile(xs, p) for p in PERCENTILES})
    out["max"] = max(xs)
    cis = confidence.percentile_cis(xs, PERCENTILES)
    if cis is not None:
        out["ci95"] = {"mean": list(confidence.mean_ci(xs)), **{f"p{p}": list(ci) for p, ci in cis.items()}}
    return out


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
        inb = [r for r in recs if bucket_of(r.expected_hit) == b]
        measured = [r for r in drc if bucket_of(r.drc_hit) == b]
        buckets[b] = {
            "requests": len(inb),
            "requests_by_drc_hit": len(measured),
            "ttft_p50_ms": percentile([r.ttft_ms for r in inb if r.ttft_ms is not None], 50) if inb else None,
            "ttft_decode_p50_ms": percentile([r.ttft_decode_ms for r in inb if r.ttft_decode_ms], 50) if inb else None,
            "wan_bytes_mean": mean([r.wan_bytes for r in inb]) if inb else None,
        }
    out = {"expected_mean": mean([r.expected_hit for r in recs]) if recs else None, "buckets": buckets}
    if drc:
        out["drc_mean"] = mean([r.drc_hit for r in drc])
        out["drc_token_weighted"] = sum(r.md_cached_tokens for r in drc) / max(1, sum(r.prompt_tokens for r in drc))
        out["drc_share_above_95"] = sum(r.drc_hit > 0.95 for r in drc) / len(drc)
    return out


def _handoffs(recs: list[RequestRecord]) -> dict:
    h = [r.handoff for r in recs if r.handoff]
    return {
        "count": len(h),
        "latency_ms": stats([x["duration_ms"] for x in h]),
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
        "prompt_from_reference": sum(r.prompt_source == "reference" for r in issued),
        "duration_s": dur,
        "throughput_rps": len(ok) / dur if dur else 0.0,
        "output_tokens_per_s": out_tokens / dur if dur else 0.0,
        "input_tokens_total": in_tokens,
        "output_tokens_total": out_tokens,
        "total_tokens_per_s": (in_tokens + out_tokens) / dur if dur else 0.0,
        "ttft_ms": stats([r.ttft_ms for r in ok]),
        "ttft_decode_ms": stats([r.ttft_decode_ms for r in ok]),
        "tpot_ms": stats([r.tpot_ms for r in ok]),
        "itl_ms": stats([g for r in ok for g in itls(r)]),
        "decode_batch": stats([r.decode_batch for r in ok]),
        "e2e_ms": stats([r.e2e_ms for r in ok]),
        "goodput_rps": len(good) / dur if dur else 0.0,
        "slo_attainment": len(good) / len(recs) if recs else 0.0,
        "wan_bytes_total": sum(r.wan_bytes for r in recs),
        "wan_bytes_per_request": stats([r.wan_bytes for r in recs]),
        "wan_kv_bytes_total": sum(r.wan_kv_bytes for r in recs),
        "wan_handoff_bytes_total": sum(r.wan_handoff_bytes for r in recs),
        "fast_kv_bytes_total": sum(r.fast_kv_bytes for r in recs),
        "hit_rate": _hits(recs),
        "rld_token_share": sum(r.rld_tokens for r in ok) / out_tokens if out_tokens else 0.0,
        "md_token_share": sum(r.md_tokens for r in ok) / out_tokens if out_tokens else 0.0,
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


# What each comparison takes from a request and how it reduces the sample: name -> (value, statistic).
COMPARED = {
    "ttft_ms.p50": (lambda r: r.ttft_ms, confidence.median_of_rows),
    "ttft_ms.p90": (lambda r: r.ttft_ms, confidence.p90_of_rows),
    "tpot_ms.p50": (lambda r: r.tpot_ms, confidence.median_of_rows),
    "e2e_ms.p50": (lambda r: r.e2e_ms, confidence.median_of_rows),
    "wan_bytes_total": (lambda r: r.wan_bytes, confidence.sum_of_rows),
}


def comparison_subject(variants: list[str]) -> str | None:
    """The variant the others are compared against: pdd where it runs, else the last one."""
    return "pdd" if "pdd" in variants else (variants[-1] if variants else None)


def comparisons(records: list[RequestRecord], variants: list[str], slo=None) -> list[dict]:
    """The subject variant's metrics over each other variant's, as ratios with 95% bootstrap intervals
    (requests resampled within each variant) and a verdict: 'lower' / 'higher' where the interval excludes 1,
    else 'no significant difference'. Latencies over completed requests; WAN bytes over every request; with an
    slo, goodput (requests meeting it per second of each variant's own duration: the bathtub's gain)."""
    subject = comparison_subject(variants)
    out = []
    for base in (v for v in variants if v != subject):
        if slo is not None:
            out += _goodput_ratio(records, subject, base, slo)
        for name, (value, stat) in COMPARED.items():
            xs, ys = (_values(records, v, value, completed=name != "wan_bytes_total") for v in (subject, base))
            if not xs or not ys:
                continue
            den = float(stat(np.asarray([ys]))[0])
            ratio = float(stat(np.asarray([xs]))[0]) / den if den else None
            ci = confidence.ratio_ci(xs, ys, stat) if ratio is not None else None
            out.append(
                {
                    "metric": name,
                    "variant": subject,
                    "baseline": base,
                    "ratio": ratio,
                    "ci95": list(ci) if ci else None,
                    "verdict": confidence.verdict(ci),
                }
            )
    return out


def _goodput_ratio(records: list[RequestRecord], subject: str, base: str, slo) -> list[dict]:
    """goodput(subject) / goodput(base): each request counts 1/duration of its variant if it met the SLO, so a
    resample's sum is that variant's goodput (requests resampled, durations kept)."""
    rows = {}
    for v in (subject, base):
        recs = [r for r in records if r.variant == v and r.issued]
        dur = _duration_s(recs)
        rows[v] = [float(meets_slo(r, slo)) / dur for r in recs] if dur else []
    xs, ys = rows[subject], rows[base]
    if not xs or not ys or not sum(ys):
        return []
    ci = confidence.ratio_ci(xs, ys, confidence.sum_of_rows)
    ratio = sum(xs) / sum(ys)
    entry = {"metric": "goodput_rps", "variant": subject, "baseline": base, "ratio": ratio}
    return [{**entry, "ci95": list(ci) if ci else None, "verdict": confidence.verdict(ci)}]


def _values(records: list[RequestRecord], variant: str, value, completed: bool) -> list[float]:
    vals = (value(r) for r in records if r.variant == variant and (r.ok or not completed))
    return [x for x in vals if x is not None]


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
) -> dict:
    """The whole summary.json."""
    measured = [r for r in records if r.kind != "warmup"]
    per = {v: variant_summary([r for r in measured if r.variant == v], slo) for v in variants}
    for v, b in (pcap_bytes or {}).items():
        if v in per:
            per[v]["wan_bytes_pcap"] = b
    uncached = [
        r.prompt_tokens - round(r.expected_hit * r.prompt_tokens)
        for r in measured
        if r.variant == (variants[0] if variants else None)
    ]
    med = percentile(uncached, 50) if uncached else 0.0
    return {
        "variants": per,
        "comparisons": comparisons(measured, variants, slo),
        "streams": compare_streams(measured, variants),
        "reference": {
            "kv_bytes_per_token": kv_bytes_per_token,
            "wan_rate_mbit": rate_mbit,
            "median_uncached_tokens": med,
            "wan_estimate_ms_median_uncached": wan_estimate_ms(med, kv_bytes_per_token, rate_mbit),
        },
        "slo": {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms, "e2e_ms": slo.e2e_ms},
    }
