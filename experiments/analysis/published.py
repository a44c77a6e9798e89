"""Beside the published figures: each of shared/PDD.md's figures against this run's value (pure functions).

Responsible for: for a run whose spec asks for it (EXP=pdd-published: SPECS), the side-by-side table of the
published figures (naive cross-DC TTFT p50 / p90 / p99 and the same-room p50 it grew from, the cross-cluster KV
transfer time's range, the WAN-traffic reduction at ~90% hit, the RLD's token share, the 100-token handoff's
KV payload, token-ID payload and latency mean / max / std) and this run's value of each, read from the summary
alone: its 95% interval where the summary has one (experiments.analysis.confidence made them: a percentile's,
a mean's, a comparison's, a similarity ratio's), the ratio this run / published, and a flag where they differ
by more than 2x (a range: where the value lies outside half its low end to twice its high end), with the usual
reason; `add_to` keeps the rows in summary.json (`published`), `markdown_section` renders them.
Not responsible for: computing any statistic or interval (experiments.analysis.metrics, similarity) or the
published deployment's similarity ratios (experiments.analysis.similarity).

Variants are found by mode (a variant named after the mode, else the first defined with it): the naive cross-DC
PD is pd-cross, the same-room PD pd-intra, PDD pdd.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from experiments.analysis.formats import num as _f

SPECS = ("pdd-published",)  # the specs whose summary gets the table
OFF_FACTOR = 2.0  # a value this many times off the published one (either way) is flagged


@dataclass(frozen=True)
class Row:
    """One published figure beside this run's.

    figure: what it is; published: its value (low, high: a range); unit: of both ("ms", "KB", "x", "%");
    variant: the variant measured (None: a figure of the modelled architecture); value, ci95: this run's and
    its 95% interval (None: none in the summary); ratio: value / published (a range: None); off: more than
    OFF_FACTOR away; note: what this run's value is, and where off, why it usually is"""

    figure: str
    published: tuple[float, float]
    unit: str
    variant: str | None
    value: float | None
    ci95: list[float | None] | None
    ratio: float | None
    off: bool | None
    note: str


def wanted(meta) -> bool:
    """Whether the run's spec asks for the table (its name is one of SPECS)."""
    return getattr(meta, "experiment", None) in SPECS


def _mode(spec: dict, variant: str) -> str:
    return ((spec.get("variant_defs") or {}).get(variant) or {}).get("mode", variant)


def variant_of(spec: dict, variants: list[str], mode: str) -> str | None:
    """The variant that runs mode: the one of its name, else the first defined with it; None where none does."""
    if mode in variants:
        return mode
    return next((v for v in variants if _mode(spec, v) == mode), None)


def _row(figure, published, unit, variant, value, ci, note, why) -> Row:
    """A Row with its ratio and flag: a point figure's ratio, a range's 'outside [low / 2, high x 2]'."""
    lo, hi = published
    ratio = value / lo if value is not None and lo == hi and lo else None
    off = None if value is None else not (lo / OFF_FACTOR <= value <= hi * OFF_FACTOR)
    return Row(
        figure,
        published,
        unit,
        variant,
        value,
        _ci(ci),
        ratio,
        off,
        " ".join(x for x in (note, why if off else "") if x),
    )


def _ci(ci) -> list[float | None] | None:
    return list(ci) if ci else None


def _stat(per: dict, v: str | None, metric: str, key: str) -> tuple[float | None, Any]:
    """(value, its ci95) of variants.<v>.<metric>.<key>; a percentile on failed requests: (None, None)."""
    st = (per.get(v) or {}).get(metric) or {}
    if key in (st.get("beyond_completed") or ()):
        return None, None
    return st.get(key), (st.get("ci95") or {}).get(key)


INTRA_WHY = (
    "The published TTFT holds the prefill queue of a loaded production cluster; here a few requests meet two "
    "modelled P workers that barely queue, so TTFT is about the roofline's prefill of the prompt."
)
TTFT_WHY = (
    "Across sites TTFT is the prefill plus the whole KV's wait for the line, whose queue the line's load sets: "
    "this run's arrival rate (workload.mooncake.time_scale) against the line, not the published traffic."
)
TRANSFER_WHY = "Transfer times follow the line's load and each request's uncached KV: this run's few requests."
HIT_WHY = "The reduction is 1 / (1 - hit) at best: this run's DRC hit, not the published ~90%, sets it."
SHARE_WHY = (
    "The RLD's share is the tokens it decodes before the MD's copy lands: the KV transfer time over the decode "
    "time of a request (the published figure is at 64K length, 1K output, 90% hit)."
)
HANDOFF_WHY = (
    "The published microbenchmark hands off exactly 100 tokens on its GPUs; here the handed tokens vary and the "
    "MD's extend is the roofline's time, with one WAN round trip in the latency."
)


