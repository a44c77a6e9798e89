"""Similarity to the published deployment: the dimensionless ratios that decide PDD's behaviour, per variant.

Responsible for: from one run's per-request records and its WAN profile (pure functions), each ratio per variant
where it applies, with its 95% interval (sessions resampled, experiments.analysis.confidence), beside the
published deployment's value derived from shared/PDD.md's figures (PUBLISHED: each with the figures it comes
from and how; "not published" where PDD.md does not give enough). A reader sees how far the emulated setting is
from the one PDD was built for: where a ratio is far off, so is the regime (on a 20 Mbit/s line the default
workload's 16-32-token outputs finish on the RLD before any KV reaches the MD; the published outputs of
hundreds of tokens make the handoff the norm).
Not responsible for: reading the run directory (experiments.analysis.records), the other figures
(experiments.analysis.metrics), rendering (experiments.analysis.summary_pdd).

The ratios (RATIOS; per request unless said; warm-up requests left out, as in every figure):

    kv_transfer_over_prefill     the WAN copy of the prompt KV (P's kv_send_start to kv_send_end, path wan) over
                                 P's prefill (prefill_arrival to prefill_done, its queue included); variants
                                 whose requests end at an MD (routes p-md, p-rld-md)
    rtt_over_tpot                the WAN profile's base round trip over the request's TPOT: tokens the RLD
                                 decodes while a message crosses the WAN and back; the same variants
    kv_bytes_over_bdp            the request's WAN KV bytes over the line's bandwidth-delay product (rate x
                                 RTT): below 1 a transfer is a few round trips (RTT-bound), far above it the
                                 line's rate decides (rate-bound); the same variants, requests that sent WAN KV
    kv_transfer_over_rld_decode  the WAN copy's time over the RLD's decode time of the request's output ((max
                                 tokens - 1) x the RLD's TPOT: the mean gap between the request's consecutive
                                 RLD tokens, the variant's median gap where the RLD made fewer than two): above
                                 1 the RLD finishes before the MD holds the KV and no handoff happens; pdd
                                 variants, requests routed p-rld-md
    rld_token_share              the RLD's share of output tokens (token-weighted over completed requests)
    drc_hit                      the MD's DRC hit (cached / prompt tokens), mean over requests

A request whose WAN copy never finished (cancelled when the RLD was done first, failed, or still under way at
the end) ranks as +inf in the two transfer ratios: its transfer took longer than the request allowed. The
medians' intervals are Woodruff's with a session-clustered variance, the share's and the mean's the
delete-one-session jackknife (experiments.analysis.confidence).
"""

from __future__ import annotations

import math
from statistics import median

import numpy as np

from experiments.analysis import confidence
from experiments.analysis.metrics import percentile
from experiments.analysis.records import RequestRecord
from experiments.analysis.summary import SIMILARITY_RATIOS, Published, Similarity, SimilarityRatio
from workers.roles.routing import ENDS_AT_MD, Route

RATIOS = SIMILARITY_RATIOS
MEDIAN = "median of per-request ratios"

# The published deployment's values, per ratio and serving mode: pdd is PDD, pd-cross the naive cross-DC PD it is
# compared with (decode moved to the other city). Figures from shared/PDD.md; each basis says which and how.
_TTFT_SAME_DC_S = 4.2  # "median TTFT grows from ≈4.2 s to ≈6.7 s": same-DC PD's median TTFT, prefill included
_NOT_PUBLISHED_RTT = "not published: PDD.md gives neither the WAN round trip nor a TPOT"
PUBLISHED: dict[str, dict[str, Published]] = {
    "kv_transfer_over_prefill": {
        # 1 s / 4.2 s = 0.238; TTFT (queue + prefill + first token) bounds the prefill from above, so the
        # ratio to the prefill alone is at least this
        "pdd": Published(
            value=1.0 / _TTFT_SAME_DC_S,
            relation="≥",
            basis="P50 cross-cluster KV transfer ≈1 s with the DRC at ≈90% hit (transfers range 1-20 s) ÷ "
            "same-DC median TTFT ≈4.2 s, an upper bound on the prefill",
        ),
        # (6.7 - 4.2) / 4.2 = 0.595: moving decode to the other city adds the transfer to the critical path
        "pd-cross": Published(
            value=(6.7 - _TTFT_SAME_DC_S) / _TTFT_SAME_DC_S,
            relation="≥",
            basis="naive cross-DC PD adds ≈2.5 s to median TTFT (4.2 → 6.7 s: the whole prompt's KV on the "
            "critical path) ÷ same-DC median TTFT ≈4.2 s, an upper bound on the prefill",
        ),
    },
    "rtt_over_tpot": {
        "pdd": Published(value=None, basis=_NOT_PUBLISHED_RTT),
        "pd-cross": Published(value=None, basis=_NOT_PUBLISHED_RTT),
    },
    "kv_bytes_over_bdp": {
        # 64K total with 1K output: ~63K prompt tokens; 10% uncached x 50 KB = 0.32 GB; 100% = 3.2 GB
        "pdd": Published(
            value=None,
            basis="not published: the WAN round trip is not given (the numerator is: ≈0.3 GB a request, 10% of "
            "a ≈63K-token prompt at ≈50 KB a token; the line 10-100 Gbit/s)",
        ),
        "pd-cross": Published(
            value=None,
            basis="not published: the WAN round trip is not given (the numerator is: ≈3 GB a request, a "
            "≈63K-token prompt at ≈50 KB a token; the line 10-100 Gbit/s)",
        ),
    },
    # 6.2%: the RLD decodes from the start until the MD holds the KV and has absorbed the handoff; at a steady
    # TPOT its share of a 1K output is (transfer + handoff) ÷ its decode time of the whole output, so the
    # transfer's part is at most 0.062 (requests sent straight P->MD, with no RLD tokens, pull the share down)
    "kv_transfer_over_rld_decode": {
        "pdd": Published(
            value=0.062,
            relation="≈",
            basis="the RLD's 6.2% share of output tokens at 64K total length, 1K output, 90% hit: at a steady "
            "TPOT, (transfer + handoff) ÷ the RLD's decode time of the whole output; an order of magnitude",
        ),
    },
    "rld_token_share": {
        "pdd": Published(value=0.062, basis="the RLD generates 6.2% of output tokens (64K total, 1K output, 90% hit)"),
    },
    "drc_hit": {
        "pdd": Published(
            value=0.90,
            basis="average prefix-cache hit ≈90% in multi-turn agent traffic (70-80% of requests hit above 95%)",
        ),
    },
}
NO_COUNTERPART = Published(value=None, basis="no published counterpart of this variant's serving mode")


