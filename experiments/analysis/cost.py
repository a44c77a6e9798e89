"""Hardware cost per hour and BCR (requests meeting the SLA per USD) per variant, over a reference variant.

Responsible for: from a run's resolved spec (metadata.json's spec: its deployment, pools and variant_defs) and
the accelerator catalogue (workers.modelled.catalogue, plus the spec's compute.catalogue), each variant's cost
per hour = sum over the roles its mode uses of workers x devices x the accelerator's price per hour, plus the
cross-site line (compute.line_cost_per_hour) where the mode crosses sites (pd-cross, pdd); its BCR = goodput_rps
x 3600 / cost per hour; each variant's BCR over the reference's (the same-room homogeneous PD: a variant named
pd-intra, else the first of mode pd-intra), its interval the run's goodput comparison's scaled by the cost ratio
(cost is exact); `bcr` comparisons beside the goodput ones, so a sweep aggregates them over repeats
(experiments.analysis.sweep_report); summary.md's "Cost and BCR" table beside the published figures.
Not responsible for: goodput or its interval (experiments.analysis.metrics), the prices (the catalogue).

Under real compute (the small model on this machine) there is no accelerator to price (this-machine's price is
0): cost and BCR are None ("–").
"""

from __future__ import annotations

import math
from pathlib import Path
from experiments.analysis import confidence
from experiments.analysis.summary import Cost, VariantCost

METRIC = "bcr"
# The roles whose workers serve a mode's requests (workers.roles.routing): the hardware it needs.
MODE_ROLES = {"colocated": ("rld",), "pd-intra": ("p", "rld"), "pd-cross": ("p", "md"), "pdd": ("p", "rld", "md")}
LINE_MODES = ("pd-cross", "pdd")  # modes that need the cross-site line
# shared/PDD.md, "Published results": pdd over same-DC homogeneous PD (88 GPUs of type A against 43 A + 32 B +
# a line, B priced 20-30% above A).
PUBLISHED_BCR = 1.375  # "up to +37.5%"
PUBLISHED_GOODPUT = 1.278  # "≈ +27.8%"
PUBLISHED_COST = (1 - 0.071, 1 - 0.035)  # "3.5-7.1% lower"
REAL_NOTE = "real compute: no accelerator is modelled (this-machine's price is 0), so no cost or BCR"


class CostError(ValueError):
    """The spec names an accelerator or catalogue the analysis cannot price; the message names the field."""


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _mode(spec: dict, variant: str) -> str:
    return ((spec.get("variant_defs") or {}).get(variant) or {}).get("mode", variant)


def reference(spec: dict, variants: list[str]) -> str | None:
    """The variant the others' BCR is divided by: pd-intra where it runs, else the first of mode pd-intra."""
    if "pd-intra" in variants:
        return "pd-intra"
    return next((v for v in variants if _mode(spec, v) == "pd-intra"), None)


def variant_cost(spec: dict, variant: str, catalogue=None) -> VariantCost:
    """One variant's cost per hour (USD) from the resolved spec (a mapping: metadata.json's spec); catalogue:
    a workers.modelled.catalogue.Catalogue (None: the shipped one plus the spec's compute.catalogue)."""
    mode = _mode(spec, variant)
    own = (spec.get("variant_defs") or {}).get(variant) or {}
    deployment = _merge(spec.get("deployment") or {}, own.get("deployment") or {})
    compute = deployment.get("compute") or {}
    if compute.get("mode", "real") != "modelled":
        return VariantCost(mode=mode, per_hour=None)
    if catalogue is None:
        from workers.modelled.catalogue import load_catalogue

        extra = compute.get("catalogue")
        catalogue = load_catalogue(*([Path(extra)] if extra else []))
    pools = {r: ((spec.get("pools") or {}).get(r) or {}).get("workers", 1) for r in ("p", "rld", "md")}
    pools.update(own.get("pools") or {})
    workers, total = [], 0.0
    for role in MODE_ROLES.get(mode, ()):
        section = deployment.get(role) or {}
        accel, devices = section.get("accelerator", "this-machine"), int(section.get("devices", 1))
        try:
            price = float(catalogue.accelerator(accel).price_per_hour)
        except Exception as err:  # noqa: BLE001 - the catalogue's own error, named by field
            raise CostError(f"variant {variant}: deployment.{role}.accelerator: {err}") from None
        cost = pools[role] * devices * price
        total += cost
        workers.append(
            {
                "role": role,
                "workers": pools[role],
                "accelerator": accel,
                "devices": devices,
                "price_per_hour": price,
                "cost_per_hour": cost,
            }
        )
    line = float(compute.get("line_cost_per_hour", 0.0)) if mode in LINE_MODES else 0.0
    return VariantCost(mode=mode, per_hour=total + line, workers=workers, line_per_hour=line)


def bcr(goodput_rps: float | None, per_hour: float | None) -> float | None:
    """Requests meeting the SLA per USD: goodput (requests/s) x 3600 / cost (USD/h); None where either is
    missing or the cost is 0."""
    if goodput_rps is None or not per_hour:
        return None
    return goodput_rps * 3600.0 / per_hour


def _goodput_comparison(comparisons: list[dict], variant: str, base: str) -> tuple[float, list[float] | None] | None:
    """goodput(variant) / goodput(base) and its interval from the run's comparisons (either direction)."""
    for c in comparisons:
        if c.get("metric") != "goodput_rps" or c.get("ratio") is None:
            continue
        if (c["variant"], c["baseline"]) == (variant, base):
            return c["ratio"], c.get("ci95")
        if (c["variant"], c["baseline"]) == (base, variant) and c["ratio"] > 0:
            ci = c.get("ci95")
            inv = [1 / ci[1] if ci[1] else math.inf, 1 / ci[0] if ci[0] else math.inf] if ci else None
            return 1 / c["ratio"], inv
    return None