def _ttft_rows(per: dict, naive: str | None, intra: str | None) -> list[Row]:
    rows = [_row("same-room PD TTFT p50", (4200, 4200), "ms", intra, *_stat(per, intra, "ttft_ms", "p50"),
                 "the published deployment before decode moved to another city.", INTRA_WHY)]  # fmt: skip
    for key, pub in (("p50", 6700), ("p90", 18300), ("p99", 29700)):
        value, ci = _stat(per, naive, "ttft_ms", key)
        failed = key in (((per.get(naive) or {}).get("ttft_ms") or {}).get("beyond_completed") or ())
        note = "lands on requests that did not complete (no value)." if failed else ""
        rows.append(_row(f"naive cross-DC TTFT {key}", (pub, pub), "ms", naive, value, ci, note, TTFT_WHY))
    return rows


def _transfer_rows(per: dict, naive: str | None, pdd: str | None) -> list[Row]:
    wan = lambda v: (((per.get(v) or {}).get("kv_paths") or {}).get("wan") or {}).get("time_ms") or {}  # noqa: E731
    t = wan(naive)
    rows = [
        _row("naive cross-DC KV transfer p50, of 1-20 s", (1000, 20000), "ms", naive, t.get("p50"),
             (t.get("ci95") or {}).get("p50"), "completed WAN KV transfers, start to end.", TRANSFER_WHY),
        _row("naive cross-DC KV transfer max, of 1-20 s", (1000, 20000), "ms", naive, t.get("max"), None,
             "the slowest completed transfer.", TRANSFER_WHY),
    ]  # fmt: skip
    t = wan(pdd)
    p50, ci = t.get("p50"), (t.get("ci95") or {}).get("p50")
    figure = "pdd WAN KV transfer p50 (≈1 s: high hits skew it small)"
    rows.append(_row(figure, (1000, 1000), "ms", pdd, p50, ci, "its uncached suffixes only.", TRANSFER_WHY))
    return rows


def _reduction_row(summary: dict, per: dict, naive: str | None, pdd: str | None) -> Row:
    """pd-cross's WAN KV bytes over pdd's: the inverse of the wan_bytes_offered comparison with its interval,
    else (no capture) the application's own totals, without one."""
    comp = next((c for c in summary.get("comparisons") or [] if c.get("metric") == "wan_bytes_offered"
                 and c.get("variant") == pdd and c.get("baseline") == naive and c.get("ratio")), None)  # fmt: skip
    value, ci, basis = None, None, "WAN KV bytes offered (capture), naive cross-DC over pdd"
    if comp is not None:
        value = 1 / comp["ratio"]
        ci = [1 / comp["ci95"][1], 1 / comp["ci95"][0]] if comp.get("ci95") and all(comp["ci95"]) else None
    elif naive in per and pdd in per and per[pdd].get("wan_kv_bytes_total"):
        value = per[naive]["wan_kv_bytes_total"] / per[pdd]["wan_kv_bytes_total"]
        basis = "delivered WAN KV bytes (no capture, no interval), naive cross-DC over pdd"
    hits = (per.get(pdd) or {}).get("hit_rate") or {}
    drc = hits.get("drc_mean")
    note = f"{basis}; pdd's DRC hit {_f(100 * drc, 1)}%." if drc is not None else f"{basis}."
    return _row("WAN-traffic reduction at ~90% hit (up to 10x)", (10, 10), "x", pdd, value, ci, note, HIT_WHY)


def _share_row(summary: dict, per: dict, pdd: str | None) -> Row:
    sim = ((summary.get("similarity") or {}).get("ratios")) or []
    r = next((r for r in sim if r.get("variant") == pdd and r.get("ratio") == "rld_token_share"), None)
    value = r["value"] if r else (per.get(pdd) or {}).get("rld_token_share")
    ci = r.get("ci95") if r else None
    pct = lambda x: None if x is None else 100 * x  # noqa: E731
    return _row("RLD token share", (6.2, 6.2), "%", pdd, pct(value), [pct(x) for x in ci] if ci else None,
                "of pdd's output tokens.", SHARE_WHY)  # fmt: skip


