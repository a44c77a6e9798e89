"""The PDD deployment inside the emulated network: its config, and the roles started under the spec's runtime.

Responsible for: writing the roles' deployment config for a variant (built by
experiments.spec.deployment, re-exported here); the topology's runtime for the spec
(`topology_kwargs`: plain processes, Docker hosts, or a Ray node in every host);
and the workers of one variant (`make_runtime`): `Runtime` starts router, P, RLD
and MD as `python -m workers.roles.<module>` inside their hosts through
`Testbed.popen` (Docker's containers go the same way) and stops them by their own
PIDs; under Ray, ray_rt.session's RayDeployment (the topology's Ray nodes) or
ClusterDeployment (an existing cluster) place and supervise them instead. All
three have start, address, dead, kill, stop.
Not responsible for: the topology (topology.net), readiness checks and load
(experiments.run.loadgen runs inside the client host), what the roles do.

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
from typing import Protocol

import yaml

# Re-exported (the runner, tests and benchmarks address the roles through deploy).
from experiments.spec.deployment import KV_PORTS as KV_PORTS
from experiments.spec.deployment import PORTS as PORTS
from experiments.spec import deployment
from experiments.spec.runtimes import KINDS
from experiments.spec.deployment import deployment_dict
from experiments.spec.deployment import grpc_address as grpc_address
from experiments.spec.deployment import roles_config as roles_config
from experiments.spec.deployment import role_of
from experiments.spec.deployment import worker_ip as worker_ip
from experiments.spec.deployment import worker_names
from workers.roles import ROLE_MODULES as ROLE_MODULES  # one home: every runtime starts the roles so
from workers.roles import START_ORDER as START_ORDER

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[2]
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


class Launcher(Protocol):
    """How a runtime brings a variant's workers up: what the topology needs for it, and the workers themselves
    (start, address, dead, kill, stop)."""

    def topology_kwargs(self, spec, run_dir: Path | None) -> dict: ...

    def workers(self, testbed, spec, config: Path, log_dir: Path, pools: dict[str, int], cpusets: dict[str, str]): ...


class _Processes:
    """process and docker: the roles as `python -m workers.roles.<module>` in their hosts through
    `Testbed.popen` (Docker's containers run them: containers=True)."""

    def __init__(self, containers: bool):
        self.containers = containers

    def topology_kwargs(self, spec, run_dir: Path | None) -> dict:
        return _docker_kwargs(spec, run_dir) if self.containers and run_dir is not None else {}

    def workers(self, testbed, spec, config, log_dir, pools, cpusets):
        return Runtime(testbed, config, log_dir, pools, cpusets)


class _Ray:
    """ray: a Ray node in every host (ray_rt.netns) and the roles placed and supervised by Ray
    (ray_rt.session.RayDeployment); on an existing Ray cluster (cluster.address), its ClusterDeployment."""

    def topology_kwargs(self, spec, run_dir: Path | None) -> dict:
        return _ray_kwargs(spec, run_dir)

    def workers(self, testbed, spec, config, log_dir, pools, cpusets):
        from ray_rt.placement import deployment_needs
        from ray_rt.session import ClusterDeployment, RayDeployment

        needs = deployment_needs(spec.pools, pools)
        if spec.cluster.address:  # an existing cluster: this process is the driver
            work_dir = f"{testbed.work_dir}/{config.parent.name}"
            return ClusterDeployment(config, log_dir, start_order(pools), needs, work_dir, cpusets)
        return RayDeployment(testbed, config, log_dir, start_order(pools), needs, cpusets)


# The one place a runtime's kind (experiments.spec.runtimes) becomes the code that launches its workers.
LAUNCHERS: dict[str, Launcher] = {"process": _Processes(False), "docker": _Processes(True), "ray": _Ray()}


def launcher(spec) -> Launcher:
    """The spec's runtime's launcher (SpecError for a runtime without one)."""
    from experiments.spec.experiment import SpecError

    kind = KINDS.get(spec.runtime)
    if kind is None or kind.name not in LAUNCHERS:
        raise SpecError(f"runtime={spec.runtime!r} is unknown; allowed: {list(LAUNCHERS)}")
    return LAUNCHERS[kind.name]


def topology_kwargs(spec, run_dir: Path | None = None) -> dict:
    """Extra TopologyConfig arguments for the spec's runtime ({} for process; without run_dir: only validated)."""
    return launcher(spec).topology_kwargs(spec, run_dir)


def _docker_kwargs(spec, run_dir: Path) -> dict:
    """docker: the router, P, RLD and MD hosts become Docker hosts of the worker image (built or reused here);
    the run directory is mounted at its own path so configs and event logs are where the process runtime puts
    them, and the weights (generated here first) are mounted read-only."""
    from docker_rt.host import DEFAULT_LIMITS, DockerOptions, DockerRuntime, RoleLimits
    from workers.model import get_config, get_or_create_weights

    get_or_create_weights(get_config(spec.model), spec.weights_seed)
    gpu_roles = tuple(role for role in ("p", "rld", "md") if getattr(spec.pools, role).device == "cuda")
    # any cuda pool: every role runs the cuda variant (its torch runs on the CPU too); never downloaded here
    variant = "cuda" if gpu_roles else "cpu"
    limits = {}
    for role in ("p", "rld", "md"):  # a pool's own limits, each 0 = the role's default
        pool, default = getattr(spec.pools, role), DEFAULT_LIMITS[role]
        limits[role] = RoleLimits(pool.cpus or default.cpus, pool.memory_mb or default.memory_mb, pool.cpuset)
    return {
        "runtime": DockerRuntime(
            DockerOptions(
                image=worker_image(variant=variant, download=variant == "cpu").ref,
                limits=limits,
                mounts=(run_dir,),
                log_dir=run_dir / "containers",
                gpu_roles=gpu_roles,
            )
        ),
    }


def _ray_kwargs(spec, run_dir: Path | None) -> dict:
    """runtime ray: plain hosts, each with a Ray node in it (ray_rt.netns); ray must be installed."""
    from experiments.spec.experiment import SpecError

    try:
        import ray  # noqa: F401
    except ImportError:
        raise SpecError("runtime=ray needs the ray package: run `make setup` (pip install -e '.[ray]')") from None
    if run_dir is None:
        return {}
    from ray_rt.netns import RayHostRuntime

    return {"runtime": RayHostRuntime(deployment.ray_nodes(spec), run_dir / "logs")}


def make_runtime(testbed, spec, config: Path, log_dir: Path, pools: dict[str, int], cpusets: dict[str, str]):
    """The workers of one variant under the spec's runtime (its Launcher): `Runtime` (processes, containers),
    or under Ray (ray_rt.session); all have start, address, dead, kill, stop."""
    return launcher(spec).workers(testbed, spec, config, log_dir, pools, cpusets)


def start_order(pools: dict[str, int] | None) -> list[str]:
    """Every worker's name, in start order (the MDs first, the router last: it dials the others)."""
    names = worker_names(pools)
    return [w for role in START_ORDER for w in names[role]]


def worker_image(base_image: str | None = None, no_cache: bool = False, variant: str = "cpu", download: bool = True):
    """docker_rt.image.ensure_image (of a variant: cpu | cuda), its build's steps shown as progress (nothing when
    it is up to date); download=False: a missing wheelhouse is an error (a run never fetches cuda's)."""
    from docker_rt.image import ensure_image
    from experiments.progress import Progress

    bar = Progress(f"worker image build ({variant})", None, log, unit="step")
    try:
        return ensure_image(
            base_image,
            no_cache,
            on_step=lambda done, total, what: bar.update(done, what, total),
            variant=variant,
            download=download,
        )
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
        return start_order(self.pools)

    def start(self) -> None:
        """Start every worker in its host (readiness is checked separately, by gRPC health)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for name in self.workers:
            argv = [sys.executable, "-m", ROLE_MODULES[role_of(name)], "--config", str(self.config), "--worker", name]
            argv = self.testbed.config.runtime.confine(argv, (self.cpusets or {}).get(role_of(name), ""))
            with open(self.log_dir / f"{name}.log", "ab") as out:
                self.procs[name] = self.testbed.popen(
                    name, argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=worker_env()
                )

    def address(self, worker: str) -> str:
        """host:port of a worker's gRPC (its topology host's address)."""
        return f"{self.testbed.address(worker)}:{PORTS[role_of(worker)]}"

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

    def signal(self, target: str, signum: int) -> int | None:
        """Send signum to one worker's process (a stop fault: SIGSTOP, then SIGCONT; a worker's name, or a
        role for its first worker); its PID, or None if it was not running. Process runtime only: under
        Docker the process is the container's docker client, which a SIGSTOP does not get past."""
        kind = getattr(self.testbed.config.runtime, "name", "process")
        if kind != "process":
            raise RuntimeError(f"runtime {kind} cannot signal a role's process (only runtime process)")
        name = worker_names(self.pools)[target][0] if target in START_ORDER else target
        proc = self.procs.get(name)
        if proc is None or proc.poll() is not None:
            return None
        os.kill(proc.pid, signum)
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


def worker_env() -> dict[str, str]:
    """Role environment: the repo importable, one BLAS thread (workers share two cores)."""
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
