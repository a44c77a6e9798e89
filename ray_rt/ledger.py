"""What a run on a Ray cluster changed on its nodes, kept here so `pddlab clean --cluster` can undo it.

Responsible for: `Ledger`, one JSON file per run on this machine (in `state_dir()`, mode 0600): the cluster's
address, the run's PID and start time (a live run's ledger is never cleaned), a token (the run's work
directories carry it: only a directory holding it is removed), every netem qdisc the run put on a node's
interface (node id, node, interface, qdisc handle) and every work directory it made (node id, node, path),
each written before the change is made and dropped once it is undone; and `clean_cluster`, which undoes what
dead runs' ledgers still hold on the cluster this process is connected to (ray_rt.nodes does the node's side).
Not responsible for: making the changes (ray_rt.nodes, experiments.run.clusterbed), local leftovers
(topology.cleanup, `pddlab clean`).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
from dataclasses import asdict, dataclass, field
from pathlib import Path

from topology.cleanup import is_same_process, start_time

log = logging.getLogger(__name__)
STATE_ENV = "PDDLAB_CLUSTER_STATE"  # where the ledgers are, instead of state_dir()'s default


def state_dir() -> Path:
    """$PDDLAB_CLUSTER_STATE, else $XDG_STATE_HOME/pddlab/cluster (~/.local/state/pddlab/cluster)."""
    if os.environ.get(STATE_ENV):
        return Path(os.environ[STATE_ENV])
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "pddlab" / "cluster"


@dataclass
class Ledger:
    """One run's changes to a cluster's nodes (see the module's docstring); `path` is where it is kept."""

    path: Path
    address: str
    token: str
    pid: int
    started: int | None
    shapes: list[dict] = field(default_factory=list)  # {node_id, node, interface, handle[, qdisc: "netem"]}
    work_dirs: list[dict] = field(default_factory=list)  # {node_id, node, path}

    @classmethod
    def create(cls, address: str, directory: Path | None = None) -> Ledger:
        """A new, empty ledger for this process's run on the cluster at address, written at once."""
        directory = directory or state_dir()
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        token = secrets.token_hex(16)
        pid = os.getpid()
        ledger = cls(directory / f"run-{pid}-{token[:8]}.json", address, token, pid, start_time(pid))
        ledger.write()
        return ledger

    @classmethod
    def load(cls, path: Path) -> Ledger:
        data = json.loads(path.read_text())
        return cls(path=path, **{k: v for k, v in data.items() if k != "path"})

    def write(self) -> None:
        """Written whole (a temporary file renamed over it), readable by this user alone."""
        data = {k: v for k, v in asdict(self).items() if k != "path"}
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, self.path)

    def add(self, kind: str, entry: dict) -> dict:
        """entry recorded under kind ("shapes" or "work_dirs") before the change is made; returns it."""
        getattr(self, kind).append(entry)
        self.write()
        return entry

    def drop(self, kind: str, entry: dict) -> None:
        """entry undone: no longer recorded."""
        items = getattr(self, kind)
        if entry in items:
            items.remove(entry)
            self.write()

    def empty(self) -> bool:
        return not self.shapes and not self.work_dirs

    def forget(self) -> None:
        """Everything undone: the ledger removed."""
        self.path.unlink(missing_ok=True)

    def alive(self) -> bool:
        """Whether the run that keeps it is still running (then it is not ours to clean)."""
        return is_same_process(self.pid, self.started)


def ledgers(directory: Path | None = None) -> list[Ledger]:
    """Every readable ledger in directory (state_dir() by default), oldest first; unreadable ones logged."""
    directory = directory or state_dir()
    found = []
    for path in sorted(directory.glob("run-*.json")) if directory.is_dir() else []:
        try:
            found.append(Ledger.load(path))
        except (OSError, ValueError, TypeError) as err:
            log.warning("cluster ledger %s unreadable (%s): left as it is", path, err)
    return found


def clean_cluster(address: str, directory: Path | None = None) -> list[str]:
    """Undo, on the cluster this process is connected to (at address), what dead runs' ledgers for that address
    still hold: each recorded netem qdisc (only if the interface's root qdisc is still that netem) and work
    directory (only if it holds the run's token); a ledger is removed once nothing of it is left. One line per
    thing removed, or per thing that could not be (then its ledger stays)."""
    from ray_rt.nodes import NodeToolError, on_node, remove_work_dir, undo_shape

    lines = []
    for ledger in ledgers(directory):
        if ledger.address != address:
            continue
        if ledger.alive():
            lines.append(f"{ledger.path.name}: run {ledger.pid} is still running: left as it is")
            continue
        for shape in list(ledger.shapes):
            handle = f" {shape['handle']}" if shape.get("handle") else ""
            kind = shape.get("qdisc", "netem")
            what = f"{kind}{handle} on {shape['interface']} of node {shape['node']}"
            try:
                removed = on_node(shape["node_id"], undo_shape, shape["interface"], shape.get("handle", ""), kind)
            except NodeToolError as err:
                lines.append(f"could not remove {what}: {err}")
                continue
            lines.append(f"removed {what}" if removed else f"{what}: gone already")
            ledger.drop("shapes", shape)
        for wd in list(ledger.work_dirs):
            what = f"work directory {wd['path']} on node {wd['node']}"
            try:
                removed = on_node(wd["node_id"], remove_work_dir, wd["path"], ledger.token)
            except NodeToolError as err:
                lines.append(f"could not remove {what}: {err}")
                continue
            lines.append(f"removed {what}" if removed else f"{what}: gone already (or not this run's)")
            ledger.drop("work_dirs", wd)
        if ledger.empty():
            ledger.forget()
            lines.append(f"removed cluster ledger {ledger.path}")
    return lines
