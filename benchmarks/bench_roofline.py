"""The model of the model checked against a real engine: the roofline's step times vs the small model's measured ones.

Responsible for: measuring this machine's peaks as bench_engine does (single-thread fp32 matmul FLOP/s, copy
bandwidth), the real engine's (workers/engine.py, one CPU thread) prefill of several prompt lengths, decode
steps of several batch sizes and extends of several lengths (median of several repetitions each); fitting the
`this-machine` efficiency (compute, memory, per-step overhead) on a few of those points
(workers/modelled/calibrate.py) and printing, for every point, measured vs predicted time and the error, both
for this run's fit (held-out points show whether the roofline generalises) and for the catalogue's shipped
`this-machine` entry. Target: every error within +-25%.
Not responsible for: the catalogue file (paste the printed figures into workers/modelled/accelerators.yaml).

    .venv/bin/python benchmarks/bench_roofline.py [--config small] [--json out.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch

from bench_engine import measure_copy_bandwidth, measure_matmul_flops, random_tokens
from workers.engine import Engine, GenerationRequest
from workers.modelled.calibrate import Measured, fit_efficiency, relative_error
from workers.modelled.catalogue import load_catalogue
from workers.modelled.roofline import Part, Roofline

log = logging.getLogger("bench_roofline")

CONTEXT = 256  # tokens of KV under each decode and extend
PREFILL_TOKENS = (128, 256, 512, 1024)
DECODE_BATCHES = (1, 4, 8, 16, 32)
EXTEND_TOKENS = (16, 64, 128)
CALIBRATE_ON = (
    "prefill 256",
    "prefill 1024",
    "decode batch 1",
    "decode batch 8",
    "extend 16",
    "extend 128",
)  # the rest is held out
REPS = 9  # rounds of every point, after a warm-up round: each point's median of REPS
TARGET = 0.25


class Meter:
    """Times the real engine's operations in CPU time of this thread (torch runs on it: one thread), so time
    the scheduler gives other jobs on this shared machine is not counted; every point is timed once per round,
    rounds repeat, and each point's median is kept, so what load remains (caches, memory bandwidth) hits every
    point alike."""

    def __init__(self, engine: Engine):
        self.engine, self._ids = engine, 0
        self.context = random_tokens(engine, CONTEXT, seed=1)
        rid = self._open(self.context, 1)
        engine.prefill(rid)
        self.context_blob = engine.export_kv(rid, 0, CONTEXT)
        engine.abort(rid)

    def _open(self, prompt, max_tokens: int) -> str:
        self._ids += 1
        rid = f"r{self._ids}"
        self.engine.open(GenerationRequest(rid, tuple(prompt), max_tokens, use_prefix_cache=False))
        return rid

    def _with_context(self, max_tokens: int) -> str:
        rid = self._open(self.context, max_tokens)
        self.engine.import_kv(rid, self.context_blob)
        self.engine.append_tokens(rid, [7])
        return rid

    def prefill(self, n: int) -> tuple[str, tuple[Part, ...], Callable[[], float]]:
        prompt = random_tokens(self.engine, n, seed=2)

        def once() -> float:
            rid = self._open(prompt, 1)
            t0 = time.thread_time()
            self.engine.prefill(rid)
            elapsed = time.thread_time() - t0
            self.engine.abort(rid)
            return elapsed

        return f"prefill {n}", (Part(n, 0, 1),), once

    def decode(self, batch: int) -> tuple[str, tuple[Part, ...], Callable[[], float]]:
        def once() -> float:
            rids = [self._with_context(2) for _ in range(batch)]
            t0 = time.thread_time()
            self.engine.decode_step(rids)
            elapsed = time.thread_time() - t0
            for rid in rids:
                self.engine.abort(rid)
            return elapsed

        return f"decode batch {batch}", tuple(Part(1, CONTEXT, 1) for _ in range(batch)), once

    def extend(self, k: int) -> tuple[str, tuple[Part, ...], Callable[[], float]]:
        ids = list(random_tokens(self.engine, k, seed=3 + k))

        def once() -> float:
            rid = self._with_context(k + 2)
            t0 = time.thread_time()
            self.engine.extend(rid, ids)
            elapsed = time.thread_time() - t0
            self.engine.abort(rid)
            return elapsed

        # the token appended after the context has no KV yet: the pass computes k + 1 tokens, logits at each
        return f"extend {k}", (Part(k + 1, CONTEXT, k + 1),), once


def measure(engine: Engine) -> tuple[list[Measured], float, float]:
    """Every point, timed once per round for a warm-up round and REPS rounds; the median of each. The machine's
    peaks (matmul FLOP/s, copy bandwidth) are measured in every round too, so they see the same load."""
    meter = Meter(engine)
    points = [meter.prefill(n) for n in PREFILL_TOKENS] + [meter.decode(b) for b in DECODE_BATCHES]
    points += [meter.extend(k) for k in EXTEND_TOKENS]
    times: list[list[float]] = [[] for _ in points]
    flops, bandwidth = [], []
    for round_ in range(REPS + 1):
        if round_ % 3 == 0:  # each takes the best of 10 runs: a few seconds
            flops.append(measure_matmul_flops(torch.float32))
            bandwidth.append(measure_copy_bandwidth())
        for (_, _, once), out in zip(points, times):
            t = once()
            if round_:
                out.append(t)
    measured = [Measured(label, parts, statistics.median(t)) for (label, parts, _), t in zip(points, times)]
    return measured, statistics.median(flops), statistics.median(bandwidth)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="small", help="model config (workers.model.CONFIGS and models.yaml)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(1)
    engine = Engine(args.config, device="cpu", prefix_cache=False, capacity_tokens=40 * (CONTEXT + 32))
    catalogue = load_catalogue()
    shipped, arch = catalogue.accelerator("this-machine"), catalogue.model(args.config)
    log.info("timing the engine and the machine's peaks, %d rounds", REPS + 1)
    points, flops, bandwidth = measure(engine)
    here = dataclasses.replace(shipped, dense_flops=flops, memory_bandwidth=bandwidth)
    fitted = fit_efficiency(here, arch, [p for p in points if p.label in CALIBRATE_ON])
    roofs = {"fit": Roofline(here, arch, 1, fitted), "shipped": Roofline(shipped, arch)}
    rows = []
    for p in points:
        row = {"operation": p.label, "set": "calibration" if p.label in CALIBRATE_ON else "held out"}
        row["measured_ms"] = p.seconds * 1e3
        for name, roof in roofs.items():
            cost = roof.step(p.parts)
            row[f"{name}_ms"], row[f"{name}_error"] = cost.seconds * 1e3, relative_error(cost.seconds, p.seconds)
            row[f"{name}_bound"] = cost.bound
        rows.append(row)
    print(f"\nRoofline vs the real engine: config {args.config}, 1 CPU thread, median of {REPS}")
    print(f"this machine now (medians): {flops / 1e9:.1f} GFLOP/s fp32 matmul, {bandwidth / 1e9:.1f} GB/s copy")
    print(
        f"fitted efficiency: compute {fitted.compute:.3f}, memory {fitted.memory:.3f}, "
        f"step overhead {fitted.step_overhead_s * 1e3:.2f} ms, per request {fitted.part_overhead_s * 1e3:.2f} ms, "
        f"ramp {fitted.ramp_tokens:.0f} tokens "
        f"(fitted on: {', '.join(CALIBRATE_ON)})"
    )
    head = f"{'measured ms':>11} {'fit ms':>8} {'error':>7} {'shipped ms':>10} {'error':>7}"
    print(f"\n{'operation':<16} {'set':<12} {head}")
    for r in rows:
        print(
            f"{r['operation']:<16} {r['set']:<12} {r['measured_ms']:>11.2f} {r['fit_ms']:>8.2f} "
            f"{r['fit_error']:>+7.0%} {r['shipped_ms']:>10.2f} {r['shipped_error']:>+7.0%}  ({r['fit_bound']})"
        )
    worst = max(abs(r["fit_error"]) for r in rows)
    print(f"\nworst error of the fit: {worst:.0%} (target {TARGET:.0%}): {'ok' if worst <= TARGET else 'MISSED'}")
    print(
        "accelerators.yaml, this-machine: "
        f"dense_flops: {flops:.3g}, memory_bandwidth: {bandwidth:.3g}, efficiency: {{compute: {fitted.compute:.3f}, "
        f"memory: {fitted.memory:.3f}, host_link: {fitted.host_link}, step_overhead_s: {fitted.step_overhead_s:.5f}, "
        f"part_overhead_s: {fitted.part_overhead_s:.5f}, ramp_tokens: {fitted.ramp_tokens:.1f}}}"
    )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
