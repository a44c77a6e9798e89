"""What a sweep point costs beyond its measured windows, with the topology shared and without.

    python benchmarks/bench_sweep.py          # pdd-smoke over link.loss_pct=0,1,3 (process runtime), twice

Prints, per mode, the seconds per run: wall, measured windows, role start, and the rest (topology set-up
and teardown where not shared, link swap, analysis), and what dominates.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from experiments.run import sweep
from experiments.analysis import sweep_report

AXIS = "link.loss_pct=0,1,3"
SET = ("runtime=process",)


def measure(share: bool, root: Path) -> dict:
    plan = sweep.Plan("pdd-smoke", SET, None, None, (sweep.parse_over(AXIS),), 1, share_topology=share)
    out = sweep.run(plan, sweep.new_sweep_dir(plan, root))
    _, points, data = sweep.load(out)
    return sweep_report.overhead(points, data.get("topologies") or [])


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="pddlab-bench-sweep-") as tmp:
        rows = {share: measure(share, Path(tmp)) for share in (True, False)}
    print(f"sweep of pdd-smoke over {AXIS} (every variant, process runtime): seconds per run\n")
    print("| topology | wall | measured windows | role start | rest | dominated by |")
    print("|---|---|---|---|---|---|")
    for share, o in rows.items():
        parts = {"measured windows": o["measured_s"], "role start": o["role_start_s"], "rest": o["rest_s"]}
        print(
            f"| {'shared' if share else 'one per point'} | {o['wall_s']:.1f} | {o['measured_s']:.1f} | "
            f"{o['role_start_s']:.1f} | {o['rest_s']:.1f} | {max(parts, key=parts.get)} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
