"""Where a spec's workers can run: its `cluster:` section and the checks of devices and Ray placement fields.

Responsible for: the `Cluster` schema (this machine, or an existing Ray cluster at an address) and two pure
checks that return the problem in the spec's own words, or None: `device_problem` (a `device: cuda` pool needs
a GPU where its workers will run) and `placement_problem` (Ray label selectors, each role's site in the
emulated topology, the cluster's address). experiments.spec.experiment raises them as SpecError at load, before anything
starts.
Not responsible for: placing anything (ray_rt.placement checks pools against a live cluster's nodes), the
memory estimate (experiments.spec.deployment), the rest of the spec (experiments.spec.experiment).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import field
from typing import Annotated, Literal

from pydantic import StringConstraints

from experiments.spec.runtimes import kind_of
from schema import Str, schema

RAY_ADDRESS = re.compile(r"(ray://)?[A-Za-z0-9.-]+:[0-9]{1,5}")


@schema
class WanEnd:
    """One end of the real WAN, on a cluster: the interface of a node of a site that faces the other site.

    site: a | b, the node's pddlab/cluster label (site a's egress carries a_to_b, b's b_to_a)
    interface: its name on that node (eth1, ens5 ...)
    node_ip: which of the site's nodes, by the address Ray knows it by ("" = the site's only one)
    labels: further label selector entries that single the node out (Ray's syntax)
    """

    site: Literal["a", "b"]
    interface: Annotated[Str, StringConstraints(pattern=r"^[A-Za-z0-9_.@-]{1,15}$")]
    node_ip: Str = ""
    labels: dict[Str, Str] = field(default_factory=dict)


@schema
class Cluster:
    """Where the roles run. address "": this machine (the emulated topology); ray://HOST:PORT or HOST:PORT: an
    existing Ray cluster whose nodes carry the pools' labels (runtime ray; README "Ray runtime").

    shape: the WAN profile's netem on these interfaces for the run (tc on those nodes, removed at the end)
    capture: tcpdump on these interfaces for the run, into pcap/wan-<site>.pcap
    capture_filter: a tcpdump filter for the captures ("" = every frame)
    """

    address: Str = ""
    shape: tuple[WanEnd, ...] = ()
    capture: tuple[WanEnd, ...] = ()
    capture_filter: Str = ""


def nvidia_gpus() -> int:
    """How many NVIDIA GPUs `nvidia-smi -L` lists (0 without the tool or a driver)."""
    if not shutil.which("nvidia-smi"):
        return 0
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    return sum(line.startswith("GPU ") for line in out.stdout.splitlines()) if out.returncode == 0 else 0


def device_problem(spec, cuda_here: bool | None = None, gpus_here: int | None = None) -> str | None:
    """A pool on cuda needs a GPU where its workers run: the process and ray runtimes run them on this machine
    (cuda_here: torch.cuda.is_available(), asked only then), Docker's containers on this machine's NVIDIA GPUs
    (gpus_here: what `nvidia-smi -L` lists) through the cuda image variant; an existing Ray cluster's nodes are
    checked at placement (ray_rt.placement)."""
    cuda_pools = [role for role in ("p", "rld", "md") if getattr(spec.pools, role).device == "cuda"]
    if not cuda_pools or spec.cluster.address:
        return None
    where = f"pools.{cuda_pools[0]}.device=cuda"
    if kind_of(spec).containers:
        if not (nvidia_gpus() if gpus_here is None else gpus_here):
            return (
                f"{where}: runtime docker runs it in the cuda worker image (make image VARIANT=cuda) on this "
                "machine's NVIDIA GPUs, and `nvidia-smi -L` lists none here; allowed: cpu"
            )
        return None
    if cuda_here is None:
        import torch

        cuda_here = torch.cuda.is_available()
    if not cuda_here:
        return (
            f"{where}: runtime {spec.runtime} runs every worker on this machine, where torch.cuda.is_available() "
            "is False (no GPU, or a CPU-only torch); allowed: cpu"
        )
    return None


def placement_problem(spec) -> str | None:
    """The pools' labels are Ray label selectors; the emulated topology has each role in its own cluster; an
    address needs runtime ray."""
    from ray_rt.placement import HOME_CLUSTER, selector_problem

    address = spec.cluster.address
    if address and not RAY_ADDRESS.fullmatch(address):
        return f'cluster.address={address!r}: "" (this machine) or ray://HOST:PORT (a Ray cluster)'
    if address and not kind_of(spec).on_cluster:
        return f"cluster.address={address!r}: a Ray cluster needs runtime: ray (runtime is {spec.runtime})"
    for role in ("p", "rld", "md"):
        pool = getattr(spec.pools, role)
        for key, value in pool.labels.items():
            problem = selector_problem(key, value)
            if problem:
                return f"pools.{role}.labels: {problem}"
        home = HOME_CLUSTER[role]
        if not address and pool.cluster not in ("", home):
            return (
                f"pools.{role}.cluster={pool.cluster!r}: in the emulated topology {role} workers live in cluster "
                f"{home.upper()} (topology.naming); allowed: '{home}' or '' (a Ray cluster's sites are free to choose)"
            )
    if kind_of(spec).ray_nodes and not address:
        return topology_placement_problem(spec)
    return None


def topology_placement_problem(spec) -> str | None:
    """runtime ray in the emulated topology: the nodes are known before they start (a node per worker host,
    ray_rt.netns), so a pool that could not be placed on them (a label they do not carry, more than they
    offer) is refused here, naming the pool, before any topology exists."""
    from experiments.spec.deployment import ray_nodes
    from ray_rt.netns import HostNode, node_labels, node_resources
    from ray_rt.placement import NodeInfo, PlacementError, check_placement, deployment_needs

    nodes: list[HostNode] = ray_nodes(spec)
    infos = [NodeInfo(n.host, n.ip, node_resources(n), node_labels(n)) for n in nodes]
    try:
        check_placement(deployment_needs(spec.pools), infos)
    except PlacementError as err:
        return f"pools (runtime ray, a Ray node in each worker host): {err}"
    return None


def cluster_problem(spec, profile) -> str | None:
    """What an existing Ray cluster cannot do that the emulated topology does: the link's schedule, cross
    traffic and faults need the topology's hosts and link; a WAN end's labels are Ray selectors; each site's
    shaping or capture is named once."""
    from ray_rt.placement import selector_problem

    c = spec.cluster
    if not c.address:
        if c.shape or c.capture:
            return "cluster.shape, cluster.capture: only with cluster.address (the emulated topology shapes its WAN)"
        return None
    for what, present in (
        ("schedule", spec.schedule or profile.schedule),
        ("cross_traffic", spec.cross_traffic),
        ("faults", spec.faults),
    ):
        if present:
            return (
                f"{what}: not on an existing Ray cluster (cluster.address={c.address!r}): it needs the emulated "
                "topology's link and hosts; allowed: none"
            )
    for name, ends in (("shape", c.shape), ("capture", c.capture)):
        sites = [e.site for e in ends]
        if len(set(sites)) != len(sites):
            return f"cluster.{name}: one entry per site (a, b); got {sites}"
        for i, e in enumerate(ends):
            for key, value in e.labels.items():
                problem = selector_problem(key, value)
                if problem:
                    return f"cluster.{name}[{i}].labels: {problem}"
    return None
