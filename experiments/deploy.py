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
from experiments.deployment import role_of
from experiments.deployment import worker_ip as worker_ip
from experiments.deployment import worker_names
from workers.roles import ROLE_MODULES as ROLE_MODULES  # one home: every runtime starts the roles so
from workers.roles import START_ORDER as START_ORDER

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parent.parent
STOP_GRACE_S = 10.0


def write_deployment(
    spec, path: Path, events_dir: Path, mode: str, overrides: dict | None = None, wan=None, pools: dict | None = None
) -> Path:
    """Write (and validate) the deployment YAML the roles read; wan: the Profile the link runs now; pools: the
    variant's workers per role (None: the spec's)."""
    from workers.roles.config import parse_config

    data = deployment_dict(spec, str(events_dir), mode, overrides, wan, pools)
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
    from docker_rt.host import DEFAULT_LIMITS, DockerOptions, DockerRuntime, RoleLimits
    from workers.model import get_config, get_or_create_weights

    get_or_create_weights(get_config(spec.model), spec.weights_seed)
    limits = {}
    for role in ("p", "rld", "md"):  # a pool's own limits, each 0 = the role's default
        pool, default = getattr(spec.pools, role), DEFAULT_LIMITS[role]
        limits[role] = RoleLimits(pool.cpus or default.cpus, pool.memory_mb or default.memory_mb, pool.cpuset)
    return {
        "runtime": DockerRuntime(
            DockerOptions(image=worker_image().ref, limits=limits, mounts=(run_dir,), log_dir=run_dir / "containers")
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
    """The workers of one variant, each started in its host; stop() ends them by PID.

    testbed: the running topology; config: deployment YAML; log_dir: one <worker>.log per worker;
    pools: workers per role (p, rld, md; one each by default); cpusets: role -> the cores its workers may run
    on (taskset; "" or absent = any)
    """

    testbed: object
    config: Path
    log_dir: Path
    pools: dict[str, int] | None = None
    cpusets: dict[str, str] | None = None

    def __post_init__(self) -> None:
        self.procs: dict[str, subprocess.Popen] = {}  # by worker (= host) name

    @property
    def workers(self) -> list[str]:
        """Every worker's name, in start order (the MDs first, the router last: it dials the others)."""
        names = worker_names(self.pools)
        return [w for role in START_ORDER for w in names[role]]

    def start(self) -> None:
        """Start every worker in its host (readiness is checked separately, by gRPC health)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for name in self.workers:
            argv = [sys.executable, "-m", ROLE_MODULES[role_of(name)], "--config", str(self.config), "--worker", name]
            cpuset = (self.cpusets or {}).get(role_of(name))
            if cpuset and self.testbed.config.runtime.name == "process":  # Docker: --cpuset-cpus (docker_rt)
                argv = ["taskset", "-c", cpuset, *argv]  # a pool's own cores
            with open(self.log_dir / f"{name}.log", "ab") as out:
                self.procs[name] = self.testbed.popen(
                    name, argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=_env()
                )

    def dead(self) -> dict[str, int]:
        """Workers that exited: worker -> exit status."""
        return {w: p.returncode for w, p in self.procs.items() if p.poll() is not None}

    def kill(self, target: str) -> int | None:
        """SIGKILL one worker (a fault the experiment plays: a worker's name, or a role for its first worker)
        and whatever the runtime runs of it; its PID, or None if it was not running."""
        name = worker_names(self.pools)[target][0] if target in START_ORDER else target
        proc = self.procs.get(name)
        if proc is None or proc.poll() is not None:
            return None
        self.testbed.kill(name, proc)
        return proc.pid

    def stop(self) -> dict[str, int]:
        """SIGTERM every worker (graceful gRPC stop), SIGKILL after a grace period; worker -> exit status."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        codes = {}
        for name, proc in self.procs.items():
            try:
                codes[name] = proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop in %.0f s: SIGKILL", name, STOP_GRACE_S)
                codes[name] = self.testbed.kill(name, proc, STOP_GRACE_S)
        self.procs.clear()
        return codes


def _env() -> dict[str, str]:
    """Role environment: the repo importable, one BLAS thread (workers share two cores)."""
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
