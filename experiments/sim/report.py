"""summary.md of a simulated run: the emulated run's tables (experiments.analysis.summary_md), marked simulated.

Responsible for: the page a reader sees first after `pddlab simulate`: what was simulated (deployment, line,
calibration), the per-variant table, intervals and comparisons as an emulated run prints them, the cost and
BCR table, and per variant its routes, RLD token share and handoffs.
Not responsible for: the figures (experiments.sim.simulate builds the summary).
"""

from __future__ import annotations

from experiments.analysis import cost
from experiments.analysis.summary_md import figures


def markdown(run, loaded) -> str:
    """The page (run: experiments.sim.simulate.SimRun; loaded: the spec)."""
    spec, s = loaded.spec, run.summary
    lines = [
        f"# {spec.name}: {spec.profile} (SIMULATED)",
        "",
        f"**Simulated, not measured** (docs/simulator.md); WAN model: {run.calibration.status}. "
        f"{run.requests} requests in {run.sim_wall_s:.2f} s of wall time ({run.requests_per_s:,.0f} requests/s). "
        f"SLO: TTFT ≤ {s.slo['ttft_ms']:g} ms, TPOT ≤ {s.slo['tpot_ms']:g} ms",
        "",
        *[f"- {w['message']}" for w in s.warnings[1:]],
        "",
        "| variant | mode | accelerators (P / RLD / MD) | line Mbit/s, RTT ms, loss % | KV B/token |",
        "|---|---|---|---|---|",
    ]
    for v, c in run.configs.items():
        pools = " / ".join(
            f"{len(ws)}x{ws[0].roofline.devices} {ws[0].roofline.accelerator.name}" if ws else "-"
            for ws in (c.workers["p"], c.workers["rld"], c.workers["md"])
        )
        ln = c.line
        lines.append(
            f"| {v} | {c.mode} | {pools} | {ln.rate_bps / 1e6:g}, {ln.rtt_s * 1e3:g}, {ln.loss * 100:g} | "
            f"{c.kv_bytes_per_token:,} |"
        )
    lines += ["", *figures(s), *cost.markdown_section(s.cost), "", "## Routes, RLD share, handoffs", ""]
    lines += ["| variant | routes | RLD token share | handoffs | WAN bytes |", "|---|---|---|---|---|"]
    for v, vs in s.variants.items():
        routes = ", ".join(f"{k} {n}" for k, n in sorted(vs.routes.items()))
        share = "–" if vs.rld_token_share is None else f"{vs.rld_token_share:.3f}"
        lines.append(f"| {v} | {routes} | {share} | {vs.handoff.get('count', 0)} | {vs.wan_bytes_total:,} |")
    return "\n".join(lines) + "\n"
