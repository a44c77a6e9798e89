"""Work on named interfaces of named nodes of a Ray cluster: tc netem shaping and packet captures.

Responsible for: `NodeTool`, a small Ray actor placed on the node a label selector names (and, where several
match, on the one whose address is given), that installs the tc backend's netem qdisc on an interface and
removes it (`topology.tc` builds the commands: the same ones the emulated topology's tc backend runs), and runs
a tcpdump on an interface (`topology.capture`) whose pcap it hands back in chunks; and `NodeTools`, the
driver's side: every shaping and capture of a run started before the roles, each refused with the node, the
interface and tc's or tcpdump's own words when it cannot run, and all of it undone at the end (qdisc deleted,
captures stopped and fetched into the run directory, actors killed) whatever happened.
Not responsible for: where the roles run (ray_rt.roles), connecting (ray_rt.cluster), which interfaces carry
the WAN (the spec's `cluster.shape` / `cluster.capture` say so).

Privileges: tc and tcpdump need root (CAP_NET_ADMIN, CAP_NET_RAW) where the actor runs, i.e. the user the
node's raylet runs as. A node without them refuses with tc's message.
"""

from __future__ import annotations

import logging
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from ray_rt import RayRuntimeError

log = logging.getLogger(__name__)
CHUNK_BYTES = 8 << 20  # a capture comes back in pieces well under Ray's object size limits
CALL_TIMEOUT_S = 60.0


class NodeToolError(RayRuntimeError):
    """Shaping or capturing on a node failed; the message names the node, the interface and why."""


@dataclass(frozen=True)
class NodeShape:
    """netem on one interface: selector (label selector of its node), node_ip ("" = any node it matches),
    interface, netem (the `netem ...` arguments, topology.tc.netem_args), what (a label for messages)."""

    selector: Mapping[str, str]
    interface: str
    netem: tuple[str, ...]
    node_ip: str = ""
    what: str = ""


@dataclass(frozen=True)
class NodeCapture:
    """A capture on one interface, written as pcap/wan-<side>.pcap: selector, interface, side (a | b),
    snaplen_bytes, node_ip ("" = any node the selector matches), bpf (a tcpdump filter; "" = every frame)."""

    selector: Mapping[str, str]
    interface: str
    side: str
    snaplen_bytes: int = 128
    node_ip: str = ""
    bpf: str = ""


@dataclass
class _Held:
    actor: object
    where: str
    shapes: list[str] = field(default_factory=list)  # interfaces with our qdisc
    captures: list[tuple[str, str]] = field(default_factory=list)  # (side, remote pcap path)


class NodeTool:
    """On one node (made a Ray actor by NodeTools): tc and tcpdump on its interfaces."""

    def __init__(self, work_dir: str):
        self.dir = Path(work_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.captures: dict[str, object] = {}

    def where(self) -> str:
        import ray

        return f"{ray.util.get_node_ip_address()}/{ray.get_runtime_context().get_node_id()[:8]}"

    def run(self, argv: list[str]) -> tuple[int, str]:
        """(exit status, stderr) of a command here."""
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=CALL_TIMEOUT_S)
        return proc.returncode, proc.stderr.strip()

    def start_capture(self, side: str, interface: str, snaplen_bytes: int, bpf: str) -> str:
        from topology.capture import Capture

        path = self.dir / f"wan-{side}.pcap"
        cap = Capture([], interface, path, snaplen_bytes)
        if bpf:
            cap.argv += bpf.split()
        cap.start()
        self.captures[side] = cap
        return str(path)

    def stop_capture(self, side: str) -> int:
        """Stop it; the pcap's size."""
        cap = self.captures.pop(side, None)
        if cap is not None:
            cap.stop()
        path = self.dir / f"wan-{side}.pcap"
        return path.stat().st_size if path.exists() else 0

    def remove(self, path: str) -> None:
        """A fetched capture, and the run's directory here once empty."""
        Path(path).unlink(missing_ok=True)
        try:
            self.dir.rmdir()
        except OSError:
            pass

    def read(self, path: str, offset: int, size: int) -> bytes:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(size)


def netem_apply_cmd(interface: str, netem: Sequence[str]) -> list[str]:
    """tc's argv that puts netem on an interface (topology.tc's replace form)."""
    return ["tc", "qdisc", "replace", "dev", interface, "root", *netem]


