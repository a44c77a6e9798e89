"""A sweep's numbers and sweep.md: its points aggregated across repeats (pure functions over sweep.json data).

Responsible for: the main metrics read from each point's summary.json, per
grid point and variant the mean over complete repeats with its 95% interval
(Student's t over the repeats; with one repeat, the run's own bootstrap
interval), pdd's ratios to each baseline likewise, the per-point overhead
(measured windows, role start, the rest, shared topologies), and sweep.md.
Not responsible for: planning or running the points (experiments.run.sweep), or
the plots (experiments.analysis.plots.sweep_plots).
"""

from __future__ import annotations

from typing import Any

from experiments.analysis import confidence

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
    "wan_bytes_total": ("wan_bytes_total",),
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
    "wan_bytes_total",
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


def aggregate(points: list[Point]) -> list[dict]:
    """Per grid point and variant, each metric over the complete repeats: mean, 95% interval, n.

    With two or more repeats the interval is Student's t over the repeat-level values; with one, the run's
    own interval (bootstrap over its requests) where the metric has one."""
    out = []
    for index in sorted({p.index for p in points}):
        reps = [p for p in points if p.index == index]
        done = [p for p in reps if p.status == "complete" and p.metrics]
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
                "complete": len(done),
                "variants": per,
                "comparisons": _aggregate_comparisons(done),
            }
        )
    return out


def _aggregate_comparisons(done: list[Point]) -> dict:
    """Each ratio of the subject variant to a baseline over the complete repeats: mean, 95% interval (t over
    repeats; with one repeat the run's bootstrap interval), n, and the verdict of that interval."""
    out = {}
    for key in dict.fromkeys(k for p in done for k in p.comparisons):
        entries = [p.comparisons[key] for p in done if key in p.comparisons]
        agg = _over_repeats(entries, "ratio", single=len(done) == 1)
        if agg is not None:
            out[key] = {"variant": entries[0]["variant"], **agg, "verdict": confidence.verdict(agg["ci95"])}
    return out


def _over_repeats(entries: list[dict], key: str, single: bool) -> dict | None:
    """entries[key] over the repeats: n, mean, 95% interval (Student's t; with a single complete repeat, its
    own ci95) and the values; None when no repeat has one."""
    vals = [e[key] for e in entries if e[key] is not None]
    if not vals:
        return None
    ci = confidence.mean_ci(vals)
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
    lines = [
        f"# Sweep of {plan.spec}: {axes}",
        "",
        f"{len(agg)} points x {plan.repeat} repeats; {done} of {len(points)} runs complete. "
        "Cells: mean over the complete repeats [95% interval] (n); with one repeat, the run's own interval "
        "(bootstrap over its requests) where the metric has one.",
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
                ends = f" [{c['ci95'][0]:.2f}, {c['ci95'][1]:.2f}]" if c["ci95"] else ""
                short = {"no significant difference": "n.s."}.get(c["verdict"], c["verdict"])
                cells.append(f"{c['mean']:.2f}{ends} {short}" + (f" (n={c['n']})" if c["n"] > 1 else ""))
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += [
        f"Ratio of {subject}'s statistic to the baseline's: the mean over repeats with Student's t interval "
        "(one repeat: the run's bootstrap interval); lower / higher where the interval excludes 1, n.s. "
        "(no significant difference) where it holds 1.",
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
