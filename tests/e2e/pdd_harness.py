"""Start a whole PDD deployment on loopback as real processes, and tear it down by PID.

Responsible for: picking free ports, writing the deployment YAML, starting
router, P, RLD and MD as `python -m workers.roles.<role>`, waiting for each
one's gRPC health SERVING, a WAN proxy in front of the MD's KV listener, and
stopping every process it started (SIGTERM, then SIGKILL) by its own PID.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import grpc
import yaml

from wanproxy import WanProxy
from workers.roles.client import wait_healthy
from workers.roles.config import load_config
from workers.roles.events import read_events

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[2]
CHUNK_TOKENS = 8  # policy.chunk_tokens: a chunked handoff's chunk
ROLE_MODULES = {
    "router": "workers.roles.router",
    "p": "workers.roles.prefill",
    "rld": "workers.roles.decode",
    "md": "workers.roles.decode",
}


_handed_out: set[int] = set()  # ports this process gave out: the OS may offer a just-released one again


def free_port() -> int:
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def deployment_yaml(
    run_dir: Path,
    wan_proxy_ports: list[int],
    pools: dict[str, int] | None = None,
    worker_fields: dict | None = None,
    **overrides,
) -> dict:
    """The deployment config as data: every port free, each MD's KV reached through its WAN proxy; pools:
    workers per role (default one each; as many MDs as proxy ports); worker_fields: set in every pool worker
    (e.g. a modelled accelerator)."""
    n = {"p": 1, "rld": 1, **(pools or {}), "md": len(wan_proxy_ports)}

    def pool(role: str, **fields) -> list[dict]:
        fields = {**fields, **(worker_fields or {})}
        return [{"name": f"{role}{i + 1}", "grpc_port": free_port(), **fields} for i in range(n[role])]

    cfg = {
        "model": "tiny",
        "seed": 0,
        "block_size": 16,
        "events_dir": str(run_dir / "events"),
        "router": {"name": "router", "grpc_port": free_port()},
        "p": pool("p", capacity_tokens=4096),
        "rld": [{**w, "kv_port": free_port()} for w in pool("rld", capacity_tokens=4096)],
        "md": [
            {**w, "kv_port": free_port(), "kv_connect": f"127.0.0.1:{port}"}
            for w, port in zip(pool("md", capacity_tokens=8192), wan_proxy_ports)
        ],
        "kv": {
            "fast": {"connections": 1, "congestion": "cubic"},
            # a new connection per transfer: the proxy's faults (cut, stall, rate ...) act per connection
            "wan": {
                "connections": 2,
                "congestion": "bbr",
                "stall_timeout_ms": 500,
                "max_retries": 3,
                "frame_bytes": 4096,
                "persistent": False,
            },
        },
        "policy": {
            "mode": "pdd",
            "handoff": "oneshot",
            "chunk_tokens": CHUNK_TOKENS,
            "wan_rate_mbit": 200,
            "direct_max_transfer_ms": 0.2,
            "singular_min_uncached_tokens": 48,
            "singular_max_output_tokens": 4,
        },
        "decode": {"kv_wait_ms": 4000, "handoff_timeout_ms": 3000},
    }
    for key, value in overrides.items():
        cfg[key] = {**cfg.get(key, {}), **value} if isinstance(value, dict) else value
    return cfg


class Deployment:
    """A running deployment: cfg (typed), router channel, one WAN proxy per MD (`proxy`: the first's), the
    processes by worker name. pools: workers per role (p, rld, md), one each by default."""

    def __init__(
        self, run_dir: Path, pools: dict[str, int] | None = None, worker_fields: dict | None = None, **overrides
    ):
        self.run_dir = run_dir
        self.proxy_ports = [free_port() for _ in range((pools or {}).get("md", 1))]
        self.proxy_port = self.proxy_ports[0]
        data = deployment_yaml(run_dir, self.proxy_ports, pools, worker_fields, **overrides)
        self.config_path = run_dir / "deployment.yaml"
        self.config_path.write_text(yaml.safe_dump(data))
        self.cfg = load_config(self.config_path)
        self.procs: dict[str, subprocess.Popen] = {}
        self.proxies: list[WanProxy] = []
        self.proxy: WanProxy | None = None
        self.channel: grpc.Channel | None = None

    def start(self) -> Deployment:
        self.proxies = [WanProxy(("127.0.0.1", md.kv_port), port=p) for md, p in zip(self.cfg.md, self.proxy_ports)]
        self.proxy = self.proxies[0]
        for role in ("md", "rld", "p", "router"):
            for worker in self.cfg.pool(role):
                self.start_role(worker.name)
        for worker in self.cfg.workers:
            wait_healthy(worker.grpc_address, timeout_s=90)
        self.channel = grpc.insecure_channel(self.cfg.router.grpc_address)
        return self

    def name(self, role_or_worker: str) -> str:
        """A worker's name: as given, or a role's first worker (md -> md1)."""
        if role_or_worker in ("p", "rld", "md", "router"):
            return self.cfg.pool(role_or_worker)[0].name
        return role_or_worker

    def proc(self, role_or_worker: str) -> subprocess.Popen:
        return self.procs[self.name(role_or_worker)]

    def start_role(self, role_or_worker: str) -> None:
        worker = self.cfg.worker(self.name(role_or_worker))
        module = ROLE_MODULES[self.cfg.role_of(worker.name)]
        cmd = [sys.executable, "-m", module, "--config", str(self.config_path), "--worker", worker.name]
        log.info("starting %s", " ".join(cmd))
        out = open(self.run_dir / f"{worker.name}.log", "ab")
        self.procs[worker.name] = subprocess.Popen(
            cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(REPO)}
        )
        out.close()

    def kill(self, role_or_worker: str) -> None:
        """SIGKILL one worker's process (a peer that disappears): a role's first, or the named worker."""
        proc = self.proc(role_or_worker)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

    def stop(self) -> dict[str, int]:
        """Stop every process this deployment started (by PID); returns their exit codes."""
        if self.channel is not None:
            self.channel.close()
        codes = {}
        for role, proc in self.procs.items():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for role, proc in self.procs.items():
            try:
                codes[role] = proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                codes[role] = proc.wait(5)
        for proxy in self.proxies:
            proxy.close()
        return codes

    def events(self, worker: str):
        path = Path(self.cfg.events_dir) / f"{worker}.jsonl"
        return read_events(path) if path.exists() else []

    def all_events(self):
        evs = [e for w in self.cfg.workers for e in self.events(w.name)]
        return sorted(evs, key=lambda e: e.t_ns)


@contextmanager
def running(run_dir: Path, pools: dict[str, int] | None = None, **overrides):
    dep = Deployment(run_dir, pools, **overrides)
    try:
        yield dep.start()
    finally:
        dep.stop()
