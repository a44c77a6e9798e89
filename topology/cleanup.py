"""Leftovers of crashed runs: recording what a run started, and removing it later.

Responsible for: a per-run state file listing the PIDs (with their start
times) that a testbed started, and `clean()`, which removes what a run that
died without teardown left behind — by its own PIDs, links carrying the
testbed prefix, and iptables rules carrying the testbed comment; while a run
is alive, its links and rules are left alone.
Not responsible for: the normal teardown (`topology.net.Testbed.stop`).

Nothing is ever killed by name: a PID is signalled only if it is listed in a
state file and the process holding it started when the recorded one did
(`/proc/PID/stat` field 22). Not its command line: a process recorded right
after `Popen(["mnexec", "-a", ...])` changes its command line when mnexec
execs the real command, and `make clean` after a SIGKILLed run used to find
every such process "someone else's" and leave it running.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from topology import naming

log = logging.getLogger(__name__)
STATE_DIR = Path("/run/pddlab")
IPTABLES_COMMENT = "pddlab"


def start_time(pid: int) -> int | None:
    """When process pid started (clock ticks since boot; survives exec), or None when there is none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # comm (field 2) may hold spaces and parentheses: the fields after it follow the last ")".
    return int(stat.rsplit(")", 1)[1].split()[19])


def is_same_process(pid: int, started: int | None) -> bool:
    """Whether pid still names the process that started at `started` (not a reused PID)."""
    return started is not None and start_time(pid) == started


# Where a testbed's scratch directory may be (tempfile.mkdtemp(prefix=WORKDIR_PREFIX)): `clean` removes a dead
# run's only there, and only by that prefix.
WORKDIR_PREFIX = "pddlab-"
# What keeps a state file: a testbed (topology.net) or a stock-kernel VM run (vm.run: qemu, virtiofsd).
RUN_KINDS = ("testbed", "vm")


def _state_paths(directory: Path) -> list[Path]:
    if not directory.exists():
        return []
    return sorted(p for kind in RUN_KINDS for p in directory.glob(f"{kind}-*.json"))


class StateFile:
    """The PIDs one run started, and its scratch directory, kept on disk until its teardown finishes.
    vm.run writes the same format itself (vm imports nothing of the project): keep the two in step."""

    def __init__(self, directory: Path = STATE_DIR, workdir: Path | None = None, kind: str = "testbed"):
        if kind not in RUN_KINDS:
            raise ValueError(f"unknown run kind {kind!r}; known: {', '.join(RUN_KINDS)}")
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"{kind}-{os.getpid()}.json"
        self.workdir = workdir
        self._entries: list[dict] = []
        self._write()

    def add(self, pid: int, what: str) -> None:
        """Record a process we started (its start time guards against PID reuse)."""
        self._entries.append({"pid": pid, "what": what, "started": start_time(pid)})
        self._write()

    def _write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        owner = os.getpid()
        state = {"owner": owner, "owner_started": start_time(owner), "procs": self._entries}
        if self.workdir is not None:
            state["workdir"] = str(self.workdir)
        tmp.write_text(json.dumps(state))
        tmp.replace(self.path)

    def remove(self) -> None:
        """Forget the run (after a complete teardown)."""
        self.path.unlink(missing_ok=True)


def _owner_alive(state: dict) -> bool:
    owner = state.get("owner")
    return bool(owner) and owner != os.getpid() and is_same_process(owner, state.get("owner_started"))


