"""Scale on paper: what one worker of each model config costs (memory, start time, CPU to start), measured, and
how many workers a 2-core box, a 64-core box and a Ray cluster of N nodes hold from those figures.

Responsible for: starting, per model config, the four roles of a one-of-each deployment as real processes on
127.0.0.1 (`python -m workers.roles.<module>`, the program every runtime starts), one after another so each
start is timed alone (spawn to gRPC health SERVING); each worker's resident memory (VmRSS) when SERVING and its
peak (VmHWM) after one pdd request of PROMPT tokens (tiny: its whole context; the spec: pdd-smoke for tiny, else
pdd-vs-baselines, with its capacities), next to the estimate the spec check uses
(`experiments.spec.deployment.worker_memory_mb`); the CPU seconds each start took. Then the table of workers per
machine: a worker wants `threads` cores (1 here, as in every shipped spec) and its peak memory; the front
(router + load generator) one core and FRONT_MB; a Ray node adds its own processes (measured by `make test-ray`:
~440 MiB per node, 86 MiB per worker's actor).
Not responsible for: throughput per worker (`make bench`: bench_engine), Ray itself (`make test-ray`).

    .venv/bin/python benchmarks/bench_scale.py [--configs tiny small default] [--json out.json]

Every process it starts is stopped by its PID (SIGTERM, then SIGKILL) before it returns.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from experiments.spec.deployment import FRONT_MB, deployment_dict, worker_memory_mb  # noqa: E402
from experiments.spec.experiment import load_spec  # noqa: E402
from workers.model import get_config, get_or_create_weights  # noqa: E402
from workers.roles import ROLE_MODULES, START_ORDER  # noqa: E402
from workers.roles.client import generate, wait_healthy  # noqa: E402
from workers.roles.config import parse_config  # noqa: E402

PROMPT = 512
OUTPUT = 16
RAY_NODE_MB = 440  # Ray's own processes per node (make test-ray: 880 MiB for two nodes with the GCS)
RAY_ACTOR_MB = 86  # a worker's RoleHost actor under Ray (make test-ray)
MACHINES = (("this box: 2 cores, 24 GiB", 2, 24), ("a 64-core box, 256 GiB", 64, 256))
RAY_NODES = (8, 16, 64)  # Ray clusters of N nodes like the 64-core box


@dataclass
class Worker:
    """One worker's measured cost. start_s: spawn to SERVING, alone; cpu_s: CPU seconds to get there."""

    config: str
    name: str
    role: str
    start_s: float
    cpu_s: float
    rss_mb: int
    peak_mb: int
    estimate_mb: int


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _status_mb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) // 1024
    return 0


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _loopback_config(spec, events: Path) -> dict:
    """The spec's deployment config with every worker on 127.0.0.1 and free ports."""
    data = deployment_dict(spec, str(events), "pdd", None, None, None)
    for key in ("router", "p", "rld", "md"):
        for w in data[key] if isinstance(data[key], list) else [data[key]]:
            w["host"] = "127.0.0.1"
            for port in ("grpc_port", "kv_port"):
                if port in w:
                    w[port] = _free_port()
    return data


