"""Simulator against emulator (issue 30): fit the real-compute constants from emulated runs' events; compare summaries.

    .venv/bin/python scripts/validate_sim.py fit RUN_DIR... [--per-run] [--variants V,V]  # realcompute's constants
    .venv/bin/python scripts/validate_sim.py p-level MATRIX... [--variants pd-intra,pdd]  # the P step's level
    .venv/bin/python scripts/validate_sim.py modelled-p RUN_DIR [--arch kimi-k2 --accelerator h800 --devices 16]
    .venv/bin/python scripts/validate_sim.py paced RUN_DIR...  # modelled runs: the simulator also at their own pace
    .venv/bin/python scripts/validate_sim.py wan-table MATRIX... [--out experiments/sim/calibration.yaml]  # the WAN
    .venv/bin/python scripts/validate_sim.py wan-spread MATRIX... [--spreads 0,0.25,0.5]  # the WAN's uneven shares
    .venv/bin/python scripts/validate_sim.py p-spread RUN_DIR... [--variants pd-intra,pdd]  # the P step's spread
    .venv/bin/python scripts/validate_sim.py decode-level MATRIX... [--variants colocated,pd-intra]  # the RLD's
    .venv/bin/python scripts/validate_sim.py lan-rate RUN_DIR... [--variants pd-intra,pdd]  # the emulated LAN's
    .venv/bin/python scripts/validate_sim.py compare DIRS [--spec pdd-vs-baselines] [--out /tmp/simval]
    .venv/bin/python scripts/validate_sim.py compare-repeats MATRIX... [--spec S] [--set K=V] [--seed S] [--out DIR]

fit: every event but the warm-up's (request ids with ".w") of the runs' variants/*/events/*.jsonl, pooled: P's
prefill_step against the lone roofline of its chunks (least absolute deviation: fixed + factor x roofline), the
decode workers' mixed steps the same way (each request's chunk at its own context), decode steps ((decode_done -
first_token, less the worker's mixed steps in between) / the steps left, against the roofline of mean_batch
sessions at 700 tokens: median ratio), KV import (kv_imported - kv_recv_end: fixed + per token). Then the same per
variant (--per-run: and per run) with each engine's CPU share (role_cpu) and the variant's level against the pooled
fit, and the count model (realcompute.Contention: the variant's engines and WAN senders, from the run's spec) fitted
on every variant at once: ENGINE_SLOWDOWN, WAN_SENDER_SLOWDOWN, POOLED_SLOWDOWN.
--variants: only those variants' events (e.g. pd-intra,pdd: the P steps without pd-cross's whole-prompt WAN sender).
p-level: each run of the matrices (as compare-repeats finds them, the spec's own only) against the simulator: the
emulated P's busy time in each variant (per_worker busy_pct x duration_s) over the simulated P's (its steps' seconds:
the simulator runs the emulated P's steps one to one), the median of that ratio over runs and variants, and
realcompute's P step constants scaled by it.
p-spread: each P step of the runs' events (the warm-up's left out, in the order they ran) against the simulator's
time for the same chunks (realcompute: P_STEP_FIXED_S per chunk + P_STEP_FACTOR x the lone roofline): log(measured /
model) less its run and variant's median (the level, p-level's), per run and variant and pooled: sigma, quantiles,
skewness, and the lag-1 correlation step to step (what realcompute.P_STEP_SIGMA and P_STEP_LAG1 are).
paced: modelled-compute runs (their summaries) against the simulator of the spec each ran (its metadata.json's) at
the roofline's time and at the pace each run's modelled engines kept (summary roles_cpu: (modelled + late) /
modelled s, per variant and role), side by side: how much of the gap is the emulator's engines running late here.
decode-level: the same for the decode worker, whose busy time the summaries do not keep (its workers' busy_pct is
P's alone; roles_cpu's serving CPU, printed beside, is CPU not wall time and missing in the oldest matrix): each
run's TPOT p50 (the decode worker's time per step, its mixed steps in between included) over the simulated one's,
the median over runs and variants, and realcompute's decode worker constants (mixed step, decode factor, import)
scaled by it.
lan-rate: the goodput the emulated fast path (P -> RLD) reached where the LAN bound it: each fast-path copy
(kv_send_start to kv_send_end on P, path fast) that ended more than 20 ms after its prefill (the prefill's end did
not hold it back: the copy ran behind the LAN all along; experiments.analysis.transfers.lan_bound_rates, what a
run's summary now keeps as kv_paths.fast.lan_bound), its KV bytes over its time; the median and
quartiles per variant and pooled, and the LAN profile's rate_mbit that gives the pooled median through the
simulator's LAN (experiments.sim.config.lan_line: rate x 1448/1514). What experiments/specs/lines/lan-this-machine.yaml
holds: compare-repeats --set lan_profile=experiments/specs/lines/lan-this-machine.yaml then simulates the LAN these
runs had, not the 10 Gbit/s the `lan` profile names.
compare: DIRS holds lines "PROFILE RUN_DIR [RC]" (a run directory or any directory with its summary.json); each
profile is simulated once (`pddlab simulate SPEC --set profile=P`) and every variant's TTFT p50 (with both 95%
intervals), p90 and WAN KV bytes are printed side by side as a markdown table, with the error and whether it is
within issue 30's acceptance (+-15% on p50 and bytes, +-25% on p90).
compare-repeats: every MATRIX (any number) holds runs of the spec, one a profile, as PROFILE/summary.json or
*/PROFILE/summary.json (metadata.json beside it is read where kept). A run whose summary is not the simulated spec's
experiment (variants, planned requests, SLO, KV bytes per token, the workload's mean hit; the metadata's experiment,
profile and compute: mode, arch, each role's accelerator and devices, as --set gives the simulated spec them) is
refused and named, never pooled. Per profile, variant and metric (TTFT p50, p90, WAN KV bytes): the
runs' mean, its Student's t 95% interval over runs (n >= 2), their coefficient of variation, the simulated figure
(its own interval where the simulator gives one), the error against the mean and a verdict: within / outside the
acceptance, or "not judgeable at this n" where the runs' interval is wider than the acceptance of their mean; and
whether the simulated figure lies inside the runs' interval; the runs that would make it judgeable at the measured
CV. Markdown table on stdout; repeats.json and repeats.md
in --out, beside each profile's simulated run. --across-profiles colocated,pd-intra: those variants (which never
cross the WAN, so the profile cannot move them) also pooled over every profile's runs, as rows "all profiles".
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _events(run: Path, variants: tuple[str, ...] = ()):
    """(variant, worker -> its events but the warm-up's) of each variant of the run (variants: only those; (): all)."""
    for vdir in sorted((run / "variants").iterdir()):
        if variants and vdir.name not in variants:
            continue
        ev = {}
        for f in (vdir / "events").glob("*.jsonl"):
            ev[f.stem] = [e for e in map(json.loads, f.open()) if ".w" not in (e.get("request_id") or "")]
        yield vdir.name, ev


def _lad(points: list[tuple[float, float]]) -> tuple[float, float]:
    import numpy as np
    from scipy.optimize import minimize

    x, y = np.array([p[0] for p in points]), np.array([p[1] for p in points])
    fixed, factor = minimize(lambda t: np.abs(y - (t[0] + t[1] * x)).sum(), [0.1, 2.0], method="Nelder-Mead").x
    return float(fixed), float(factor)


@dataclass
class Samples:
    """One variant's (or every variant's) events as fit reads them: (lone roofline s, measured s) of P's prefill
    steps and of the decode workers' mixed steps; decode steps as measured / roofline ratios; KV imports as
    (tokens, s); cpu: per engine (p1, rld1, md1) its serving CPU seconds / serving wall seconds (role_cpu)."""

    p_steps: list = field(default_factory=list)
    mixed: list = field(default_factory=list)
    decode: list = field(default_factory=list)
    imports: list = field(default_factory=list)
    cpu: dict = field(default_factory=dict)
    mode: str = ""  # the variant's mode (run_mode)
    contention: object = None  # the variant's experiments.sim.realcompute.Contention (run_mode)

    def extend(self, other: Samples) -> None:
        self.p_steps += other.p_steps
        self.mixed += other.mixed
        self.decode += other.decode
        self.imports += other.imports
        for w, shares in other.cpu.items():
            self.cpu.setdefault(w, []).extend(shares)


def _p_steps(events: list, lone) -> list[tuple[float, float]]:
    from workers.modelled.roofline import Part

    return [
        (
            lone.step([Part(n, start, 1 if last else 0) for _rid, start, n, last in e["chunks"]]).seconds,
            e["duration_ns"] / 1e9,
        )
        for e in events
        if e["event"] == "prefill_step" and e["chunks"] and not any(".w" in c[0] for c in e["chunks"])
    ]


def _decode_worker(events: list, lone, kv_bytes_per_token: int, s: Samples) -> None:
    """A decode worker's mixed steps, decode steps and imports into s."""
    from workers.modelled.roofline import Part

    first: dict[str, int] = {}  # the earliest: until 2026-12-06 a worker also wrote one at index 1 after index 0
    for e in events:
        if e["event"] == "first_token":
            first[e["request_id"]] = min(e["t_ns"], first.get(e["request_id"], e["t_ns"]))
    recv = {e["request_id"]: e["t_ns"] for e in events if e["event"] == "kv_recv_end"}
    mixed_ends = [(e["t_ns"], e["duration_ns"]) for e in events if e["event"] == "decode_step_mixed"]
    context = {}  # request -> tokens with KV so far (its cached prefix at decode_open, then its chunks')
    for e in events:
        rid = e.get("request_id")
        warm = any(".w" in r for r in e.get("requests") or ())
        if e["event"] == "decode_open":
            context[rid] = e.get("cached_tokens") or 0
        elif e["event"] == "decode_step_mixed" and e["chunk_tokens"] > 1 and not warm:
            # the step's chunk tokens split evenly over its requests, each at its own context (600 if unknown)
            share = e["chunk_tokens"] / len(e["requests"])
            parts = [Part(1, 700, 1)] * e["decode_tokens"]
            for r in e["requests"]:
                parts.append(Part(max(1, round(share)), context.get(r, 600), 1))
                context[r] = context.get(r, 600) + round(share)
            s.mixed.append((lone.step(parts).seconds, e["duration_ns"] / 1e9))
        elif e["event"] == "decode_done" and rid in first and e["steps"] > 1:
            # the worker's steps with a prefill chunk in them (mixed steps: colocated's RLD) between the request's
            # first token and its last are fitted as mixed steps above, not decode steps: taken out of the span
            inside = [d for t, d in mixed_ends if first[rid] < t <= e["t_ns"]]
            steps = e["steps"] - len(inside)
            if steps >= 1:
                per_step = (e["t_ns"] - first[rid] - sum(inside)) / 1e9 / steps
                s.decode.append(per_step / lone.decode_s([700] * max(1, round(e["mean_batch"]))))
        elif e["event"] == "kv_imported" and rid in recv:
            s.imports.append((e["kv_bytes"] / kv_bytes_per_token, (e["t_ns"] - recv[rid]) / 1e9))


def run_mode(run: Path, variant: str):
    """A run's variant: its mode and its Contention as the simulator derives it (experiments.sim.config.contention),
    from the run's spec (metadata.json: variant_defs, pools)."""
    from experiments.sim.config import contention

    spec = json.loads((run / "metadata.json").read_text())["spec"]
    mode = ((spec.get("variant_defs") or {}).get(variant) or {}).get("mode", variant)
    return mode, contention(mode, {role: spec["pools"][role]["workers"] for role in ("p", "rld", "md")})


def samples(runs: list[Path], variants: tuple[str, ...] = ()) -> dict[str, Samples]:
    """variant -> its samples over every run (the warm-up's events left out; variants: only those, (): all)."""
    from workers.modelled.catalogue import load_catalogue
    from workers.modelled.roofline import Roofline

    cat = load_catalogue()
    model = cat.model("default")
    lone = Roofline(cat.accelerator("this-machine"), model)
    out: dict[str, Samples] = {}
    for run in runs:
        for variant, ev in _events(run, variants):
            s = Samples(p_steps=_p_steps(ev.get("p1", []), lone))
            for w in ("rld1", "md1"):
                _decode_worker(ev.get(w, []), lone, model.kv_bytes_per_token, s)
            for w in ("p1", "rld1", "md1"):
                for e in ev.get(w, []):
                    if e["event"] == "role_cpu" and e.get("serving_wall_s"):
                        s.cpu.setdefault(w, []).append(e["serving_cpu_s"] / e["serving_wall_s"])
            mode, busy = run_mode(run, variant)
            if out.setdefault(variant, Samples(mode=mode, contention=busy)).contention != busy:
                raise ValueError(f"{run}: {variant} has contention {busy}, other runs {out[variant].contention}")
            out[variant].extend(s)
    return out


@dataclass(frozen=True)
class ContentionFit:
    """The constants at one engine alone and the slowdown per other engine / WAN sender (realcompute's names)."""

    p_step_fixed_s: float
    p_step_factor: float
    mixed_step_fixed_s: float
    mixed_step_factor: float
    decode_factor: float
    import_fixed_s: float
    import_per_token_s: float
    engine_slowdown: float
    wan_sender_slowdown: float

    def slowdown(self, busy) -> float:
        return 1 + self.engine_slowdown * (busy.engines - 1) + self.wan_sender_slowdown * busy.wan_senders


def fit_contention(by_variant: dict[str, Samples], nonnegative: bool = True) -> ContentionFit:
    """Every kind of event of every variant at once: measured = (fixed + factor x roofline) x slowdown(variant)
    (a decode step: decode_factor x roofline x slowdown), robust least squares on log(measured / predicted), each
    kind of event weighted alike whatever its count (so the 4 variants' differences, not the most numerous kind,
    set the slowdown). nonnegative: the slowdowns bounded at 0 (else at -0.5, to see where the data alone put them)."""
    import numpy as np
    from scipy.optimize import least_squares

    kinds = ("p_steps", "mixed", "decode", "imports")
    data = {k: [(x, y, s.contention) for s in by_variant.values() for x, y in _pairs(s, k)] for k in kinds}
    cols = {k: [np.array(c) for c in zip(*[(x, y) for x, y, _b in data[k]])] for k in kinds if data[k]}
    busy = {k: [b for _x, _y, b in data[k]] for k in cols}

    def residuals(t):
        f = ContentionFit(*t)
        out = []
        for k, (x, y) in cols.items():
            slow = np.array([f.slowdown(b) for b in busy[k]])
            base = {
                "p_steps": f.p_step_fixed_s + f.p_step_factor * x,
                "mixed": f.mixed_step_fixed_s + f.mixed_step_factor * x,
                "decode": f.decode_factor * x,
                "imports": f.import_fixed_s + f.import_per_token_s * x,
            }[k]
            out.append((np.log(y) - np.log(np.maximum(base * slow, 1e-9))) / np.sqrt(len(y)))
        return np.concatenate(out)

    start = [0.05, 1.0, 0.03, 0.8, 0.6, 0.004, 4e-5, 0.2, 0.5]
    # another process on the cores cannot make a step faster: both slowdowns >= 0
    lower = [0, 0.01, 0, 0.01, 0.01, 0, 0, 0, 0] if nonnegative else [0, 0.01, 0, 0.01, 0.01, 0, 0, -0.5, -0.5]
    bounds = (lower, [2, 20, 2, 20, 20, 1, 1e-2, 5, 10])
    return ContentionFit(*least_squares(residuals, start, bounds=bounds, loss="soft_l1", f_scale=0.05).x)


def _pairs(s: Samples, kind: str) -> list[tuple[float, float]]:
    """(x, measured) of one kind: x the roofline's s (a decode step: 1, its measured value being the ratio), or
    an import's tokens."""
    return [(1.0, r) for r in s.decode] if kind == "decode" else getattr(s, kind)


def _ratio(points: list[tuple[float, float]]) -> str:
    """The median measured / roofline ratio of (roofline, measured) points."""
    return f"{statistics.median(m / r for r, m in points):.2f}x" if points else "–"


def _lad_text(points: list[tuple[float, float]], per: str = "x") -> str:
    """A LAD fit's text: 'fixed + factor x' (s, of the roofline), or per token: 'fixed ms + factor ms/token'."""
    if len(points) < 3:
        return f"– (n={len(points)})"
    fixed, factor = _lad(points)
    if per == "token":
        return f"{fixed * 1e3:.1f} ms + {factor * 1e3:.4f} ms/token (n={len(points)})"
    return f"{fixed:.3f} + {factor:.2f}x (n={len(points)})"


@dataclass(frozen=True)
class PooledConstants:
    """experiments/sim/realcompute.py's constants, pooled over every variant (LAD fits, the decode ratio's median)."""

    p_step: tuple[float, float]  # fixed s, factor x roofline
    mixed_step: tuple[float, float]  # fixed s, factor x roofline
    decode_factor: float
    import_: tuple[float, float]  # fixed s, s per token


def pooled_constants(pooled: Samples) -> PooledConstants:
    return PooledConstants(
        _lad(pooled.p_steps), _lad(pooled.mixed), statistics.median(pooled.decode), _lad(pooled.imports)
    )


def slowdowns(by_variant: dict[str, Samples], c: PooledConstants) -> dict[str, tuple[float, float]]:
    """mode -> (P, decode workers): the median of measured / the pooled constants' time, over its P's steps, and
    over its decode workers' mixed steps, decode steps and imports together (1.0 where the variant has no such
    event): each variant's own level, what free per-variant constants would be."""
    out = {}
    for s in by_variant.values():
        p = [m / (c.p_step[0] + c.p_step[1] * x) for x, m in s.p_steps]
        d = [m / (c.mixed_step[0] + c.mixed_step[1] * x) for x, m in s.mixed]
        d += [r / c.decode_factor for r in s.decode]
        d += [m / (c.import_[0] + c.import_[1] * n) for n, m in s.imports]
        out[s.mode] = (statistics.median(p) if p else 1.0, statistics.median(d) if d else 1.0)
    return out


def _slowdown_text(slow: dict[str, tuple[float, float]]) -> str:
    return "{" + ", ".join(f'"{m}": ({p:.2f}, {d:.2f})' for m, (p, d) in sorted(slow.items())) + "}"


def fit(runs: list[Path], per_run: bool = False, variants: tuple[str, ...] = ()) -> None:
    """The pooled constants of experiments/sim/realcompute.py, each variant's own (per_run: also each run's, to
    see the run-to-run spread) and its level against the pooled ones, then the count model (realcompute's
    Contention: a slowdown per other engine and per WAN sender) fitted on every variant at once. variants: only
    those variants' events (e.g. pd-intra,pdd: P's steps without pd-cross's whole-prompt WAN sender); (): all."""
    by_variant = samples(runs, variants)
    pooled = Samples()
    for s in by_variant.values():
        pooled.extend(s)
    c = pooled_constants(pooled)
    q = statistics.quantiles(pooled.decode, n=4)
    print(f"P_STEP_FIXED_S, P_STEP_FACTOR = {c.p_step[0]:.4f}, {c.p_step[1]:.3f}  (n={len(pooled.p_steps)})")
    print(
        f"MIXED_STEP_FIXED_S, MIXED_STEP_FACTOR = {c.mixed_step[0]:.4f}, {c.mixed_step[1]:.3f}  (n={len(pooled.mixed)})"
    )
    print(f"DECODE_FACTOR = {c.decode_factor:.3f}  (quartiles {q[0]:.2f}, {q[2]:.2f}; n={len(pooled.decode)})")
    print(f"IMPORT_FIXED_S, IMPORT_PER_TOKEN_S = {c.import_[0]:.4f}, {c.import_[1]:.3g}  (n={len(pooled.imports)})")
    print(f"per variant, measured / pooled (P, decode workers): {_slowdown_text(slowdowns(by_variant, c))}")
    print(f"\nPer variant, {len(runs)} runs pooled:\n")
    print("\n".join(variant_table(by_variant)))
    for run in runs if per_run else ():
        one = samples([run], variants)
        print(f"\n{run.name}: measured / pooled (P, decode workers) = {_slowdown_text(slowdowns(one, c))}\n")
        print("\n".join(variant_table(one)))
    free = fit_contention(by_variant, nonnegative=False)
    print_contention(fit_contention(by_variant), by_variant)
    print(
        f"\nUnbounded (where the data alone put them): ENGINE_SLOWDOWN, WAN_SENDER_SLOWDOWN = "
        f"{free.engine_slowdown:.3f}, {free.wan_sender_slowdown:.3f}"
    )


def variant_table(by_variant: dict[str, Samples]) -> list[str]:
    """Markdown: per variant its contention, P's and the mixed steps' LAD fits (fixed s + factor x roofline) and
    median measured / roofline ratios, the decode ratio's median and quartiles, the import's fit (fixed s + s per
    token) and each engine's CPU share (p1, rld1, md1: serving CPU s / serving wall s)."""
    out = [
        "| variant | contention | P step | P ratio | mixed step | mixed ratio | decode ratio [quartiles] (n) | import "
        "| CPU p1, rld1, md1 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for variant, s in sorted(by_variant.items()):
        dq = statistics.quantiles(s.decode, n=4) if len(s.decode) > 1 else None
        dec = f"{dq[1]:.2f}x [{dq[0]:.2f}, {dq[2]:.2f}] ({len(s.decode)})" if dq else "–"
        cpu = ", ".join(f"{statistics.fmean(s.cpu[w]):.2f}" if w in s.cpu else "–" for w in ("p1", "rld1", "md1"))
        busy = f"{s.contention.engines} engines, {s.contention.wan_senders} WAN"
        out.append(
            f"| {variant} | {busy} | {_lad_text(s.p_steps)} | {_ratio(s.p_steps)} | {_lad_text(s.mixed)} "
            f"| {_ratio(s.mixed)} | {dec} | {_lad_text(s.imports, 'token')} | {cpu} |"
        )
    return out


def pooled_slowdown(f: ContentionFit, by_variant: dict[str, Samples]) -> float:
    """The count model's slowdown averaged over every event of the fit (each P step, mixed step, decode step and
    import once): what constants pooled over these variants carry, so realcompute divides it out."""
    weights = [
        (len(s.p_steps) + len(s.mixed) + len(s.decode) + len(s.imports), f.slowdown(s.contention))
        for s in by_variant.values()
    ]
    return sum(n * k for n, k in weights) / sum(n for n, _k in weights)


def print_contention(f: ContentionFit, by_variant: dict[str, Samples]) -> None:
    """The contention model's constants and, per variant, its slowdown and the measured / modelled median ratio of
    each kind of step (1.00x: the model carries that variant's contention)."""
    print(
        "\nThe count model (every variant at once): the constants at one engine alone, the slowdown per other engine"
        " and per WAN sender, and the slowdown the pooled constants carry (the mean over these events):\n"
    )
    print(
        f"P_STEP_FIXED_S, P_STEP_FACTOR = {f.p_step_fixed_s:.4f}, {f.p_step_factor:.3f}\n"
        f"MIXED_STEP_FIXED_S, MIXED_STEP_FACTOR = {f.mixed_step_fixed_s:.4f}, {f.mixed_step_factor:.3f}\n"
        f"DECODE_FACTOR = {f.decode_factor:.3f}\n"
        f"IMPORT_FIXED_S, IMPORT_PER_TOKEN_S = {f.import_fixed_s:.4f}, {f.import_per_token_s:.3g}\n"
        f"ENGINE_SLOWDOWN, WAN_SENDER_SLOWDOWN = {f.engine_slowdown:.3f}, {f.wan_sender_slowdown:.3f}\n"
        f"POOLED_SLOWDOWN = {pooled_slowdown(f, by_variant):.3f}"
    )
    print("\n| variant | slowdown | P step measured / model | mixed | decode | import |")
    print("|---|---|---|---|---|---|")
    for variant, s in sorted(by_variant.items()):
        slow = f.slowdown(s.contention)
        p = _ratio([(f.p_step_fixed_s + f.p_step_factor * r, m / slow) for r, m in s.p_steps])
        mx = _ratio([(f.mixed_step_fixed_s + f.mixed_step_factor * r, m / slow) for r, m in s.mixed])
        dec = _ratio([(f.decode_factor, r / slow) for r in s.decode])
        imp = _ratio([(f.import_fixed_s + f.import_per_token_s * n, m / slow) for n, m in s.imports])
        print(f"| {variant} | {slow:.2f} | {p} | {mx} | {dec} | {imp} |")


def _err(emulated, simulated) -> str:
    return f"{(simulated - emulated) / emulated:+.0%}" if emulated and simulated is not None else "–"


def _num(x) -> str:
    return f"{x:,.0f}" if isinstance(x, (int, float)) else "–"


def _p50(v: dict) -> str:
    t = v.get("ttft_ms") or {}
    ci = (t.get("ci95") or {}).get("p50")
    return _num(t.get("p50")) + (f" [{ci[0]:,.0f}, {ci[1]:,.0f}]" if ci else "")


def kv_scale(run: Path) -> float:
    """The run's compute.kv_scale (metadata.json's line_scaling; 1 without one): an emulated run with kv_scale k
    carries each token's KV as 1/k of its bytes over a line k times slower, so its wire's KV bytes x k are the
    modelled deployment's, which the simulator (no scaled line) counts."""
    meta = run / "metadata.json"
    if not meta.exists():
        return 1.0
    return float((json.loads(meta.read_text()).get("line_scaling") or {}).get("kv_scale") or 1.0)


def compare(dirs: Path, spec: str, out: Path) -> None:
    sims: dict[str, dict] = {}
    print(
        "| profile | run | variant | TTFT p50 emulated [95%] | simulated [95%] | error | p90 emulated | simulated |"
        " error | WAN KV bytes emulated | simulated | error | sent (emulated) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for line in dirs.read_text().splitlines():
        if not line.strip():
            continue
        profile, run = line.split()[:2]
        summary = Path(run) / "summary.json"
        if not summary.exists():
            print(f"| {profile} | {Path(run).name} | (no summary.json: skipped) |", file=sys.stderr)
            continue
        if profile not in sims:
            sims[profile] = _simulate(spec, profile, out)["variants"]
        scale = kv_scale(Path(run))
        for name, e in json.loads(summary.read_text())["variants"].items():
            s = sims[profile].get(name, {})
            te, ts = e.get("ttft_ms") or {}, s.get("ttft_ms") or {}
            we, ws = e.get("wan_kv_bytes_total"), s.get("wan_kv_bytes_total")
            we = we * scale if we is not None else None  # the deployment's bytes, as the simulator counts them
            print(
                f"| {profile} | {Path(run).name[:15]} | {name} | {_p50(e)} | {_p50(s)} "
                f"| {_err(te.get('p50'), ts.get('p50'))} "
                f"| {_num(te.get('p90'))} | {_num(ts.get('p90'))} | {_err(te.get('p90'), ts.get('p90'))} "
                f"| {_num(we)} | {_num(ws)} | {_err(we, ws) if we else '–'} | {e.get('issued')}/{e.get('requests')} |"
            )


# --- compare-repeats: the simulator against the mean of repeated emulated runs ---------------------------------

# issue 30's acceptance: the simulated figure within this share of the emulated one
TOLERANCE = {"ttft_p50_ms": 0.15, "ttft_p90_ms": 0.25, "wan_kv_bytes": 0.15}
# where each metric sits in a variant's summary; the last key also names its within-run interval (ci95), if any
METRIC_PATHS = {
    "ttft_p50_ms": ("ttft_ms", "p50"),
    "ttft_p90_ms": ("ttft_ms", "p90"),
    "wan_kv_bytes": ("wan_kv_bytes_total",),
}


@dataclass(frozen=True)
class Run:
    """One emulated run of the spec on one profile.

    matrix: the directory it was found under; profile: its profile (the summary's folder name);
    summary: its summary.json; metadata: its metadata.json where kept beside it (None otherwise)
    """

    matrix: str
    profile: str
    summary: dict
    metadata: dict | None = None

    @property
    def commit(self) -> str:
        """The code that analysed it (the run's own commit where its metadata is kept), short, '+' if dirty."""
        git = (
            ((self.metadata or {}).get("provenance") or {}).get("git")
            or (self.summary.get("analysed_by") or {}).get("git")
            or {}
        )
        return (git.get("commit") or "?")[:7] + ("+" if git.get("dirty") else "")

    @property
    def speed(self) -> str:
        """The machine's reference prefill before the run (workers.speed, CPU ms; metadata's provenance.machine.speed),
        '' where it was not recorded (runs made before it was): the machine's level beside the run's figures."""
        speed = (((self.metadata or {}).get("provenance") or {}).get("machine") or {}).get("speed")
        return f", machine {speed['prefill_cpu_ms']:.0f} ms" if speed else ""


def find_runs(matrices: list[Path]) -> list[Run]:
    """Every summary.json one or two folders below each matrix directory (MATRIX/PROFILE/ or MATRIX/*/PROFILE/)."""
    runs = []
    for m in matrices:
        for f in sorted([*m.glob("*/summary.json"), *m.glob("*/*/summary.json")]):
            meta = f.parent / "metadata.json"
            runs.append(
                Run(
                    str(m),
                    f.parent.name,
                    json.loads(f.read_text()),
                    json.loads(meta.read_text()) if meta.exists() else None,
                )
            )
    return runs


def identity(summary: dict) -> dict:
    """What makes two summaries the same experiment: variants, each one's planned requests, the SLO, the KV bytes
    per token and the workload's mean expected hit (a fingerprint of its seed and shape). The profile's own
    figures (line rate, RTT) and the code version are not in it."""
    variants = summary.get("variants") or {}
    hits = {round((v.get("hit_rate") or {}).get("expected_mean") or 0.0, 9) for v in variants.values()}
    ref = summary.get("reference") or {}
    return {
        "variants": {name: v.get("requests") for name, v in sorted(variants.items())},
        "slo": summary.get("slo"),
        "kv_bytes_per_token": ref.get("kv_bytes_per_token"),
        "median_uncached_tokens": ref.get("median_uncached_tokens"),
        "expected_hit": sorted(hits),
    }


def compute_of(deployment: dict | None) -> dict:
    """What computes in a spec's deployment (its raw overrides, as a spec and metadata.json keep them): compute
    (mode real unless named) and each role's accelerator and devices where set."""
    d = deployment or {}
    out = {"compute": {"mode": "real", **(d.get("compute") or {})}}
    for role in ("p", "rld", "md"):
        if r := {k: v for k, v in (d.get(role) or {}).items() if k in ("accelerator", "devices")}:
            out[role] = r
    return out


def run_compute(run: Run) -> dict:
    """compute_of the spec the run ran (metadata.json); without its metadata only the mode, read from its summary
    (roles_cpu: modelled engines' seconds)."""
    if run.metadata:
        return compute_of((run.metadata.get("spec") or {}).get("deployment"))
    modelled = any(
        (r.get("modelled_s") or 0) > 0
        for v in run.summary.get("variants", {}).values()
        for r in ((v.get("roles_cpu") or {}).get("roles") or {}).values()
    )
    return {"compute": {"mode": "modelled" if modelled else "real"}}


def mismatch(run: Run, reference: dict, spec: str, compute: dict | None = None) -> str | None:
    """Why run is not the experiment of reference (the simulated spec's identity), or None if it is. compute: the
    simulated spec's compute_of; a run that computed otherwise (real against modelled, another accelerator or
    arch) is not its experiment, though its summary's identity may match (without metadata only the mode is
    compared)."""
    ident = identity(run.summary)
    diff = [f"{k} {ident[k]} != {reference[k]}" for k in reference if ident.get(k) != reference[k]]
    if compute is not None:
        theirs = run_compute(run)
        ours = compute if run.metadata else {"compute": {"mode": compute["compute"]["mode"]}}
        if theirs != ours:
            diff.append(f"compute {theirs} != {ours}")
    meta = run.metadata or {}
    if meta and meta.get("experiment") != spec:
        diff.append(f"experiment {meta.get('experiment')} != {spec}")
    if meta and (meta.get("spec") or {}).get("profile") not in (None, run.profile):
        diff.append(f"metadata's profile {meta['spec']['profile']} != folder {run.profile}")
    if run.summary.get("simulated"):
        diff.append("a simulated summary, not an emulated run")
    return "; ".join(diff) or None


def metric(variant: dict, name: str) -> tuple[float | None, list | None]:
    """A variant's value of a METRIC_PATHS metric and its within-run 95% interval (None where it has none)."""
    *path, last = METRIC_PATHS[name]
    node = variant
    for k in path:
        node = node.get(k) or {}
    ci = (node.get("ci95") or {}).get(last) if path else None
    return node.get(last), ci


@dataclass(frozen=True)
class Pooled:
    """One figure over n runs: mean, Student's t 95% interval of the mean (None under two runs), the run-to-run
    coefficient of variation (sample std / mean; None under two runs or at mean 0) and the values."""

    n: int
    mean: float
    ci95: tuple[float, float] | None
    cv: float | None
    values: tuple[float, ...]


def pool(values: list[float]) -> Pooled:
    """values (one per run) pooled: their mean and its interval (confidence.repeats_mean_interval, scipy's t)."""
    from experiments.analysis import confidence

    mean = statistics.fmean(values)
    cv = statistics.stdev(values) / mean if len(values) > 1 and mean else None
    ci = confidence.repeats_mean_interval(values)
    return Pooled(len(values), mean, (float(ci[0]), float(ci[1])) if ci else None, cv, tuple(values))


def runs_needed(cv: float | None, tolerance: float, most: int = 1000) -> int | None:
    """Runs for the mean's 95% t interval to fit within +-tolerance of it, if the run-to-run CV stays what it is:
    the least n >= 2 with t(n-1) x cv / sqrt(n) <= tolerance (None without a CV; most + 1 past most)."""
    from experiments.analysis import confidence

    if cv is None:
        return None
    n = 2
    while n <= most and confidence.t_quantile(n - 1) * cv / n**0.5 > tolerance:
        n += 1
    return n


@dataclass(frozen=True)
class Judgement:
    """The simulated figure against the pooled emulated one.

    error: (simulated - mean) / mean (None at mean 0); verdict: 'within' / 'outside' the tolerance, 'not
    judgeable at this n' (the emulated interval's half-width exceeds the tolerance of its mean: no figure could
    pass or fail it), 'one run' (no interval), or 'exact' / 'off' where the runs measured 0;
    consistent: the simulated figure lies inside the emulated interval (None without one)
    """

    error: float | None
    verdict: str
    consistent: bool | None


def judge(p: Pooled, simulated: float, tolerance: float) -> Judgement:
    """Verdict of simulated against the pooled runs p at a tolerance (a share of the emulated mean)."""
    consistent = p.ci95[0] <= simulated <= p.ci95[1] if p.ci95 else None
    if p.mean == 0:
        return Judgement(None, "exact" if simulated == 0 else "off (the runs measured 0)", consistent)
    error = (simulated - p.mean) / p.mean
    if p.ci95 is None:
        return Judgement(error, "one run: not judgeable", None)
    if (p.ci95[1] - p.ci95[0]) / 2 > tolerance * abs(p.mean):
        # the mean itself is unknown to more than the tolerance; say so, and whether even the interval's
        # nearest edge is further than the tolerance from the simulated figure (off whatever the true mean)
        lo, hi = simulated / (1 + tolerance), simulated / (1 - tolerance)
        far = p.ci95[1] < lo or p.ci95[0] > hi
        return Judgement(
            error, "not judgeable at this n" + ("; off even at the interval's edge" if far else ""), consistent
        )
    return Judgement(error, f"{'within' if abs(error) <= tolerance else 'outside'} +-{tolerance:.0%}", consistent)


@dataclass(frozen=True)
class Row:
    """One profile, variant and metric: the pooled runs, the simulated figure and the verdict."""

    profile: str
    variant: str
    metric: str
    emulated: Pooled
    simulated: float | None
    simulated_ci95: list | None
    judgement: Judgement | None
    sent: tuple[int, int, int]  # the runs' fewest and most requests sent, of the planned
    simulated_sent: int | None


def rows_for(profile: str, runs: list[Run], sim: dict) -> list[Row]:
    """Every variant and metric of one profile's pooled runs against the simulator's summary sim (its variants)."""
    out = []
    for name in runs[0].summary["variants"]:
        vs = [r.summary["variants"][name] for r in runs]
        issued = [v.get("issued", v.get("requests")) for v in vs]
        s = sim.get(name) or {}
        for m, tol in TOLERANCE.items():
            vals = [metric(v, m)[0] for v in vs]
            if any(x is None for x in vals):
                continue
            p = pool([float(x) for x in vals])
            sv, sci = metric(s, m) if s else (None, None)
            j = judge(p, float(sv), tol) if sv is not None else None
            out.append(
                Row(profile, name, m, p, sv, sci, j, (min(issued), max(issued), vs[0].get("requests")), s.get("issued"))
            )
    return out


def rows_across(kept: dict[str, list[Run]], sims: dict[str, dict], variants: list[str]) -> list[Row]:
    """variants that never cross the WAN pooled over every profile's runs (the profile cannot move their figures,
    so each run is one more repeat) against the simulator's figure, which must then be the same on every profile
    (ValueError where it is not)."""
    figures = {json.dumps([metric(s.get(v) or {}, m)[0] for v in variants for m in TOLERANCE]) for s in sims.values()}
    if len(figures) > 1:
        raise ValueError(
            f"the simulator's figures of {variants} differ between profiles: not one figure to pool against"
        )
    runs = [r for profile in sorted(kept) for r in kept[profile]]
    rows = rows_for("all profiles", runs, next(iter(sims.values()))) if runs else []
    return [r for r in rows if r.variant in variants]


def _needed(p: Pooled, tolerance: float) -> str:
    n = runs_needed(p.cv, tolerance)
    return "–" if n is None else ("> 1000" if n > 1000 else str(n))


def _err_pct(j: Judgement | None) -> str:
    return "–" if j is None or j.error is None else f"{j.error:+.0%}"


def _band(p: Pooled, digits: int = 0) -> str:
    ci = f" [{p.ci95[0]:,.{digits}f}, {p.ci95[1]:,.{digits}f}]" if p.ci95 else ""
    return f"{p.mean:,.{digits}f}{ci}"


def markdown_rows(rows: list[Row]) -> list[str]:
    """The table: one line a profile, variant and metric (WAN bytes left out where runs and simulator carry 0)."""
    out = [
        "| profile | variant | metric | n | emulated mean [95% t] | CV | runs | simulated [95%] | error | verdict "
        "| consistent with the runs | runs needed | sent (runs; sim) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.metric == "wan_kv_bytes" and r.emulated.mean == 0 and not r.simulated:
            continue
        j, p = r.judgement, r.emulated
        sim = _num(r.simulated) + (
            f" [{r.simulated_ci95[0]:,.0f}, {r.simulated_ci95[1]:,.0f}]" if r.simulated_ci95 else ""
        )
        cons = "–" if j is None or j.consistent is None else ("yes" if j.consistent else "no")
        if j is not None and j.consistent is False and len(set(p.values)) == 1:
            cons = "no (the runs agree exactly)"
        lo, hi, planned = r.sent
        sent = (
            f"{lo}" if lo == hi else f"{lo}-{hi}"
        ) + f"/{planned}; {r.simulated_sent if r.simulated_sent is not None else '–'}"
        out.append(
            f"| {r.profile} | {r.variant} | {r.metric} | {p.n} | {_band(p)} | {'–' if p.cv is None else f'{p.cv:.0%}'} "
            f"| {', '.join(_num(v) for v in p.values)} | {sim} | {_err_pct(j)} "
            f"| {j.verdict if j else 'not simulated'} | {cons} | {_needed(p, TOLERANCE[r.metric])} | {sent} |"
        )
    return out


def _simulate(spec: str, profile: str, out: Path, seed: int | None = None, sets: tuple[str, ...] = ()) -> dict:
    """The simulator's summary of spec on profile (`pddlab simulate SPEC --set profile=P [--set ...] [--seed S]`),
    kept in out/profile."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "experiments.cli",
            "simulate",
            spec,
            "--set",
            f"profile={profile}",
            "--out",
            str(out / profile),
            *(["--seed", str(seed)] if seed is not None else []),
            *(a for kv in sets for a in ("--set", kv)),
        ],
        check=True,
        capture_output=True,
        cwd=ROOT,
    )
    return json.loads((out / profile / "summary.json").read_text())


def spec_compute(spec: str, sets: tuple[str, ...] = ()) -> dict:
    """compute_of the spec as simulated (its --set overrides applied)."""
    from experiments.sim.config import load_for_simulation

    return compute_of(load_for_simulation(spec, list(sets)).spec.deployment)


def compare_repeats(
    matrices: list[Path],
    spec: str,
    out: Path,
    across: list[str] = (),
    seed: int | None = None,
    sets: tuple[str, ...] = (),
) -> None:
    """Pool each profile's runs found under the matrices, simulate the profile (seed: the simulator's, None: the
    workload's; sets: --set overrides, as the runs had them: modelled compute), print the table, write JSON; the
    across variants (those that never cross the WAN) also pooled over every profile."""
    by_profile: dict[str, list[Run]] = {}
    for run in find_runs(matrices):
        by_profile.setdefault(run.profile, []).append(run)
    rows, refused, pooled_runs, kept_by, sims = [], [], {}, {}, {}
    compute = spec_compute(spec, sets)
    for profile, runs in sorted(by_profile.items()):
        sim = sims[profile] = _simulate(spec, profile, out, seed, sets)
        ref = identity(sim)
        kept = []
        for run in runs:
            why = mismatch(run, ref, spec, compute)
            (refused.append({"profile": profile, "matrix": run.matrix, "reason": why}) if why else kept.append(run))
        if kept:
            pooled_runs[profile] = [{"matrix": r.matrix, "commit": r.commit, "speed": r.speed} for r in kept]
            kept_by[profile] = kept
            rows += rows_for(profile, kept, sim["variants"])
    if across:
        rows += rows_across(kept_by, {p: sim["variants"] for p, sim in sims.items() if p in kept_by}, across)
    print("\n".join(markdown_rows(rows)))
    print(
        "\nRuns pooled (the run's commit where its metadata is kept, else the one that analysed it; '+': dirty; the"
        " machine's reference prefill where recorded: docs/outputs.md):"
    )
    for profile, runs in pooled_runs.items():
        print(f"- {profile}: " + ", ".join(f"{r['matrix']} ({r['commit']}{r['speed']})" for r in runs))
    for r in refused:
        print(f"- REFUSED {r['profile']} from {r['matrix']}: {r['reason']}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "repeats.md").write_text("\n".join(markdown_rows(rows)) + "\n")
    (out / "repeats.json").write_text(
        json.dumps(
            {
                "spec": spec,
                "tolerance": TOLERANCE,
                "runs": pooled_runs,
                "refused": refused,
                "rows": [asdict(r) for r in rows],
            },
            indent=1,
        )
    )
    print(f"\n{out / 'repeats.json'}, {out / 'repeats.md'}")


def emulated_p_busy_s(variant: dict) -> float | None:
    """A run's P busy time (s) in one variant of its summary: each P worker's busy_pct (its prefills' prefill_start
    -> prefill_done, in % of the window) x the variant's duration_s, summed over its P workers; None if unknown."""
    busy = [
        w["busy_pct"] * variant["duration_s"] / 100
        for w in (variant.get("workers") or {}).values()
        if w.get("role") == "p" and w.get("busy_pct") is not None
    ]
    return sum(busy) if busy and variant.get("duration_s") else None


def simulated_p_busy_s(spec: str, profile: str, variant: str) -> float:
    """The simulated P workers' busy time (s, their steps' seconds summed) of one variant of spec on profile."""
    from experiments.sim.config import sim_config
    from experiments.sim.pipeline import Simulation
    from experiments.sim.simulate import workload_of
    from experiments.sim.wan import load_calibration
    from experiments.spec.experiment import load

    loaded = load(spec, [f"profile={profile}"], check_machine=False)
    s = loaded.spec
    sim = Simulation(
        sim_config(loaded, variant), workload_of(loaded), s.workload.seed, load_calibration(), s.timeouts.request_s
    )
    sim.run()
    return sum(p.busy_s for p in sim.p)


def p_level(pairs: list[tuple[float, float]]) -> float:
    """The level of the simulated P against the emulated runs: the median of emulated / simulated P busy time over
    (emulated s, simulated s) pairs, one a run and variant (the simulator runs the emulated P's steps one to one:
    the same prompts, cached tokens and chunks, so the busy times differ by the steps' level alone)."""
    return statistics.median(e / s for e, s in pairs)


BURST_NS = 20_000_000  # requests sent this close together arrive at the router as one burst


def bursts(records: list[dict], gap_ns: int = BURST_NS) -> list[list[dict]]:
    """The requests (records of one variant, warm-up left out) in runs sent within gap_ns of the one before."""
    recs = sorted((r for r in records if r.get("kind") != "warmup"), key=lambda r: r["t_send_ns"])
    out: list[list[dict]] = []
    for r in recs:
        if out and r["t_send_ns"] - out[-1][-1]["t_send_ns"] < gap_ns:
            out[-1].append(r)
        else:
            out.append([r])
    return [b for b in out if len(b) > 1]


def modelled_p(run: Path, arch: str, accelerator: str, devices: int) -> None:
    """A modelled-compute run's P: each prefill step against the roofline of its chunks (the modelled engine waits
    exactly that; more is the machine's lateness), and the bursts of requests and how many of them one P took."""
    from workers.modelled.catalogue import load_catalogue
    from workers.modelled.roofline import Roofline

    cat = load_catalogue()
    roofline = Roofline(cat.accelerator(accelerator), cat.model(arch), devices)
    print("| variant | P | steps | roofline s | measured s | ratio | per step median (p90) | bursts to one P |")
    print("|---|---|---|---|---|---|---|---|")
    records = [json.loads(line) for line in (run / "requests.jsonl").open()]
    for vdir in sorted((run / "variants").iterdir()):
        mine = [r for r in records if r["variant"] == vdir.name]
        bs = bursts(mine)
        one = sum(len({r["workers"].get("p") for r in b}) == 1 for b in bs)
        for f in sorted((vdir / "events").glob("p*.jsonl")):
            pairs = _p_steps([json.loads(line) for line in f.open()], roofline)  # the warm-up's steps left out
            if not pairs:
                continue
            ratios = sorted(d / m for m, d in pairs)
            model, measured = sum(m for m, _ in pairs), sum(d for _, d in pairs)
            print(
                f"| {vdir.name} | {f.stem} | {len(pairs)} | {model:.1f} | {measured:.1f} | {measured / model:.2f} | "
                f"{statistics.median(ratios):.2f} ({ratios[9 * len(ratios) // 10]:.2f}) | {one} of {len(bs)} |"
            )


def emulated_pace(summary: dict) -> dict[str, dict[str, float]]:
    """variant -> role -> the pace an emulated run's modelled engines kept: (modelled + late) / modelled s, from its
    summary's roles_cpu (workers.modelled.engine.ModelledEngine.pace). ValueError for a run with none (real
    compute, or a run made before the roles recorded it)."""
    from experiments.analysis.summary import RolesCpu

    out = {}
    for v, d in summary["variants"].items():
        roles = RolesCpu.model_validate(d["roles_cpu"]).roles if d.get("roles_cpu") else {}
        pace = {k: r.pace for k, r in roles.items() if r.pace is not None}
        if pace:
            out[v] = pace
    if not out:
        raise ValueError("no modelled role recorded its pace (real compute, or a run made before roles_cpu had it)")
    return out


def _with_err(emulated, simulated) -> str:
    return f"{_num(simulated)} ({_err(emulated, simulated)})"


def run_spec(run: Path):
    """The spec a run ran, as its metadata.json keeps it (resolved: its profile and every --set), loaded for the
    simulator."""
    import tempfile

    import yaml

    from experiments.sim.config import load_for_simulation

    meta = run / "metadata.json"
    if not meta.exists():
        raise ValueError(f"{run}: no metadata.json, so no record of the spec it ran")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "spec.yaml"
        path.write_text(yaml.safe_dump(json.loads(meta.read_text())["spec"]))
        return load_for_simulation(str(path))


def paced(runs: list[Path]) -> None:
    """Modelled-compute runs against the simulator of the spec each ran (run_spec), twice: at the roofline's time
    (as the spec names it) and at the pace the run's modelled engines kept (emulated_pace): how much of the gap is
    the emulator running late."""
    from experiments.sim.simulate import simulate

    print(
        "| run | profile | variant | pace P / RLD / MD | TTFT p50 emulated [95%] | simulated | paced | p90 emulated "
        "| simulated | paced | WAN KV bytes emulated | simulated | paced |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for run in runs:
        summary = json.loads((run / "summary.json").read_text())
        pace = emulated_pace(summary)
        loaded = run_spec(run)
        plain = simulate(loaded).summary.model_dump(mode="json")["variants"]
        kept = simulate(loaded, pace=pace).summary.model_dump(mode="json")["variants"]
        scale, profile = kv_scale(run), Path(loaded.spec.profile).stem
        for v, e in summary["variants"].items():
            s, k = plain.get(v, {}), kept.get(v, {})
            te, ts, tk = (x.get("ttft_ms") or {} for x in (e, s, k))
            we = e.get("wan_kv_bytes_total")
            we = we * scale if we else None  # the deployment's bytes, as the simulator counts them
            ws, wk = s.get("wan_kv_bytes_total"), k.get("wan_kv_bytes_total")
            rates = " / ".join(f"{pace.get(v, {}).get(r, 1.0):.2f}" for r in ("p", "rld", "md"))
            print(
                f"| {run.name} | {profile} | {v} | {rates} | {_p50(e)} "
                f"| {_with_err(te.get('p50'), ts.get('p50'))} | {_with_err(te.get('p50'), tk.get('p50'))} "
                f"| {_num(te.get('p90'))} | {_with_err(te.get('p90'), ts.get('p90'))} "
                f"| {_with_err(te.get('p90'), tk.get('p90'))} "
                f"| {_num(we)} | {_with_err(we, ws) if we else '–'} | {_with_err(we, wk) if we else '–'} |"
            )


MIN_TRANSFERS = 5  # a point of the WAN table needs this many transfers measured on its line at its concurrency
# Only transfers this large make the table: theirs is the line's throughput, where a small one's time is its round
# trips and slow start (modelled as such: kept connections, rounds), which a factor on the rates would misstate
WAN_TABLE_MIN_BYTES = 8_000_000


def flows_bin(concurrency: float) -> int:
    """A transfer's time-averaged concurrency as the WAN table's `flows`: the nearest power of two (>= 1)."""
    return 2 ** max(0, round(math.log2(max(1.0, concurrency))))


def wan_transfers(runs: list[Run], variant: str | None = None) -> dict[tuple[str, int], list[dict]]:
    """(profile, flows) -> every WAN KV transfer of WAN_TABLE_MIN_BYTES or more the runs measured there (variant:
    its only; None: every variant's) (summary.json's transfer_limits: each transfer's bytes, the sender's time, its
    goodput and the transfers sharing the line on average), its goodput over the time its sender had bytes to send:
    the emulated P streams a prompt's KV while it computes it, so part of a copy's time (`sender_idle`, median 4-22%
    a profile) is P's, which the simulator counts before the copy starts."""
    out: dict[tuple[str, int], list[dict]] = {}
    for run in runs:
        for name, v in run.summary["variants"].items():
            if variant is not None and name != variant:
                continue
            for t in (v.get("transfer_limits") or {}).get("transfers") or []:
                if t.get("path") == "wan" and t.get("goodput_mbit") and t["kv_bytes"] >= WAN_TABLE_MIN_BYTES:
                    busy = t | {"goodput_mbit": t["goodput_mbit"] / max(0.05, 1 - (t.get("sender_idle") or 0.0))}
                    out.setdefault((run.profile, flows_bin(t.get("concurrency") or 1.0)), []).append(busy)
    return out


def wan_table(matrices: list[Path], spec: str, out: Path | None, share_spread: float = 0.0) -> None:
    """The simulator's WAN calibration table from the emulated runs' own KV transfers: per shipped profile and
    concurrency (flows), the transfers' median goodput and the factor at which the simulator's line gives its
    transfers that goodput (experiments.sim.wan.solve_factor); printed, and written to out (the simulator reads
    experiments/sim/calibration.yaml) with share_spread (what wan-spread chose over the same runs)."""
    import yaml

    from experiments.sim.config import load_for_simulation, sim_config
    from experiments.sim.wan import line_from_profile, solve_factor
    from topology.profiles import load_profile

    runs = [r for r in find_runs(matrices) if r.summary.get("simulated") is not True]
    cfg = sim_config(load_for_simulation(spec, []), "pd-cross")
    congestion, connections = cfg.wan_congestion, cfg.wan_connections
    points = []
    print("| profile | flows | transfers | median kv bytes | median goodput Mbit/s | factor |")
    print("|---|---|---|---|---|---|")
    for (profile, flows), ts in sorted(wan_transfers(runs).items()):
        if len(ts) < MIN_TRANSFERS:
            continue
        line = line_from_profile(load_profile(profile))
        kv_bytes = int(statistics.median(t["kv_bytes"] for t in ts))
        goodput = statistics.median(t["goodput_mbit"] for t in ts)
        factor = solve_factor(line, congestion, connections, flows, kv_bytes, goodput, share_spread)
        rate = line.rate_bps / 1e6 if math.isfinite(line.rate_bps) else 0.0
        points.append(
            {
                "rate_mbit": round(rate, 3),
                "rtt_ms": round(line.rtt_s * 1e3, 3),
                "loss_pct": round(line.loss * 100, 4),
                "flows": flows,
                "congestion": congestion,
                "kv_bytes": kv_bytes,
                "transfers": len(ts),
                "per_flow_mbit": round(goodput, 3),
                "factor": factor,
            }
        )
        print(f"| {profile} | {flows} | {len(ts)} | {kv_bytes:,} | {goodput:.2f} | {factor:.4g} |")
    if out is None:
        return
    sources = ", ".join(sorted({r.matrix for r in runs}))
    header = (
        '# The simulator\'s WAN calibration table (experiments/sim/wan.py; docs/simulator.md, "The WAN"), made by\n'
        f"#   .venv/bin/python scripts/validate_sim.py wan-table {' '.join(map(str, matrices))} --out {out}"
        f" --share-spread {share_spread:g}\n"
        "# from the emulated runs' own WAN KV transfers (summary.json's transfer_limits): per line and concurrency,\n"
        "# their median goodput and the factor the simulator's rates take there so its transfers match it;\n"
        "# share_spread: how unevenly transfers share a full line (validate_sim.py wan-spread over the same runs).\n"
    )
    status = f"calibrated: {len(points)} points from {len(runs)} emulated runs of {spec} ({sources})"
    lines = [f"  - {yaml.safe_dump(p, default_flow_style=True, sort_keys=False, width=1000).strip()}\n" for p in points]
    top = yaml.safe_dump({"status": status, "share_spread": share_spread}, width=1000, sort_keys=False)
    out.write_text(header + top + "points:\n" + "".join(lines))
    print(f"\n{out}: {status}")


SPREAD_MIN_FLOWS = 2.5  # wan-spread reads the transfers that shared the line with two others or more, on average


def _quantiles(xs: list[float]) -> tuple[float, float, float]:
    from experiments.analysis.metrics import percentile

    return tuple(percentile(xs, q) for q in (10, 50, 90))


def sim_share_ratios(spec: str, profile: str, sets: tuple[str, ...], variant: str, seeds: range, spread: float):
    """The simulator's WAN copies of `variant` (each of seeds) as wan-spread reads the runs': each copy of
    WAN_TABLE_MIN_BYTES or more with SPREAD_MIN_FLOWS or more copies in flight on average over its life (itself
    included), its goodput over its share (the line's rate / that mean); the table's share_spread set to spread."""
    from experiments.analysis.limits import mean_concurrency
    from experiments.sim.config import load_for_simulation, sim_config
    from experiments.sim.pipeline import Simulation
    from experiments.sim.simulate import workload_of
    from experiments.sim.wan import Calibration, load_calibration

    loaded = load_for_simulation(spec, [f"profile={profile}", *sets])
    cfg, reqs = sim_config(loaded, variant), workload_of(loaded)
    base = load_calibration()
    cal = Calibration(base.points, base.status, spread)
    out = []
    for seed in seeds:
        sim = Simulation(cfg, reqs, seed, cal, request_s=loaded.spec.timeouts.request_s)
        sim.line.log = []
        sim.run()
        spans = [(a, b) for a, _n, b in (r for r in sim.line.log if len(r) == 3)]
        for a, n, *end in sim.line.log:
            if not end or n < WAN_TABLE_MIN_BYTES or end[0] <= a:
                continue
            flows = mean_concurrency((a, end[0]), spans)
            if flows >= SPREAD_MIN_FLOWS:
                out.append(n * 8 / (end[0] - a) / (cfg.line.rate_bps / flows))
    return out


def wan_spread(matrices: list[Path], spec: str, sets: tuple[str, ...], variant: str, spreads: list[float]) -> None:
    """How unevenly concurrent WAN copies share the line, in the runs and in the simulator at each share_spread:
    per profile, the copies' goodput over their share (the line over the mean number in flight; the runs' from
    summary.json's transfer_limits, goodput over the time its sender had bytes, as wan-table), 10th / 50th / 90th
    percentiles, and the 90th over the 10th, the figure share_spread is chosen by (pooled over profiles, weighted
    by the runs' copies)."""
    from topology.profiles import load_profile

    runs = [r for r in find_runs(matrices) if r.summary.get("simulated") is not True]
    measured: dict[str, list[float]] = {}
    for (profile, _flows), ts in wan_transfers(runs, variant).items():
        for t in ts:
            if t.get("share_mbit") and (t.get("concurrency") or 1.0) >= SPREAD_MIN_FLOWS:
                measured.setdefault(profile, []).append(t["goodput_mbit"] / t["share_mbit"])
    floor = f">= {WAN_TABLE_MIN_BYTES / 1e6:g} MB, >= {SPREAD_MIN_FLOWS} in flight"
    print(f"{variant}'s WAN copies ({floor}): goodput / share")
    heads = " | ".join(f"spread {s:g}" for s in spreads)
    print(f"| profile | copies | runs p10 / p50 / p90 | runs p90/p10 | {heads} |")
    print("|---|---|---|---|" + "---|" * len(spreads))
    pooled = {s: 0.0 for s in spreads}
    for profile, xs in sorted(measured.items()):
        if len(xs) < MIN_TRANSFERS:
            continue
        load_profile(profile)  # a profile the runs name but this checkout lacks: its error, here
        lo, mid, hi = _quantiles(xs)
        cells = []
        for s in spreads:
            sim = sim_share_ratios(spec, profile, sets, variant, range(1, 5), s)
            slo, smid, shi = _quantiles(sim) if len(sim) >= MIN_TRANSFERS else (math.nan,) * 3
            pooled[s] += len(xs) * abs(math.log((shi / slo) / (hi / lo))) if slo > 0 else math.inf
            cells.append(f"{slo:.2f} / {smid:.2f} / {shi:.2f} ({shi / slo:.2f}, {len(sim)})")
        runs_cell = f"{lo:.2f} / {mid:.2f} / {hi:.2f} | {hi / lo:.2f}"
        print(f"| {profile} | {len(xs)} | {runs_cell} | " + " | ".join(cells) + " |")
    n = sum(len(xs) for xs in measured.values() if len(xs) >= MIN_TRANSFERS)
    print(
        "\nmean |log(simulated p90/p10 / runs')|, weighted by copies: "
        + ", ".join(f"spread {s:g}: {pooled[s] / max(1, n):.3f}" for s in spreads)
    )


def spec_runs(matrices: list[Path], spec: str, out: Path):
    """(run, the simulator's summary of its profile) for each run of the matrices that is spec's experiment (each
    profile simulated once, kept in out); a run of another experiment is printed as REFUSED with why."""
    sims: dict[str, dict] = {}
    compute = spec_compute(spec)
    for run in find_runs(matrices):
        if run.profile not in sims:
            sims[run.profile] = _simulate(spec, run.profile, out)
        if why := mismatch(run, identity(sims[run.profile]), spec, compute):
            print(f"REFUSED {run.matrix} {run.profile}: {why}")
            continue
        yield run, sims[run.profile]


def p_level_report(matrices: list[Path], spec: str, variants: list[str]) -> None:
    """Each run's P busy time against the simulated P's (the runs of find_runs that are spec's experiment), the
    median ratio and realcompute's P step constants scaled by it (the level those runs' P measured)."""
    from experiments.sim import realcompute

    sims: dict[tuple[str, str], float] = {}
    pairs = []
    print("| matrix | profile | variant | emulated P busy s | simulated | emulated / simulated |")
    print("|---|---|---|---|---|---|")
    for run, _ in spec_runs(matrices, spec, Path("/tmp/validate-sim-p-level")):
        for v in variants:
            emulated = emulated_p_busy_s(run.summary["variants"][v])
            if emulated is None:
                continue
            simulated = sims.setdefault((run.profile, v), simulated_p_busy_s(spec, run.profile, v))
            pairs.append((emulated, simulated))
            ratio = emulated / simulated
            print(f"| {run.matrix} | {run.profile} | {v} | {emulated:.1f} | {simulated:.1f} | {ratio:.2f} |")
    k = p_level(pairs)
    print(f"\nmedian emulated / simulated over {len(pairs)} runs and variants: {k:.3f}")
    print(
        f"P_STEP_FIXED_S, P_STEP_FACTOR = {realcompute.P_STEP_FIXED_S * k:.4f}, {realcompute.P_STEP_FACTOR * k:.3f}"
        f"  (the shipped {realcompute.P_STEP_FIXED_S}, {realcompute.P_STEP_FACTOR} x {k:.3f})"
    )


def p_spread_logs(events: list, lone) -> list[float]:
    """log(measured / the simulator's time) of each P step but the warm-up's, in the order the steps ran (the
    simulator's: realcompute's P_STEP_FIXED_S per chunk of the step's budget + P_STEP_FACTOR x the lone roofline)."""
    import math

    from experiments.sim import realcompute
    from workers.modelled.roofline import Part

    warm = [e["event"] != "prefill_step" or not e["chunks"] or any(".w" in c[0] for c in e["chunks"]) for e in events]
    steps = sorted((e for e, w in zip(events, warm) if not w), key=lambda e: e["t_start_ns"])
    out = []
    for e in steps:
        parts = [Part(n, start, 1 if last else 0) for _rid, start, n, last in e["chunks"]]
        chunks = math.ceil(sum(p.new_tokens for p in parts if p.new_tokens > 1) / max(1, e["budget_tokens"]))
        model_s = realcompute.P_STEP_FIXED_S * chunks + realcompute.P_STEP_FACTOR * lone.step(parts).seconds
        out.append(math.log(e["duration_ns"] / 1e9 / model_s))
    return out


def spread_stats(logs: list[float]) -> dict[str, float]:
    """Sigma, quantiles, skewness and lag-1 correlation of a run's centred log ratios (logs in step order)."""
    import numpy as np

    x = np.array(logs)
    q = np.quantile(x, [0.05, 0.25, 0.5, 0.75, 0.95])
    sd = float(x.std(ddof=1))
    lag1 = float(np.corrcoef(x[:-1], x[1:])[0, 1]) if len(x) > 2 else float("nan")
    skew = float(((x - x.mean()) ** 3).mean() / x.std() ** 3)
    quantiles = dict(zip(("q05", "q25", "q50", "q75", "q95"), map(float, q)))
    return {"n": len(x), "sigma": sd, **quantiles, "skew": skew, "lag1": lag1}


def p_spread(runs: list[Path], variants: tuple[str, ...]) -> None:
    """Per run and variant, then pooled: the spread of the emulated P's steps about the simulator's (p_spread_logs,
    each run and variant's own median taken out), as a markdown table."""
    import numpy as np

    from workers.modelled.catalogue import load_catalogue
    from workers.modelled.roofline import Roofline

    cat = load_catalogue()
    lone = Roofline(cat.accelerator("this-machine"), cat.model("default"))
    cols = ("n", "level", "sigma", "q05", "q25", "q75", "q95", "skew", "lag1")
    print("| run | variant | " + " | ".join(cols) + " |")
    print("|---|---|" + "---|" * len(cols))
    pooled: dict[str, list[float]] = {}
    lag_pairs: dict[str, list[tuple[float, float]]] = {}

    def row(name: str, v: str, x: list[float], level: float) -> None:
        st = spread_stats(x) | {"level": level}
        print(f"| {name} | {v} | " + " | ".join(f"{st[c]:.4g}" for c in cols) + " |")

    for run in runs:
        for v, ev in _events(run, variants):
            logs = p_spread_logs(ev.get("p1", []), lone)
            if len(logs) < 3:
                continue
            med = statistics.median(logs)
            x = [g - med for g in logs]
            row(run.name, v, x, float(np.exp(med)))
            for key in (v, "all"):
                pooled.setdefault(key, []).extend(x)
                lag_pairs.setdefault(key, []).extend(zip(x[:-1], x[1:]))
    for key, x in pooled.items():
        st = spread_stats(x)
        a, b = zip(*lag_pairs[key])
        st["lag1"] = float(np.corrcoef(a, b)[0, 1])  # within runs only (no pair across two runs)
        print(f"| pooled | {key} | " + " | ".join(f"{(st | {'level': 1.0})[c]:.4g}" for c in cols) + " |")


def emulated_decode_cpu_s(variant: dict) -> float | None:
    """A run's decode workers' (RLD and MD roles') serving CPU seconds in one variant (roles_cpu; None where the
    summary has none): printed beside the TPOT level as a check, not fitted (CPU, not the wall time a step takes on
    shared cores)."""
    roles = ((variant.get("roles_cpu") or {}).get("roles")) or {}
    cpu = [roles[r]["serving_cpu_s"] for r in ("rld", "md") if (roles.get(r) or {}).get("serving_cpu_s") is not None]
    return sum(cpu) if cpu else None


def decode_level_report(matrices: list[Path], spec: str, variants: list[str]) -> None:
    """Each run's TPOT p50 against the simulated one's (the runs of find_runs that are spec's experiment; the
    simulator runs the same requests on its decode worker, so the TPOTs differ by the decode worker's step level
    and the batching it brings), the median ratio, and realcompute's decode worker constants scaled by it."""
    from experiments.sim import realcompute

    ratios = []
    print("| matrix | profile | variant | emulated TPOT p50 ms | simulated | emulated / simulated | decode CPU s |")
    print("|---|---|---|---|---|---|---|")
    for run, sim in spec_runs(matrices, spec, Path("/tmp/validate-sim-decode-level")):
        for v in variants:
            emulated = (run.summary["variants"][v].get("tpot_ms") or {}).get("p50")
            simulated = (sim["variants"][v].get("tpot_ms") or {}).get("p50")
            if not emulated or not simulated:
                continue
            ratios.append(emulated / simulated)
            cpu = emulated_decode_cpu_s(run.summary["variants"][v])
            print(
                f"| {run.matrix} | {run.profile} | {v} | {emulated:.1f} | {simulated:.1f} | {ratios[-1]:.2f} "
                f"| {'–' if cpu is None else f'{cpu:.1f}'} |"
            )
    k = statistics.median(ratios)
    print(f"\nmedian emulated / simulated TPOT p50 over {len(ratios)} runs and variants: {k:.3f}")
    r = realcompute
    print(
        f"MIXED_STEP_FIXED_S, MIXED_STEP_FACTOR = {r.MIXED_STEP_FIXED_S * k:.4f}, {r.MIXED_STEP_FACTOR * k:.3f}\n"
        f"DECODE_FACTOR = {r.DECODE_FACTOR * k:.3f}\n"
        f"IMPORT_FIXED_S, IMPORT_PER_TOKEN_S = {r.IMPORT_FIXED_S * k:.4f}, {r.IMPORT_PER_TOKEN_S * k:.3g}\n"
        f"(the shipped ones x {k:.3f}; variants whose P sends KV over the WAN, pd-cross and pdd: rather "
        f"DECODE_WAN_SLOWDOWN = {r.DECODE_WAN_SLOWDOWN * k:.3f})"
    )


def lan_rates(events: dict[str, list[dict]]) -> list[float]:
    """The goodput (bit/s) of each fast-path copy of one variant's events (worker -> events) that the LAN bound
    (experiments.analysis.transfers.lan_bound_rates, which the emulated summary's kv_paths.fast.lan_bound reads)."""
    from experiments.analysis.transfers import lan_bound_rates, pair_transfers

    flat = [e for ev in events.values() for e in ev]
    return [r * 1e6 for r in lan_bound_rates(pair_transfers(flat), flat)]


def lan_rate(runs: list[Path], variants: tuple[str, ...]) -> None:
    from experiments.analysis.metrics import percentile
    from experiments.sim.wan import MSS_BYTES
    from topology.profiles import FRAME_BYTES

    by: dict[str, list[float]] = {}
    for run in runs:
        for v, ev in _events(run, variants):
            by.setdefault(v, []).extend(lan_rates(ev))
    by["pooled"] = [r for rs in by.values() for r in rs]
    print("| variant | LAN-bound copies | goodput median Gbit/s | quartiles |\n|---|---|---|---|")
    for v, rs in by.items():
        if rs:
            q = [percentile(rs, p) / 1e9 for p in (25, 50, 75)]  # as summary.json's kv_paths.fast.lan_bound
            print(f"| {v} | {len(rs)} | {q[1]:.2f} | {q[0]:.2f} - {q[2]:.2f} |")
    if by["pooled"]:
        rate = percentile(by["pooled"], 50) / 1e6 * FRAME_BYTES / MSS_BYTES
        print(f"\nrate_mbit: {rate:.0f}  # the LAN profile whose simulated goodput is the pooled median")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fit")
    f.add_argument("runs", nargs="+", type=Path)
    f.add_argument("--per-run", action="store_true", help="also each run's own per-variant table")
    f.add_argument("--variants", default="", help="only these variants' events (e.g. pd-intra,pdd); default: all")
    c = sub.add_parser("compare")
    c.add_argument("dirs", type=Path)
    c.add_argument("--spec", default="pdd-vs-baselines")
    c.add_argument("--out", type=Path, default=Path("/tmp/simval"))
    r = sub.add_parser("compare-repeats")
    r.add_argument("matrices", nargs="+", type=Path)
    r.add_argument("--spec", default="pdd-vs-baselines")
    r.add_argument("--out", type=Path, default=Path("/tmp/simval-repeats"))
    r.add_argument(
        "--across-profiles",
        default="",
        help="variants that never cross the WAN (e.g. colocated,pd-intra), also pooled over every profile's runs",
    )
    r.add_argument("--seed", type=int, default=None, help="the simulator's (the line's jitter, P's step spread)")
    r.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an override of the simulated spec, as the runs had it (modelled compute: deployment.compute.mode=...)",
    )
    lv = sub.add_parser("p-level")
    lv.add_argument("matrices", nargs="+", type=Path)
    lv.add_argument("--spec", default="pdd-vs-baselines")
    lv.add_argument("--variants", default="pd-intra,pdd", help="the variants whose P busy time is compared")
    mp = sub.add_parser("modelled-p")
    mp.add_argument("run", type=Path)
    mp.add_argument("--arch", default="kimi-k2")
    mp.add_argument("--accelerator", default="h800")
    mp.add_argument("--devices", type=int, default=16)
    pc = sub.add_parser("paced")
    pc.add_argument("runs", nargs="+", type=Path, help="emulated modelled-compute runs (summary.json, metadata.json)")
    wt = sub.add_parser("wan-table")
    wt.add_argument("matrices", nargs="+", type=Path)
    wt.add_argument("--spec", default="pdd-vs-baselines")
    wt.add_argument("--out", type=Path, default=None, help="write the table here (experiments/sim/calibration.yaml)")
    wt.add_argument("--share-spread", type=float, default=0.0, help="the table's share_spread (wan-spread's choice)")
    ws = sub.add_parser("wan-spread")
    ws.add_argument("matrices", nargs="+", type=Path)
    ws.add_argument("--spec", default="pdd-vs-baselines")
    ws.add_argument("--variant", default="pd-cross", help="the variant whose WAN copies are read")
    ws.add_argument("--spreads", default="0,0.25,0.5,0.75", help="the share_spread values to simulate")
    ws.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="as compare-repeats' --set")
    sp = sub.add_parser("p-spread")
    sp.add_argument("runs", nargs="+", type=Path)
    sp.add_argument("--variants", default="pd-intra,pdd", help="the variants whose P steps are read")
    ln = sub.add_parser("lan-rate")
    ln.add_argument("runs", nargs="+", type=Path)
    ln.add_argument("--variants", default="pd-intra,pdd", help="the variants whose fast-path copies are read")
    dl = sub.add_parser("decode-level")
    dl.add_argument("matrices", nargs="+", type=Path)
    dl.add_argument("--spec", default="pdd-vs-baselines")
    dl.add_argument("--variants", default="colocated,pd-intra", help="the variants whose TPOT is compared")
    a = ap.parse_args()
    if a.cmd == "fit":
        fit(a.runs, a.per_run, tuple(v for v in a.variants.split(",") if v))
    elif a.cmd == "p-level":
        p_level_report(a.matrices, a.spec, [v for v in a.variants.split(",") if v])
    elif a.cmd == "modelled-p":
        modelled_p(a.run, a.arch, a.accelerator, a.devices)
    elif a.cmd == "paced":
        paced(a.runs)
    elif a.cmd == "wan-table":
        wan_table(a.matrices, a.spec, a.out, a.share_spread)
    elif a.cmd == "wan-spread":
        wan_spread(a.matrices, a.spec, tuple(a.set), a.variant, [float(x) for x in a.spreads.split(",")])
    elif a.cmd == "p-spread":
        p_spread(a.runs, tuple(v for v in a.variants.split(",") if v))
    elif a.cmd == "lan-rate":
        lan_rate(a.runs, tuple(v for v in a.variants.split(",") if v))
    elif a.cmd == "decode-level":
        decode_level_report(a.matrices, a.spec, [v for v in a.variants.split(",") if v])
    elif a.cmd == "compare":
        compare(a.dirs, a.spec, a.out)
    else:
        compare_repeats(a.matrices, a.spec, a.out, [v for v in a.across_profiles.split(",") if v], a.seed, tuple(a.set))


if __name__ == "__main__":
    main()
