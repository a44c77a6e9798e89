"""Sweeps: one experiment spec over a grid of values x repeats, each point an ordinary run directory.

Responsible for: reading `--over KEY=V1,V2,...` axes and refusing bad ones
(unknown key, wrong type, empty list, `--repeat 0`) before anything starts,
with the key and the allowed values; the grid (axes' product x repeats, a
different workload seed per repeat unless told otherwise); each point's spec
(a profile field becomes a derived profile file in the sweep directory);
running the points one after another, recording each in `sweep.json` as it
goes, so an interrupted sweep keeps its finished points and `--resume DIR`
runs only the rest; aggregating the points' summaries across repeats (mean and
95% interval per variant and metric); `sweep.md` and the sweep plots.
Not responsible for: running one experiment (experiments.run.runner) or its
analysis (experiments.analysis.analyze): every point is a run directory that
`pddlab analyze` reads on its own.

Axis keys:

    profile=wan-regional,wan-lossy      shipped profile names or YAML files
    link.FIELD=...                      a profile field in both directions (link.loss_pct=0,1,3)
    a_to_b.FIELD=... / b_to_a.FIELD=... a profile field in one direction
    anything else                       a spec field, dotted as in --set (workload.synthetic.sessions=2,4)

A swept loss model (loss_pct, loss_ge: Gilbert-Elliott, loss_state: 4-state) replaces the
profile's other ones: netem takes one loss model at a time.

Sweep directory (results/<time>-sweep-<name>/):

    sweep.json      the command (spec, --set, profile, axes, repeats, seeds), provenance, and per point its
                    values, repeat, seed, run directory, status, wall time, and its metrics per variant;
                    the aggregate per point and variant (mean, 95% interval, n over repeats)
    sweep.md        the aggregate tables, the per-point overhead, what failed
    plots/*.png     each main metric against the swept value, per variant, with 95% bands
    runs/<point>/   one run directory per point and repeat
    profiles/       the derived profiles of profile-field axes
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from experiments.analysis import summary as summary_mod
from experiments.rundir import metadata, files as rundir
from experiments.rundir.metadata import RunMetadata
from experiments.progress import Progress
from experiments.analysis.sweep_report import PLOTTED, RATIOS_PLOTTED, aggregate, markdown, point_metrics
from experiments.spec.experiment import ExperimentSpec, SpecError, load_spec, yaml_problem
from topology.profiles import DIRECTIONS, LOSS_MODELS, LinkParams, ProfileError, load_profile, profile_from_dict

log = logging.getLogger(__name__)
PROFILE_SECTIONS = ("link", *DIRECTIONS)


class SweepError(ValueError):
    """A bad sweep: the message names the key and the allowed values."""


@dataclass(frozen=True)
class Axis:
    key: str
    values: tuple[Any, ...]


@dataclass
class Point:
    index: int  # position in the grid (the axes' product), shared by its repeats
    values: dict[str, Any]
    repeat: int
    seed: int  # the workload seed
    name: str  # its run directory under runs/: p<index>-r<repeat>-<values>
    status: str = "pending"  # pending | complete | incomplete | failed | interrupted
    run_dir: str = ""
    wall_s: float | None = None
    error: str = ""
    topology: int | None = None  # the shared topology it ran on (experiments.run.runner.SharedTopology), if any
    metrics: dict = field(default_factory=dict)  # variant -> metric -> value
    comparisons: dict = field(default_factory=dict)  # "<metric> / <baseline>" -> {ratio, ci95} (summary.json)
    overhead: dict = field(default_factory=dict)  # role start and measured windows, from metadata.json


@dataclass(frozen=True)
class Plan:
    spec: str
    set_items: tuple[str, ...]
    profile: str | None
    backend: str | None
    axes: tuple[Axis, ...]
    repeat: int
    same_seed: bool = False
    share_topology: bool = True  # consecutive points that differ only in the link and workload share one

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(d: dict) -> "Plan":
        axes = tuple(Axis(a["key"], tuple(a["values"])) for a in d["axes"])
        return Plan(
            d["spec"],
            tuple(d["set_items"]),
            d["profile"],
            d["backend"],
            axes,
            d["repeat"],
            d["same_seed"],
            d.get("share_topology", True),
        )


def split_values(raw: str) -> list[str]:
    """'0,1,[2, 3]' -> ['0', '1', '[2, 3]']: commas inside brackets and braces stay with their value."""
    out, depth, cur = [], 0, ""
    for ch in raw:
        depth += ch in "[{"
        depth -= ch in "]}"
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    out.append(cur.strip())
    return out


def parse_over(item: str) -> Axis:
    """One `--over KEY=V1,V2,...` (values are YAML: numbers, names, lists)."""
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise SweepError(f"--over {item!r}: expected KEY=V1,V2,...")
    parts = split_values(raw) if raw.strip() else []
    if not parts or any(p == "" for p in parts):
        raise SweepError(f"--over {key}: needs a non-empty, comma-separated list of values (got {raw!r})")
    try:
        values = tuple(yaml.safe_load(p) for p in parts)
    except yaml.YAMLError as err:
        raise SweepError(f"--over {key}: a value is not valid YAML: {yaml_problem(err)}") from None
    if len(set(map(repr, values))) != len(values):
        raise SweepError(f"--over {key}: a value is listed twice ({list(values)})")
    return Axis(key, values)


def _is_profile_field(key: str) -> bool:
    return key.split(".", 1)[0] in PROFILE_SECTIONS


def grid(plan: Plan) -> list[Point]:
    """Every point (the axes' product) x repeat, with its workload seed."""
    base = _load(plan, {}).workload.seed
    seeded = any(a.key == "workload.seed" for a in plan.axes)
    points = []
    combos = list(itertools.product(*(a.values for a in plan.axes)))
    for index, combo in enumerate(combos):
        values = dict(zip((a.key for a in plan.axes), combo))
        for r in range(plan.repeat):
            seed = values["workload.seed"] if seeded else base + (0 if plan.same_seed else r)
            points.append(Point(index, values, r, seed, f"p{index:02d}-r{r}-{_slug(combo)}".rstrip("-")))
    return points


def _slug(combo: tuple) -> str:
    """The values of a grid point in a file name (profile files by their stem)."""
    words = [Path(str(v)).stem if str(v).endswith((".yaml", ".yml")) else str(v) for v in combo]
    return "-".join(re.sub(r"[^A-Za-z0-9.]+", "_", w).strip("_") for w in words)[:60]


def validate(plan: Plan) -> list[Point]:
    """The grid, every point's spec built and checked (no topology yet); SweepError names what is wrong."""
    if plan.repeat < 1:
        raise SweepError(f"--repeat {plan.repeat}: must be at least 1")
    if not plan.axes and plan.repeat < 2:
        raise SweepError("nothing to sweep: give at least one --over KEY=V1,V2,... or --repeat 2 or more")
    keys = [a.key for a in plan.axes]
    if len(set(keys)) != len(keys):
        raise SweepError(f"--over: a key is swept twice ({keys})")
    spec_fields = [f.name for f in dataclasses.fields(ExperimentSpec)]
    for key in keys:
        if key != "profile" and key.split(".", 1)[0] not in (*PROFILE_SECTIONS, *spec_fields):
            raise SweepError(
                f"--over {key}: unknown key; allowed: profile, link.FIELD / a_to_b.FIELD / b_to_a.FIELD (a profile "
                f"field: {', '.join(f.name for f in dataclasses.fields(LinkParams))}), or a spec field "
                f"({', '.join(spec_fields)}, dotted as in --set)"
            )
    points = grid(plan)
    from experiments.run import runner

    with tempfile.TemporaryDirectory(prefix="pddlab-sweep-") as scratch:
        for p in points:
            runner.prepare(point_spec(plan, p, Path(scratch)))  # the workload too: a trace line may be bad
    return points


def point_spec(plan: Plan, point: Point, profile_dir: Path) -> ExperimentSpec:
    """The spec of one point: its profile (derived when a profile field is swept) and spec fields, its seed."""
    profile = point.values.get("profile", plan.profile)
    fields = {k: v for k, v in point.values.items() if _is_profile_field(k)}
    if fields:
        name = f"p{point.index:02d}-" + _slug(tuple(point.values.values()))
        profile = str(_derived_profile(plan, profile, fields, profile_dir / f"{name}.yaml"))
    overrides = {k: v for k, v in point.values.items() if k != "profile" and not _is_profile_field(k)}
    overrides["workload.seed"] = point.seed
    overrides["variant_order_seed"] = point.repeat  # repeats turn the variants' order, on one seed too
    return _load(plan, overrides, profile, what=", ".join(f"{k}={v}" for k, v in point.values.items()))


def _load(plan: Plan, overrides: dict, profile: str | None = None, what: str = "the base spec") -> ExperimentSpec:
    items = [*plan.set_items, *(f"{k}={json.dumps(v)}" for k, v in overrides.items())]  # JSON is YAML
    try:
        return load_spec(plan.spec, items, profile=profile or plan.profile, backend=plan.backend)
    except (SpecError, ProfileError) as err:
        raise SweepError(f"--over {what}: {err}") from None


def _derived_profile(plan: Plan, base: str | None, fields: dict, path: Path) -> Path:
    """The base profile (the point's, else the command's, else the spec's) with the swept fields set, as a
    profile file named after the point."""
    try:
        profile = load_profile(base or _load(plan, {}).profile)
    except ProfileError as err:
        raise SweepError(f"--over profile: {err}") from None
    data = yaml.safe_load(profile.path.read_text())
    base_link = data.pop("link", None) or {}
    for d in DIRECTIONS:  # each direction whole: the base link and the direction's own fields
        data[d] = {**base_link, **(data.get(d) or {})}
    for key, value in fields.items():
        section, _, name = key.partition(".")
        if not name:
            raise SweepError(f"--over {key}: name a field, e.g. {section}.loss_pct")
        for d in list(DIRECTIONS) if section == "link" else [section]:
            if name in LOSS_MODELS:  # exclusive in netem: the swept one drops the profile's others
                for other in LOSS_MODELS:
                    data[d].pop(other, None)
            data[d][name] = value
    data["name"] = path.stem
    data["description"] = (
        f"{data.get('description', '')} (sweep: " + ", ".join(f"{k}={v}" for k, v in fields.items()) + ")"
    )
    try:
        profile_from_dict(data, f"--over {', '.join(f'{k}={v}' for k, v in fields.items())}")
    except ProfileError as err:
        raise SweepError(str(err)) from None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


# --- running -------------------------------------------------------------------------------------------------


def new_sweep_dir(plan: Plan, root: Path = rundir.RESULTS) -> Path:
    name = Path(plan.spec).stem
    return rundir.new_run_dir(f"sweep-{name}", root)


def run(plan: Plan, out: Path, points: list[Point] | None = None) -> Path:
    """Run every point not yet complete, in grid order, recording each in sweep.json; then aggregate."""

    points = validate(plan) if points is None else points
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    state = {"plan": plan.to_dict(), "provenance": rundir.provenance(), "started_at": started}
    if (out / "sweep.json").exists():  # a resumed sweep: its first start and provenance stay, each resume noted
        old = json.loads((out / "sweep.json").read_text())
        state = {k: old[k] for k in ("plan", "provenance", "started_at", "topologies") if k in old}
        state["resumed"] = [*old.get("resumed", []), {"at": started, "provenance": rundir.provenance()}]
    todo = [p for p in points if p.status != "complete"]
    log.info("sweep %s: %d points x %d repeats, %d to run", out, len(points) // plan.repeat, plan.repeat, len(todo))
    topologies = _Topologies(out, plan.share_topology, first_id=1 + max((p.topology or 0 for p in points), default=0))
    earlier = list(state.get("topologies") or [])
    bar = Progress("sweep points", len(todo), log, unit="point", every_s=0)
    try:
        for k, p in enumerate(todo, 1):
            log.info("sweep point %d/%d: %s (repeat %d, seed %d)", k, len(todo), p.values, p.repeat, p.seed)
            _run_point(plan, p, out, topologies)
            state["topologies"] = earlier + topologies.all_records()
            _write(out, state, points)
            failed = sum(q.status == "failed" for q in todo)
            bar.update(k, f"failed {failed}" if failed else "")
    finally:
        bar.close()
        topologies.close()
        state["topologies"] = earlier + topologies.all_records()
        _write(out, state, points, finished=True)
    return out


def needs_topology(plan: Plan) -> bool:
    """The sweep's points run on the emulated topology here (not on an existing Ray cluster: cluster.address)."""
    return not _load(plan, {}).cluster.address


def failed_points(out: Path, points: list[Point]) -> list[str]:
    """Each point that did not do what was asked, one line each: it failed, was interrupted or never ran, or a
    variant of its run failed (experiments.run.outcome; failed requests are data); [] when none."""
    from experiments.run import outcome

    bad = []
    for p in points:
        if p.status in ("complete", "incomplete") and p.run_dir:
            problems = outcome.failures(out / p.run_dir)
            bad += [f"point {p.name}: {'; '.join(problems)}"] if problems else []
        else:
            bad.append(" ".join(f"point {p.name} {p.status}: {p.error}".rstrip(": ").split()))
    return bad


def _run_point(plan: Plan, p: Point, out: Path, topologies: "_Topologies") -> None:
    from experiments.run import runner

    _set_aside(out / "runs" / p.name)
    t0 = time.monotonic()
    try:
        spec = point_spec(plan, p, out / "profiles")
        shared = topologies.for_spec(spec)
        p.topology = shared.ident if shared else None
        run_dir = runner.run(spec, results=out / "runs", out=out / "runs" / p.name, shared=shared)
        p.run_dir = str(run_dir.relative_to(out))
        _read_point(out, p)
        if p.status != "complete":
            topologies.close()  # whatever broke the run (a dead emulator, say) must not carry into the next
    except KeyboardInterrupt:
        p.status = "interrupted"
        raise
    except Exception as exc:  # noqa: BLE001 - one failed point must not lose the others
        p.status, p.error = "failed", f"{type(exc).__name__}: {exc}"
        log.exception("sweep point %s failed", p.name)
        topologies.close()  # a failure may have left the shared topology broken: the next point builds anew
    finally:
        p.wall_s = time.monotonic() - t0


class _Topologies:
    """The shared topology of the points being run: kept while consecutive points fit it (only the link and
    the workload differ), replaced when one does not; none where sharing is off or a point cannot share."""

    def __init__(self, root: Path, enabled: bool, first_id: int = 1):
        self.root, self.enabled, self.next_id = root, enabled, first_id
        self.current = None
        self.records: list[dict] = []

    def for_spec(self, spec: ExperimentSpec):
        from experiments.run import runner

        if not (self.enabled and runner.can_share(spec)):
            self.close()
            return None
        if self.current is None or not self.current.fits(spec):
            self.close()
            self.current = runner.SharedTopology(spec, self.root, self.next_id).__enter__()
            self.next_id += 1
        return self.current

    def all_records(self) -> list[dict]:
        """Each topology made so far: id, runs on it, seconds to come up."""
        return self.records + ([self._record(self.current)] if self.current else [])

    @staticmethod
    def _record(shared) -> dict:
        return {"id": shared.ident, "runs": shared.runs, "start_s": round(shared.started_s, 3)}

    def close(self) -> None:
        if self.current is not None:
            shared, self.current = self.current, None
            self.records.append(self._record(shared))
            shared.__exit__(None, None, None)


def _set_aside(path: Path) -> None:
    """An earlier, unfinished attempt at a point is kept beside it (nothing lost), not overwritten."""
    if path.exists():
        for n in itertools.count(1):
            aside = path.with_name(f"{path.name}.attempt{n}")
            if not aside.exists():
                shutil.move(path, aside)
                return


def _read_point(out: Path, p: Point) -> None:
    run_dir = out / p.run_dir
    meta = metadata.read(run_dir)
    summary_path = run_dir / "summary.json"
    p.status = "complete" if meta.complete else "incomplete"
    p.error = meta.error or ""
    p.overhead = _overhead(meta)
    if summary_path.exists():
        summary = summary_mod.read(run_dir)
        p.metrics = {v: point_metrics(s.model_dump(mode="json")) for v, s in summary.variants.items()}
        p.comparisons = {
            f"{c.metric} / {c.baseline}": {"variant": c.variant, "ratio": c.ratio, "ci95": c.ci95, "verdict": c.verdict}
            for c in summary.comparisons
        }


def _overhead(meta: RunMetadata) -> dict:
    """Seconds of role start (start to ready) and of measured windows (ready to end), summed over variants."""
    variants = meta.variants.values()
    return {"role_start_s": sum(w.role_start_s for w in variants), "measured_s": sum(w.measured_s for w in variants)}


def load(out: Path) -> tuple[Plan, list[Point], dict]:
    """A sweep directory's plan, points and the whole sweep.json."""
    data = json.loads((out / "sweep.json").read_text())
    points = [Point(**{k: v for k, v in p.items() if k in Point.__dataclass_fields__}) for p in data["points"]]
    return Plan.from_dict(data["plan"]), points, data


def resume(out: Path) -> tuple[Plan, list[Point]]:
    """The plan and points of an earlier sweep directory (finished points kept). A finished point whose run
    holds a summary.json is read again: a run analysed anew since (`pddlab analyze`, after an analysis change)
    counts with its new figures."""
    if not (out / "sweep.json").exists():
        raise SweepError(f"--resume {out}: no sweep.json there")
    plan, points, _ = load(out)
    for p in points:
        if p.status != "complete":
            continue
        if not (out / p.run_dir / "metadata.json").exists():
            p.status = "pending"  # its run directory is gone: run it again
        elif (out / p.run_dir / "summary.json").exists():
            _read_point(out, p)
    validate(plan)  # the specs and profiles still load on this checkout
    return plan, points


def _write(out: Path, state: dict, points: list[Point], finished: bool = False) -> None:
    from experiments.analysis import plots

    agg = aggregate(points)
    data = {**state, "points": [dataclasses.asdict(p) for p in points], "aggregate": agg}
    if finished:
        data["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    rundir.write_json(out / "sweep.json", data)
    plan = Plan.from_dict(state["plan"])
    (out / "sweep.md").write_text(markdown(plan, points, agg, data.get("topologies") or []))
    if finished:
        try:
            plots.sweep_plots(plan.axes, agg, out / "plots", PLOTTED)
            plots.sweep_ratio_plots(plan.axes, agg, out / "plots", RATIOS_PLOTTED)
        except Exception:  # noqa: BLE001 - the numbers are written; a plot failure must not hide them
            log.exception("sweep plots failed")
