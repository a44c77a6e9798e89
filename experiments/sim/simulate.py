"""`pddlab simulate`: a spec's variants simulated, analysed like an emulated run, written to a run directory.

Responsible for: the workload of a spec (experiments.spec.workload.build, the same requests the emulated run
sends; at most N of them), one `Simulation` per variant, the summary (experiments.analysis.metrics.summarize
and the cost/BCR section: the emulated analysis' own functions, so the figures have the same names and
intervals) marked simulated, and the run directory: summary.json, summary.md, simulation.json (how it was
made: the resolved spec, seed, calibration, wall time, requests simulated per second), requests.jsonl (each
simulated request's record, as the emulated analysis writes them).
Not responsible for: the model itself (experiments.sim.pipeline, .workers, .wan).

summary.json is the emulated run's schema (experiments.analysis.summary.Summary) so `pddlab compare` and the
report tools read it; it is marked simulated in `analysed_by` (`simulated: true`, the tool, the calibration's
status) and by a warning at the top of summary.md, since the schema has no top-level field for it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from experiments.analysis import cost, metrics
from experiments.analysis import records as request_records
from experiments.analysis.records import RequestRecord
from experiments.analysis.summary import Summary, write
from experiments.rundir.files import git_state, new_run_dir, write_json
from experiments.sim import compiled
from experiments.sim.config import SimConfig, sim_config
from experiments.sim.kvroom import kv_capacity_tokens
from experiments.sim.pipeline import Simulation, few_collections
from experiments.sim.wan import Calibration, load_calibration
from experiments.spec import workload
from experiments.spec.experiment import Loaded, to_dict

RESULTS = Path(__file__).resolve().parents[2] / "results"


@dataclass
class SimRun:
    """A finished simulation: records of every variant, the variants' configs, the summary, and wall time (s)."""

    records: list[RequestRecord]
    configs: dict[str, SimConfig]
    summary: Summary
    wall_s: float
    sim_wall_s: float  # of which the simulations themselves (not the workload or the analysis)
    calibration: Calibration
    p_prefix_hit: dict = field(default_factory=dict)  # variant -> P worker -> Simulation.p_prefix_hit's figures

    @property
    def requests(self) -> int:
        return len(self.records)

    @property
    def requests_per_s(self) -> float:
        """Requests simulated per second of wall time (the simulations alone)."""
        return self.requests / self.sim_wall_s if self.sim_wall_s > 0 else float("inf")


def workload_of(loaded: Loaded, requests: int | None = None) -> list[workload.WorkloadRequest]:
    """The spec's workload, cut to its first `requests` (a later turn kept only with its earlier ones: the cut
    keeps whole prefixes of the list, where a turn follows the one it comes after); the warm-up first, beside
    them (not simulated: its prompt is in every P's prefix cache, as after the emulated warm-up)."""
    reqs = workload.build(loaded.spec)
    warm, measured = [r for r in reqs if r.kind == "warmup"], [r for r in reqs if r.kind != "warmup"]
    return warm + (measured if requests is None else measured[:requests])


def simulate(
    loaded: Loaded,
    requests: int | None = None,
    seed: int | None = None,
    calibration: Calibration | None = None,
    analyse: bool = True,
    pace: Mapping[str, Mapping[str, float]] | None = None,
) -> SimRun:
    """Every variant of the spec over the same workload; seed: the line's jitter and real compute's P step spread
    (None: the workload's seed); pace: variant -> role -> times the roofline's time its modelled engines take
    (validation against an emulated run that could not keep the roofline's pace: sim_config)."""
    t0 = time.perf_counter()
    spec = loaded.spec
    seed = spec.workload.seed if seed is None else seed
    cal = calibration or load_calibration()
    reqs = workload_of(loaded, requests)
    configs = {v: sim_config(loaded, v, (pace or {}).get(v)) for v in spec.variants}
    records, sim_s, p_hit = [], 0.0, {}
    for v, cfg in configs.items():
        t1 = time.perf_counter()
        sim = Simulation(cfg, reqs, seed, cal, request_s=spec.timeouts.request_s)
        records += sim.run()
        sim_s += time.perf_counter() - t1
        p_hit[v] = sim.p_prefix_hit()
    with few_collections():  # the analysis' ~10M short-lived tuples and lists: ~1 s of collections else
        summary = (
            summarize(loaded, records, configs, cal, seed, pace)
            if analyse
            else Summary(variants={}, comparisons=[], streams={}, reference={}, slo={})
        )
    return SimRun(records, configs, summary, time.perf_counter() - t0, sim_s, cal, p_hit)


def summarize(
    loaded: Loaded,
    records: list[RequestRecord],
    configs: dict[str, SimConfig],
    cal: Calibration,
    seed: int,
    pace: Mapping[str, Mapping[str, float]] | None = None,
) -> Summary:
    """The emulated analysis' summary of simulated records, marked simulated (and paced, where it was)."""
    spec = loaded.spec
    variants = list(configs)
    first = next(iter(configs.values()))
    rate = first.line.rate_bps / 1e6
    data = metrics.summarize(records, variants, spec.slo, first.kv_bytes_per_token, rate)
    c = cost.cost_section(data, to_dict(spec), variants)
    data["cost"] = c.model_dump(mode="json")
    data["comparisons"] = list(data["comparisons"]) + cost.bcr_comparisons(data, c)
    data["simulated"] = True
    data["analysed_by"] = {
        "simulated": True,
        "tool": "pddlab simulate (experiments/sim)",
        "wan_calibration": cal.status,
        "seed": seed,
        "git": git_state(),
        **({"pace": {v: dict(p) for v, p in pace.items()}} if pace else {}),
    }
    data["warnings"] = [
        {
            "kind": "simulated",
            "message": "Simulated, not measured: a discrete-event model of the pipeline (docs/simulator.md); "
            f"WAN model {cal.describe(first.line, first.wan_congestion)}; its error against the emulator: "
            'docs/simulator.md, "Validation".',
        }
    ]
    if pace:
        data["warnings"].append(
            {
                "kind": "paced",
                "message": "Paced: the modelled engines took the roofline's time times an emulated run's measured "
                f"pace ({pace}), to compare with that run as it ran, not as its spec names.",
            }
        )
    data["warnings"] += [{"kind": "not simulated", "message": m} for m in not_simulated(loaded, configs)]
    data["complete"] = True
    return Summary.model_validate(data)


