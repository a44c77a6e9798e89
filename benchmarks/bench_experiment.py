"""The reproduction table: the default PDD experiment beside the published figures (PDD.md).

    python benchmarks/bench_experiment.py            # runs `pdd-vs-baselines`, then prints the table
    python benchmarks/bench_experiment.py RUN_DIR    # prints the table of an existing run

The testbed reproduces the figures' shape at small scale (ratios, orderings),
not their absolute values; each row says which published number it stands for.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from experiments.rundir import metadata
from experiments.rundir.metadata import RunMetadata

# Published figures (../shared/PDD.md), as the table prints them.
PUBLISHED = {
    "ttft_cross_vs_intra": "median TTFT 4.2 s -> 6.7 s (x1.6) when decode moves to another city",
    "ttft_pdd_vs_intra": "PDD keeps TTFT at intra-cluster levels (~x1.0)",
    "wan_bytes": "~90% prefix hit cuts WAN bandwidth by up to 10x",
    "rld_share": "RLD generates 6.2% of output tokens, MD 93.8%",
    "handoff_ids": "100-token handoff as token IDs: 1.5 KB, mean 305 ms, std 4.8 ms",
}


def _ratio(a: float, b: float) -> str:
    return f"x{a / b:.2f}" if b else "-"


def _ci(st: dict, key: str) -> str:
    ci = (st.get("ci95") or {}).get(key)
    return f" [{ci[0]:.0f}, {ci[1]:.0f}]" if ci else ""


def _compared(summary: dict, metric: str, baseline: str) -> str:
    """pdd's ratio to a baseline with its bootstrap interval and verdict (summary.json's comparisons)."""
    c = next((c for c in summary.get("comparisons") or [] if (c["metric"], c["baseline"]) == (metric, baseline)), None)
    if not c or c["ratio"] is None:
        return ""
    ends = f" [{c['ci95'][0]:.2f}, {c['ci95'][1]:.2f}]" if c["ci95"] else ""
    return f" (pdd / {baseline} x{c['ratio']:.2f}{ends}: {c['verdict']})"


def table(summary: dict) -> str:
    """Markdown rows: measured (with 95% intervals) vs published."""
    v = summary["variants"]
    ttft = {name: v[name]["ttft_ms"] for name in v}
    rows = ["| quantity | measured [95% interval] | published |", "|---|---|---|"]
    for name in ("colocated", "pd-intra", "pd-cross", "pdd"):
        if name in ttft:
            t = ttft[name]
            rows.append(
                f"| TTFT p50 / p90 / p99 ms, {name} | {t['p50']:.0f}{_ci(t, 'p50')} / {t['p90']:.0f}{_ci(t, 'p90')} "
                f"/ {t['p99']:.0f} | |"
            )
    intra = ttft.get("pd-intra", {}).get("p50", 0)
    if "pd-cross" in ttft:
        rows.append(
            f"| TTFT p50 pd-cross / pd-intra | {_ratio(ttft['pd-cross']['p50'], intra)} "
            f"| {PUBLISHED['ttft_cross_vs_intra']} |"
        )
    if "pdd" in ttft:
        rows.append(
            f"| TTFT p50 pdd / pd-intra | {_ratio(ttft['pdd']['p50'], intra)}"
            f"{_compared(summary, 'ttft_ms.p50', 'pd-intra')} | {PUBLISHED['ttft_pdd_vs_intra']} |"
        )
    if "pdd" in v and "pd-cross" in v:
        pdd_b, cross_b = v["pdd"]["wan_bytes_total"], v["pd-cross"]["wan_bytes_total"]
        rows.append(
            f"| WAN bytes pdd / pd-cross | {pdd_b / 1e6:.1f} MB / {cross_b / 1e6:.1f} MB "
            f"({_ratio(cross_b, pdd_b)} less){_compared(summary, 'wan_bytes_total', 'pd-cross')} "
            f"| {PUBLISHED['wan_bytes']} |"
        )
    if "pdd" in v:
        p = v["pdd"]
        rows.append(
            f"| RLD share of output tokens, pdd | {100 * p['rld_token_share']:.1f}% | {PUBLISHED['rld_share']} |"
        )
        h = p.get("handoff") or {}
        if h.get("count"):
            lat = h["latency_ms"]
            rows.append(
                f"| handoff (token IDs): payload mean B, latency mean / max ms | {h['payload_bytes']['mean']:.0f} B, "
                f"{lat['mean']:.0f} / {lat['max']:.0f} ms | {PUBLISHED['handoff_ids']} |"
            )
    return "\n".join(rows)


def run_time(meta: RunMetadata) -> str:
    """How long the run took and what dominated it: per variant, role start (start to every role ready) and
    the measured window (ready to roles stopped); the rest is topology set-up, teardown and analysis."""
    import datetime

    def at(s: str) -> datetime.datetime:
        return datetime.datetime.strptime(s, "%Y-%m-%dT%H:%M:%S%z")

    total = (at(meta.require("finished_at")) - at(meta.provenance.started_at)).total_seconds()
    start = sum(w.role_start_s for w in meta.variants.values())
    measured = sum(w.measured_s for w in meta.variants.values())
    rest = total - start - measured
    parts = {"measured windows": measured, "role start": start, "topology, teardown, analysis": rest}
    top = max(parts, key=parts.get)
    return f"run time {total:.0f} s: " + ", ".join(f"{k} {s:.0f} s" for k, s in parts.items()) + f"; dominated by {top}"


def main() -> int:
    """Run (or read) the default experiment and print the reproduction table."""
    if len(sys.argv) > 1:
        run_dir = Path(sys.argv[1])
    else:
        from experiments.run import runner
        from experiments.spec.experiment import load_spec

        spec = load_spec("pdd-vs-baselines")
        run_dir = runner.run(runner.prepare(spec))
    summary = json.loads((run_dir / "summary.json").read_text())
    print(f"reproduction table ({run_dir}):\n")
    print(table(summary))
    print("\n" + run_time(metadata.read(run_dir)))
    print("\nKV-vs-IDs handoff microbenchmark (100 tokens, std and payload): benchmarks/bench_roles.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
