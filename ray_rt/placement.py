"""Where each worker runs under Ray, as data: a spec's pools -> Ray requests, checked against a cluster's nodes.

Responsible for: what one worker of each pool asks Ray for (`PoolNeeds`: logical CPUs and GPUs, memory, a label
selector naming its site, its accelerator type and any further labels), those as Ray actor options and placement
group bundles, Ray's label selector syntax, and `check_placement`: a pure check of every pool against a cluster's
nodes (`ray.nodes()`-shaped data) that refuses, naming the pool, GPUs where no node has any, a label no node
carries, and pools that do not fit the nodes that carry their labels — before any role starts.
Not responsible for: talking to Ray (`ray_rt.roles`), or what a pool is in a spec (experiments.spec.experiment; a
pool is
read here by attribute, so this module imports nothing above it).

Why labels and not custom resources. Ray's scheduling docs (docs.ray.io, ray-core/scheduling: "Labels",
"Use labels to control scheduling") recommend label selectors for *where* a task or actor runs — a node's site,
zone or accelerator — and custom resources only "when you need to manage scheduling using numeric values"; they
name the custom-resource pattern for placement a legacy one, and recommend the default `ray.io/accelerator-type`
label over the `accelerator_type=` option. Labels are set per node at `ray start --labels pddlab/cluster=a`,
selected by `label_selector=` on an actor or `bundle_label_selector=` on a placement group (Ray >= 2.49; beta in
2.60, which this is tested with), and read back in `ray.nodes()` as "Labels", which is what the check below
reads. Quantities stay resources: CPU, GPU and memory, which Ray counts.

Naming: a site's nodes carry CLUSTER_LABEL=a or =b; the router, P and RLD default to a, MD to b (their
clusters in the emulated topology, topology.naming). Label selector values use Ray's syntax: `v` (equals),
`!v` (not equal, or absent), `in(v1, v2)`, `!in(v1, v2)`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from ray_rt import RayRuntimeError

CLUSTER_LABEL = "pddlab/cluster"
HOST_LABEL = "pddlab/host"  # Ray in the emulated topology (ray_rt.netns): the host a node runs in
ACCELERATOR_LABEL = "ray.io/accelerator-type"  # a default label: Ray sets it on a node that has an accelerator
ROLES = ("router", "p", "rld", "md")
HOME_CLUSTER = {"router": "a", "p": "a", "rld": "a", "md": "b"}  # topology.naming's clusters of each role
# Logical CPUs a worker asks for when its pool sets neither num_cpus nor cpus: docker_rt's default limits.
DEFAULT_CPUS = {"router": 0.5, "p": 1.0, "rld": 1.0, "md": 1.0}
MB = 1 << 20
# Ray's label selector syntax (ray/_private/label_utils.py): a value, !value, in(v, ...), !in(v, ...).
_LABEL_VALUE = r"[a-zA-Z0-9](?:[a-zA-Z0-9_.-]{0,61}[a-zA-Z0-9])?"
_SELECTOR = re.compile(rf"^(!?)(?:in\(({_LABEL_VALUE}(?:, ?{_LABEL_VALUE})*)\)|({_LABEL_VALUE}))$")
_KEY = re.compile(rf"^(?:{_LABEL_VALUE}(?:\.{_LABEL_VALUE})*/)?{_LABEL_VALUE}$")


class PlacementError(RayRuntimeError):
    """A pool cannot be placed on the cluster's nodes; the message names the pool and why."""


def selector_problem(key: str, value: str) -> str | None:
    """Why key: value is not a Ray label selector entry, or None."""
    if not _KEY.fullmatch(key) or len(key) > 316:
        return f"label key {key!r}: an optional DNS-subdomain prefix and '/', then 1-63 of [A-Za-z0-9_.-]"
    if not _SELECTOR.fullmatch(value):
        return f"label selector {key}={value!r}: a value, !value, in(v1, v2) or !in(v1, v2)"
    return None


def selector_matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    """Whether a node with these labels satisfies every entry of a label selector (Ray's semantics)."""
    for key, value in selector.items():
        m = _SELECTOR.fullmatch(value)
        if m is None:
            raise ValueError(selector_problem(key, value))
        negated, listed, single = m.groups()
        wanted = {v.strip() for v in listed.split(",")} if listed else {single}
        present = key in labels and labels[key] in wanted
        if present == bool(negated):
            return False
    return True


