"""The PDD roles as Ray actors: placed by Ray, each running its role's process on its node, supervised, collected.

Responsible for: `RayRoles`, the roles of one deployment under Ray. Placement first and all at once: the pure
check of every pool against the cluster's nodes (`ray_rt.placement.check_placement`), then one placement group
holding a bundle per worker (its resources and label selector) that must be ready before any actor exists — so
a pool that cannot be placed is one error and nothing runs. Then one `RoleHost` actor per worker in its bundle;
each reports its node's address and two free ports, which become the worker's addresses in the deployment
config; each then runs `python -m workers.roles.<module> --config ... --worker NAME` on its node (MDs first, the
router last), its output in a log there. `check()` reports crashes (role, worker, node, exit code, last log
lines) as the Docker runtime does; `stop()` ends every role process (SIGTERM, then SIGKILL), brings each
worker's log and event file into the run directory, kills the actors and removes the placement group.
Not responsible for: starting or connecting to Ray (`ray_rt.local`, the caller's `ray.init`), readiness (the
caller's gRPC health checks) or load.

Why a process per role and not the role inside the actor: the role is the same program under every runtime
(its signal handling, its exit code, its memory on its own), so a crash report reads the same, a role never
shares an interpreter with Ray's worker, and the actor stays a small supervisor a node's raylet can kill. The
role process dies with its actor (PR_SET_PDEATHSIG).

Files: on each node everything lives under `work_dir` (the same path on every node): deployment.yaml per
worker, `logs/<worker>.log`, `events/<worker>.jsonl`; `stop()` copies a worker's log and events into log_dir and
events_dir of the driver's run directory, so a run directory has one layout whatever ran it.
"""

from __future__ import annotations

import copy
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from ray_rt import RayRuntimeError
from ray_rt.placement import HOST_LABEL, PlacementError, PoolNeeds, alive_nodes, check_placement
from workers.roles import ROLE_MODULES, START_ORDER

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parent.parent
LOG_TAIL_LINES = 20
STOP_GRACE_S = 10.0
PLACEMENT_TIMEOUT_S = 60.0
CALL_TIMEOUT_S = 60.0
PR_SET_PDEATHSIG = 1  # prctl(2)


class WorkerCrashed(RayRuntimeError):
    """A role process of the run exited on its own with a failure, or its actor died."""


