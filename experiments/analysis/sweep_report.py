"""A sweep's numbers and sweep.md: its points aggregated across repeats (pure functions over sweep.json data).

Responsible for: the main metrics read from each point's summary.json, per
grid point and variant the mean over every repeat that has a summary (complete
or not: a repeat that lost requests counts, its latencies with the failures
ranked worst; one without a summary is listed, never silently left out) with
its 95% interval (Student's t over the repeats; with one repeat, the run's own
interval), pdd's ratios to each baseline as the geometric mean over repeats
(t on the log scale: no bound below zero), the within-run verdicts tallied over
the repeats (an A/A sweep's false-positive rate), the per-point overhead
(measured windows, role start, the rest, shared topologies), and sweep.md.
Not responsible for: planning or running the points (experiments.run.sweep), or
the plots (experiments.analysis.plots.sweep_plots).
"""

from __future__ import annotations

import math
from typing import Any

from experiments.analysis import confidence
from experiments.analysis.cost import METRIC, PUBLISHED_BCR, PUBLISHED_GOODPUT

# Points and plans are experiments.run.sweep's Point and Plan, read by attribute here (that module imports this
# one): Point = index, values, status, metrics, comparisons, wall_s, overhead, topology, name, error.
Point = Plan = Any


# The main metrics of a point and variant, read from the run's summary.json: name -> (path, ci path or None).
METRICS: dict[str, tuple[str, ...]] = {
    "ttft_p50_ms": ("ttft_ms", "p50"),
    "ttft_p90_ms": ("ttft_ms", "p90"),
    "tpot_p50_ms": ("tpot_ms", "p50"),
    "e2e_p50_ms": ("e2e_ms", "p50"),
    "goodput_rps": ("goodput_rps",),
    "completed": ("completed",),
    "wan_bytes_offered": ("wan_bytes_offered",),
    "rld_token_share": ("rld_token_share",),
    "fallbacks": ("fallbacks",),
    "wan_kv_retrans_bytes": ("wan_bytes", "bytes_retrans"),
    "handoffs": ("handoff", "count"),
    "handoff_mean_ms": ("handoff", "latency_ms", "mean"),
    "handoff_std_ms": ("handoff", "latency_ms", "std"),
    "handoff_p99_ms": ("handoff", "latency_ms", "p99"),
    "lone_tail_share": ("prefill_steps", "lone_tail_share"),
}
PLOTTED = (
    "ttft_p50_ms",
    "ttft_p90_ms",
    "tpot_p50_ms",
    "goodput_rps",
    "wan_bytes_offered",
    "rld_token_share",
    "fallbacks",
    "wan_kv_retrans_bytes",
    "handoff_mean_ms",
    "handoff_std_ms",
    "lone_tail_share",
)
RATIOS_PLOTTED = ("goodput_rps",)  # the subject's ratio to each baseline, against the swept value (the bathtub)


def point_metrics(s: dict) -> dict:
    """The main metrics of one variant's summary, each {value, ci95 (within the run, where it has one)}."""
    out = {}
    for name, path in METRICS.items():
        node: Any = s
        for k in path[:-1]:
            node = (node or {}).get(k) or {}
        value = node.get(path[-1]) if isinstance(node, dict) else None
        if name == "fallbacks":
            value = sum((value or {}).values())
        ci = (node.get("ci95") or {}).get(path[-1]) if isinstance(node, dict) and len(path) > 1 else None
        out[name] = {"value": value, "ci95": ci}
    return out


def counted(p: Point) -> bool:
    """A repeat the aggregate counts: every one that ran to its end and left a summary, complete or incomplete
    (requests lost, a variant failed), so the hardest repeats are not left out of the mean. A repeat the user
    interrupted, or one without a summary, is listed instead ("not_counted")."""
    return p.status in ("complete", "incomplete") and bool(p.metrics)


def aggregate(points: list[Point]) -> list[dict]:
    """Per grid point and variant, each metric over every counted repeat: mean, 95% interval, n; the repeats
    that are incomplete and those without a summary, by name.

    With two or more repeats the interval is Student's t over the repeat-level values; with one, the run's
    own interval where the metric has one."""
    out = []
    for index in sorted({p.index for p in points}):
        reps = [p for p in points if p.index == index]
        done = [p for p in reps if counted(p)]
        variants = list(dict.fromkeys(v for p in done for v in p.metrics))
        per = {}
        for v in variants:
            per[v] = {}
            for name in METRICS:
                entries = [p.metrics[v][name] for p in done if v in p.metrics]
                per[v][name] = _over_repeats(entries, "value", single=len(done) == 1) or {"n": 0}
        out.append(
            {
                "index": index,
                "values": reps[0].values,
                "repeats": len(reps),
                "complete": sum(p.status == "complete" for p in done),
                "counted": len(done),
                "incomplete": [p.name for p in done if p.status != "complete"],
                "not_counted": [f"{p.name}: {p.status}" for p in reps if not counted(p) and p.status != "pending"],
                "variants": per,
                "comparisons": _aggregate_comparisons(done),
                "verdicts": _tally_verdicts(done),
            }
        )
    return out