@dataclass(frozen=True)
class PoolNeeds:
    """What each worker of one pool asks of a node.

    role: router | p | rld | md; workers: how many
    cluster: a | b, the CLUSTER_LABEL value of the nodes it may run on
    num_cpus: logical CPUs per worker (Ray's scheduling unit; a reservation, not a limit)
    num_gpus: GPUs per worker
    memory_mb: memory reserved per worker (MiB; 0 = none asked)
    accelerator_type: the ray.io/accelerator-type its node must carry ("" = any)
    labels: further label selector entries (Ray's syntax)
    device: cpu | cuda, where its engine runs
    """

    role: str
    workers: int
    cluster: str
    num_cpus: float
    num_gpus: float = 0.0
    memory_mb: int = 0
    accelerator_type: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    device: str = "cpu"

    def selector(self) -> dict[str, str]:
        """The label selector of its workers: its cluster, its accelerator, its further labels."""
        out = {CLUSTER_LABEL: self.cluster}
        if self.accelerator_type:
            out[ACCELERATOR_LABEL] = self.accelerator_type
        return {**out, **self.labels}

    def resources(self) -> dict[str, float]:
        """One worker's Ray resources (a placement group bundle): CPU, GPU, memory (bytes)."""
        out = {"CPU": self.num_cpus}
        if self.num_gpus:
            out["GPU"] = self.num_gpus
        if self.memory_mb:
            out["memory"] = float(self.memory_mb * MB)
        return out

    def actor_options(self) -> dict:
        """Keyword arguments of `ActorClass.options(...)` that place one worker."""
        out: dict = {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus, "label_selector": self.selector()}
        if self.memory_mb:
            out["memory"] = self.memory_mb * MB
        return out

    def describe(self) -> str:
        asks = ", ".join(f"{k} {_amount(k, v)}" for k, v in self.resources().items())
        return f"{self.workers} x ({asks})"


def pool_needs(role: str, pool=None) -> PoolNeeds:
    """The needs of a pool (an experiments.spec.experiment Pool, read by attribute; None: the router, one worker)."""
    if pool is None:
        return PoolNeeds(role, 1, HOME_CLUSTER[role], DEFAULT_CPUS[role])
    gpus = pool.num_gpus or (1.0 if pool.device == "cuda" else 0.0)  # a cuda worker holds a GPU of its own
    return PoolNeeds(
        role=role,
        workers=pool.workers,
        cluster=pool.cluster or HOME_CLUSTER[role],
        num_cpus=pool.num_cpus or pool.cpus or DEFAULT_CPUS[role],
        num_gpus=gpus,
        memory_mb=pool.memory_mb,
        accelerator_type=pool.accelerator_type,
        labels=dict(pool.labels),
        device=pool.device,
    )


def deployment_needs(pools, sizes: Mapping[str, int] | None = None) -> list[PoolNeeds]:
    """The router's needs and each pool's (pools: a spec's Pools); sizes: a variant's own workers per role."""
    out = [pool_needs("router")]
    for role in ("p", "rld", "md"):
        needs = pool_needs(role, getattr(pools, role))
        if sizes and role in sizes:
            needs = PoolNeeds(**{**needs.__dict__, "workers": sizes[role]})
        out.append(needs)
    return out


@dataclass(frozen=True)
class NodeInfo:
    """One alive node of a Ray cluster: its id, address, total resources and labels."""

    node_id: str
    address: str
    resources: Mapping[str, float]
    labels: Mapping[str, str]

    @classmethod
    def from_ray(cls, entry: Mapping) -> NodeInfo:
        """From one entry of `ray.nodes()`."""
        return cls(
            entry.get("NodeID", ""),
            entry.get("NodeManagerAddress", ""),
            dict(entry.get("Resources") or {}),
            dict(entry.get("Labels") or {}),
        )

    def name(self) -> str:
        return f"{self.address}/{self.node_id[:8]}"


def alive_nodes(entries: Sequence[Mapping]) -> list[NodeInfo]:
    """The alive nodes of a `ray.nodes()` answer."""
    return [NodeInfo.from_ray(e) for e in entries if e.get("Alive", True)]


