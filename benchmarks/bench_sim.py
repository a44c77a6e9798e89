"""How fast the simulator runs a published-size deployment: requests simulated per second of wall time.

Responsible for: a deployment of the published scale (PDD.md: hundreds of accelerators over two sites, a
100 Gbit/s line): kimi-k2, P 16 x 16 h800 and the RLD 2 x 16 h800 in site A, the MD 14 x 16 h20 in site B
(512 accelerators), on a 100 Gbit/s line of 30 ms RTT and 0.01% loss, and >= 10k requests of the synthetic
multi-turn agent workload; it simulates the spec's variants with experiments.sim.simulate (the code
`pddlab simulate` runs) and prints, per variant, requests, wall time, requests simulated per second, and the
headline figures, and which build ran (experiments.sim.compiled: compiled or pure Python); --hash: each variant's
records' sha256, equal before and after a change that must keep the figures. Goal: >= 10,000 requests simulated
per second of wall time.
Not responsible for: whether the figures are right (the validation against the emulator, docs/simulator.md).

    .venv/bin/python benchmarks/bench_sim.py [--requests 10000] [--variants pd-intra,pdd] [--analyse] [--hash]
        [--repeat N]
    PDDLAB_SIM_PURE=1 .venv/bin/python benchmarks/bench_sim.py   # as pure Python, whatever is built
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.sim import compiled  # noqa: E402
from experiments.sim.config import load_for_simulation, sim_config  # noqa: E402
from experiments.sim.pipeline import Simulation  # noqa: E402
from experiments.sim.simulate import summarize, workload_of  # noqa: E402
from experiments.sim.wan import load_calibration  # noqa: E402

LINE = (
    "name: published-line\ndescription: a 100 Gbit/s cross-DC line\n"
    "link: {rate_mbit: 100000, delay_ms: 15, loss_pct: 0.01}\n"
)
PUBLISHED = [
    "lan_profile=experiments/specs/lines/published-rdma.yaml",  # RDMA in the cluster: the host links alone
    "model=small",  # the tokenizer and the context check: the arithmetic is kimi-k2's
    "pools.p.workers=16",
    "pools.rld.workers=2",
    "pools.md.workers=14",
    "capacity_tokens={p: 65536, rld: 65536, md: 65536}",
    "deployment.compute={mode: modelled, arch: kimi-k2}",
    "deployment.p={accelerator: h800, devices: 16}",
    "deployment.rld={accelerator: h800, devices: 16}",
    "deployment.md={accelerator: h20, devices: 16}",
    "deployment.kv.wan={connections: 2, congestion: cubic}",
    "workload.source=synthetic",
    "workload.synthetic={sessions: 1000, session_rate_per_s: 40, turns: [10, 12], system_prompt_tokens: 1024,"
    " output_tokens: [32, 96], fresh_requests: 200}",
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--variants", default="pd-intra,pd-cross,pdd")
    ap.add_argument("--analyse", action="store_true", help="also time the summary (the emulated analysis)")
    ap.add_argument("--hash", action="store_true", help="also print each variant's records' sha256 (same figures?)")
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="simulate each variant N times and print the best and the median rate (a shared machine's load only"
        " ever slows a run: the best of N is the code's speed, as timeit reports it)",
    )
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error(f"--repeat {args.repeat}: at least 1 run of each variant")
    with tempfile.TemporaryDirectory() as tmp:
        line = Path(tmp) / "published-line.yaml"
        line.write_text(LINE)
        sets = [f"profile={line}", f"variants=[{args.variants}]", *PUBLISHED]
        t0 = time.perf_counter()
        loaded = load_for_simulation("pdd-vs-baselines", sets)
        reqs = workload_of(loaded, args.requests)
        configs = {v: sim_config(loaded, v) for v in loaded.spec.variants}
        print(f"spec and workload: {len(reqs)} requests in {time.perf_counter() - t0:.1f} s")
    cal, records = load_calibration(), []
    built = compiled.loaded()
    print(f"simulator: {'compiled (Cython): ' + ', '.join(built) if built else 'pure Python'}")
    for v, cfg in configs.items():
        walls, cpus = [], []
        for _ in range(args.repeat):
            t1, c1 = time.perf_counter(), time.process_time()
            sim = Simulation(cfg, reqs, seed=1, calibration=cal, request_s=loaded.spec.timeouts.request_s)
            recs = sim.run()
            walls.append(time.perf_counter() - t1)
            cpus.append(time.process_time() - c1)
        wall, cpu = walls[0], cpus[0]
        records += recs
        ttft = sorted(r.ttft_ms for r in recs)
        sim_end = max(r.t_done_ns for r in recs) / 1e9
        print(
            f"{v:9s} {cfg.accelerators} accelerators, line {cfg.line.rate_bps / 1e9:g} Gbit/s: {len(recs)} requests "
            f"({sum(r.output_tokens for r in recs):,} tokens, {sim_end:.0f} s simulated) in {wall:.2f} s wall = "
            f"{len(recs) / wall:,.0f} requests/s ({len(recs) / cpu:,.0f} per CPU second); "
            f"TTFT p50 {ttft[len(ttft) // 2]:.0f} ms, "
            f"p90 {ttft[int(len(ttft) * 0.9)]:.0f} ms; WAN {sum(r.wan_bytes for r in recs) / 1e9:.1f} GB"
        )
        if len(walls) > 1:
            n, median = len(recs), statistics.median
            print(
                f"{v:9s} {len(walls)} runs: best {n / min(walls):,.0f} requests/s, median {n / median(walls):,.0f}"
                f" (per CPU second: best {n / min(cpus):,.0f}, median {n / median(cpus):,.0f})"
            )
        if args.hash:
            print(f"{v:9s} records sha256 {records_sha256(sim, recs)}")
    if args.analyse:
        t2 = time.perf_counter()
        summarize(loaded, records, configs, cal, 1)
        print(f"analysis (summary.json's figures with intervals): {time.perf_counter() - t2:.1f} s")
    return 0


def records_sha256(sim: Simulation, recs: list) -> str:
    """Every field of every record (json.dumps, in order) and each worker's counters: equal hashes, same figures."""
    h = hashlib.sha256()
    for r in recs:
        h.update(json.dumps(dataclasses.asdict(r)).encode())
    for w in [*sim.p, *sim.rld, *sim.md]:
        h.update(repr((w.name, w.busy_s, getattr(w, "steps", None), getattr(w, "tokens", None))).encode())
    for name, room in sim.rooms.items():
        h.update(repr((name, room.reserved, room.cached_blocks, room.evictions)).encode())
    return h.hexdigest()


if __name__ == "__main__":
    sys.exit(main())