def not_simulated(loaded: Loaded, configs: dict[str, SimConfig]) -> list[str]:
    """What the spec asks for that the simulator leaves out (docs/simulator.md), one line each."""
    spec, out = loaded.spec, []
    if (spec.schedule or loaded.profile.schedule) and spec.schedule_clock != "variant":
        out.append("Not simulated: the link's schedule (schedule_clock link: the line keeps its base parameters).")
    elif spec.schedule or loaded.profile.schedule:
        out.append(
            "Simulated in part: the link's schedule changes the A->B line (rate, delay, loss, jitter) from each "
            "step on; transfers under way keep their TCP cap, and the way back (the MD's answers and tokens) keeps "
            "the base one-way delay."
        )
    if spec.cross_traffic:
        out.append("Not simulated: cross traffic on the WAN (the KV transfers have the line to themselves).")
    if spec.faults:
        out.append("Not simulated: faults (no component is killed).")
    a_to_b = loaded.profile.a_to_b
    if a_to_b.rate_trace:
        out.append(
            f"Not simulated: the rate trace's variation ({Path(a_to_b.rate_trace).name}): the line runs at the "
            f"trace's mean rate, {a_to_b.mean_rate_mbit:.3g} Mbit/s."
        )
    if a_to_b.loss_ge is not None or a_to_b.loss_state is not None:
        model = "Gilbert-Elliott" if a_to_b.loss_ge is not None else "4-state"
        out.append(
            f"Not simulated: the bursts of the {model} loss model (its stationary mean, "
            f"{a_to_b.expected_loss_pct:.3g}%, caps TCP as random loss would)."
        )
    measured = [v for v, c in configs.items() if c.mode == "pdd" and c.policy.wan_estimate == "measured"]
    if measured:
        out.append(
            f"Not simulated: policy.wan_estimate: measured ({', '.join(measured)}): the route decision uses the "
            f"static estimate (policy.wan_rate_mbit, the line's rate: no loss bound)."
        )
    lookup = [v for v, c in configs.items() if c.mode == "pdd" and c.policy.drc_estimate == "lookup"]
    if lookup:
        out.append(
            f"Not simulated: policy.drc_estimate: lookup ({', '.join(lookup)}): the route decision reads the "
            f"MD's DRC hit at no cost (no WAN round trip to ask each MD, no failed lookup)."
        )
    chunked = sorted({c.handoff for c in configs.values() if c.handoff in ("chunked", "auto")})
    if chunked or spec.handoff_per_request:
        out.append(f"Simulated as one-shot: the {', '.join(chunked) or 'per-request'} handoff.")
    return out


def write_run(run: SimRun, loaded: Loaded, out: Path | None = None) -> Path:
    """The run directory (out, or results/<stamp>-<spec>-sim/): summary.json, summary.md, simulation.json."""
    from experiments.sim.report import markdown

    out = Path(out) if out else new_run_dir(f"{loaded.spec.name}-sim", RESULTS)
    out.mkdir(parents=True, exist_ok=True)
    write(out, run.summary)
    request_records.write(out, run.records, [])  # requests.jsonl: `pddlab compare` pairs requests across runs
    (out / "summary.md").write_text(markdown(run, loaded))
    write_json(
        out / "simulation.json",
        {
            "simulated": True,
            "spec": to_dict(loaded.spec),
            "seed": run.summary.analysed_by.get("seed") if run.summary.analysed_by else None,
            "wan_calibration": run.calibration.status,
            "requests": run.requests,
            "wall_s": run.wall_s,
            "simulation_wall_s": run.sim_wall_s,
            "requests_per_s": run.requests_per_s,
            "compiled_modules": compiled.loaded(),  # those that ran compiled (experiments.sim.compiled): same records
            "variants": {v: _config_record(c) for v, c in run.configs.items()},
            "p_prefix_hit": run.p_prefix_hit,  # each P's own prefix cache (the emulated summary's workers.*)
            "git": git_state(),
        },
    )
    return out


def _config_record(c: SimConfig) -> dict:
    pools = {
        role: {
            "workers": len(ws),
            "accelerator": ws[0].roofline.accelerator.name if ws else None,
            "devices": ws[0].roofline.devices if ws else None,
            "kv_tokens": kv_capacity_tokens(ws[0]) if ws else None,
        }
        for role, ws in c.workers.items()
    }
    line = {"rate_mbit": c.line.rate_bps / 1e6, "rtt_ms": c.line.rtt_s * 1e3, "loss_pct": c.line.loss * 100}
    return {
        "mode": c.mode,
        "handoff": c.handoff,
        "pools": pools,
        "accelerators": c.accelerators,
        "kv_bytes_per_token": c.kv_bytes_per_token,
        "line": line,
        "wan_connections": c.wan_connections,
    }
