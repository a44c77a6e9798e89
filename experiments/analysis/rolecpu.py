"""The roles' CPU time per variant: what the P, RLD, MD and router processes spent, summed per role kind.

Responsible for: from a variant's events (each role's last one, `role_cpu`, written by workers/roles/server.py once
its server stopped) and the workers its deployment had, a `RolesCpu` per variant: per role kind the CPU seconds
its workers reported (user + system over the process's life; before serving and since), the total, the serving
CPU per completed request, and every worker that never reported (a SIGKILLed role writes nothing: missing, never
0); summary.md's "Roles' CPU time" table. With modelled compute, each role kind's pace (how far the host let its
modelled passes run past the roofline's time: workers.modelled.engine.ModelledEngine.pace), summary.md's
"Modelled compute's pace" and a `modelled_compute_late` warning where a role kind ran more than LATE_PACE slow,
and no verdict on a comparison using such a variant (`mark_late`). Pure functions over typed inputs, apart from
`add_to` and `mark_late`.
Not responsible for: measuring (the roles do, with getrusage), reading files (experiments.analysis.records,
runmeta) or the per-worker figures (experiments.analysis.per_worker).

A run made before role_cpu existed has none in any variant: `roles_cpu` stays None there ("–"), not "all missing".
"""

from __future__ import annotations

from experiments.analysis.per_worker import emitter
from experiments.analysis.summary import RoleCpu, RolesCpu, Summary
from experiments.spec.deployment import role_of

KINDS = ("p", "rld", "md", "router")
SUMMED = ("cpu_s", "user_s", "system_s", "startup_cpu_s", "serving_cpu_s", "wall_s", "modelled_s", "modelled_late_s")
# A modelled role kind whose passes took more than this times the roofline's is warned about: the run measured a
# slower accelerator than its spec names (2026-12-06, docs/runs/pdd-published-20261206d on this 2-core machine: P
# 1.01x in pd-intra; 1.36x in pd-cross and 1.23x in pdd, where its KV crossed the userspace emulator)
LATE_PACE = 1.10


def _sum(reports: list[dict], key: str) -> float | None:
    """The sum over the reports, None where any lacks the figure (an age /proc could not give)."""
    vals = [r.get(key) for r in reports]
    return round(sum(vals), 3) if vals and all(v is not None for v in vals) else None


def role_cpu(reports: list[dict], missing: list[str]) -> RoleCpu:
    """One role kind: its workers' role_cpu events summed; missing: its workers that never reported."""
    late_max = [r["modelled_late_max_ms"] for r in reports if r.get("modelled_late_max_ms") is not None]
    return RoleCpu(
        workers=len(reports),
        missing=sorted(missing),
        **{k: _sum(reports, k) for k in SUMMED},
        modelled_late_max_ms=max(late_max) if late_max else None,
    )


def variant_cpu(events: list[dict], deployed: list[str], completed: int) -> RolesCpu:
    """One variant's roles' CPU from its events (that variant's alone); deployed: its workers' names (router, p1,
    rld1, ...; those its events name count too); completed: its completed requests."""
    reports = {e.get("worker"): e for e in events if e["event"] == "role_cpu"}
    names = set(deployed) | {emitter(e) for e in events} | set(reports)
    roles = {}
    for kind in KINDS:
        mine = sorted(n for n in names if n and role_of(n) == kind)
        if mine:
            roles[kind] = role_cpu([reports[n] for n in mine if n in reports], [n for n in mine if n not in reports])
    total = _total(roles, "cpu_s")
    serving = _total(roles, "serving_cpu_s")
    return RolesCpu(
        roles=roles,
        cpu_s=total,
        serving_cpu_s=serving,
        serving_cpu_s_per_request=round(serving / completed, 4) if serving is not None and completed else None,
        missing=sorted(n for r in roles.values() for n in r.missing),
    )


def _total(roles: dict[str, RoleCpu], key: str) -> float | None:
    """Over the role kinds that reported (a missing worker's share is not in it: `missing` names it)."""
    vals = [getattr(r, key) for r in roles.values() if r.workers]
    return round(sum(vals), 3) if vals and all(v is not None for v in vals) else None


def add_to(summary: dict, events: list[dict], deployed: dict[str, list[str]]) -> None:
    """Into summary, in place: each variant's `roles_cpu` (deployed: variant -> its workers' names); left None
    everywhere where no role of the run reported (a run made before role_cpu)."""
    if not any(e["event"] == "role_cpu" for e in events):
        return
    for v, s in summary["variants"].items():
        evs = [e for e in events if e.get("variant") == v]
        cpu = variant_cpu(evs, deployed.get(v, []), s["completed"])
        s["roles_cpu"] = cpu.model_dump(mode="json")
        summary["warnings"] += late_warnings(v, cpu)


def slow_kinds(cpu: RolesCpu) -> dict[str, RoleCpu]:
    """The variant's modelled role kinds whose pace was above LATE_PACE."""
    return {k: r for k, r in cpu.roles.items() if r.pace is not None and r.pace > LATE_PACE}