def _aggregate_comparisons(done: list[Point]) -> dict:
    """Each ratio of the subject variant to a baseline over the counted repeats: the geometric mean, its 95%
    interval (t on the log ratios of independent repeats; with one repeat the run's own interval), n, and the
    verdict of that interval (scope "repeats")."""
    out = {}
    for key in dict.fromkeys(k for p in done for k in p.comparisons):
        entries = [p.comparisons[key] for p in done if key in p.comparisons]
        ratios = [e["ratio"] for e in entries if e["ratio"] is not None and e["ratio"] > 0]
        if not ratios:
            continue
        ci = confidence.repeats_ratio_interval(ratios)
        if ci is None and len(done) == 1:
            ci = entries[0].get("ci95")
        out[key] = {
            "variant": entries[0]["variant"],
            "n": len(ratios),
            "mean": math.exp(sum(math.log(r) for r in ratios) / len(ratios)),  # geometric
            "ci95": list(ci) if ci else None,
            "values": ratios,
            "verdict": confidence.verdict(ci),
            "scope": "repeats" if len(ratios) > 1 else "this run",
        }
    return out


def _tally_verdicts(done: list[Point]) -> dict:
    """Per comparison, how the runs' own (within-run) verdicts fell over the repeats: {lower, higher, n.s., not
    judged}. In an A/A sweep (identical variants) every lower or higher is a false positive."""
    out: dict = {}
    for p in done:
        for key, c in p.comparisons.items():
            tally = out.setdefault(key, {"lower": 0, "higher": 0, "no significant difference": 0, "not judged": 0})
            tally[c.get("verdict") or "not judged"] = tally.get(c.get("verdict") or "not judged", 0) + 1
    return out


def false_positives(agg: list[dict]) -> dict | None:
    """Over every point and comparison of a sweep: within-run verdicts that called the variants different (lower
    or higher) out of those judged, with the share's 95% interval (Wilson). For an A/A sweep, whose variants are
    identical, that share is the verdicts' false-positive rate."""
    judged = called = 0
    for a in agg:
        for t in (a.get("verdicts") or {}).values():
            called += t["lower"] + t["higher"]
            judged += t["lower"] + t["higher"] + t["no significant difference"]
    if not judged:
        return None
    lo, hi = confidence.proportion_interval(called, judged)
    return {"called": called, "judged": judged, "share": called / judged, "ci95": [lo, hi]}


def _over_repeats(entries: list[dict], key: str, single: bool) -> dict | None:
    """entries[key] over the repeats: n, mean, 95% interval (Student's t; with a single complete repeat, its
    own ci95) and the values; None when no repeat has one."""
    vals = [e[key] for e in entries if e[key] is not None]
    if not vals:
        return None
    ci = confidence.repeats_mean_interval(vals)
    if ci is None and single:
        ci = entries[0].get("ci95")
    return {"n": len(vals), "mean": sum(vals) / len(vals), "ci95": list(ci) if ci else None, "values": vals}


def _cell(m: dict, digits: int) -> str:
    if not m.get("n"):
        return "–"
    s = f"{m['mean']:,.{digits}f}"
    if m.get("ci95"):
        s += f" [{m['ci95'][0]:,.{digits}f}, {m['ci95'][1]:,.{digits}f}]"
    return s + (f" (n={m['n']})" if m["n"] > 1 else "")


DIGITS = {
    "tpot_p50_ms": 1,
    "goodput_rps": 3,
    "rld_token_share": 3,
    "lone_tail_share": 2,
    "completed": 1,
    "fallbacks": 1,
    "handoffs": 1,
    "handoff_mean_ms": 1,
    "handoff_std_ms": 1,
    "handoff_p99_ms": 1,
}


