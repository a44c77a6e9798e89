"""The PDD deployment inside the emulated network: its config, and the roles as processes in the hosts.

Responsible for: writing the roles' deployment config for a variant (built by
experiments.deployment, re-exported here), and the `process` runtime: starting router, P, RLD and MD as `python -m
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

# Re-exported (the runner, tests and benchmarks address the roles through deploy).
from experiments.deployment import KV_PORTS as KV_PORTS
from experiments.deployment import PORTS as PORTS
from experiments.deployment import deployment_dict
from experiments.deployment import grpc_address as grpc_address
from experiments.deployment import roles_config as roles_config
from experiments.deployment import worker_ip as worker_ip
from experiments.deployment import worker_names

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parent.parent
ROLE_MODULES = {
    "router": "workers.roles.router",
    "p": "workers.roles.prefill",
    "rld": "workers.roles.decode",
    "md": "workers.roles.decode",
}
START_ORDER = ("md", "rld", "p", "router")  # the router last: it dials the others
STOP_GRACE_S = 10.0


def write_deployment(spec, path: Path, events_dir: Path, mode: str, overrides: dict | None = None, wan=None) -> Path:
    """Write (and validate) the deployment YAML the roles read; wan: the Profile the link runs now."""
    from workers.roles.config import parse_config

    data = deployment_dict(spec, str(events_dir), mode, overrides, wan)
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
    from docker_rt.host import DockerOptions, DockerRuntime
    from workers.model import get_config, get_or_create_weights

    get_or_create_weights(get_config(spec.model), spec.weights_seed)
    return {
        "runtime": DockerRuntime(
            DockerOptions(image=worker_image().ref, mounts=(run_dir,), log_dir=run_dir / "containers")
        ),
    }


def worker_image(base_image: str | None = None, no_cache: bool = False):
    """docker_rt.image.ensure_image, its build's steps shown as progress (nothing when it is up to date)."""
    from docker_rt.image import ensure_image
    from experiments.progress import Progress

    bar = Progress("worker image build", None, log, unit="step")
    try:
        return ensure_image(base_image, no_cache, on_step=lambda done, total, what: bar.update(done, what, total))
    finally:
        bar.close()


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
                self.procs[role] = self.testbed.popen(
                    names[role], argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=_env()
                )

    def dead(self) -> dict[str, int]:
        """Roles that exited: role -> exit status."""
        return {r: p.returncode for r, p in self.procs.items() if p.poll() is not None}

    def kill(self, role: str) -> int | None:
        """SIGKILL one role (a fault the experiment plays) and whatever the runtime runs of it; its PID, or
        None if it was not running."""
        proc = self.procs.get(role)
        if proc is None or proc.poll() is not None:
            return None
        self.testbed.kill(worker_names()[role], proc)
        return proc.pid

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
                codes[role] = self.testbed.kill(worker_names()[role], proc, STOP_GRACE_S)
        self.procs.clear()
        return codes


def _env() -> dict[str, str]:
    """Role environment: the repo importable, one BLAS thread (workers share two cores)."""
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