def late_warnings(variant: str, cpu: RolesCpu) -> list[dict]:
    """A `modelled_compute_late` warning for each modelled role kind of the variant slower than LATE_PACE."""
    return [
        {
            "variant": variant,
            "path": None,
            "kind": "modelled_compute_late",
            "count": r.workers,
            "message": f"{variant}: the modelled {kind.upper()} ran {r.pace:.2f}x the roofline's time "
            f"({r.modelled_late_s:,.1f} s late over {r.modelled_s:,.1f} s modelled; one pass up to "
            f"{r.modelled_late_max_ms:,.0f} ms): this machine could not keep its pace, so the run measured a "
            "slower accelerator than the spec names",
        }
        for kind, r in slow_kinds(cpu).items()
    ]


def mark_late(summary: dict) -> None:
    """In place: every comparison (the BCR ones too: call it after cost.add_to) that uses a variant whose modelled
    compute ran late (a role kind above LATE_PACE) gets a caveat naming it, and its verdict is not called ("not
    judged"), as analyze.mark_machinery does for a late emulator: the two variants did not run the accelerators
    their spec names at the same speed, so part of the difference is this machine's."""
    late = {}
    for v, s in summary["variants"].items():
        if s.get("roles_cpu") and (slow := slow_kinds(RolesCpu.model_validate(s["roles_cpu"]))):
            late[v] = {k: r.pace for k, r in slow.items()}
    for c in summary.get("comparisons") or []:
        who = [v for v in (c["variant"], c["baseline"]) if v in late]
        if who:
            note = "the modelled compute ran late in " + ", ".join(
                f"{v} ({', '.join(f'{k.upper()} {p:.2f}x' for k, p in late[v].items())})" for v in who
            )
            c["caveat"] = f"{c['caveat']}; {note}" if c.get("caveat") else note
            c["verdict"] = "not judged"


def _cell(r: RoleCpu | None) -> str:
    """A role kind's CPU s with its serving share in brackets, and its workers that never reported."""
    if r is None:
        return "–"
    if not r.workers:
        return f"missing ({', '.join(r.missing)})"
    cpu = "–" if r.cpu_s is None else f"{r.cpu_s:,.1f}"
    serving = "" if r.serving_cpu_s is None else f" ({r.serving_cpu_s:,.1f})"
    return cpu + serving + (f"; {', '.join(r.missing)} missing" if r.missing else "")


def markdown_section(summary: Summary) -> list[str]:
    """summary.md's "Roles' CPU time": per variant each role kind's CPU s (serving's in brackets), the total and
    the serving CPU per completed request."""
    per = {v: s.roles_cpu for v, s in summary.variants.items() if s.roles_cpu is not None}
    if not per:
        return []
    lines = [
        "## Roles' CPU time",
        "",
        "| variant | P s | RLD s | MD s | router s | total s | serving s | serving CPU s / completed request |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for v, c in per.items():
        cells = " | ".join(_cell(c.roles.get(k)) for k in KINDS)
        total = "–" if c.cpu_s is None else f"{c.cpu_s:,.1f}"
        serving = "–" if c.serving_cpu_s is None else f"{c.serving_cpu_s:,.1f}"
        each = "–" if c.serving_cpu_s_per_request is None else f"{c.serving_cpu_s_per_request:.3f}"
        lines.append(f"| {v} | {cells} | {total}{' (partial)' if c.missing else ''} | {serving} | {each} |")
    lines += [
        "",
        "CPU time of each role's process (getrusage: user + system, every thread) from its start to the end of its "
        "stop, summed over the role's workers; in brackets, and 'serving': since it began serving (the rest is "
        "start-up: interpreter, imports, engine and weights). A role written to its log once it stopped; one "
        "killed (SIGKILL) wrote nothing: 'missing', and the totals leave it out ('partial'). Warm-ups count.",
        "",
    ]
    return lines + _pace_section(per)


def _pace_section(per: dict[str, RolesCpu]) -> list[str]:
    """summary.md's "Modelled compute's pace": per variant and modelled role kind, the roofline's time, how late
    its passes ended and the pace; nothing for real compute."""
    rows = [
        f"| {v} | {kind.upper()} | {r.modelled_s:,.1f} | {r.modelled_late_s:,.2f} | {r.modelled_late_max_ms:,.1f} "
        f"| {r.pace:.3f} |"
        for v, c in per.items()
        for kind, r in c.roles.items()
        if r.pace is not None
    ]
    if not rows:
        return []
    return [
        "## Modelled compute's pace",
        "",
        "| variant | role | modelled s | late s | worst pass late ms | pace |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
        "A modelled engine waits the roofline's time for each pass and KV copy; 'late' is how far past those times "
        "they ended (the pass's own work, reading each layer's rows for the KV senders, and a host too busy to wake "
        f"it in time), summed over the role's workers. Pace = (modelled + late) / modelled: above {LATE_PACE} the "
        "run is warned about (`modelled_compute_late`): it measured a slower accelerator than its spec names.",
        "",
    ]