def _handoff_rows(per: dict, pdd: str | None, kv_bytes_per_token: int | None) -> list[Row]:
    h = (per.get(pdd) or {}).get("handoff") or {}
    lat, pay, toks = h.get("latency_ms") or {}, h.get("payload_bytes") or {}, h.get("tokens") or {}
    ids_kb = pay["mean"] / toks["mean"] * 100 / 1e3 if pay.get("mean") and toks.get("mean") else None
    kv_kb = kv_bytes_per_token * 100 / 1e3 if kv_bytes_per_token else None
    tokens = f"{h.get('count', 0)} handoffs, {_f(toks.get('p50'))} tokens p50"
    return [
        _row("100-token handoff: KV payload", (4649, 4649), "KB", None, kv_kb, None,
             "the modelled architecture's KV of 100 tokens (unscaled); the IDs are sent instead.",
             "The published model's KV is ~46.5 KB a token; this architecture's differs."),
        _row("100-token handoff: token-ID payload", (1.5, 1.5), "KB", pdd, ids_kb, None,
             f"mean payload per token x 100 ({tokens}).", HANDOFF_WHY),
        _row("handoff by token IDs: latency mean", (305, 305), "ms", pdd, lat.get("mean"),
             (lat.get("ci95") or {}).get("mean"), f"RLD's handoff start to the MD's reply ({tokens}).", HANDOFF_WHY),
        _row("handoff by token IDs: latency max", (321.4, 321.4), "ms", pdd, lat.get("max"), None, "", HANDOFF_WHY),
        _row("handoff by token IDs: latency std", (4.8, 4.8), "ms", pdd, lat.get("std"), None,
             "over this run's handoffs.", HANDOFF_WHY),
    ]  # fmt: skip


def rows(summary: dict, spec: dict, kv_bytes_per_token: int | None = None) -> list[Row]:
    """Every published figure beside this run's (summary: the analysis' mapping, or summary.json as data;
    spec: the resolved spec as a mapping; kv_bytes_per_token: the modelled architecture's, unscaled)."""
    per, variants = summary["variants"], list(summary["variants"])
    naive, intra, pdd = (variant_of(spec, variants, m) for m in ("pd-cross", "pd-intra", "pdd"))
    return [
        *_ttft_rows(per, naive, intra),
        *_transfer_rows(per, naive, pdd),
        _reduction_row(summary, per, naive, pdd),
        _share_row(summary, per, pdd),
        *_handoff_rows(per, pdd, kv_bytes_per_token),
    ]


def arch_kv_bytes_per_token(spec: dict) -> int | None:
    """The modelled architecture's KV bytes a token (unscaled; None under real compute or an unknown arch)."""
    compute = (spec.get("deployment") or {}).get("compute") or {}
    if compute.get("mode") != "modelled" or not compute.get("arch"):
        return None
    from pathlib import Path

    from workers.modelled.catalogue import load_catalogue

    try:
        extra = compute.get("catalogue")
        return load_catalogue(*([Path(extra)] if extra else [])).model(compute["arch"]).kv_bytes_per_token
    except Exception:  # noqa: BLE001 - the spec was validated when it ran; a catalogue gone since: no figure
        return None


def add_to(summary: dict, meta) -> None:
    """Into summary (the analysis' mapping), in place: published = {rows: [...]} where the run's spec asks for the
    table (wanted); nothing otherwise."""
    if not wanted(meta):
        return
    spec = meta.spec.model_dump() if hasattr(meta.spec, "model_dump") else dict(meta.spec)
    table = rows(summary, spec, arch_kv_bytes_per_token(spec))
    summary["published"] = {"rows": [asdict(r) for r in table]}


def _cell(x: float | None, unit: str) -> str:
    return "–" if x is None else _f(x, 1 if unit in ("x", "%", "KB") or abs(x) < 100 else 0)


def _published_cell(r: dict) -> str:
    lo, hi = r["published"]
    return _cell(lo, r["unit"]) if lo == hi else f"{_cell(lo, r['unit'])}-{_cell(hi, r['unit'])}"


def markdown_section(published: dict | None) -> list[str]:
    """summary.md's "Beside the published figures" (published: summary.json's `published`)."""
    if not published or not published.get("rows"):
        return []
    lines = [
        "",
        "## Beside the published figures (shared/PDD.md)",
        "",
        "| figure | variant | this run [95% interval] | published | this run / published | note |",
        "|---|---|---|---|---|---|",
    ]
    for r in published["rows"]:
        u, ci = r["unit"], r["ci95"]
        ends = f" [{_cell(ci[0], u)}, {_cell(ci[1], u)}]" if ci else ""
        ratio = "–" if r["ratio"] is None else f"{r['ratio']:.2f}×"
        flag = " **off > 2×**" if r["off"] else ""
        lines.append(
            f"| {r['figure']} ({u}) | {r['variant'] or 'architecture'} | {_cell(r['value'], u)}{ends} | "
            f"{_published_cell(r)} | {ratio}{flag} | {r['note'] or ''} |"
        )
    off = sum(1 for r in published["rows"] if r["off"])
    return lines + [
        "",
        f"{off} of {len(published['rows'])} figures differ from the published ones by more than 2× (a range: this "
        "run's value outside half its low end to twice its high end); their note says why such a figure usually "
        "does. Intervals: the summary's own (a percentile's or a mean's over sessions, a comparison's, the "
        "similarity's token share); '–': none (a maximum, a figure of the architecture, or too few values). The "
        "published figures come from a deployment of hundreds of GPUs under production traffic; this run's from "
        "a few modelled workers on an emulated, scaled line: read the table for orders of magnitude.",
    ]