class NodeTools:
    """The shaping and captures of one run on an existing Ray cluster (the driver is connected).

    work_dir: where each node keeps its captures while they run (created there)
    """

    def __init__(self, shapes: Sequence[NodeShape], captures: Sequence[NodeCapture], work_dir: str):
        self.shapes, self.captures, self.work_dir = list(shapes), list(captures), work_dir
        self.held: dict[tuple, _Held] = {}
        self.applied: list[dict] = []

    def _tool(self, selector: Mapping[str, str], node_ip: str) -> _Held:
        import ray

        key = (tuple(sorted(selector.items())), node_ip)
        if key in self.held:
            return self.held[key]
        node = _node_matching(selector, node_ip)
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        actor = (
            ray.remote(NodeTool)
            .options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))
            .remote(self.work_dir)
        )
        held = self.held[key] = _Held(actor, ray.get(actor.where.remote(), timeout=CALL_TIMEOUT_S))
        return held

    def start(self) -> None:
        """Every shaping, then every capture; NodeToolError (everything undone) at the first that fails."""
        import ray

        try:
            for s in self.shapes:
                held = self._tool(s.selector, s.node_ip)
                argv = netem_apply_cmd(s.interface, s.netem)
                code, err = ray.get(held.actor.run.remote(argv), timeout=CALL_TIMEOUT_S)
                if code != 0:
                    raise NodeToolError(
                        f"shaping {s.what or s.interface} on node {held.where}: `{' '.join(argv)}` failed ({code}): "
                        f"{err or 'no message'} (tc needs root there and the kernel's sch_netem: modprobe sch_netem)"
                    )
                held.shapes.append(s.interface)
                self.applied.append({"node": held.where, "interface": s.interface, "netem": list(s.netem)})
                log.info("netem on %s of node %s: %s", s.interface, held.where, " ".join(s.netem))
            for c in self.captures:
                held = self._tool(c.selector, c.node_ip)
                try:
                    remote = ray.get(
                        held.actor.start_capture.remote(c.side, c.interface, c.snaplen_bytes, c.bpf),
                        timeout=CALL_TIMEOUT_S,
                    )
                except ray.exceptions.RayTaskError as err:
                    raise NodeToolError(f"capture on {c.interface} of node {held.where}: {_cause(err)}") from None
                held.captures.append((c.side, remote))
        except BaseException:
            self.stop(None)
            raise

    def stop(self, pcap_dir: Path | None) -> list[str]:
        """Captures stopped and fetched into pcap_dir (None: dropped), qdiscs removed, actors killed; the
        problems met on the way (also logged; teardown goes on)."""
        import ray

        problems = []
        for held in self.held.values():
            for side, remote in held.captures:
                try:
                    size = ray.get(held.actor.stop_capture.remote(side), timeout=CALL_TIMEOUT_S)
                    if pcap_dir is not None:
                        _fetch(held.actor, remote, size, pcap_dir / f"wan-{side}.pcap")
                    ray.get(held.actor.remove.remote(remote), timeout=CALL_TIMEOUT_S)
                except (ray.exceptions.RayError, OSError) as err:
                    problems.append(f"capture {side} on node {held.where}: {_cause(err)}")
            for interface in held.shapes:
                try:
                    code, err = ray.get(held.actor.run.remote(["tc", "qdisc", "del", "dev", interface, "root"]))
                    if code != 0:
                        problems.append(f"removing netem from {interface} of node {held.where}: {err}")
                except ray.exceptions.RayError as err:
                    problems.append(f"removing netem from {interface} of node {held.where}: {_cause(err)}")
            ray.kill(held.actor, no_restart=True)
        self.held.clear()
        for p in problems:
            log.error("%s", p)
        return problems


def _fetch(actor, remote: str, size: int, dest: Path) -> None:
    import ray

    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest, "wb") as out:
        for offset in range(0, size, CHUNK_BYTES):
            out.write(ray.get(actor.read.remote(remote, offset, CHUNK_BYTES), timeout=CALL_TIMEOUT_S))


def _node_matching(selector: Mapping[str, str], node_ip: str) -> str:
    """The id of the one alive node whose labels satisfy selector (and whose address is node_ip, if given)."""
    import ray

    from ray_rt.placement import alive_nodes, selector_matches

    nodes = [n for n in alive_nodes(ray.nodes()) if selector_matches(selector, n.labels)]
    if node_ip:
        nodes = [n for n in nodes if n.address == node_ip]
    words = " and ".join(f"{k}={v}" for k, v in selector.items()) + (f" at {node_ip}" if node_ip else "")
    if len(nodes) != 1:
        found = ", ".join(n.name() for n in nodes) or "none"
        raise NodeToolError(f"the node with {words}: {len(nodes)} nodes match ({found}); name one (node_ip)")
    return nodes[0].node_id


def _cause(err: BaseException) -> str:
    return (str(getattr(err, "cause", None) or err).strip().splitlines() or [type(err).__name__])[-1]
