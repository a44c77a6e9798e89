"""The analysis's view of a run's variants: their records on the plots' clock, their workers, the data-plane ports.

Responsible for: each variant's VariantRecord (experiments.rundir.metadata: window, link changes, cross
traffic) put on one time axis; each variant's workers as it deployed them (variants/<v>/deployment.yaml,
read through workers.roles.config) with what each was given, and the decode workers' kv ports.
Not responsible for: metadata.json's layout, writing or reading (experiments.rundir.metadata), what the
entries mean for the metrics or plots.

Time axis: plots use seconds since the first variant's wall_start (the pcap is in Unix time). An event's
t_ns (monotonic) maps onto it through its variant's pair (wall_start, t_start_ns), both taken at the
variant's start; a variant whose record lacks the pair (it never started) is off the axis (None).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from experiments.rundir.metadata import CrossTrafficEntry, LinkChange, RunMetadata, VariantRecord
from workers.roles.config import ConfigError, DeploymentConfig, load_config

log = logging.getLogger(__name__)
DEFAULT_KV_PORTS = (50062, 50063)  # rld, md (experiments.run.deploy.KV_PORTS) where no deployment.yaml says


@dataclass(frozen=True)
class WorkerSetup:
    """One worker as its variant deployed it.

    name: p1, rld2, md1, ... (topology.naming); role: p | rld | md; capacity_tokens: its engine's KV slots
    (tokens); threads: its engine's torch threads; kv_address: host:port peers send it KV at ('' for P);
    cpus, memory_mb: the CPU (cores) and memory (MiB) limits its container ran under (the docker runtime's
    record), None where none was enforced (the process runtime)
    """

    name: str
    role: str
    capacity_tokens: int
    threads: int
    kv_address: str = ""
    cpus: float | None = None
    memory_mb: int | None = None


@dataclass
class RunMeta:
    """windows: each variant's record (metadata.json's `variants`); kv_ports: the decode workers' kv ports;
    workers: each variant's workers (router left out) as its deployment.yaml says, {} where it has none."""

    windows: dict[str, VariantRecord]
    kv_ports: set[int] = field(default_factory=lambda: set(DEFAULT_KV_PORTS))
    workers: dict[str, list[WorkerSetup]] = field(default_factory=dict)
    site_a: frozenset[bytes] | None = None  # a real cluster's site A addresses (packed); None: the topology's
    lan_rate_mbit: float | None = None  # the LAN profile's rate (metadata's topology.lan_profile; None: unknown)

    @property
    def origin_s(self) -> float | None:
        """The plots' time zero: the first variant's wall_start (Unix s)."""
        starts = [w.wall_start for w in self.windows.values() if w.wall_start is not None]
        return min(starts) if starts else None

    def axis_s(self, variant: str | None, t_ns: int | None) -> float | None:
        """A monotonic t_ns of variant's events in s on the plots' axis; None where the window lacks the pair."""
        w = self.windows.get(variant)
        if t_ns is None or w is None or w.wall_start is None or w.t_start_ns is None:
            return None
        return w.wall_start - self.origin_s + (t_ns - w.t_start_ns) / 1e9

    @property
    def link_changes(self) -> list[tuple[str, LinkChange]]:
        """(variant, change) of every variant's link changes."""
        return [(v, c) for v, w in self.windows.items() for c in w.link_changes]

    @property
    def cross_traffic(self) -> list[tuple[str, CrossTrafficEntry]]:
        """(variant, entry) of every variant's cross flows."""
        return [(v, c) for v, w in self.windows.items() for c in w.cross_traffic]

    @property
    def cross_ports(self) -> set[int]:
        return {c.port for _, c in self.cross_traffic}


def deployments(run_dir: Path) -> dict[str, DeploymentConfig]:
    """variant -> its roles' config (variants/<v>/deployment.yaml); one that does not read is left out, logged."""
    out = {}
    for path in sorted(Path(run_dir).glob("variants/*/deployment.yaml")):
        try:
            out[path.parent.name] = load_config(path)
        except (ConfigError, OSError, ValueError) as err:
            log.warning("%s", err)
    return out


def kv_ports(deps: dict[str, DeploymentConfig]) -> set[int]:
    """The decode workers' kv_port of every variant's deployment (rld: handoff, md: WAN KV)."""
    ports = {w.kv_port for cfg in deps.values() for w in cfg.rld + cfg.md if w.kv_port}
    return ports or set(DEFAULT_KV_PORTS)


def worker_setups(cfg: DeploymentConfig, meta: RunMetadata) -> list[WorkerSetup]:
    """Every P, RLD and MD of one variant's deployment, with the container limits of its role where the run's
    runtime enforced some (metadata.json's topology.runtime_metadata.limits: the docker runtime)."""
    limits = ((meta.topology.runtime_metadata if meta.topology else None) or {}).get("limits") or {}
    out = []
    for role in ("p", "rld", "md"):
        lim = limits.get(role) or {}
        out += [
            WorkerSetup(
                w.name,
                role,
                w.capacity_tokens,
                w.threads,
                w.kv_address if w.kv_port or w.kv_connect else "",
                lim.get("cpus"),
                lim.get("memory_mb"),
            )
            for w in getattr(cfg, role)
        ]
    return out


def load(run_dir: Path, meta: RunMetadata) -> RunMeta:
    """RunMeta of a run directory whose metadata.json is already read into meta."""
    deps = deployments(run_dir)
    return RunMeta(
        windows=meta.variants,
        kv_ports=kv_ports(deps),
        workers={v: worker_setups(cfg, meta) for v, cfg in deps.items()},
        site_a=site_a(meta),
        lan_rate_mbit=meta.topology.lan_profile.a_to_b.rate_mbit if meta.topology else None,
    )


def site_a(meta: RunMetadata) -> frozenset[bytes] | None:
    """Site A's node addresses of a run on an existing Ray cluster (its captures' directions), else None."""
    import ipaddress

    topo = meta.topology
    if topo is None or not (topo.runtime_metadata or {}).get("site_a"):  # recorded by runs on a cluster only
        return None
    return frozenset(ipaddress.IPv4Address(a).packed for a in topo.runtime_metadata.get("site_a", []))
