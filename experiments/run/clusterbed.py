"""An existing Ray cluster where the emulated topology would stand: the runner's testbed for `--cluster`.

Responsible for: `ClusterBed`, what the runner asks of a `topology.net.Testbed`, on real machines: connect to
the cluster (one clear error when its address does not answer), check every pool against the cluster's alive
nodes before anything starts (`ray_rt.placement`: a label no node has, GPUs where there are none, a pool that
does not fit), the WAN as the spec names it (`cluster.shape`: the profile's netem on named interfaces of named
nodes; `cluster.capture`: tcpdump there, fetched into pcap/ — ray_rt.nodes), the load generator and health
checks as local processes (this machine is the client), the run's work directory on every node (a name drawn
at random, made there with mode 0700: ray_rt.nodes.make_work_dir), and at the end everything undone: captures
fetched, qdiscs removed, work directories removed, Ray disconnected — also on SIGTERM and SIGHUP (a kill, a
dropped ssh session), which raise KeyboardInterrupt here as in a local run (topology.net). Every qdisc and work
directory is written in the run's ledger (ray_rt.ledger) before it is made and dropped once undone, so that
`pddlab clean --cluster ADDRESS` can undo what a SIGKILLed run left. The run directory has the emulated runs'
layout.
Not responsible for: the roles (ray_rt.session.ClusterDeployment, chosen by experiments.run.deploy.make_runtime),
the cluster itself (someone started it: README "Ray runtime"), schedules, cross traffic and faults (refused at
spec load: they need the emulated topology's hosts).
"""

from __future__ import annotations

import logging
import secrets
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from experiments.spec.scaling import lan_profile
from topology.tc import netem_args

log = logging.getLogger(__name__)
DIRECTION_OF_SITE = {"a": "a_to_b", "b": "b_to_a"}  # a site's egress onto the WAN carries its direction


class ClusterRuntime:
    """The testbed's `runtime` on a cluster: a name and a record (the roles are ClusterDeployment's)."""

    name = "ray-cluster"

    def __init__(self, address: str):
        self.address = address
        self.record: dict = {"address": address}

    def metadata(self) -> dict:
        return self.record


@dataclass
class _Config:
    wan_profile: object  # the profile the WAN runs (shaped by cluster.shape) or is assumed to be (the router's rate)


@dataclass
class _Link:
    """No emulated link: no changes, no emulator health."""

    changes: list = field(default_factory=list)

    class backend:  # noqa: N801 - stands where topology.shaping's backend object stands
        name = "none"
        exit_code = None

        @staticmethod
        def health():
            return None