def markdown(plan: Plan, points: list[Point], agg: list[dict], topologies: list[dict] = ()) -> str:
    """sweep.md: one table per metric (rows: grid points, columns: variants), the overhead, the failures."""
    axes = ", ".join(f"{a.key} = {list(a.values)}" for a in plan.axes)
    done = sum(p.status == "complete" for p in points)
    counted_runs = sum(counted(p) for p in points)
    lines = [
        f"# Sweep of {plan.spec}: {axes}",
        "",
        f"{len(agg)} points x {plan.repeat} repeats; {done} of {len(points)} runs complete, {counted_runs} counted. "
        "Cells: mean over every repeat that left a summary, complete or not (a repeat that lost requests counts, "
        "its latencies with the failures ranked worst) [95% interval: Student's t over the repeats] (n); with "
        "one repeat, the run's own interval where the metric has one. Runs that did not complete are listed at "
        "the end.",
        "",
    ]
    variants = list(dict.fromkeys(v for a in agg for v in a["variants"]))
    for name in METRICS:
        lines += [f"## {name}", "", "| point | " + " | ".join(variants) + " |", "|---|" + "---|" * len(variants)]
        for a in agg:
            label = ", ".join(f"{k}={v}" for k, v in a["values"].items()) or "all"
            cells = [_cell(a["variants"].get(v, {}).get(name, {}), DIGITS.get(name, 0)) for v in variants]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += _comparison_tables(agg)
    lines += bcr_tables(agg)
    lines += _verdicts_section(agg)
    lines += _overhead_section(points, topologies)
    bad = [p for p in points if p.status not in ("complete", "pending")]
    if bad:
        lines += ["## Runs not complete", ""] + [f"- {p.name}: {p.status} {p.error}".rstrip() for p in bad] + [""]
    return "\n".join(lines)


def _comparison_tables(agg: list[dict]) -> list[str]:
    """One table per compared metric: rows grid points, columns baselines, cells ratio [interval] verdict."""
    keys = list(dict.fromkeys(k for a in agg for k in a.get("comparisons") or {}))
    if not keys:
        return []
    subject = next(c["variant"] for a in agg for c in (a.get("comparisons") or {}).values())
    lines = []
    for metric in dict.fromkeys(k.split(" / ")[0] for k in keys):
        bases = [k.split(" / ")[1] for k in keys if k.startswith(metric + " / ")]
        lines += [
            f"## {subject} / baseline: {metric}",
            "",
            "| point | " + " | ".join(bases) + " |",
            "|---|" + "---|" * len(bases),
        ]
        for a in agg:
            label = ", ".join(f"{k}={v}" for k, v in a["values"].items()) or "all"
            cells = []
            for base in bases:
                c = (a.get("comparisons") or {}).get(f"{metric} / {base}")
                if not c:
                    cells.append("–")
                    continue
                ends = f" [{_r(c['ci95'][0])}, {_r(c['ci95'][1])}]" if c["ci95"] else ""
                short = {"no significant difference": "n.s."}.get(c["verdict"], c["verdict"])
                cells.append(f"{c['mean']:.2f}{ends} {short}" + (f" (n={c['n']})" if c["n"] > 1 else ""))
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += [
        f"Ratio of {subject}'s statistic to the baseline's: the geometric mean over repeats, its interval Student's "
        "t on the log ratios of the independent repeats (one repeat: the run's own interval); lower / higher where "
        "the interval excludes 1, n.s. (no significant difference) where it holds 1. Over repeats a verdict "
        "includes the run-to-run variance: this is the one to quote.",
        "",
    ]
    return lines


def bcr_tables(agg: list[dict]) -> list[str]:
    """Per baseline (same-room PD, a name starting pd-intra, first): "BCR of <subject> over <baseline> by point",
    the BCR ratio and the goodput ratio over the repeats (geometric mean, t on the log ratios) beside the published
    +37.5% and +27.8% (experiments.analysis.cost)."""
    keys = [
        k for k in dict.fromkeys(k for a in agg for k in a.get("comparisons") or {}) if k.startswith(METRIC + " / ")
    ]
    bases = sorted((k.split(" / ")[1] for k in keys), key=lambda b: not b.startswith("pd-intra"))
    lines = []
    for base in bases:
        subject = next(
            a["comparisons"][f"{METRIC} / {base}"]["variant"]
            for a in agg
            if f"{METRIC} / {base}" in (a.get("comparisons") or {})
        )
        lines += [
            f"## BCR of {subject} over {base} by point",
            "",
            "| point | BCR ratio | goodput ratio | published BCR | published goodput |",
            "|---|---|---|---|---|",
        ]
        published = f"{PUBLISHED_BCR:.3f} (+37.5%) | {PUBLISHED_GOODPUT:.3f} (+27.8%)"
        for a in agg:
            label = ", ".join(f"{k}={v}" for k, v in a["values"].items()) or "all"
            comps = a.get("comparisons") or {}
            cells = [_ratio_cell(comps.get(f"{m} / {base}")) for m in (METRIC, "goodput_rps")]
            lines.append(f"| {label} | {cells[0]} | {cells[1]} | {published} |")
        lines.append("")
    if lines:
        lines += [
            "BCR: requests meeting the SLA per USD of hardware (the accelerator catalogue's prices, the spec's "
            "line cost); the ratio is the goodput ratio times the exact cost ratio. Published: pdd over same-DC "
            "homogeneous PD, up to +37.5% BCR with +27.8% goodput (shared/PDD.md).",
            "",
        ]
    return lines


