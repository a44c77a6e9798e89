"""A Ray cluster of several nodes on this machine's loopback, one per site, and the driver connected to it.

Responsible for: `LocalRayCluster`: Ray nodes bound to 127.0.0.1 only, each labelled with its site
(pddlab/cluster=a, =b) and its own CPUs, started as Ray's own test harness does (`ray.cluster_utils.Cluster`,
which runs several raylets on one machine), the driver connected; and at the end every process of it gone —
stopped by Ray through the process handles it holds, then checked by PID.
Not responsible for: what runs on the nodes (`ray_rt.roles`) or where (`ray_rt.placement`); nodes in the
topology's namespaces (not built: README "Ray runtime").

Loopback only. Ray replaces 127.0.0.1 by the machine's outward address ("so that other nodes can reach it")
unless RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, which keeps it; with 127.0.0.1 as node address its GCS, raylets and
workers listen on 127.0.0.1 alone (checked with ss on Ray 2.60; with any other address they listen on all
interfaces). The same switch makes `ray start` refuse a second node, hence cluster_utils' nodes. Nothing leaves
the machine: usage statistics off (RAY_USAGE_STATS_ENABLED=0), no dashboard, Ray's token authentication on with
a token of this process (RAY_AUTH_TOKEN, never written to ~/.ray), Ray's files under a temp dir of our own
(RAY_TMPDIR; removed at stop).
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from ray_rt import RayRuntimeError
from ray_rt.placement import CLUSTER_LABEL

log = logging.getLogger(__name__)
LOOPBACK = "127.0.0.1"
OBJECT_STORE_MB = 128  # the roles move KV on their own data plane, not through Ray's object store
STOP_WAIT_S = 20.0
_TOKEN = secrets.token_hex(16)  # one per process: Ray's C++ side caches the token it first reads


@dataclass(frozen=True)
class LocalNode:
    """site: a | b (its pddlab/cluster label); num_cpus, num_gpus: what it offers Ray; labels: any further ones"""

    site: str
    num_cpus: float = 2.0
    num_gpus: float = 0.0
    labels: Mapping[str, str] = field(default_factory=dict)

    def node_args(self) -> dict:
        """Keyword arguments of `Cluster.add_node` (ray._private.parameter.RayParams)."""
        return {
            "node_ip_address": LOOPBACK,
            "num_cpus": self.num_cpus,
            "num_gpus": self.num_gpus,
            "labels": {CLUSTER_LABEL: self.site, **self.labels},
            "object_store_memory": OBJECT_STORE_MB << 20,
            "include_dashboard": False,
        }


def ray_env(temp_dir: Path) -> dict[str, str]:
    """The environment a loopback-only Ray needs, in the driver and so in every process it starts."""
    return {
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # keep 127.0.0.1 as the node address (see the docstring)
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_TMPDIR": str(temp_dir),
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": _TOKEN,
    }


def pid_alive(pid: int) -> bool:
    """Whether a process runs (a zombie, ended but not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def wait_gone(pids: set[int], wait_s: float) -> set[int]:
    """Wait up to wait_s until none of pids runs; the ones that still do."""
    deadline = time.monotonic() + wait_s
    while True:
        left = {p for p in pids if pid_alive(p)}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def descendants(pid: int) -> set[int]:
    """Every live process below pid (from /proc: children, their children ...)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


class LocalRayCluster:
    """Ray nodes on loopback and this process connected as the driver; a context manager.

    nodes: one LocalNode per Ray node, the first the head
    """

    def __init__(self, nodes: Sequence[LocalNode]):
        if not nodes:
            raise RayRuntimeError("a local Ray cluster needs at least one node")
        self.nodes = tuple(nodes)
        self.temp_dir: Path | None = None
        self.cluster = None
        self.address = ""
        self.start_s = 0.0  # wall time of start(): nodes up and the driver connected
        self._saved_env: dict[str, str | None] = {}
        self._pids: set[int] = set()

    def start(self) -> LocalRayCluster:
        """Start the nodes and connect; RayRuntimeError with Ray's words if a node does not come up."""
        import ray

        t0 = time.monotonic()
        self.temp_dir = Path(tempfile.mkdtemp(prefix="pddlab-ray-", dir="/tmp"))  # short: Ray's socket paths
        (self.temp_dir / "ray").mkdir()  # where cluster_utils notes the address (RAY_TMPDIR/ray)
        self._set_env(ray_env(self.temp_dir))
        try:
            self._start_nodes()
            ray.init(address=self.address, log_to_driver=False, _node_ip_address=LOOPBACK)
        except Exception as err:
            self.stop()
            raise RayRuntimeError(f"local Ray cluster did not start: {err}") from err
        self.start_s = time.monotonic() - t0
        log.info("local Ray cluster of %d node(s) at %s up in %.1f s", len(self.nodes), self.address, self.start_s)
        return self

    def _start_nodes(self) -> None:
        from ray._private import ray_constants
        from ray._raylet import Config
        from ray.cluster_utils import Cluster

        ray_constants.ENABLE_RAY_CLUSTER = False  # read at ray's import: ray may have been imported before us
        Config.initialize("")  # the same for Ray's C++ side (auth mode): re-read from the environment
        log.info("starting %d Ray node(s) on %s, sites %s", len(self.nodes), LOOPBACK, [n.site for n in self.nodes])
        self.cluster = Cluster(shutdown_at_exit=True)  # kept before any node starts: stop() must reach them all
        for node in self.nodes:  # the first is the head
            self.cluster.add_node(**node.node_args())
        self.address = self.cluster.address

    def ray_pids(self) -> set[int]:
        """This process's Ray processes now: every process below it (nodes, their workers, the roles' actors)."""
        return descendants(os.getpid())

    def stop(self) -> set[int]:
        """Disconnect, stop every node, wait until every process they had is gone; returns the PIDs still
        alive (none unless Ray left one behind, which is then logged)."""
        import ray

        if self.temp_dir is None:
            return set()  # never started, or stopped already
        self._pids = self.ray_pids()
        try:
            ray.shutdown()
            if self.cluster is not None:
                self.cluster.shutdown()
        finally:
            self.cluster = None
            left = self._wait_gone(self._pids)
            self._restore_env()
            shutil.rmtree(self.temp_dir, ignore_errors=True)
            self.temp_dir = None
        if left:
            log.error("Ray processes still alive after the cluster stopped: %s", sorted(left))
        return left

    @staticmethod
    def _wait_gone(pids: set[int]) -> set[int]:
        return wait_gone(pids, STOP_WAIT_S)

    def _set_env(self, env: dict[str, str]) -> None:
        for key, value in env.items():
            self._saved_env.setdefault(key, os.environ.get(key))
            os.environ[key] = value

    def _restore_env(self) -> None:
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved_env = {}

    def __enter__(self) -> LocalRayCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
