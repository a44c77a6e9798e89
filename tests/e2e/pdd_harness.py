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
ROLE_MODULES = {
    "router": "workers.roles.router",
    "p": "workers.roles.prefill",
    "rld": "workers.roles.decode",
    "md": "workers.roles.decode",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def deployment_yaml(run_dir: Path, wan_proxy_port: int, **overrides) -> dict:
    """The deployment config as data: every port free, the MD's KV reached through the WAN proxy."""
    cfg = {
        "model": "tiny",
        "seed": 0,
        "block_size": 16,
        "events_dir": str(run_dir / "events"),
        "router": {"name": "router", "grpc_port": free_port()},
        "p": {"name": "p1", "grpc_port": free_port(), "capacity_tokens": 4096},
        "rld": {"name": "rld1", "grpc_port": free_port(), "kv_port": free_port(), "capacity_tokens": 4096},
        "md": {
            "name": "md1",
            "grpc_port": free_port(),
            "kv_port": free_port(),
            "capacity_tokens": 8192,
            "kv_connect": f"127.0.0.1:{wan_proxy_port}",
        },
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
            "chunk_tokens": 8,
            "wan_rate_mbit": 200,
            "direct_max_transfer_ms": 0.2,
            "singular_min_uncached_tokens": 48,
            "singular_max_output_tokens": 4,
        },
        "decode": {"kv_wait_ms": 4000, "handoff_timeout_ms": 3000},
    }
    for key, value in overrides.items():
        cfg[key] = {**cfg[key], **value} if isinstance(value, dict) else value
    return cfg


class Deployment:
    """A running deployment: cfg (typed), router channel, the WAN proxy, the processes by role."""

    def __init__(self, run_dir: Path, **overrides):
        self.run_dir = run_dir
        self.proxy_port = free_port()
        data = deployment_yaml(run_dir, self.proxy_port, **overrides)
        self.config_path = run_dir / "deployment.yaml"
        self.config_path.write_text(yaml.safe_dump(data))
        self.cfg = load_config(self.config_path)
        self.procs: dict[str, subprocess.Popen] = {}
        self.proxy: WanProxy | None = None
        self.channel: grpc.Channel | None = None

    def start(self) -> Deployment:
        self.proxy = WanProxy(("127.0.0.1", self.cfg.md.kv_port), port=self.proxy_port)
        for role in ("md", "rld", "p", "router"):
            self.start_role(role)
        for role in ("md", "rld", "p", "router"):
            wait_healthy(getattr(self.cfg, role).grpc_address, timeout_s=90)
        self.channel = grpc.insecure_channel(self.cfg.router.grpc_address)
        return self

    def start_role(self, role: str) -> None:
        worker = getattr(self.cfg, role)
        cmd = [sys.executable, "-m", ROLE_MODULES[role], "--config", str(self.config_path), "--worker", worker.name]
        log.info("starting %s", " ".join(cmd))
        out = open(self.run_dir / f"{worker.name}.log", "ab")
        self.procs[role] = subprocess.Popen(
            cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(REPO)}
        )
        out.close()

    def kill(self, role: str) -> None:
        """SIGKILL one role's process (a peer that disappears)."""
        proc = self.procs[role]
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
        if self.proxy is not None:
            self.proxy.close()
        return codes

    def events(self, worker: str):
        path = Path(self.cfg.events_dir) / f"{worker}.jsonl"
        return read_events(path) if path.exists() else []

    def all_events(self):
        evs = [e for w in ("router", "p1", "rld1", "md1") for e in self.events(w)]
        return sorted(evs, key=lambda e: e.t_ns)


@contextmanager
def running(run_dir: Path, **overrides):
    dep = Deployment(run_dir, **overrides)
    try:
        yield dep.start()
    finally:
        dep.stop()
