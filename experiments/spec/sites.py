"""A spec's topology file: which one it runs, where its workers' hosts are, and what it cannot run with yet.

Responsible for: the spec's `topology` (a topology file's registry name or path, topology.topofile; the
default `two-clusters` is the network the testbed always built), the pool counts the file places checked
against the spec's pools, every worker host's address in that topology (for the roles' config), the line
each MD sits behind (the router's per-request line choice, policy.lines), and refusing the combinations the
testbed does not run on a topology file yet (a real cluster, the Ray runtime, cross traffic, `pddlab serve`
and the simulator: they know the two-cluster network only).
Not responsible for: the file's format (topology.topofile), building it (topology.net), routes (topology.routes).
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache

from experiments.spec.runtimes import kind_of
from experiments.spec.scaling import spec_kv_scale

from topology import routes
from topology.topofile import DEFAULT_TOPOLOGY, Topology, TopologyError, host_specs, line_specs, load_topology


def is_default(spec) -> bool:
    """Whether the spec runs the default topology (two clusters, one WAN line)."""
    return spec.topology == DEFAULT_TOPOLOGY


@lru_cache(maxsize=16)
def _load(name_or_path: str) -> Topology:
    return load_topology(name_or_path)


def topology_of(spec) -> Topology:
    """The spec's topology, loaded (TopologyError for an unknown name or a bad file)."""
    return _load(spec.topology)


def pool_counts(spec) -> dict[str, int]:
    """The spec's workers per pool (p, rld, md)."""
    return {role: getattr(spec.pools, role).workers for role in ("p", "rld", "md")}


def addresses(spec) -> dict[str, str] | None:
    """host name -> address in the spec's topology (None for the default: topology.naming's addresses)."""
    if is_default(spec):
        return None
    return {h.name: h.ip for h in host_specs(topology_of(spec), pool_counts(spec))}


def md_lines(spec) -> dict[str, str]:
    """MD worker -> the line a KV transfer from the P site to it crosses ({} for the default topology; a path
    of several lines is named by its last, the one at the MD's site)."""
    if is_default(spec):
        return {}
    topo = topology_of(spec)
    specs = host_specs(topo, pool_counts(spec))
    p_site = next(h.cluster for h in specs if h.role == "p")
    paths = routes.host_paths(topo, specs, line_specs(topo))[p_site]
    return {h.name: paths[h.name][-1] for h in specs if h.role == "md" and paths[h.name]}


def line_policy(spec, wan) -> tuple[dict[str, str], dict]:
    """(MD -> its line, the policy the roles need for it) for the spec's topology; ({}, {}) for the default, or
    where an MD sits behind no line (in the P site). The policy: each MD line's static figures (`policy.lines`:
    its forward rate and one-way delay; the first line runs `wan`, the spec's profile as applied) and, where the
    topology file says `choose: measured`, `pick_md: line_measured` (the router's per-request line choice)."""
    lines = md_lines(spec)
    if not lines or len(lines) != pool_counts(spec)["md"]:
        return {}, {}
    specs = line_specs(topology_of(spec))
    specs[0] = dataclasses.replace(specs[0], profile=wan)
    used = [ln for ln in specs if ln.name in set(lines.values())]
    policy: dict = {
        "lines": {
            # 200 if unlimited, as deployment._wan_rate_mbit (not imported: deployment imports this module)
            ln.name: {"rate_mbit": float(ln.profile.a_to_b.rate_mbit or 200.0), "delay_ms": ln.profile.a_to_b.delay_ms}
            for ln in used
        }
    }
    if any(ln.choose == "measured" for ln in used) and len(used) > 1:
        policy["pick_md"] = "line_measured"
    return lines, policy


NOT_YET = (
    # (what, whether the spec asks for it): the testbed runs these on the two-cluster network only
    ("a real cluster (cluster.address)", lambda s: bool(s.cluster.address)),
    ("the Ray runtime", lambda s: kind_of(s).ray_nodes),
    ("cross traffic (its hosts xa, xb are the two-cluster network's)", lambda s: bool(s.cross_traffic)),
    ("compute.kv_scale (only the first line would be scaled)", lambda s: spec_kv_scale(s) != 1),
)


def topology_problem(spec) -> str | None:
    """Why the spec's topology cannot run with it (None: it can): an unknown or bad file, pool counts the file
    disagrees with, or a combination the testbed runs on the two-cluster network only."""
    try:
        topo = topology_of(spec)
        host_specs(topo, pool_counts(spec))
    except TopologyError as err:
        return f"topology={spec.topology!r}: {err}"
    if not topo.serves:
        return f"topology={spec.topology!r}: places no roles (named hosts only): a network for `pddlab net` alone"
    if is_default(spec):
        return None
    for what, asked in NOT_YET:
        if asked(spec):
            return f"topology={spec.topology!r}: {what} runs on the default topology ({DEFAULT_TOPOLOGY}) only, for now"
    return None