def _die_with_parent() -> None:
    """In the role's process before exec: SIGKILL it when the actor that started it dies."""
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def tail(path: Path, lines: int) -> str:
    """The last lines of a text file ("" if it does not exist)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def distinct_ports(endpoints: dict[str, dict], again, tries: int = 20) -> dict[str, dict]:
    """endpoints with every (ip, port) distinct. Each actor finds its free ports alone and releases them, so two
    actors on one node can be handed the same just-released port (seen in the Ray tier: two workers on one
    grpc_port, every role refused the config): a worker whose ports collide with an earlier one's is asked
    again (`again(worker)` -> a fresh endpoint) up to `tries` times."""
    taken: set[tuple[str, int]] = set()
    out = {}
    for worker, ep in endpoints.items():
        for _ in range(tries):
            mine = {(ep["ip"], ep["grpc_port"]), (ep["ip"], ep["kv_port"])}
            if not mine & taken:
                break
            ep = again(worker)
        else:
            raise RayRuntimeError(f"{worker}: no ports distinct from the other workers' after {tries} tries")
        taken |= mine
        out[worker] = ep
    return out


class RoleHost:
    """One worker's place on a Ray node (made a Ray actor by RayRoles): runs its role process there.

    worker: the worker's name (p1, md2, ...); work_dir: this run's directory on every node
    """

    def __init__(self, worker: str, work_dir: str):
        self.worker, self.dir = worker, Path(work_dir)
        for sub in ("logs", "events", "config"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen | None = None

    @property
    def log_path(self) -> Path:
        return self.dir / "logs" / f"{self.worker}.log"

    def endpoint(self) -> dict:
        """Where this worker can listen: its node's address (the one Ray uses) and two free ports there."""
        import ray

        ip = ray.util.get_node_ip_address()
        ports = []
        socks = [socket.socket() for _ in range(2)]
        try:
            for s in socks:
                s.bind((ip, 0))
                ports.append(s.getsockname()[1])
        finally:
            for s in socks:
                s.close()
        node = ray.get_runtime_context().get_node_id()
        return {"ip": ip, "grpc_port": ports[0], "kv_port": ports[1], "node_id": node, "actor_pid": os.getpid()}

    def start(self, module: str, config_yaml: str, env: dict[str, str], cpuset: str = "") -> int:
        """Write the config here and start the role's process (on cpuset's cores, "" = any); its PID."""
        config = self.dir / "config" / f"{self.worker}.yaml"
        config.write_text(config_yaml)
        argv = [sys.executable, "-m", module, "--config", str(config), "--worker", self.worker]
        if cpuset:
            argv = ["taskset", "-c", cpuset, *argv]
        log.info("run: %s", " ".join(argv))  # in the actor's log on its node
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                argv,
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", **env},
                preexec_fn=_die_with_parent,
            )
        return self.proc.pid

    def poll(self) -> int | None:
        """The role process's exit status, None while it runs (or before it started)."""
        return None if self.proc is None else self.proc.poll()

    def kill(self) -> int | None:
        """SIGKILL the role process (a fault an experiment plays); its PID, None if it was not running."""
        if self.proc is None or self.proc.poll() is not None:
            return None
        self.proc.kill()
        self.proc.wait()
        return self.proc.pid

    def tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return tail(self.log_path, lines)

    def rss_kb(self) -> dict[str, int]:
        """Resident memory (KiB) of the role process and of this actor's own process."""
        out = {"actor": process_rss_kb(os.getpid())}
        if self.proc is not None and self.proc.poll() is None:
            out["role"] = process_rss_kb(self.proc.pid)
        return out

    def stop(self, grace_s: float = STOP_GRACE_S) -> int | None:
        """SIGTERM the role process (a graceful gRPC stop), SIGKILL after grace_s; its exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(grace_s)
        return self.proc.returncode

    def remove_files(self) -> None:
        """This worker's files on its node, once collected, and the run's directories there once empty."""
        for rel in (f"logs/{self.worker}.log", f"events/{self.worker}.jsonl", f"config/{self.worker}.yaml"):
            (self.dir / rel).unlink(missing_ok=True)
        for d in (self.dir / "logs", self.dir / "events", self.dir / "config", self.dir):
            try:
                d.rmdir()
            except OSError:
                pass  # another worker's files are still there, or it is gone already

    def files(self) -> dict[str, bytes]:
        """This worker's log and event file, by their paths under work_dir."""
        out = {}
        for rel in (f"logs/{self.worker}.log", f"events/{self.worker}.jsonl"):
            path = self.dir / rel
            if path.exists():
                out[rel] = path.read_bytes()
        return out


def process_rss_kb(pid: int) -> int:
    """Resident memory of a process (KiB); 0 when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


@dataclass
class Placed:
    """One worker's actor and where it landed."""

    worker: str
    role: str
    actor: object
    endpoint: dict
    pid: int = 0
    exit_code: int | None = None


