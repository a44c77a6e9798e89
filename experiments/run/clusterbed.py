"""An existing Ray cluster where the emulated topology would stand: the runner's testbed for `--cluster`.

Responsible for: `ClusterBed`, what the runner asks of a `topology.net.Testbed`, on real machines: connect to
the cluster (one clear error when its address does not answer), check every pool against the cluster's alive
nodes before anything starts (`ray_rt.placement`: a label no node has, GPUs where there are none, a pool that
does not fit), the WAN as the spec names it (`cluster.shape`: the profile's netem on named interfaces of named
nodes; `cluster.capture`: tcpdump there, fetched into pcap/ — ray_rt.nodes), the load generator and health
checks as local processes (this machine is the client), and at the end everything undone: captures fetched,
qdiscs removed, Ray disconnected. The run directory has the emulated runs' layout.
Not responsible for: the roles (ray_rt.session.ClusterDeployment, chosen by experiments.run.deploy.make_runtime),
the cluster itself (someone started it: README "Ray runtime"), schedules, cross traffic and faults (refused at
spec load: they need the emulated topology's hosts).
"""

from __future__ import annotations

import logging
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from topology.profiles import load_profile
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
        self.work_dir = f"/tmp/pddlab-cluster-{out.name}"  # on every node; emptied and removed at the end
        self.tools = None
        self._procs: list[subprocess.Popen] = []
        self.nodes: list = []

    # ---- lifecycle
    def __enter__(self) -> ClusterBed:
        import ray

        from ray_rt.cluster import connect
        from ray_rt.placement import CLUSTER_LABEL

        t0 = time.monotonic()
        connect(self.spec.cluster.address)
        try:
            self._check_placement()
            self._start_tools()
        except BaseException:
            ray.shutdown()
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
            self.tools = NodeTools(shapes, captures, self.work_dir)
            self.tools.start()

    def __exit__(self, *exc) -> bool:
        import ray

        from topology.proc import terminate

        try:
            for proc in reversed(self._procs):
                terminate(proc)
            if self.tools is not None:
                problems = self.tools.stop(self.out / "pcap")
                self.runtime.record["teardown_problems"] = problems
        finally:
            ray.shutdown()
        return False

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
            "lan_profile": load_profile("lan").to_dict(),
            "hosts": [],
            "seed": self.spec.topology_seed,
            "snaplen_bytes": self.spec.snaplen_bytes,
            "runtime": self.runtime.name,
            "runtime_metadata": self.runtime.metadata(),
            "link_changes": [],
        }


def _selector(entry) -> dict[str, str]:
    from ray_rt.placement import CLUSTER_LABEL

    return {CLUSTER_LABEL: entry.site, **dict(entry.labels)}