def _kill_recorded(entry: dict) -> bool:
    if not is_same_process(entry["pid"], entry.get("started")):
        return False  # gone, or the PID now belongs to someone else
    log.info("killing leftover %s (pid %d)", entry["what"], entry["pid"])
    try:
        os.kill(entry["pid"], signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


def _iptables_rules() -> list[list[str]]:
    out = subprocess.run(["iptables", "-S", "FORWARD"], capture_output=True, text=True)
    rules = []
    for line in out.stdout.splitlines():
        if f"--comment {IPTABLES_COMMENT}" in line and line.startswith("-A "):
            rules.append(line.split()[1:])
    return rules


def kill_leftovers(directory: Path = STATE_DIR) -> tuple[list[str], list[int]]:
    """Kill the recorded processes of every run that died without teardown, forgetting those runs;
    returns (a line per process killed or run skipped, the PIDs of runs still alive)."""
    removed, live = [], []
    for path in _state_paths(directory):
        state = json.loads(path.read_text())
        if _owner_alive(state):
            removed.append(f"skipped {path.name}: its run (pid {state['owner']}) is still alive")
            live.append(state["owner"])
            continue
        removed += [f"process {e['what']} (pid {e['pid']})" for e in state["procs"] if _kill_recorded(e)]
        removed += _remove_workdir(state.get("workdir"))
        path.unlink()
    return removed, live


def _remove_workdir(recorded: str | None) -> list[str]:
    """A dead run's scratch directory (the emulator's control socket, temporary configs), if it is one of
    ours: directly in the system's temporary directory, named with WORKDIR_PREFIX."""
    if not recorded:
        return []
    path = Path(recorded)
    if path.parent != Path(tempfile.gettempdir()) or not path.name.startswith(WORKDIR_PREFIX) or not path.is_dir():
        return []
    if _mounts_under(path):  # never delete through a mount (a VM run's view of the host root is one)
        return [f"work directory {path} left alone: mounts under it ({', '.join(_mounts_under(path))})"]
    shutil.rmtree(path, ignore_errors=True)
    return [f"work directory {path}"]


def _mounts_under(path: Path) -> list[str]:
    """Mount points at or below path in this process's mount namespace."""
    text = Path("/proc/self/mounts").read_text()
    points = [line.split()[1].encode().decode("unicode_escape") for line in text.splitlines() if line.strip()]
    return [m for m in points if m == str(path) or m.startswith(f"{path}/")]


def live_runs(directory: Path = STATE_DIR) -> list[int]:
    """The owner PIDs of the runs recorded in directory that are still alive."""
    states = _state_paths(directory)
    return [s["owner"] for s in (json.loads(p.read_text()) for p in states) if _owner_alive(s)]


def clean(directory: Path = STATE_DIR) -> list[str]:
    """Remove what crashed runs left; return a line per thing removed. While a run is alive (recorded in
    directory, or in the machine's STATE_DIR when directory is another one), the testbed's links and
    rules are its own (only one topology exists at a time): left alone."""
    removed, live = kill_leftovers(directory)
    if directory != STATE_DIR:
        live += live_runs(STATE_DIR)
    if live:
        return removed + [f"links and iptables rules left alone: run {', '.join(map(str, live))} is alive"]
    time.sleep(0.2)  # let killed namespace holders release their interfaces
    for name in prefixed_links():
        subprocess.run(["ip", "link", "del", name], capture_output=True)
        removed.append(f"link {name}")
    for rule in _iptables_rules():
        subprocess.run(["iptables", "-D", *rule], capture_output=True)
        removed.append(f"iptables rule {' '.join(rule)}")
    return removed


def prefixed_links() -> list[str]:
    """Root-namespace links carrying the testbed prefix (bridges and their ports)."""
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    names = [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]
    return [n for n in names if n.startswith(f"{naming.PREFIX}-")]


NOTHING = {"links": [], "state_files": [], "live_recorded_pids": [], "iptables": []}


def leftovers(directory: Path = STATE_DIR) -> dict:
    """Everything a testbed could have left on this machine (all empty after a clean teardown)."""
    states = _state_paths(directory)
    entries = [e for s in states for e in json.loads(s.read_text())["procs"]]
    return {
        "links": prefixed_links(),
        "state_files": [s.name for s in states],
        "live_recorded_pids": [e["pid"] for e in entries if is_same_process(e["pid"], e.get("started"))],
        "iptables": _iptables_rules(),
    }
