"""How a finished run went, read from its run directory: what kept it from doing what was asked (the exit status).

Responsible for: judging a run directory by what the runner recorded (metadata.json: the run's error, each
variant's status; summary.json: the analysis) and naming, in one line each, the variants that did not run to
the end and a run that ended early or was not analysed. Requests that failed under impairment are data, not a
failure: a variant whose status is `failed_requests` ran to the end (its failed requests are counted in the
summary). Not responsible for: running anything (experiments.run.runner) or the exit codes themselves
(experiments.cli).
"""

from __future__ import annotations

from pathlib import Path

from experiments.rundir import metadata

RAN = ("ok", "failed_requests")  # a variant's statuses that mean its whole workload ran (metadata.Status)
WHY = {
    "timeout": "its workload did not finish within timeouts.variant_s",
    "interrupted": "interrupted",
    "running": "it never finished",
}


def failures(run_dir: Path) -> list[str]:
    """What failed in the run at run_dir, one line each; [] when every variant of its spec ran to the end and
    the run was analysed (summary.json and summary.md written: the analysis writes summary.md last)."""
    meta = metadata.read(run_dir)
    out = [f"the run ended early: {meta.error}"] if meta.error else []
    if meta.interrupted:
        out.append("the run was interrupted")
    for variant in meta.spec.variants if meta.spec else meta.variants:
        record = meta.variants.get(variant)
        if record is None:
            out.append(f"variant {variant} never ran")
        elif record.status not in RAN:
            out.append(f"variant {variant} {record.status}: {record.error or WHY.get(record.status, '')}".rstrip(": "))
    if not all((Path(run_dir) / name).exists() for name in ("summary.json", "summary.md")):
        out.append(f"no analysis (rerun: pddlab analyze {run_dir})")
    return [" ".join(line.split()) for line in out]  # a role's output in an error stays on its line