def check_placement(needs: Sequence[PoolNeeds], nodes: Sequence[NodeInfo]) -> dict[str, list[str]]:
    """Every worker of every pool on a node that carries its labels and has room for it (first fit, largest
    first, all pools together), or PlacementError naming the first pool that cannot be placed and why.
    Returns role -> the node id of each of its workers (what Ray could do; Ray itself places them)."""
    if not nodes:
        raise PlacementError("the Ray cluster has no alive node")
    for pool in needs:
        _check_pool_alone(pool, nodes)
    free = {n.node_id: dict(n.resources) for n in nodes}
    taken: dict[str, list[str]] = {n.node_id: [] for n in nodes}
    plan: dict[str, list[str]] = {p.role: [] for p in needs}
    order = sorted(needs, key=lambda p: (-p.num_gpus, -p.num_cpus, -p.memory_mb))
    for pool in order:
        for i in range(pool.workers):
            node = _first_fit(pool, nodes, free)
            if node is None:
                raise PlacementError(_no_room(pool, i, nodes, free, taken))
            for key, amount in pool.resources().items():
                free[node.node_id][key] = free[node.node_id].get(key, 0.0) - amount
            taken[node.node_id].append(pool.role)
            plan[pool.role].append(node.node_id)
    return plan


def _check_pool_alone(pool: PoolNeeds, nodes: Sequence[NodeInfo]) -> None:
    """The checks of one pool on its own: its labels exist, its GPUs exist, one worker fits one node."""
    selector = pool.selector()
    for key, value in selector.items():
        problem = selector_problem(key, value)
        if problem:
            raise PlacementError(f"pool {pool.role}: {problem}")
    candidates = [n for n in nodes if selector_matches(selector, n.labels)]
    if not candidates:
        alone = {k: any(selector_matches({k: v}, n.labels) for n in nodes) for k, v in selector.items()}
        missing = [f"{k}={v}" for k, v in selector.items() if not alone[k]]
        what = f"label {missing[0]}" if missing else "all of " + ", ".join(f"{k}={v}" for k, v in selector.items())
        raise PlacementError(f"pool {pool.role}: no node has {what}; the nodes' labels: {_labels_of(nodes)}")
    where = _selector_words(selector)
    if pool.num_gpus and not any(n.resources.get("GPU", 0) > 0 for n in candidates):
        anywhere = "" if any(n.resources.get("GPU", 0) > 0 for n in nodes) else " (no node of the cluster has one)"
        raise PlacementError(
            f"pool {pool.role} asks for {pool.num_gpus:g} GPU per worker (device {pool.device}), but no node with "
            f"{where} has a GPU{anywhere}"
        )
    for key, amount in pool.resources().items():
        most = max(n.resources.get(key, 0.0) for n in candidates)
        if amount > most:
            raise PlacementError(
                f"pool {pool.role}: one worker needs {key} {_amount(key, amount)}; the largest node with {where} "
                f"has {_amount(key, most)}"
            )


def _first_fit(pool: PoolNeeds, nodes: Sequence[NodeInfo], free: dict) -> NodeInfo | None:
    selector, need = pool.selector(), pool.resources()
    for node in nodes:
        if selector_matches(selector, node.labels) and all(
            free[node.node_id].get(k, 0.0) >= v - 1e-9 for k, v in need.items()
        ):
            return node
    return None


def _no_room(pool: PoolNeeds, index: int, nodes: Sequence[NodeInfo], free: dict, taken: dict) -> str:
    selector = pool.selector()
    mine = [n for n in nodes if selector_matches(selector, n.labels)]
    state = "; ".join(
        f"{n.name()}: "
        + ", ".join(f"{k} {_amount(k, free[n.node_id].get(k, 0.0))}" for k in pool.resources())
        + " left"
        + (f" after {_counted(taken[n.node_id])}" if taken[n.node_id] else "")
        for n in mine
    )
    return (
        f"pool {pool.role} cannot be placed: {pool.describe()} on the nodes with {_selector_words(selector)}; "
        f"worker {index + 1} finds no room ({state})"
    )


def _counted(roles: list[str]) -> str:
    return ", ".join(f"{r} x{roles.count(r)}" for r in dict.fromkeys(roles))


def _selector_words(selector: Mapping[str, str]) -> str:
    return " and ".join(f"{k}={v}" for k, v in selector.items())


def _labels_of(nodes: Sequence[NodeInfo]) -> str:
    shown = [
        f"{n.name()} {{{', '.join(f'{k}={v}' for k, v in sorted(n.labels.items()) if k != 'ray.io/node-id')}}}"
        for n in nodes
    ]
    return "; ".join(shown)


def _amount(key: str, value: float) -> str:
    return f"{value / MB:.0f} MiB" if key == "memory" else f"{value:g}"
