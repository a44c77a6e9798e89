"""Work on named interfaces of named nodes of a Ray cluster: tc netem shaping and packet captures.

Responsible for: `NodeTool`, a small Ray actor placed on the node a label selector names (and, where several
match, on the one whose address is given), that installs the tc backend's netem qdisc on an interface and
removes it (`topology.tc` builds the commands: the same ones the emulated topology's tc backend runs), and runs
a tcpdump on an interface (`topology.capture`) whose pcap it hands back in chunks; and `NodeTools`, the
driver's side: every shaping and capture of a run started before the roles, each refused with the node, the
interface and tc's or tcpdump's own words when it cannot run, and all of it undone at the end (qdisc deleted,
captures stopped and fetched into the run directory, actors killed) whatever happened, each qdisc written in
the run's ledger (ray_rt.ledger) before it is applied and dropped from it once removed; and the node's side of
a run's work directory (`make_work_dir`: a new directory, mode 0700, at a name the driver drew at random, never
one that was there before unless it holds the run's token; `remove_work_dir`) and of `pddlab clean --cluster`
(`undo_shape`), run there as Ray tasks (`on_node`).
Not responsible for: where the roles run (ray_rt.roles), connecting (ray_rt.cluster), which interfaces carry
the WAN (the spec's `cluster.shape` / `cluster.capture` say so).

Privileges: tc and tcpdump need root (CAP_NET_ADMIN, CAP_NET_RAW) where the actor runs, i.e. the user the
node's raylet runs as. A node without them refuses with tc's message.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import stat
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from ray_rt import RayRuntimeError

log = logging.getLogger(__name__)
CHUNK_BYTES = 8 << 20  # a capture comes back in pieces well under Ray's object size limits
CALL_TIMEOUT_S = 60.0
MARKER = ".pddlab-run"  # in a work directory: the run's token (ray_rt.ledger), proof that the run made it


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
    node_id: str = ""
    shapes: list[str] = field(default_factory=list)  # interfaces with our qdisc
    captures: list[tuple[str, str]] = field(default_factory=list)  # (side, remote pcap path)


class NodeTool:
    """On one node (made a Ray actor by NodeTools): tc and tcpdump on its interfaces."""

    def __init__(self, work_dir: str):
        self.dir = Path(work_dir)  # made by make_work_dir before any tool starts
        self.captures: dict[str, object] = {}

    def where(self) -> str:
        return here()

    def run(self, argv: list[str]) -> tuple[int, str]:
        """(exit status, stderr) of a command here."""
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=CALL_TIMEOUT_S)
        return proc.returncode, proc.stderr.strip()

    def root_qdisc(self, interface: str) -> str:
        """The handle of the interface's root qdisc if it is a netem ("8001:"), else ""."""
        kind, handle = _root_qdisc(interface)
        return handle if kind == "netem" else ""

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

    def __init__(self, shapes: Sequence[NodeShape], captures: Sequence[NodeCapture], work_dir: str, ledger=None):
        self.shapes, self.captures, self.work_dir = list(shapes), list(captures), work_dir
        self.ledger = ledger  # ray_rt.ledger.Ledger: each qdisc recorded there while it is on
        self.held: dict[tuple, _Held] = {}
        self._recorded: dict[tuple[str, str], dict] = {}  # (where, interface) -> its ledger entry
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
        held = self.held[key] = _Held(actor, ray.get(actor.where.remote(), timeout=CALL_TIMEOUT_S), node)
        return held

    def start(self) -> None:
        """Every shaping, then every capture; NodeToolError (everything undone) at the first that fails."""
        import ray

        try:
            for s in self.shapes:
                held = self._tool(s.selector, s.node_ip)
                argv = netem_apply_cmd(s.interface, s.netem)
                self._record(held, s.interface)
                code, err = ray.get(held.actor.run.remote(argv), timeout=CALL_TIMEOUT_S)
                if code != 0:
                    self._forget(held, s.interface)  # not applied
                    raise NodeToolError(
                        f"shaping {s.what or s.interface} on node {held.where}: `{' '.join(argv)}` failed ({code}): "
                        f"{err or 'no message'} (tc needs root there and the kernel's sch_netem: modprobe sch_netem)"
                    )
                held.shapes.append(s.interface)
                handle = ray.get(held.actor.root_qdisc.remote(s.interface), timeout=CALL_TIMEOUT_S)
                self._record(held, s.interface, handle)
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
                    else:
                        self._forget(held, interface)
                except ray.exceptions.RayError as err:
                    problems.append(f"removing netem from {interface} of node {held.where}: {_cause(err)}")
            ray.kill(held.actor, no_restart=True)
        self.held.clear()
        for p in problems:
            log.error("%s", p)
        return problems

    def _record(self, held: _Held, interface: str, handle: str = "") -> None:
        if self.ledger is None:
            return
        old = self._recorded.get((held.where, interface))
        if old is not None:
            self.ledger.drop("shapes", old)
        entry = {"node_id": held.node_id, "node": held.where, "interface": interface, "handle": handle}
        self._recorded[(held.where, interface)] = self.ledger.add("shapes", entry)

    def _forget(self, held: _Held, interface: str) -> None:
        entry = self._recorded.pop((held.where, interface), None)
        if entry is not None and self.ledger is not None:
            self.ledger.drop("shapes", entry)


