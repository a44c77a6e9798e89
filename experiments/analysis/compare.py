"""`pddlab compare A B [C ...]`: runs or sweeps of one spec side by side, with the summaries' own rigour.

Responsible for: the answer to a user's own A/B question (before/after a policy, a profile, a commit): per
variant and metric, each later directory's figure over the first one's as a ratio with a 95% interval and a
verdict, and the table of it (markdown) and its data (JSON).
- Two sweeps (directories with sweep.json): each repeat is one independent sample of the whole run, so the
  ratio is of the geometric means over the repeats, its interval Welch's t on the log values (scope
  "repeats": run-to-run variance included; this is the comparison to quote).
- Two runs (directories with requests.jsonl): the requests' own samples, clustered by session, paired by
  request where both runs replayed the same workload (equal workload.jsonl), on the log scale (scope "these
  two runs": one run each cannot tell the change from run-to-run variance; say so).
Not responsible for: analysing a run (experiments.analysis.analyze writes what this reads) or running one.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

from experiments.analysis import confidence, metrics, records, summary as summary_mod
from experiments.rundir import metadata

# What is compared: name -> (the request value for runs, the statistic, the sweep aggregate's metric).
METRICS = {
    "ttft_ms.p50": (lambda r: r.ttft_ms, "p50", "ttft_p50_ms"),
    "tpot_ms.p50": (lambda r: r.tpot_ms, "p50", "tpot_p50_ms"),
    "e2e_ms.p50": (lambda r: r.e2e_ms, "p50", "e2e_p50_ms"),
    "goodput_rps": (None, None, "goodput_rps"),
    "wan_bytes_offered": (None, None, "wan_bytes_offered"),
}


class CompareError(ValueError):
    """The directories cannot be compared; the message says which and why."""


@dataclass(frozen=True)
class Row:
    """One variant's metric in `other` over `base`."""

    variant: str
    metric: str
    base: str
    other: str
    ratio: float | None
    ci95: tuple[float, float] | None
    verdict: str
    scope: str
    paired: bool = False


def kind(path: Path) -> str:
    """'sweep', 'run', or CompareError naming what the directory lacks."""
    if (path / "sweep.json").exists():
        return "sweep"
    if (path / "summary.json").exists() and (path / "requests.jsonl").exists():
        return "run"
    raise CompareError(f"{path}: neither a sweep (sweep.json) nor an analysed run (summary.json, requests.jsonl)")


def compare(dirs: list[Path]) -> list[Row]:
    """Every later directory against the first, per variant both have and metric."""
    if len(dirs) < 2:
        raise CompareError("compare needs two or more run or sweep directories")
    kinds = {kind(d) for d in dirs}
    if len(kinds) > 1:
        raise CompareError("compare runs with runs and sweeps with sweeps (a sweep's repeats are the samples)")
    rows = []
    for other in dirs[1:]:
        rows += _sweeps(dirs[0], other) if kinds == {"sweep"} else _runs(dirs[0], other)
    return rows