def bcr_ratio(
    goodput_ratio: float, goodput_ci: list[float] | None, cost: float, base_cost: float
) -> tuple[float, list[float] | None]:
    """BCR(variant) / BCR(base) = goodput ratio x base cost / cost; the interval scaled alike (cost is exact)."""
    k = base_cost / cost
    return goodput_ratio * k, [end * k for end in goodput_ci] if goodput_ci else None


def cost_section(summary: dict, spec: dict, variants: list[str], catalogue=None) -> Cost:
    """The cost section of a summary (the analysis' mapping: its variants' goodput_rps and its comparisons)."""
    costs = {v: variant_cost(spec, v, catalogue) for v in variants}
    ref = reference(spec, variants)
    comps = summary.get("comparisons") or []
    for v, c in costs.items():
        c.goodput_rps = (summary["variants"].get(v) or {}).get("goodput_rps")
        c.bcr = bcr(c.goodput_rps, c.per_hour)
    base = costs.get(ref) if ref else None
    for v, c in costs.items():
        if v == ref or base is None or not c.per_hour or not base.per_hour:
            continue
        g = _goodput_comparison(comps, v, ref)
        if g is not None:
            c.over_reference, c.over_reference_ci95 = bcr_ratio(g[0], g[1], c.per_hour, base.per_hour)
        elif c.bcr is not None and base.bcr:
            c.over_reference = c.bcr / base.bcr
    real = all(c.per_hour is None for c in costs.values())
    return Cost(reference=ref, variants=costs, note=REAL_NOTE if real else None)


def bcr_comparisons(summary: dict, cost: Cost) -> list[dict]:
    """A `bcr` comparison beside each goodput comparison whose two variants both have a cost: the goodput ratio
    and interval scaled by the cost ratio, its verdict, scope and caveat carried over."""
    out = []
    for c in summary.get("comparisons") or []:
        a, b = cost.variants.get(c.get("variant")), cost.variants.get(c.get("baseline"))
        if c.get("metric") != "goodput_rps" or c.get("ratio") is None or not a or not b:
            continue
        if not a.per_hour or not b.per_hour:
            continue
        ratio, ci = bcr_ratio(c["ratio"], c.get("ci95"), a.per_hour, b.per_hour)
        out.append({**c, "metric": METRIC, "ratio": ratio, "ci95": ci, "verdict": confidence.verdict(ci)})
    return out


def add_to(summary: dict, meta) -> None:
    """Into summary (the analysis' mapping, before it is typed), in place: `cost` for this run, and the `bcr`
    comparisons (meta: its RunMetadata; the resolved spec in meta.spec)."""
    spec = meta.spec.model_dump() if hasattr(meta.spec, "model_dump") else dict(meta.spec)
    cost = cost_section(summary, spec, list(summary["variants"]))
    summary["cost"] = cost.model_dump(mode="json")
    summary["comparisons"] = list(summary.get("comparisons") or []) + bcr_comparisons(summary, cost)


def _money(x: float | None) -> str:
    return "–" if x is None else f"{x:,.2f}"


def _ratio_cell(ratio: float | None, ci: list[float] | None) -> str:
    if ratio is None:
        return "–"
    ends = f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""
    return f"{ratio:.2f}{ends} ({100 * (ratio - 1):+.1f}%)"


def markdown_section(cost: Cost | None) -> list[str]:
    """summary.md's "Cost and BCR" table: per variant its hardware, cost per hour, goodput, BCR and BCR over the
    reference's, beside the published figures."""
    if cost is None:
        return []
    lines = ["## Cost and BCR", ""]
    if cost.note:
        return [*lines, cost.note + ".", ""]
    ref = cost.reference or "none"
    lines += [
        f"| variant | mode | hardware | line USD/h | USD/h | goodput rps | BCR (req/USD) | BCR ÷ {ref}'s | "
        f"cost ÷ {ref}'s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    base = cost.variants.get(cost.reference) if cost.reference else None
    for v, c in cost.variants.items():
        hw = ", ".join(f"{w['role']} {w['workers']}×{w['devices']} {w['accelerator']}" for w in c.workers) or "–"
        over = "1 (reference)" if v == cost.reference else _ratio_cell(c.over_reference, c.over_reference_ci95)
        rel = (
            f"{c.per_hour / base.per_hour:.3f}"
            if base is not None and base.per_hour and c.per_hour is not None
            else "–"
        )
        gp = "–" if c.goodput_rps is None else f"{c.goodput_rps:.3f}"
        bc = "–" if c.bcr is None else f"{c.bcr:,.1f}"
        lines.append(
            f"| {v} | {c.mode} | {hw} | {_money(c.line_per_hour)} | {_money(c.per_hour)} | {gp} | {bc} | {over} | "
            f"{rel} |"
        )
    lines += [
        "",
        f"Published (PDD.md) for pdd over same-DC homogeneous PD: BCR {PUBLISHED_BCR:.3f} (+37.5%), goodput "
        f"{PUBLISHED_GOODPUT:.3f} (+27.8%), cost {PUBLISHED_COST[0]:.3f}-{PUBLISHED_COST[1]:.3f} (3.5-7.1% "
        "lower: 43 type-A + 32 type-B GPUs and a line against 88 type-A). BCR: requests meeting the SLA per USD "
        "of hardware (prices: the accelerator catalogue's assumptions); its interval is the goodput "
        "comparison's (sessions resampled) scaled by the exact cost ratio.",
        "",
    ]
    return lines