def published(ratio: str, mode: str) -> Published:
    """The published deployment's value of ratio for a variant of this serving mode."""
    return PUBLISHED[ratio].get(mode, NO_COUNTERPART)


def wan_setting(wan_profile) -> tuple[float | None, float | None]:
    """(base RTT ms, A->B rate Mbit/s) of a WAN profile record (metadata's topology.wan_profile): the RTT is
    both directions' delay_ms, None without a profile or delay; the rate None where it is unlimited (0)."""
    if wan_profile is None:
        return None, None
    delays = [getattr(d, "delay_ms", None) for d in (wan_profile.a_to_b, wan_profile.b_to_a)]
    rtt = sum(delays) if all(d is not None for d in delays) and sum(delays) > 0 else None
    rate = wan_profile.a_to_b.rate_mbit or None
    return rtt, rate


def _span_ms(r: RequestRecord, name: str) -> float | None:
    s = r.spans.get(name)
    return s[1] - s[0] if s else None


def transfer_ms(r: RequestRecord) -> float:
    """The request's WAN copy of its prompt KV (ms); +inf where it never finished."""
    t = _span_ms(r, "wan_kv")
    return math.inf if t is None else t


def rld_gaps(r: RequestRecord) -> list[float]:
    """Gaps between the request's consecutive tokens that the RLD both made (ms)."""
    w, t = r.token_workers, r.token_ms
    return [t[i] - t[i - 1] for i in range(1, len(t)) if w[i].startswith("rld") and w[i - 1].startswith("rld")]


def _ends(ci) -> list[float | None] | None:
    return None if ci is None else [None if math.isinf(x) else float(x) for x in ci]


def median_ratio(name: str, variant: str, mode: str, rows: list[tuple[float, RequestRecord]]) -> SimilarityRatio:
    """The median of per-request values (+inf: a WAN copy that never finished) with Woodruff's interval,
    requests clustered by session."""
    vals = [x for x, _ in rows]
    never = sum(math.isinf(x) for x in vals)
    med = percentile(vals, 50) if vals else None
    ci = None
    if vals:
        s = confidence.Sample(np.asarray(vals, float), np.asarray([r.session for _, r in rows]), np.arange(len(vals)))
        ci = confidence.quantile_interval(s, 50)
    beyond = med is not None and math.isinf(med)
    return SimilarityRatio(
        ratio=name,
        variant=variant,
        value=None if beyond else med,
        ci95=_ends(ci),
        statistic=MEDIAN,
        n=len(vals),
        never_landed=never,
        beyond=beyond,
        published=published(name, mode),
    )


def token_share(variant: str, mode: str, recs: list[RequestRecord]) -> SimilarityRatio:
    """The RLD's share of completed requests' output tokens, with the paired delete-one-session jackknife of
    sum(RLD tokens) / sum(output tokens) (no interval at a share of 0)."""
    ok = [r for r in recs if r.ok and r.output_tokens]
    total = sum(r.output_tokens for r in ok)
    share = sum(r.rld_tokens for r in ok) / total if total else None
    ci = None
    if share:

        def sample(f):
            return confidence.Sample(
                np.asarray([f(r) for r in ok], float), np.asarray([r.session for r in ok]), np.arange(len(ok))
            )

        ci = confidence.ratio_interval(sample(lambda r: r.rld_tokens), sample(lambda r: r.output_tokens), "sum")
    return SimilarityRatio(
        ratio="rld_token_share",
        variant=variant,
        value=share,
        ci95=None if ci is None else [ci[0], min(ci[1], 1.0)],
        statistic="share of completed requests' output tokens",
        n=len(ok),
        published=published("rld_token_share", mode),
    )


