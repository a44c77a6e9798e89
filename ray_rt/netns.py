"""Ray inside the emulated topology: one Ray node per end host, in that host's network namespace.

Responsible for: `RayHostRuntime`, the `topology.runtime.HostRuntime` of `runtime: ray`. Once the hosts exist
and reach each other (`up`), it starts `ray start --block` in each worker host through `Testbed.popen` — the
head in `router` (cluster A), a node in every p, rld and md host, each labelled with its site
(pddlab/cluster=a|b) and its host (pddlab/host=<name>) — so Ray's own traffic between an md host and the head
crosses the shaped WAN exactly as the roles' traffic does. `down` ends them by PID (SIGTERM to each node's
`ray start`, whose processes die with it: Ray starts them with PR_SET_PDEATHSIG; then SIGKILL by PID to any of
them still alive, from a list of its descendants taken first) and removes Ray's files. `check` names a node
that died. The builders of each node's command line are pure.
Not responsible for: what runs on the nodes (`ray_rt.session` starts the driver that places the roles,
`ray_rt.roles`), or the hosts themselves (topology.net).

Addresses and ports: a node listens on its host's address; inside a namespace "all interfaces" is that one
host's interface and loopback, so nothing of Ray is reachable from outside the topology. Every port a node
opens is fixed (NODE_PORTS, below the roles' 50050-50063 and the ephemeral range a role could otherwise
collide with); each host has its own port space, so every node uses the same numbers. Ray's usage statistics
are off, there is no dashboard, token authentication is on (one token per run, passed by environment), and
every node keeps its files in a temp dir of the run's (RAY_TMPDIR and --temp-dir; short: Ray's socket paths).

The WAN is an impaired link: GCS health checks of a node are relaxed (HEALTH_CHECK_*) so a lossy or briefly
blackholed WAN does not get the MD's node declared dead, which would kill its worker.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ray_rt import RayRuntimeError
from ray_rt.placement import CLUSTER_LABEL, HOST_LABEL

log = logging.getLogger(__name__)
HEAD_HOST = "router"  # cluster A; the driver runs here too (a Ray driver must run on a node of its cluster)
GCS_PORT = 6379
NODE_PORTS = {
    "--node-manager-port": 6380,
    "--object-manager-port": 6381,
    "--runtime-env-agent-port": 6382,
    "--dashboard-agent-grpc-port": 6383,
    "--dashboard-agent-listen-port": 6384,
    "--metrics-export-port": 6385,
    "--min-worker-port": 10002,
    "--max-worker-port": 10999,
}
OBJECT_STORE_MB = 80  # the roles move KV on their own data plane, not through Ray's object store (min 75 MiB)
HEALTH_CHECK_PERIOD_MS = 3000
HEALTH_CHECK_FAILURE_THRESHOLD = 40  # 2 min of missed checks: longer than any outage the shipped specs play
START_TIMEOUT_S = 90.0
STOP_WAIT_S = 20.0
LOG_TAIL_LINES = 15


@dataclass(frozen=True)
class HostNode:
    """One Ray node: host (topology host name), ip (its address), site (a | b), what it offers Ray:
    num_cpus (logical CPUs), num_gpus, memory_mb (0 = Ray's own estimate)."""

    host: str
    ip: str
    site: str
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    memory_mb: int = 0


def ray_env(temp_root: Path, token: str) -> dict[str, str]:
    """The environment of every node, the driver and the role processes under it."""
    return {
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_TMPDIR": str(temp_root),
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": token,
        "PYTHONUNBUFFERED": "1",
    }


def ray_executable() -> str:
    """The `ray` command of this interpreter's environment."""
    return str(Path(sys.executable).with_name("ray"))


def node_labels(node: HostNode) -> dict[str, str]:
    """The labels a node starts with: its site and its host."""
    return {CLUSTER_LABEL: node.site, HOST_LABEL: node.host}


def node_resources(node: HostNode) -> dict[str, float]:
    """What a node offers Ray, as `ray.nodes()` reports it (memory in bytes; 0 = left out, Ray estimates it)."""
    out = {"CPU": float(max(1, math.ceil(node.num_cpus))), "GPU": node.num_gpus}
    if node.memory_mb:
        out["memory"] = float(node.memory_mb << 20)
    return out


def node_argv(node: HostNode, head_ip: str | None, temp_dir: Path) -> list[str]:
    """`ray start --block` for one node: the head when head_ip is None, else a node joining it."""
    argv = [ray_executable(), "start", "--block", "--disable-usage-stats", f"--node-ip-address={node.ip}"]
    if head_ip is None:
        config = {
            "health_check_period_ms": HEALTH_CHECK_PERIOD_MS,
            "health_check_failure_threshold": HEALTH_CHECK_FAILURE_THRESHOLD,
        }
        argv += ["--head", f"--port={GCS_PORT}", "--include-dashboard=false", f"--system-config={_json(config)}"]
    else:
        argv += [f"--address={head_ip}:{GCS_PORT}"]
    argv += [f"{flag}={port}" for flag, port in NODE_PORTS.items()]
    offers = node_resources(node)
    argv += [
        f"--num-cpus={offers['CPU']:.0f}",  # Ray takes whole CPUs per node
        f"--num-gpus={node.num_gpus:g}",
        f"--object-store-memory={OBJECT_STORE_MB << 20}",
        "--labels=" + ",".join(f"{k}={v}" for k, v in node_labels(node).items()),
        f"--temp-dir={temp_dir}",
    ]
    if "memory" in offers:
        argv.append(f"--memory={offers['memory']:.0f}")
    return argv


def _json(data: dict) -> str:
    import json

    return json.dumps(data, separators=(",", ":"))


class RayHostRuntime:
    """Ray nodes in the topology's hosts (a topology.runtime.HostRuntime: the caller passes it in).

    nodes: one HostNode per worker host, the head (host `router`) among them
    log_dir: where each node's `ray start` output goes (ray-<host>.log)
    """

    name = "ray"

    def __init__(self, nodes: Sequence[HostNode], log_dir: Path):
        heads = [n for n in nodes if n.host == HEAD_HOST]
        if len(heads) != 1:
            raise RayRuntimeError(f"Ray in the topology needs exactly one node in host {HEAD_HOST!r} (the head)")
        self.head = heads[0]
        self.nodes = [self.head, *(n for n in nodes if n.host != HEAD_HOST)]
        self.log_dir = log_dir
        self.token = secrets.token_hex(16)
        self.temp_root: Path | None = None
        self.procs: dict[str, object] = {}  # host -> the Popen of its `ray start --block`
        self.up_s = 0.0
        self._version = ""
        self._temp_name = ""  # the temp root's path, kept for metadata after it is removed

    # ---- HostRuntime
    def start(self) -> None:
        """Before the hosts exist: Ray must be importable here (the ray extra)."""
        try:
            import ray
        except ImportError:
            raise RayRuntimeError(
                "runtime ray needs the ray package: run `make setup` (it installs the ray extra, "
                "pip install -e '.[ray]')"
            ) from None
        self._version = ray.__version__

    def host_params(self, host: str, role: str) -> dict:
        return {}

    def exec_argv(self, host: str, argv: list[str]) -> list[str] | None:
        return None

    def confine(self, argv: list[str], cpuset: str) -> list[str]:
        """Unchanged: the roles start under their actors, which pin them (ray_rt.roles.RoleHost.start)."""
        return argv

    def reap(self, host: str) -> None:
        pass

    @property
    def address(self) -> str:
        """The head's GCS address, as the driver in the head's host dials it."""
        return f"{self.head.ip}:{GCS_PORT}"

    def env(self) -> dict[str, str]:
        """The environment a driver or role process under these nodes needs."""
        if self.temp_root is None:
            raise RayRuntimeError("the Ray nodes are not up")
        return ray_env(self.temp_root, self.token)

    def up(self, testbed) -> None:
        """Start the head in its host, wait until its GCS listens, then every other node (each in its host)."""
        from topology.proc import wait_listening

        t0 = time.monotonic()
        self.temp_root = Path(tempfile.mkdtemp(prefix="pddray-", dir="/tmp"))  # short: Ray's socket paths
        self._temp_name = str(self.temp_root)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log.info("starting %d Ray nodes in the topology's hosts (head in %s)", len(self.nodes), HEAD_HOST)
        self._start_node(testbed, self.head, None)
        alive = lambda: self.procs[HEAD_HOST].poll() is None  # noqa: E731
        try:
            wait_listening(lambda argv: testbed.run(HEAD_HOST, argv), GCS_PORT, "Ray head", START_TIMEOUT_S, alive)
            for node in self.nodes[1:]:
                self._start_node(testbed, node, self.head.ip)
            for node in self.nodes[1:]:
                run = lambda argv, h=node.host: testbed.run(h, argv)  # noqa: E731
                port = NODE_PORTS["--node-manager-port"]
                wait_listening(run, port, f"Ray node in {node.host}", START_TIMEOUT_S, self._alive(node.host))
        except RuntimeError as err:
            raise RayRuntimeError(f"Ray nodes did not come up: {err}\n{self._tails()}") from None
        self.up_s = time.monotonic() - t0
        log.info("Ray nodes up in %.1f s", self.up_s)

    def _alive(self, host: str):
        return lambda: self.procs[host].poll() is None

    def _start_node(self, testbed, node: HostNode, head_ip: str | None) -> None:
        temp_dir = self.temp_root / node.host
        temp_dir.mkdir()
        env = {**os.environ, **self.env()}
        with open(self.log_dir / f"ray-{node.host}.log", "ab") as out:
            self.procs[node.host] = testbed.popen(
                node.host, node_argv(node, head_ip, temp_dir), stdout=out, stderr=out, env=env
            )

    def check(self) -> None:
        """RayRuntimeError naming each node whose `ray start` exited (its workers went with it)."""
        gone = {h: p.returncode for h, p in self.procs.items() if p.poll() is not None}
        if gone:
            raise RayRuntimeError(
                "Ray node(s) died: "
                + ", ".join(f"{h} (exit {c})" for h, c in gone.items())
                + "\n"
                + self._tails(list(gone))
            )

    def down(self) -> set[int]:
        """End every node by PID (the head last); returns the PIDs still alive after it (none, or logged)."""
        if not self.procs:
            return set()
        from ray_rt.local import descendants

        before = {pid for p in self.procs.values() for pid in descendants(p.pid)}  # GCS, raylet, agents, workers
        for host in [n.host for n in reversed(self.nodes) if n.host in self.procs]:
            proc = self.procs[host]
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)  # its processes die with it (PR_SET_PDEATHSIG)
        for proc in self.procs.values():
            try:
                proc.wait(STOP_WAIT_S)
            except Exception:  # noqa: BLE001 - a node that ignores SIGTERM is killed below
                proc.kill()
                proc.wait(5)
        left = self._wait_gone(before)
        for pid in left:
            log.warning("Ray process %d outlived its node: SIGKILL", pid)
            _kill(pid)
        left = self._wait_gone(left, 5.0)
        if left:
            log.error("Ray processes still alive after the nodes stopped: %s", sorted(left))
        self.procs.clear()
        if self.temp_root is not None:
            shutil.rmtree(self.temp_root, ignore_errors=True)
            self.temp_root = None
        return left

    def stop(self) -> None:
        self.down()

    def metadata(self) -> dict | None:
        return {
            "ray": self._version,
            "head": self.address,
            "up_s": round(self.up_s, 2),
            "temp_root": self._temp_name,
            "nodes": [{**n.__dict__} for n in self.nodes],
        }

    # ---- helpers
    def _tails(self, hosts: list[str] | None = None) -> str:
        from ray_rt.roles import tail

        paths = [self.log_dir / f"ray-{host}.log" for host in hosts or list(self.procs)]
        return "\n".join(f"--- {path} (last lines)\n{tail(path, LOG_TAIL_LINES)}" for path in paths)

    @staticmethod
    def _wait_gone(pids: set[int], wait_s: float = STOP_WAIT_S) -> set[int]:
        from ray_rt.local import wait_gone

        return wait_gone(pids, wait_s)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
