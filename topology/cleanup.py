"""Leftovers of crashed runs: recording what a run started, and removing it later.

Responsible for: a per-run state file listing the PIDs (with their command
lines) that a testbed started, and `clean()`, which removes what a run that
died without teardown left behind — by its own PIDs, links carrying the
testbed prefix, and iptables rules carrying the testbed comment.
Not responsible for: the normal teardown (`topology.net.Testbed.stop`).

Nothing is ever killed by name: a PID is signalled only if it is listed in a
state file and its command line still matches what was recorded.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import time
from pathlib import Path

from topology import naming

log = logging.getLogger(__name__)
STATE_DIR = Path("/run/pddlab")
IPTABLES_COMMENT = "pddlab"


def _cmdline(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return None


class StateFile:
    """The PIDs one testbed started, kept on disk until its teardown finishes."""

    def __init__(self, directory: Path = STATE_DIR):
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"testbed-{os.getpid()}.json"
        self._entries: list[dict] = []

    def add(self, pid: int, what: str) -> None:
        """Record a process we started (its command line guards against PID reuse)."""
        self._entries.append({"pid": pid, "what": what, "cmdline": _cmdline(pid)})
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"owner": os.getpid(), "procs": self._entries}))
        tmp.replace(self.path)

    def remove(self) -> None:
        """Forget the run (after a complete teardown)."""
        self.path.unlink(missing_ok=True)


def _owner_alive(state: dict) -> bool:
    owner = state.get("owner")
    return bool(owner) and owner != os.getpid() and _cmdline(owner) is not None


def _kill_recorded(entry: dict) -> bool:
    pid, recorded = entry["pid"], entry.get("cmdline")
    if recorded is None or _cmdline(pid) != recorded:
        return False  # gone, or the PID now belongs to someone else
    log.info("killing leftover %s (pid %d)", entry["what"], pid)
    os.kill(pid, signal.SIGKILL)
    return True


def _iptables_rules() -> list[list[str]]:
    out = subprocess.run(["iptables", "-S", "FORWARD"], capture_output=True, text=True)
    rules = []
    for line in out.stdout.splitlines():
        if f"--comment {IPTABLES_COMMENT}" in line and line.startswith("-A "):
            rules.append(line.split()[1:])
    return rules


def clean(directory: Path = STATE_DIR) -> list[str]:
    """Remove what crashed runs left; return a line per thing removed."""
    removed = []
    for path in sorted(directory.glob("testbed-*.json")) if directory.exists() else []:
        state = json.loads(path.read_text())
        if _owner_alive(state):
            removed.append(f"skipped {path.name}: its run (pid {state['owner']}) is still alive")
            continue
        removed += [f"process {e['what']} (pid {e['pid']})" for e in state["procs"] if _kill_recorded(e)]
        path.unlink()
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
    states = sorted(directory.glob("testbed-*.json")) if directory.exists() else []
    entries = [e for s in states for e in json.loads(s.read_text())["procs"]]
    return {
        "links": prefixed_links(),
        "state_files": [s.name for s in states],
        "live_recorded_pids": [e["pid"] for e in entries if e.get("cmdline") and _cmdline(e["pid"]) == e["cmdline"]],
        "iptables": _iptables_rules(),
    }