class RayRoles:
    """The roles of one deployment under Ray (the driver is connected: ray.init done); a context manager.

    config: the roles' deployment config as data (workers/roles/config.py); each worker's host and ports are
      replaced by where Ray placed it, events_dir by work_dir's
    needs: what each pool's workers ask (ray_rt.placement.deployment_needs), one entry per role
    log_dir, events_dir: where stop() puts each worker's log and events on the driver
    work_dir: the run's directory on every node (created there)
    env: extra environment of the role processes
    topology_hosts: Ray in the emulated topology (ray_rt.netns): each worker runs on the node in the topology
      host of its name (label pddlab/host), at the config's address and ports, and, on the driver's own
      filesystem, writes its events to the config's events_dir and its log to work_dir/logs (= log_dir)
    cpusets: role -> the cores its workers' processes run on (taskset; "" or absent = any)
    """

    def __init__(
        self,
        config: dict,
        needs: list[PoolNeeds],
        log_dir: Path,
        events_dir: Path,
        work_dir: str,
        env: dict[str, str] | None = None,
        topology_hosts: bool = False,
        cpusets: dict[str, str] | None = None,
    ):
        self.topology_hosts, self.cpusets = topology_hosts, cpusets or {}
        self.config = copy.deepcopy(config)
        self.needs = {n.role: n for n in needs}
        self.log_dir, self.events_dir, self.work_dir = log_dir, events_dir, work_dir
        self.env = {"OMP_NUM_THREADS": "1", **(env or {})}
        self.placed: dict[str, Placed] = {}
        self.plan: dict[str, list[str]] = {}
        self._pg = None
        self._checked: set[str] = set()

    # ---- placement
    def workers(self) -> list[tuple[str, str]]:
        """(role, worker) of every worker, in start order (the MDs first, the router last)."""
        out = []
        for role in START_ORDER:
            section = self.config[role]
            for w in [section] if isinstance(section, dict) else section:
                out.append((role, w["name"]))
        return out

    def place(self, timeout_s: float = PLACEMENT_TIMEOUT_S) -> dict[str, list[str]]:
        """Check every pool against the cluster's nodes, reserve a bundle per worker, start the actors; returns
        role -> the node id of each worker. PlacementError (nothing left running) when a pool cannot be placed."""
        import ray

        workers = self.workers()
        counts = {role: sum(1 for r, _ in workers if r == role) for role in dict.fromkeys(r for r, _ in workers)}
        self.needs = {r: PoolNeeds(**{**self.needs[r].__dict__, "workers": n}) for r, n in counts.items()}
        check_placement(list(self.needs.values()), alive_nodes(ray.nodes()))
        self._reserve(workers, timeout_s)
        try:
            self._start_actors(workers)
        except BaseException:
            self.stop()
            raise
        self.plan = {}
        for p in self.placed.values():
            self.plan.setdefault(p.role, []).append(p.endpoint["node_id"])
        return self.plan

    def _reserve(self, workers: list[tuple[str, str]], timeout_s: float) -> None:
        from ray.util.placement_group import placement_group, remove_placement_group

        bundles = [self.needs[role].resources() for role, _ in workers]
        selectors = [self.selector(role, worker) for role, worker in workers]
        log.info("reserving %d bundles (one per worker) in one placement group", len(bundles))
        self._pg = placement_group(bundles, strategy="PACK", bundle_label_selector=selectors)
        if not self._pg.wait(timeout_s):
            remove_placement_group(self._pg)
            self._pg = None
            wanted = ", ".join(f"{w} ({self.needs[r].describe()} on {self.needs[r].selector()})" for r, w in workers)
            raise PlacementError(
                f"Ray did not place every worker within {timeout_s:.0f} s (other jobs may hold what the nodes "
                f"have); nothing was started. Wanted: {wanted}"
            )

    def selector(self, role: str, worker: str) -> dict[str, str]:
        """The label selector of one worker's bundle: its pool's, pinned to its own host in the topology."""
        return {**self.needs[role].selector(), **({HOST_LABEL: worker} if self.topology_hosts else {})}

    def _start_actors(self, workers: list[tuple[str, str]]) -> None:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        actor_class = ray.remote(RoleHost)
        refs = {}
        for index, (role, worker) in enumerate(workers):
            opts = self.needs[role].actor_options()
            opts.pop("label_selector")  # the bundle carries it
            actor = actor_class.options(
                **opts,
                name=f"pddlab-{worker}-{os.getpid()}",
                max_restarts=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(self._pg, placement_group_bundle_index=index),
            ).remote(worker, self.work_dir)
            self.placed[worker] = Placed(worker, role, actor, {})
            refs[worker] = actor.endpoint.remote()
        got = {worker: ray.get(ref, timeout=CALL_TIMEOUT_S) for worker, ref in refs.items()}
        again = lambda worker: ray.get(self.placed[worker].actor.endpoint.remote(), timeout=CALL_TIMEOUT_S)  # noqa: E731
        for worker, endpoint in distinct_ports(got, again).items():
            self.placed[worker].endpoint = endpoint

    # ---- the roles
    def final_config(self) -> dict:
        """The deployment config with every worker at its node's address and ports, events under work_dir."""
        cfg = copy.deepcopy(self.config)
        if self.topology_hosts:
            return cfg  # each worker in its own host: the topology's addresses, one filesystem
        cfg["events_dir"] = str(Path(self.work_dir) / "events")
        for role in ("router", "p", "rld", "md"):
            section = cfg[role]
            for w in [section] if isinstance(section, dict) else section:
                ep = self.placed[w["name"]].endpoint
                w["host"], w["grpc_port"] = ep["ip"], ep["grpc_port"]
                if "kv_port" in w or role in ("rld", "md"):
                    w["kv_port"] = ep["kv_port"]
                w.pop("kv_connect", None)
        return cfg

    def start(self) -> dict:
        """Start every role's process on its node (MDs first, the router last); returns the final config."""
        import ray

        cfg = self.final_config()
        text = yaml.safe_dump(cfg, sort_keys=False)
        for worker, p in self.placed.items():
            cpuset = self.cpusets.get(p.role, "")
            p.pid = ray.get(p.actor.start.remote(ROLE_MODULES[p.role], text, self.env, cpuset), timeout=CALL_TIMEOUT_S)
            log.info("%s (%s) started on %s as PID %d", worker, p.role, p.endpoint["ip"], p.pid)
        return cfg

    def crashes(self) -> list[str]:
        """A message per worker whose process exited on its own or whose actor died, with its last log lines."""
        import ray

        out = []
        for worker, p in self.placed.items():
            node = f"{p.endpoint.get('ip', '?')}/{p.endpoint.get('node_id', '?')[:8]}"
            try:
                code = ray.get(p.actor.poll.remote(), timeout=CALL_TIMEOUT_S)
            except ray.exceptions.RayActorError as err:
                out.append(f"role {p.role} worker {worker} on node {node}: its Ray actor died ({_first_line(err)})")
                continue
            if code is None or code == 0:
                continue
            p.exit_code = code
            lines = ray.get(p.actor.tail.remote(), timeout=CALL_TIMEOUT_S) or "(no output)"
            what = f"role {p.role} worker {worker} on node {node}"
            out.append(f"{what}: exited with code {code}; last log lines:\n{lines}")
        return out

    def check(self) -> None:
        """Raise WorkerCrashed naming each crashed worker, its role, node, exit code and last log lines."""
        messages = self.crashes()
        if messages:
            raise WorkerCrashed("\n".join(messages))

    def exit_codes(self) -> dict[str, int | None]:
        """worker -> its role process's exit status (None while it runs; -1 when its actor is gone)."""
        import ray

        refs = {w: p.actor.poll.remote() for w, p in self.placed.items()}
        out = {}
        for worker, ref in refs.items():
            try:
                out[worker] = ray.get(ref, timeout=CALL_TIMEOUT_S)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                out[worker] = -1
        return out

    def kill(self, worker: str) -> int | None:
        """SIGKILL one worker's role process (its actor stays, so the exit is reported); its PID or None."""
        import ray

        return ray.get(self.placed[worker].actor.kill.remote(), timeout=CALL_TIMEOUT_S)

    def memory_kb(self) -> dict[str, dict[str, int]]:
        """worker -> resident memory (KiB) of its role process and of its actor."""
        import ray

        return {w: ray.get(p.actor.rss_kb.remote(), timeout=CALL_TIMEOUT_S) for w, p in self.placed.items()}

    # ---- teardown
    def stop(self) -> dict[str, int | None]:
        """End every role process, collect logs and events, kill the actors, free the placement group;
        worker -> exit status of its role process (None: it never started or its actor was gone)."""
        import ray
        from ray.util.placement_group import remove_placement_group

        for message in self.crashes() if self.placed else []:
            log.error("%s", message)
        stops = {w: p.actor.stop.remote() for w, p in reversed(self.placed.items())}  # the router first
        codes = {}
        for worker, ref in stops.items():
            codes[worker] = _get_or_none(ref, STOP_GRACE_S * 2 + 5)
        self._collect()
        if not self.topology_hosts:  # the nodes' copies, once collected
            for p in self.placed.values():
                _get_or_none(p.actor.remove_files.remote(), CALL_TIMEOUT_S)
        for p in self.placed.values():
            ray.kill(p.actor, no_restart=True)
        self.placed = {}
        if self._pg is not None:
            remove_placement_group(self._pg)
            self._pg = None
        return codes

    def _collect(self) -> None:
        if self.topology_hosts:
            return  # written in place (one filesystem)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.events_dir.mkdir(parents=True, exist_ok=True)
        for worker, p in self.placed.items():
            files = _get_or_none(p.actor.files.remote(), CALL_TIMEOUT_S) or {}
            for rel, data in files.items():
                kind, name = rel.split("/", 1)
                (self.log_dir if kind == "logs" else self.events_dir).joinpath(name).write_bytes(data)

    def __enter__(self) -> RayRoles:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _get_or_none(ref, timeout_s: float):
    """ray.get, None when the actor is gone or does not answer in time (teardown goes on)."""
    import ray

    try:
        return ray.get(ref, timeout=timeout_s)
    except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as err:
        log.warning("a role's actor did not answer: %s", _first_line(err))
        return None


def _first_line(err: Exception) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]