def drc_hit(variant: str, mode: str, recs: list[RequestRecord]) -> SimilarityRatio | None:
    """The mean DRC hit over the requests that measured one, with the delete-one-session jackknife."""
    rows = [r for r in recs if r.drc_hit is not None]
    if not rows:
        return None
    s = confidence.Sample(
        np.asarray([r.drc_hit for r in rows], float), np.asarray([r.session for r in rows]), np.arange(len(rows))
    )
    ci = confidence.mean_interval(s)
    return SimilarityRatio(
        ratio="drc_hit",
        variant=variant,
        value=float(s.values.mean()),
        ci95=None if ci is None else [max(ci[0], 0.0), min(ci[1], 1.0)],
        statistic="mean over requests",
        n=len(rows),
        published=published("drc_hit", mode),
    )


def wan_ratios(variant: str, mode: str, recs: list[RequestRecord], rtt_ms, rate_mbit) -> list[SimilarityRatio]:
    """The three ratios of a variant whose requests end at an MD (their prompt KV crosses the WAN)."""
    to_md = [r for r in recs if r.route in ENDS_AT_MD]
    if not to_md:
        return []
    prefill = [(transfer_ms(r) / p, r) for r in to_md if (p := _span_ms(r, "prefill"))]
    out = [median_ratio("kv_transfer_over_prefill", variant, mode, prefill)]
    if rtt_ms:
        tpot = [(rtt_ms / r.tpot_ms, r) for r in recs if r.ok and r.tpot_ms]
        out.append(median_ratio("rtt_over_tpot", variant, mode, tpot))
    if rtt_ms and rate_mbit:
        bdp = rate_mbit * 1e6 / 8 * rtt_ms / 1e3
        sent = [(r.wan_kv_bytes / bdp, r) for r in to_md if r.wan_kv_bytes > 0]
        out.append(median_ratio("kv_bytes_over_bdp", variant, mode, sent))
    return out


def relay_ratio(variant: str, mode: str, recs: list[RequestRecord]) -> SimilarityRatio | None:
    """kv_transfer_over_rld_decode over the requests routed P->RLD->MD (module docstring)."""
    relayed = [r for r in recs if r.route == Route.P_RLD_MD and r.max_tokens > 1]
    pooled = [g for r in relayed for g in rld_gaps(r)]
    if not relayed or not pooled:
        return None
    fallback = median(pooled)
    rows = []
    for r in relayed:
        gaps = rld_gaps(r)
        tpot = sum(gaps) / len(gaps) if gaps else fallback
        if tpot > 0:
            rows.append((transfer_ms(r) / ((r.max_tokens - 1) * tpot), r))
    return median_ratio("kv_transfer_over_rld_decode", variant, mode, rows)


def variant_ratios(variant: str, recs: list[RequestRecord], rtt_ms, rate_mbit) -> list[SimilarityRatio]:
    """Every ratio that applies to one variant's measured, issued requests."""
    mode = recs[0].mode or variant if recs else variant
    out = wan_ratios(variant, mode, recs, rtt_ms, rate_mbit)
    if mode == "pdd":
        pdd = (relay_ratio(variant, mode, recs), token_share(variant, mode, recs), drc_hit(variant, mode, recs))
        out += [x for x in pdd if x is not None]
    return out


def similarity(records: list[RequestRecord], variants: list[str], wan_profile) -> Similarity:
    """summary.json's `similarity`: the run's WAN setting and every ratio per variant where it applies.
    wan_profile: metadata's topology.wan_profile (None: no emulated topology, so no RTT or rate)."""
    rtt_ms, rate_mbit = wan_setting(wan_profile)
    measured = [r for r in records if r.kind != "warmup" and r.issued]
    ratios = [
        x for v in variants for x in variant_ratios(v, [r for r in measured if r.variant == v], rtt_ms, rate_mbit)
    ]
    bdp = rate_mbit * 1e6 / 8 * rtt_ms / 1e3 if rtt_ms and rate_mbit else None
    return Similarity(rtt_ms=rtt_ms, rate_mbit=rate_mbit, bdp_bytes=bdp, ratios=ratios)


def add_to(summary: dict, records: list[RequestRecord], variants: list[str], meta) -> None:
    """Into summary (the analysis' mapping, before it is typed), in place: `similarity` for this run (meta: its
    RunMetadata; the WAN profile from its topology)."""
    wan = meta.topology.wan_profile if meta.topology else None
    summary["similarity"] = similarity(records, variants, wan).model_dump(mode="json")