def on_node(node_id: str, fn, *args, timeout_s: float = CALL_TIMEOUT_S):
    """fn(*args) run as a Ray task on the node node_id (the driver is connected); NodeToolError when it fails
    there or the node is gone."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(fn).options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False))
    try:
        return ray.get(task.remote(*args), timeout=timeout_s)
    except ray.exceptions.RayError as err:
        raise NodeToolError(f"on node {node_id[:8]}: {_cause(err)}") from None


def here() -> str:
    """This node as messages name it: address/node id (the host's name outside Ray)."""
    import ray

    if not ray.is_initialized():
        return socket.gethostname()
    return f"{ray.util.get_node_ip_address()}/{ray.get_runtime_context().get_node_id()[:8]}"


def _ours(path: Path, token: str) -> bool:
    """Whether path is a directory (not a link) of this user, mode 0700, holding token in its marker."""
    try:
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) != 0o700:
            return False
        return (path / MARKER).read_text() == token
    except OSError:
        return False


def make_work_dir(path: str, token: str) -> None:
    """On a node: a new directory at path, mode 0700, holding token (MARKER). One already there is
    taken only when this run made it (several nodes of one machine share /tmp); anything else — a directory
    someone made first, a link — is refused (NodeToolError): its owner would control what the roles read."""
    p = Path(path)
    try:
        os.mkdir(p, 0o700)
    except FileExistsError:
        if _ours(p, token):
            return
        raise NodeToolError(f"{p} exists on node {here()} and this run did not make it: refusing it") from None
    os.chmod(p, 0o700)  # whatever the umask
    fd = os.open(p / MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token)


def remove_work_dir(path: str, token: str) -> bool:
    """On a node: the run's work directory removed with everything in it, if it is the run's (holds token)."""
    p = Path(path)
    if not _ours(p, token):
        return False
    shutil.rmtree(p)
    return True


def _root_qdisc(interface: str) -> tuple[str, str]:
    """(kind, handle) of the interface's root qdisc, e.g. ("netem", "8001:"); ("", "") when tc shows none."""
    proc = subprocess.run(
        ["tc", "qdisc", "show", "dev", interface, "root"], capture_output=True, text=True, timeout=CALL_TIMEOUT_S
    )
    words = proc.stdout.split()
    return (words[1], words[2]) if proc.returncode == 0 and len(words) > 2 and words[0] == "qdisc" else ("", "")


def undo_shape(interface: str, handle: str, kind: str = "netem") -> bool:
    """On a node: the interface's root qdisc removed if it is still the one recorded (that kind, and that
    handle when one is given); whether it was. NodeToolError when tc fails."""
    now_kind, now_handle = _root_qdisc(interface)
    if now_kind != kind or (handle and now_handle != handle):
        return False
    proc = subprocess.run(
        ["tc", "qdisc", "del", "dev", interface, "root"], capture_output=True, text=True, timeout=CALL_TIMEOUT_S
    )
    if proc.returncode != 0:
        raise NodeToolError(f"`tc qdisc del dev {interface} root` failed on node {here()}: {proc.stderr.strip()}")
    return True


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
