"""summary.md's PDD sections: the handoffs (by variant, and by mode where modes interleave), the PDD bullet list,
the warm-up's settle, why the MD took little over where it did, and the similarity to the published deployment
(pure functions over summary.json's data).

Not responsible for: the other sections of summary.md (experiments.analysis.summary_md) or any figure.
"""

from __future__ import annotations

import math

from experiments.analysis.formats import num as _f, pct as _pct, ratio_end as _ratio_end, size as _mb
from experiments.analysis.summary import SIMILARITY_RATIOS, Published, Similarity, SimilarityRatio
from experiments.rundir.metadata import RunMetadata

PUBLISHED_HANDOFF = (
    "published (100 tokens over the WAN): KV 4649 KB, mean 185 ms, peaks 512.6 ms; token IDs + recompute "
    "1.5 KB, mean 305 ms, max 321.4 ms, std 4.8 ms"
)
IDS_MODES = ("oneshot", "chunked", "auto:oneshot", "auto:chunked")  # handoffs by token IDs


def _handoff_section(per: dict) -> list[str]:
    """Per variant with handoffs: their latency distribution (RLD's handoff start to the MD's reply), what
    the MD spent absorbing them (extend, or KV import), payload, and the KV transfer of `kv` handoffs; with
    an IDs variant and a KV variant side by side, std(IDs) / std(KV)."""
    rows = [(v, s["handoff"]) for v, s in per.items() if (s.get("handoff") or {}).get("count")]
    if not rows:
        return []
    lines = [
        "",
        "## Handoffs by variant",
        "",
        "| variant | modes | count | tokens p50 | payload mean | latency mean / std / p50 / p99 / max ms | "
        "MD absorb mean ms | handoff KV transfer p50 ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for v, h in rows:
        lat, kv = h["latency_ms"], (per[v].get("kv_paths") or {}).get("handoff") or {}
        lines.append(
            f"| {v} | {', '.join(f'{m}: {n}' for m, n in h['modes'].items())} | {h['count']} | "
            f"{_f(h['tokens'].get('p50'))} | {_mb(h['payload_bytes'].get('mean'))} | {_f(lat.get('mean'), 1)} / "
            f"{_f(lat.get('std'), 1)} / {_f(lat.get('p50'), 1)} / {_f(lat.get('p99'), 1)} / "
            f"{_f(lat.get('max'), 1)} | {_f(h['extend_ms'].get('mean'), 1)} | "
            f"{_f((kv.get('time_ms') or {}).get('p50'), 1)} |"
        )
    lines += [
        "",
        "latency: the RLD's handoff start (before a KV export) to the MD's reply, so one WAN round trip is in "
        "it; MD absorb: the MD's extend of the handed IDs, or its wait for and import of their KV; tokens: "
        "IDs sent, P's token included (the overlap the MD checks). " + PUBLISHED_HANDOFF + ".",
    ]
    ratio = std_ratio(per)
    if ratio is not None:
        lines.append(f"- std(IDs) / std(KV) of the handoff latency: {ratio:.2f} (below 1: IDs are the steadier)")
    return lines + _handoff_modes_section(per)


def _handoff_modes_section(per: dict) -> list[str]:
    """Per variant and handoff mode (modes interleaved in one window where the spec asks): the handoffs planned,
    finished and censored, and the time from the RLD's decision to the MD ready, with the std's interval; the
    std ratio of IDs over KV with its interval."""
    rows = [(v, m, b) for v, s in per.items() for m, b in ((s.get("handoff") or {}).get("by_mode") or {}).items()]
    if not rows:
        return []
    lines = [
        "",
        "### Handoffs by mode: decision to MD ready",
        "",
        "| variant | mode | planned | finished | censored | ready mean / p50 / p99 ms | ready std ms [95%] |",
        "|---|---|---|---|---|---|---|",
    ]
    for v, m, b in rows:
        r, ci = b["ready_ms"], b.get("std_ci95")
        std = f"{_f(r.get('std'), 1)}" + (f" [{_f(ci[0], 1)}, {_f(ci[1], 1)}]" if ci else " (too few)")
        lines.append(
            f"| {v} | {m} | {b['planned']} | {b['finished']} | {b['censored']} ({_pct(b['censored_share'])}) | "
            f"{_f(r.get('mean'), 1)} / {_f(r.get('p50'), 1)} / {_f(r.get('p99'), 1)} | {std} |"
        )
    for v, s in per.items():
        sr = (s.get("handoff") or {}).get("std_ratio")
        if sr:
            ci = sr.get("ci95")
            ends = f" [{_ratio_end(ci[0])}, {_ratio_end(ci[1])}]" if ci else ""
            lines.append(f"- {v}: std({sr['ids_mode']}) / std(kv) of ready: {sr['ratio']:.2f}{ends}")
    lines += [
        "",
        "ready: from the RLD's decision to hand off (before any KV export) to the MD's handoff_recv_end (after its "
        "extend or KV import), the same two points for every mode on the host's one clock. Censored: handoffs "
        "planned (P->RLD->MD) that never finished (failed, the MD never ready, the RLD done first): their time is "
        "unknown and would be the longest, so a mode with many censored handoffs looks steadier than it is. std "
        "intervals: delete-one jackknife of log(std), t (a std's interval from a skewed sample runs short: ~90% "
        "measured for lognormal latencies).",
    ]
    return lines


def std_ratio(per: dict) -> float | None:
    """std of handoff latency in the variant handing off only by IDs over the one handing off only by KV
    (the first of each), None without both."""

    def pick(kv: bool):
        for s in per.values():
            h = s.get("handoff") or {}
            modes = set(h.get("modes") or {})
            if h.get("count", 0) > 1 and modes and (modes == {"kv"} if kv else modes <= set(IDS_MODES)):
                return h["latency_ms"].get("std")
        return None

    ids, kv = pick(False), pick(True)
    return ids / kv if ids is not None and kv else None


def _pdd_section(p: dict | None, summary: dict) -> list[str]:
    if not p:
        return []
    h, hr = p["handoff"], p["hit_rate"]
    return [
        "",
        "## PDD",
        "",
        f"- routes: {p['routes']}",
        f"- DRC hit: mean {_f(100 * hr.get('drc_mean', math.nan), 1)}%, token-weighted "
        f"{_f(100 * hr.get('drc_token_weighted', math.nan), 1)}%, above 95%: "
        f"{_f(100 * hr.get('drc_share_above_95', math.nan), 0)}% of requests",
        f"- RLD token share: {_pct(p['rld_token_share'])} (MD {_pct(p['md_token_share'])})",
        f"- handoffs: {h['count']} ({h['modes']}); latency mean {_f(h['latency_ms'].get('mean'), 1)} ms, "
        f"max {_f(h['latency_ms'].get('max'), 1)} ms; payload mean {_f(h['payload_bytes'].get('mean'))} B; "
        f"extend mean {_f(h['extend_ms'].get('mean'), 1)} ms; largest gap around it p50 "
        f"{_f(h['gap_ms'].get('p50'))} ms, max {_f(h['gap_ms'].get('max'))} ms",
        f"- singular requests: {p['singular']['count']}, WAN bytes saved {_mb(p['singular']['kv_bytes_saved'])}",
        *_md_cache_lines(p),
        f"- fallbacks: {p['fallbacks'] or 'none'}",
        _uncached_line(summary["reference"]),
        *_why_few_handoffs(p),
    ]


def _settle_lines(meta: RunMetadata) -> list[str]:
    """Per variant whose warm-up crossed the WAN: how long its clock waited for the prefix in an MD's DRC."""
    waits = [(v, w.warmup_settle) for v, w in meta.variants.items() if w.warmup_settle is not None]
    if not waits:
        return []
    return ["", "Warm-up before each variant's clock (its prompt's whole blocks in an MD's DRC):", ""] + [
        f"- {v}: "
        + (
            f"in the DRC {ws.wait_s:.1f} s after the warm-up's reply"
            if ws.ok
            else f"NOT in the DRC after {ws.wait_s:.1f} s (settle timeout; {ws.cached_tokens} of "
            f"{ws.want_tokens} tokens): the window's first turns waited on its copy"
        )
        for v, ws in waits
    ]


def _md_cache_lines(p: dict) -> list[str]:
    """The MD's in-flight DRC and the RLD outputs it recomputed (absent from summaries made before them)."""
    inf = p.get("inflight")
    if inf is None:
        return []
    return [
        f"- in-flight DRC: {inf['requests']} requests shipped only what lies beyond an earlier turn's WAN copy "
        f"still under way ({inf['tokens_not_resent']} prompt tokens not sent again); {inf['prefix_lost']} lost "
        "that prefix (the earlier session ended without caching it) and completed on the RLD",
        f"- RLD outputs recomputed at the MD (the RLD finished alone; the MD's DRC keeps prompt + output): "
        f"{p.get('relay_absorbed', 0)}",
    ]


def _why_few_handoffs(p: dict) -> list[str]:
    """Where the MD took little over, the reason in numbers: how often its copy came too late, how long the
    WAN copies took against the requests, how many were still under way when the variant ended."""
    late = sum(n for cause, n in (p.get("fallbacks") or {}).items() if cause == "completed_on_rld:md_never_ready")
    wan = (p.get("kv_paths") or {}).get("wan") or {}
    if (p["md_token_share"] or 0) >= 0.5 or not late:
        return []
    return [
        f"- why the MD took little over: its copy of the prompt KV came after the RLD had finished in {late} of "
        f"{p['requests']} requests (completed_on_rld: md_never_ready); WAN KV transfers p50 "
        f"{_f((wan.get('time_ms') or {}).get('p50'))} ms against a request E2E p50 of {_f(p['e2e_ms'].get('p50'))} "
        f"ms; {wan.get('ok', 0)} of {wan.get('transfers', 0)} WAN transfers completed, {wan.get('cancelled', 0)} "
        f"were cancelled (by their request's end, or still under way when the variant's roles stopped) and "
        f"{wan.get('unfinished', 0)} never ended"
        + (
            f"; {(p.get('inflight') or {}).get('requests', 0)} of the MD's sessions could open only once an earlier "
            "turn's copy had landed (in-flight DRC)"
            if (p.get("inflight") or {}).get("requests")
            else ""
        )
    ]


BOUND_OF_FACTOR = {"≥": "≤ ", "≤": "≥ ", "≈": ""}  # a published lower bound makes the factor an upper bound


def _g(x: float | None) -> str:
    """A ratio with three significant digits; "∞" for an interval's end on transfers that never landed."""
    return "∞" if x is None else f"{x:.3g}"


def _this_run(r: SimilarityRatio) -> str:
    if r.beyond:
        return f"never landed ({r.never_landed} of {r.n})"
    if r.value is None:
        return "–"
    out = _g(r.value) + (f" [{_g(r.ci95[0])}, {_g(r.ci95[1])}]" if r.ci95 else " (too few)")
    return out + (f" · {r.never_landed} never landed" if r.never_landed else "")


def _published(p: Published) -> str:
    if p.value is None:
        return "not published" if p.basis.startswith("not published") else "–"
    return f"{'' if p.relation == '≈' else p.relation + ' '}{_g(p.value)}"


def _uncached_line(ref: dict) -> str:
    """The median uncached suffix and its time on the WAN at the profile's rate; a line with no fixed rate (a
    rate trace, or unlimited) has no such time."""
    tokens = f"- median uncached suffix {_f(ref['median_uncached_tokens'])} tokens"
    if not ref.get("wan_rate_mbit"):
        return f"{tokens} (no fixed WAN rate: a rate trace or an unlimited line)"
    return (
        f"{tokens} = {_f(ref['wan_estimate_ms_median_uncached'], 1)} ms on the WAN at {ref['wan_rate_mbit']:g} Mbit/s"
    )


def _factor(r: SimilarityRatio) -> str:
    """This run's value over the published one ("–" where either is missing or zero)."""
    if r.value is None or not r.published.value:
        return "–"
    return f"{BOUND_OF_FACTOR.get(r.published.relation, '')}{r.value / r.published.value:.3g}×"


def similarity_section(sim: Similarity | None) -> list[str]:
    """The table "Similarity to the published deployment": each ratio per variant with its interval, beside the
    published deployment's value and how far this run is from it; the published values' bases below."""
    if sim is None or not sim.ratios:
        return []
    bdp = f"{sim.bdp_bytes / 1e6:,.2f} MB" if sim.bdp_bytes is not None else "–"
    lines = [
        "",
        "## Similarity to the published deployment",
        "",
        f"WAN profile: base RTT {_f(sim.rtt_ms, 1)} ms (both directions' delay), line {_f(sim.rate_mbit)} Mbit/s, "
        f"bandwidth-delay product {bdp}.",
        "",
        "| ratio | variant | this run [95%] | published | this run ÷ published | requests |",
        "|---|---|---|---|---|---|",
    ]
    for r in sim.ratios:
        lines.append(
            f"| {SIMILARITY_RATIOS.get(r.ratio, r.ratio)} | {r.variant} | {_this_run(r)} | {_published(r.published)} "
            f"| {_factor(r)} | {r.n} |"
        )
    lines += [
        "",
        "Per request, then the median over the variant's requests (the share and the hit: over its tokens and "
        "requests); intervals resample sessions (experiments/analysis/similarity.py). WAN KV transfer: P's "
        "kv_send_start to kv_send_end of the prompt's copy to the MD, a copy that never landed (cancelled when "
        "the RLD finished first, failed) ranked longest; prefill: P's prefill_arrival to prefill_done; RLD decode "
        "time: (max tokens − 1) × the RLD's TPOT for the request; above 1 the RLD finishes before the MD holds "
        "the KV and no handoff happens. The published column is derived from shared/PDD.md's figures (pdd: PDD; "
        "pd-cross: the naive cross-DC PD); ≥ / ≤: a published figure bounds a term, so the value is a bound. "
        "Published bases:",
    ]
    seen = {}
    for r in sim.ratios:
        if r.published.value is not None or r.published.basis.startswith("not published"):
            seen.setdefault((r.ratio, r.published.basis), f"{SIMILARITY_RATIOS.get(r.ratio, r.ratio)}, {r.variant}")
    lines += [f"- {who}: {basis}" for (_, basis), who in seen.items()]
    return lines