class ClusterBed:
    """An existing Ray cluster as the runner's testbed; a context manager.

    spec: the experiment (cluster.address set, runtime ray); profile: its WAN profile (parsed); out: the run
    directory (captures come back into out/pcap)
    """

    def __init__(self, spec, profile, out: Path):
        self.spec, self.out = spec, out
        self.config = _Config(profile)
        self.runtime = ClusterRuntime(spec.cluster.address)
        self.link = _Link()
        self.links = {"wan": self.link}  # as topology.net.Testbed's: every line by name (one, unshaped)
        # on every node (the same path: the roles' config names it); unpredictable, made 0700, removed at the end
        self.work_dir = f"/tmp/pddlab-cluster-{secrets.token_hex(8)}"
        self.tools = None
        self.ledger = None
        self._made: list[dict] = []  # work directories made (their ledger entries)
        self._old_handlers: dict = {}
        self._procs: list[subprocess.Popen] = []
        self.nodes: list = []

    # ---- lifecycle
    def __enter__(self) -> ClusterBed:
        import ray

        from ray_rt.cluster import connect
        from ray_rt.placement import CLUSTER_LABEL

        from ray_rt.ledger import Ledger

        t0 = time.monotonic()
        self._stop_signals_raise()
        try:
            connect(self.spec.cluster.address)
            self._stop_signals_raise()  # again: ray.init may have set its own
            self.ledger = Ledger.create(self.spec.cluster.address)
            self._check_placement()
            self._make_work_dirs()
            self._start_tools()
        except BaseException:
            self._teardown()
            raise
        self.runtime.record.update(
            nodes=[{"id": n.node_id, "address": n.address, "labels": dict(n.labels)} for n in self.nodes],
            site_a=sorted({n.address for n in self.nodes if n.labels.get(CLUSTER_LABEL) == "a"}),  # captures' sides
            connect_s=round(time.monotonic() - t0, 2),
            ray=ray.__version__,
            shaped=self.tools.applied if self.tools else [],
        )
        return self

    def _check_placement(self) -> None:
        import ray

        from ray_rt.placement import alive_nodes, check_placement, deployment_needs

        self.nodes = alive_nodes(ray.nodes())
        check_placement(deployment_needs(self.spec.pools), self.nodes)

    def _stop_signals_raise(self) -> None:
        """SIGTERM and SIGHUP raise KeyboardInterrupt (the run tears down and exits 130), as in a local run."""
        from topology.proc import STOP_SIGNALS

        if threading.current_thread() is not threading.main_thread():
            return
        for sig in STOP_SIGNALS:
            old = signal.signal(sig, _raise_interrupt)
            self._old_handlers.setdefault(sig, old)

    def _make_work_dirs(self) -> None:
        """The run's work directory on every alive node, recorded in the ledger first."""
        from ray_rt.nodes import make_work_dir, on_node

        for node in self.nodes:
            entry = self.ledger.add("work_dirs", {"node_id": node.node_id, "node": node.address, "path": self.work_dir})
            try:
                on_node(node.node_id, make_work_dir, self.work_dir, self.ledger.token)
            except BaseException:
                self.ledger.drop("work_dirs", entry)  # not made (refused or failed there)
                raise
            self._made.append(entry)

    def _remove_work_dirs(self) -> list[str]:
        from ray_rt.nodes import NodeToolError, on_node, remove_work_dir

        problems = []
        for entry in list(self._made):
            try:
                on_node(entry["node_id"], remove_work_dir, entry["path"], self.ledger.token)
                self.ledger.drop("work_dirs", entry)
                self._made.remove(entry)
            except NodeToolError as err:
                problems.append(f"removing {entry['path']} on node {entry['node']}: {err}")
        return problems

    def _start_tools(self) -> None:
        from ray_rt.nodes import NodeCapture, NodeShape, NodeTools

        c = self.spec.cluster
        profile = self.config.wan_profile
        shapes = [
            NodeShape(
                _selector(e),
                e.interface,
                tuple(netem_args(profile.direction(DIRECTION_OF_SITE[e.site]))),
                e.node_ip,
                f"{DIRECTION_OF_SITE[e.site]} ({profile.name})",
            )
            for e in c.shape
        ]
        captures = [
            NodeCapture(_selector(e), e.interface, e.site, self.spec.snaplen_bytes, e.node_ip, c.capture_filter)
            for e in c.capture
        ]
        if shapes or captures:
            self.tools = NodeTools(shapes, captures, self.work_dir, self.ledger)
            self.tools.start()

    def __exit__(self, *exc) -> bool:
        from topology.proc import terminate

        for proc in reversed(self._procs):
            terminate(proc)
        self.runtime.record["teardown_problems"] = self._teardown(self.out / "pcap")
        return False

    def _teardown(self, pcap_dir: Path | None = None) -> list[str]:
        """Captures fetched into pcap_dir, qdiscs and work directories removed, Ray disconnected, the signals'
        handlers restored; the ledger removed when nothing of it is left. The problems met (logged)."""
        import ray

        problems = []
        try:
            if self.tools is not None:
                problems += self.tools.stop(pcap_dir)
            if self.ledger is not None:
                problems += self._remove_work_dirs()
        finally:
            ray.shutdown()
            for sig, handler in self._old_handlers.items():
                if signal.getsignal(sig) is _raise_interrupt:  # else the runner holds it for the teardown
                    signal.signal(sig, handler)
            self._old_handlers = {}
        for p in problems:
            log.error("%s (`pddlab clean --cluster %s` retries it)", p, self.spec.cluster.address)
        if self.ledger is not None and self.ledger.empty():
            self.ledger.forget()
        return problems

    # ---- what the runner calls on a testbed
    def popen(self, host: str, argv: list[str], **kwargs) -> subprocess.Popen:
        """Start a process here (the load generator, health checks: this machine is the client)."""
        log.info("[local, for %s] start: %s", host, " ".join(argv))
        proc = subprocess.Popen(argv, **kwargs)
        self._procs.append(proc)
        return proc

    def kill(self, host: str, proc: subprocess.Popen, grace_s: float = 5.0) -> int:
        proc.kill()
        return proc.wait(grace_s)

    def kill_emulator(self) -> None:
        return None  # no emulator: the WAN is real

    def check(self) -> None:
        """Nothing plays on the link (schedules are refused on a cluster)."""

    def restore_profile(self, cause: str = "") -> list:
        return []

    def metadata(self) -> dict:
        """The run's topology record: the cluster instead of emulated hosts
        (experiments.rundir.metadata.TopologyRecord)."""
        profile = self.config.wan_profile
        shaped = bool(self.spec.cluster.shape)
        return {
            "backend": "tc" if shaped else None,
            "backend_requested": "cluster",
            "backend_reason": (
                "an existing Ray cluster: netem on the interfaces cluster.shape names"
                if shaped
                else "an existing Ray cluster: its own WAN, not shaped"
            ),
            "lan_shaping": None,
            "wan_profile": profile.to_dict(),
            "lan_profile": lan_profile(self.spec).to_dict(),
            "hosts": [],
            "seed": self.spec.topology_seed,
            "snaplen_bytes": self.spec.snaplen_bytes,
            "runtime": self.runtime.name,
            "runtime_metadata": self.runtime.metadata(),
            "link_changes": [],
        }


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def _selector(entry) -> dict[str, str]:
    from ray_rt.placement import CLUSTER_LABEL

    return {CLUSTER_LABEL: entry.site, **dict(entry.labels)}