def _ratio_cell(c: dict | None) -> str:
    if not c:
        return "–"
    ends = f" [{_r(c['ci95'][0])}, {_r(c['ci95'][1])}]" if c["ci95"] else ""
    n = f" (n={c['n']})" if c["n"] > 1 else ""
    return f"{c['mean']:.3f}{ends} ({100 * (c['mean'] - 1):+.1f}%){n}"


def _r(x) -> str:
    return "∞" if x is None else f"{x:.2f}"


def _verdicts_section(agg: list[dict]) -> list[str]:
    """Within-run verdicts over the repeats, and the share that called the variants different."""
    keys = list(dict.fromkeys(k for a in agg for k in a.get("verdicts") or {}))
    fp = false_positives(agg)
    if not keys or fp is None:
        return []
    lines = [
        "## Within-run verdicts over the repeats",
        "",
        "| point | comparison | lower | higher | n.s. | not judged |",
        "|---|---|---|---|---|---|",
    ]
    for a in agg:
        label = ", ".join(f"{k}={v}" for k, v in a["values"].items()) or "all"
        for key, t in (a.get("verdicts") or {}).items():
            lines.append(
                f"| {label} | {key} | {t['lower']} | {t['higher']} | {t['no significant difference']} | "
                f"{t['not judged']} |"
            )
    lines += [
        "",
        f"Called different (lower or higher): {fp['called']} of {fp['judged']} judged verdicts, "
        f"{100 * fp['share']:.1f}% [95% interval {100 * fp['ci95'][0]:.1f}, {100 * fp['ci95'][1]:.1f}] (Wilson). "
        "In an A/A sweep (EXP=aa-calibration: identical variants) this is the false-positive rate of one run's "
        "verdicts; the verdicts of one point's repeats are correlated (the same machine and spec), so the "
        "interval is a lower bound on the uncertainty.",
        "",
    ]
    return lines


def overhead(points: list[Point], topologies: list[dict] = ()) -> dict | None:
    """Seconds per run, on average over the runs that ran: wall, measured windows, role start, and the rest
    (topology set-up and teardown where not shared, link swap, analysis); shared topologies' start apart."""
    ran = [p for p in points if p.wall_s and p.overhead]
    if not ran:
        return None
    n = len(ran)
    wall = sum(p.wall_s for p in ran) / n
    measured = sum(p.overhead["measured_s"] for p in ran) / n
    start = sum(p.overhead["role_start_s"] for p in ran) / n
    return {
        "runs": n,
        "wall_s": wall,
        "measured_s": measured,
        "role_start_s": start,
        "rest_s": wall - measured - start,
        "shared_runs": sum(p.topology is not None for p in ran),
        "topologies": len(topologies),
        "topology_start_s": sum(t["start_s"] for t in topologies) / len(topologies) if topologies else None,
    }


def _overhead_section(points: list[Point], topologies: list[dict]) -> list[str]:
    o = overhead(points, topologies)
    if o is None:
        return []
    shared = (
        f" {o['shared_runs']} of the runs shared {o['topologies']} topolog{'y' if o['topologies'] == 1 else 'ies'} "
        f"(each up in {o['topology_start_s']:.1f} s, once: inside the wall time of its first run)."
        if o["topologies"]
        else " Every run brought its own topology up."
    )
    return [
        "## Per-point overhead",
        "",
        f"{o['runs']} runs, {o['wall_s']:.1f} s each on average: measured windows {o['measured_s']:.1f} s, "
        f"role start {o['role_start_s']:.1f} s, the rest (topology set-up and teardown where not shared, "
        f"link swap, analysis) {o['rest_s']:.1f} s.{shared}",
        "",
    ]