def _stop(procs: dict[str, subprocess.Popen]) -> None:
    for proc in procs.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs.values():
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def measure(config: str, work: Path) -> list[Worker]:
    """Start the roles of config one by one, measure each, send one request, measure the peaks."""
    base = "pdd-smoke" if config.startswith("tiny") else "pdd-vs-baselines"  # tiny's context is 128 tokens
    spec = load_spec(base, [f"model={config}"])
    model = get_config(config)
    get_or_create_weights(model, spec.weights_seed)  # generated once, not in anyone's start time
    data = _loopback_config(spec, work / "events")
    path = work / f"{config}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    roles = {w["name"]: key for key in ("p", "rld", "md") for w in data[key]} | {"router": "router"}
    addr = {w["name"]: f"127.0.0.1:{w['grpc_port']}" for key in ("p", "rld", "md") for w in data[key]}
    addr["router"] = f"127.0.0.1:{data['router']['grpc_port']}"
    procs: dict[str, subprocess.Popen] = {}
    started: dict[str, tuple[float, float]] = {}
    try:
        for role in START_ORDER:
            for name in [n for n, r in roles.items() if r == role]:
                cmd = [sys.executable, "-m", ROLE_MODULES[role], "--config", str(path), "--worker", name]
                log = open(work / f"{config}-{name}.log", "wb")
                t0 = time.monotonic()
                procs[name] = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
                log.close()
                wait_healthy(addr[name], timeout_s=180)
                started[name] = (time.monotonic() - t0, _cpu_s(procs[name].pid))
        rss = {n: _status_mb(p.pid, "VmRSS") for n, p in procs.items()}
        with grpc.insecure_channel(addr["router"]) as channel:
            prompt = min(PROMPT, model.max_seq_len - OUTPUT - 1)
            generate(channel, [(7 * i) % 200 + 3 for i in range(prompt)], OUTPUT, mode="pdd", timeout_s=300)
        peak = {n: _status_mb(p.pid, "VmHWM") for n, p in procs.items()}
    finally:
        _stop(procs)
    caps, cfg = spec.capacity_tokens, parse_config(data)
    budgets = {"p": cfg.prefill.step_budget_tokens, "rld": cfg.decode.step_budget_tokens}
    budgets["md"] = budgets["rld"]
    return [
        Worker(
            config,
            name,
            role,
            *started[name],
            rss[name],
            peak[name],
            worker_memory_mb(model, getattr(caps, role), budgets[role]) if role != "router" else 0,
        )
        for name, role in roles.items()
    ]


def workers_held(cores: int, mem_gib: int, worker_mb: int, reserved_mb: int) -> tuple[int, int]:
    """Workers (one thread each) one machine holds beside reserved_mb and one core of its own, by its cores and
    by its memory (1 GiB left to the OS): the smaller binds."""
    return cores - 1, (mem_gib * 1024 - 1024 - reserved_mb) // worker_mb


def table(rows: list[Worker]) -> str:
    head = (
        "| config | worker | start s (alone) | CPU s to start | RSS serving MiB | peak MiB (a request) | estimate MiB |"
    )
    out = [head, "|---|---|---|---|---|---|---|"]
    for w in rows:
        est = f"{w.estimate_mb:,}" if w.estimate_mb else "–"
        out.append(
            f"| {w.config} | {w.name} | {w.start_s:.1f} | {w.cpu_s:.1f} | {w.rss_mb:,} | {w.peak_mb:,} | {est} |"
        )
    machines = [m[0] for m in MACHINES] + [f"Ray, {n} nodes like the 64-core box" for n in RAY_NODES]
    out += ["", "| config | worker MiB (largest peak) | " + " | ".join(machines) + " |"]
    out.append("|---|---|" + "---|" * len(machines))
    for config in dict.fromkeys(w.config for w in rows):
        mb = max(w.peak_mb for w in rows if w.config == config and w.role != "router")
        cells = [
            f"{min(h)} ({h[0]} by cores, {h[1]} by memory)"
            for h in (workers_held(c, g, mb, FRONT_MB) for _, c, g in MACHINES)
        ]
        per_node = min(workers_held(MACHINES[-1][1], MACHINES[-1][2], mb + RAY_ACTOR_MB, RAY_NODE_MB))
        cells += [f"{n * per_node:,}" for n in RAY_NODES]  # the front on one node: one core of each spare
        out.append(f"| {config} | {mb:,} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", nargs="+", default=["tiny", "small", "default"])
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    rows: list[Worker] = []
    with tempfile.TemporaryDirectory(prefix="pddlab-scale-") as tmp:
        for config in args.configs:
            print(f"measuring {config} ...", file=sys.stderr, flush=True)
            rows += measure(config, Path(tmp))
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
