"""The PDD deployment inside the emulated network: its config, and the roles as processes in the hosts.

Responsible for: the roles' deployment config for a spec and a variant (every
address derived from `topology.naming`, ports written once below), and the
`process` runtime: starting router, P, RLD and MD as `python -m
workers.roles.<module>` inside their Mininet hosts through `Testbed.popen`,
and stopping them by their own PIDs. The seam for another runtime is
`Runtime`: `docker` (issue 5) goes through the same `Testbed.popen`, with the
Testbed built for containers (`topology_kwargs`).
Not responsible for: the topology (topology.net), readiness checks and load
(experiments.loadgen runs inside the client host), what the roles do.

Placement (host = worker name): router in `router`, P in `p1`, RLD in `rld1`,
MD in `md1`, the load generator in `client`.
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from topology import naming

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parent.parent
# Ports, the same on every host (each host has its own address).
PORTS = {"router": 50050, "p": 50051, "rld": 50052, "md": 50053}
KV_PORTS = {"rld": 50062, "md": 50063}
ROLE_MODULES = {"router": "workers.roles.router", "p": "workers.roles.prefill", "rld": "workers.roles.decode",
                "md": "workers.roles.decode"}
START_ORDER = ("md", "rld", "p", "router")   # the router last: it dials the others
STOP_GRACE_S = 10.0


def worker_names() -> dict[str, str]:
    """role -> worker (= host) name."""
    return {"router": "router", "p": naming.host_name("p", 1), "rld": naming.host_name("rld", 1),
            "md": naming.host_name("md", 1)}


def worker_ip(role: str) -> str:
    return naming.host_ip(role, 0 if role == "router" else 1)


def grpc_address(role: str) -> str:
    return f"{worker_ip(role)}:{PORTS[role]}"


def roles_config(events_dir: str, model: str = "tiny", seed: int = 0, block_size: int = 16,
                 capacity_tokens: dict[str, int] | None = None, **sections) -> dict:
    """The roles' deployment config (workers/roles/config.py) as data: every worker on its host of the
    topology at PORTS / KV_PORTS; capacity_tokens per role (p, rld, md; else the config default); further
    sections (policy, kv, decode, ...) merged in."""
    names, cap = worker_names(), capacity_tokens or {}
    data = {"model": model, "seed": seed, "block_size": block_size, "events_dir": events_dir}
    for role in ("router", "p", "rld", "md"):
        data[role] = {"name": names[role], "host": worker_ip(role), "grpc_port": PORTS[role]}
        if role in KV_PORTS:
            data[role]["kv_port"] = KV_PORTS[role]
        if role in cap:
            data[role]["capacity_tokens"] = cap[role]
    for section, value in sections.items():
        if isinstance(value, dict) and isinstance(data.get(section), dict):
            data[section] = _merge(data[section], value)
        else:
            data[section] = value
    return data


def deployment_dict(spec, events_dir: str, mode: str = "pdd") -> dict:
    """The roles' deployment config for this spec and variant mode, as data; spec.deployment merged in."""
    data = roles_config(events_dir, spec.model, spec.weights_seed, spec.block_size,
                        {"p": spec.capacity_tokens.p, "rld": spec.capacity_tokens.rld, "md": spec.capacity_tokens.md},
                        policy={"mode": mode, "handoff": spec.handoff, "wan_rate_mbit": _wan_rate_mbit(spec.profile)})
    return _merge(data, spec.deployment)


def _wan_rate_mbit(profile: str) -> float:
    """The A->B rate the router's route decision assumes: the profile's (200 if unlimited)."""
    from topology.profiles import load_profile
    return float(load_profile(profile).a_to_b.rate_mbit or 200.0)


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def write_deployment(spec, path: Path, events_dir: Path, mode: str) -> Path:
    """Write (and validate) the deployment YAML the roles read."""
    from workers.roles.config import parse_config
    data = deployment_dict(spec, str(events_dir), mode)
    parse_config(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def topology_kwargs(spec, run_dir: Path | None = None) -> dict:
    """Extra TopologyConfig arguments for the spec's runtime ({} for process; without run_dir: only validated).

    docker: the router, P, RLD and MD hosts become Docker hosts of the worker
    image (built or reused here); the run directory is mounted at its own path
    so configs and event logs are where the process runtime puts them, and the
    weights (generated here first) are mounted read-only.
    """
    from experiments.spec import RUNTIMES, SpecError
    if spec.runtime not in RUNTIMES:
        raise SpecError(f"runtime={spec.runtime!r} is unknown; allowed: {list(RUNTIMES)}")
    if spec.runtime == "process" or run_dir is None:
        return {}
    from docker_rt.host import DockerOptions
    from docker_rt.image import ensure_image
    from workers.model import get_config, get_or_create_weights
    get_or_create_weights(get_config(spec.model), spec.weights_seed)
    return {"runtime": "docker",
            "docker": DockerOptions(image=ensure_image().ref, mounts=(run_dir,), log_dir=run_dir / "containers")}


@dataclass
class Runtime:
    """The roles of one variant, started in their hosts; stop() ends them by PID.

    testbed: the running topology; config: deployment YAML; log_dir: one <worker>.log per role
    """
    testbed: object
    config: Path
    log_dir: Path

    def __post_init__(self) -> None:
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self) -> None:
        """Start every role in its host (readiness is checked separately, by gRPC health)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        names = worker_names()
        for role in START_ORDER:
            argv = [sys.executable, "-m", ROLE_MODULES[role], "--config", str(self.config), "--worker", names[role]]
            with open(self.log_dir / f"{names[role]}.log", "ab") as out:
                self.procs[role] = self.testbed.popen(names[role], argv, cwd=REPO, stdout=out,
                                                      stderr=subprocess.STDOUT, env=_env())

    def dead(self) -> dict[str, int]:
        """Roles that exited: role -> exit status."""
        return {r: p.returncode for r, p in self.procs.items() if p.poll() is not None}

    def stop(self) -> dict[str, int]:
        """SIGTERM every role (graceful gRPC stop), SIGKILL after a grace period; role -> exit status."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        codes = {}
        for role, proc in self.procs.items():
            try:
                codes[role] = proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop in %.0f s: SIGKILL", role, STOP_GRACE_S)
                proc.kill()
                codes[role] = proc.wait(STOP_GRACE_S)
        self.procs.clear()
        return codes


def _env() -> dict[str, str]:
    """Role environment: the repo importable, one BLAS thread (workers share two cores)."""
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