# ---- two runs ---------------------------------------------------------------------------------------------------
def _digest(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


def _runs(base: Path, other: Path) -> list[Row]:
    sa, sb = summary_mod.read(base), summary_mod.read(other)
    ra, rb = records.read(base), records.read(other)
    same_workload = _digest(base / "workload.jsonl") == _digest(other / "workload.jsonl") is not None
    rows = []
    for v in [v for v in sa.variants if v in sb.variants]:
        for name, (value, stat, _) in METRICS.items():
            if value is not None:
                x = _sample(rb, v, value)
                y = _sample(ra, v, value)
                rows.append(_run_row(v, name, base, other, x, y, stat, same_workload))
            elif name == "wan_bytes_offered":
                a, b = sa.variants[v].wan_bytes_offered, sb.variants[v].wan_bytes_offered
                ratio = b / a if a and b is not None else None
                rows.append(Row(v, name, str(base), str(other), ratio, None, "not judged", "these two runs"))
            else:
                a, b = sa.variants[v].goodput_rps, sb.variants[v].goodput_rps
                ratio = b / a if a and b is not None else None
                rows.append(Row(v, name, str(base), str(other), ratio, None, "not judged", "these two runs"))
    return rows


def _sample(recs: list[records.RequestRecord], variant: str, value) -> confidence.Sample | None:
    measured = [r for r in recs if r.kind != "warmup"]
    return metrics._sample(measured, variant, value, latency=True)


def _run_row(v, name, base, other, x, y, stat, paired) -> Row:
    if x is None or y is None:
        return Row(v, name, str(base), str(other), None, None, "not judged", "these two runs")
    num, den = metrics._point(x, stat), metrics._point(y, stat)
    ratio = num / den if den and math.isfinite(num) and math.isfinite(den) else None
    ci = confidence.ratio_interval(x, y, stat, paired=paired) if ratio is not None else None
    is_paired = paired and confidence._paired(x, y) is not None
    return Row(v, name, str(base), str(other), ratio, ci, confidence.verdict(ci), "these two runs", is_paired)


# ---- two sweeps -------------------------------------------------------------------------------------------------
def _sweeps(base: Path, other: Path) -> list[Row]:
    """The sweeps' own aggregates (sweep.json `aggregate`: per variant and metric the repeats' values)."""
    aa, ab = (json.loads((d / "sweep.json").read_text()).get("aggregate") or [] for d in (base, other))
    if len(aa) != 1 or len(ab) != 1:
        raise CompareError("compare sweeps of one point each (repeats of one configuration); split a grid first")
    va, vb = aa[0]["variants"], ab[0]["variants"]
    rows = []
    for v in [v for v in va if v in vb]:
        for name, (_, _, key) in METRICS.items():
            xa, xb = va[v].get(key, {}).get("values") or [], vb[v].get(key, {}).get("values") or []
            rows.append(_repeats_row(v, name, base, other, xa, xb))
    return rows


def _repeats_row(v, name, base, other, xa: list[float], xb: list[float]) -> Row:
    """Ratio of the geometric means of the repeats' values, Welch's t interval on their logs."""
    la = [math.log(x) for x in xa if x and x > 0]
    lb = [math.log(x) for x in xb if x and x > 0]
    if not la or not lb:
        return Row(v, name, str(base), str(other), None, None, "not judged", "repeats")
    diff = sum(lb) / len(lb) - sum(la) / len(la)
    ci = None
    if len(la) >= 2 and len(lb) >= 2:
        va, vb = _var(la) / len(la), _var(lb) / len(lb)
        se = math.sqrt(va + vb)
        if se > 0:
            df = (va + vb) ** 2 / (va**2 / (len(la) - 1) + vb**2 / (len(lb) - 1))
            half = confidence.t_quantile(df) * se
            ci = (math.exp(diff - half), math.exp(diff + half))
        else:
            ci = (math.exp(diff), math.exp(diff))
    return Row(v, name, str(base), str(other), math.exp(diff), ci, confidence.verdict(ci), "repeats")


def _var(xs: list[float]) -> float:
    m = sum(xs) / len(xs)
    return sum((x - m) ** 2 for x in xs) / (len(xs) - 1)


# ---- the report -------------------------------------------------------------------------------------------------
def markdown(rows: list[Row]) -> str:
    """One table per later directory: rows variants, columns metrics, cells ratio [interval] verdict."""
    lines = []
    for other in dict.fromkeys(r.other for r in rows):
        mine = [r for r in rows if r.other == other]
        names = list(dict.fromkeys(r.metric for r in mine))
        base = mine[0].base
        lines += [
            f"## {other} over {base}",
            "",
            "| variant | " + " | ".join(names) + " |",
            "|---|" + "---|" * len(names),
        ]
        by = {(r.variant, r.metric): r for r in mine}
        for v in dict.fromkeys(r.variant for r in mine):
            cells = [_cell(by.get((v, n))) for n in names]
            lines.append(f"| {v} | " + " | ".join(cells) + " |")
        scope = mine[0].scope
        lines += ["", _SCOPES[scope], ""]
        if scope == "these two runs":
            lines += [machines(Path(base), Path(other)), ""]
    return "\n".join(lines)


def _speed(run: Path) -> metadata.SpeedRecord | None:
    """The reference speed at a run's start (None: a run made before it was recorded, or not measured)."""
    try:
        machine = metadata.read(run).provenance.machine
    except metadata.MetadataError:
        return None
    return machine.speed if machine else None


def machines(base: Path, other: Path) -> str:
    """How fast the machine was at each run's start (workers.speed's prefill pass, CPU time), and whether that
    differs enough to stand beside the change: step times follow the machine's speed."""
    a, b = _speed(base), _speed(other)
    if a is None or b is None:
        return "Machine: the reference speed of one run or both was not recorded (runs made before it was)."
    said = (
        f"Machine: the reference prefill took {a.prefill_cpu_ms:.0f} ms of CPU before {base.name} and "
        f"{b.prefill_cpu_ms:.0f} ms before {other.name} ({a.ratio(b):.2f}x)"
    )
    tolerance = f"{metadata.SPEED_TOLERANCE:.0%}"
    if a.differs(b):
        return said + f": the machine itself differed by more than {tolerance}, part of any change is its."
    return said + f": within {tolerance}."


def _cell(r: Row | None) -> str:
    if r is None or r.ratio is None:
        return "–"
    ends = f" [{r.ci95[0]:.2f}, {'∞' if math.isinf(r.ci95[1]) else f'{r.ci95[1]:.2f}'}]" if r.ci95 else ""
    short = {"no significant difference": "n.s."}.get(r.verdict, r.verdict)
    return f"{r.ratio:.2f}{ends} {short}"


_SCOPES = {
    "repeats": "Ratio of the geometric means over each sweep's repeats, 95% interval Welch's t on the log values: "
    "run-to-run variance included. lower / higher: the interval excludes 1; n.s.: it holds 1.",
    "these two runs": "Ratio of the later run's statistic to the first's over every request sent (failures ranked "
    "worst), 95% interval on the log scale with the session as the unit, paired by request where both runs "
    "replayed the same workload. It speaks for these two runs only: one run of each cannot tell a change from "
    "run-to-run variance (compare sweeps with repeats: make sweep ... REPEAT=N). goodput and WAN bytes: ratios "
    "of the two runs' totals, not judged.",
}


def to_json(rows: list[Row]) -> list[dict]:
    """The rows as data (compare.json)."""
    return [
        {**r.__dict__, "ci95": None if r.ci95 is None else [None if math.isinf(x) else x for x in r.ci95]} for r in rows
    ]
