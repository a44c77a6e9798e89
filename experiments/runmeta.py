"""What metadata.json and the deployments say about each variant, typed: its window, link changes, cross
traffic and data-plane ports, and the clock that puts monotonic event times on the pcap's time axis.

Responsible for: reading meta["variants"][v] (wall_start / wall_end in Unix s,
t_start_ns / t_ready_ns / t_end_ns in CLOCK_MONOTONIC ns, link_changes,
cross_traffic) and variants/<v>/deployment.yaml (kv ports); every key may be
missing in older runs, which then yield no entries rather than errors.
Not responsible for: writing metadata (experiments.runner), what the
entries mean for the metrics or plots.

Time axis: plots use seconds since the first variant's wall_start (the pcap
is in Unix time). An event's t_ns (monotonic) maps onto it through its
variant's pair (wall_start, t_start_ns), both taken at the variant's start.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import yaml

log = logging.getLogger(__name__)
DEFAULT_KV_PORTS = (50062, 50063)  # rld, md (experiments.deploy.KV_PORTS) where no deployment.yaml says


@dataclass(frozen=True)
class LinkChange:
    """One change of the WAN's parameters during a variant (direction a_to_b | b_to_a)."""

    variant: str
    t_ns: int | None
    offset_s: float | None  # from the variant's measured start
    direction: str
    params: dict
    cause: str


@dataclass(frozen=True)
class CrossTraffic:
    """One cross-traffic stream (iperf3) during a variant."""

    variant: str
    name: str
    kind: str  # tcp | udp
    direction: str
    start_ns: int | None
    end_ns: int | None
    port: int | None
    iperf_json: str | None  # relative to the run directory


@dataclass
class RunMeta:
    """Per-variant windows, link changes, cross traffic and ports of one run directory."""

    windows: dict[str, dict]
    link_changes: list[LinkChange] = field(default_factory=list)
    cross_traffic: list[CrossTraffic] = field(default_factory=list)
    kv_ports: set[int] = field(default_factory=lambda: set(DEFAULT_KV_PORTS))

    @property
    def origin_s(self) -> float | None:
        """The plots' time zero: the first variant's wall_start (Unix s)."""
        starts = [w["wall_start"] for w in self.windows.values() if "wall_start" in w]
        return min(starts) if starts else None

    def axis_s(self, variant: str, t_ns: int | None) -> float | None:
        """A monotonic t_ns of variant's events in s on the plots' axis; None where the window lacks the pair."""
        w = self.windows.get(variant, {})
        if t_ns is None or "wall_start" not in w or "t_start_ns" not in w:
            return None
        return w["wall_start"] - self.origin_s + (t_ns - w["t_start_ns"]) / 1e9

    def change_s(self, c: LinkChange) -> float | None:
        """A link change on the plots' axis (from t_ns, else from offset_s)."""
        at = self.axis_s(c.variant, c.t_ns)
        w = self.windows.get(c.variant, {})
        if at is None and c.offset_s is not None and "wall_start" in w:
            at = w["wall_start"] - self.origin_s + c.offset_s
        return at

    @property
    def cross_ports(self) -> set[int]:
        return {c.port for c in self.cross_traffic if c.port}


def _changes(v: str, w: dict) -> list[LinkChange]:
    return [
        LinkChange(
            v, c.get("t_ns"), c.get("offset_s"), c.get("direction", "?"), c.get("params") or {}, c.get("cause", "")
        )
        for c in w.get("link_changes") or []
        if isinstance(c, dict)
    ]


def _cross(v: str, w: dict) -> list[CrossTraffic]:
    return [
        CrossTraffic(
            v,
            c.get("name", "?"),
            c.get("kind", "?"),
            c.get("direction", "?"),
            c.get("start_ns"),
            c.get("end_ns"),
            c.get("port"),
            c.get("iperf_json"),
        )
        for c in w.get("cross_traffic") or []
        if isinstance(c, dict)
    ]


def kv_ports(run_dir: Path) -> set[int]:
    """The decode workers' kv_port of every variant's deployment.yaml (rld: handoff, md: WAN KV)."""
    ports = set()
    for path in sorted(Path(run_dir).glob("variants/*/deployment.yaml")):
        try:
            dep = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as err:
            log.warning("%s: %s", path, err)
            continue
        ports |= {dep[r]["kv_port"] for r in ("rld", "md") if isinstance(dep.get(r), dict) and dep[r].get("kv_port")}
    return ports or set(DEFAULT_KV_PORTS)


def load(run_dir: Path, meta: dict) -> RunMeta:
    """RunMeta of a run directory whose metadata.json is already read into meta."""
    variants = {v: w for v, w in (meta.get("variants") or {}).items() if isinstance(w, dict)}
    return RunMeta(
        windows=variants,
        link_changes=[c for v, w in variants.items() for c in _changes(v, w)],
        cross_traffic=[c for v, w in variants.items() for c in _cross(v, w)],
        kv_ports=kv_ports(run_dir),
    )
