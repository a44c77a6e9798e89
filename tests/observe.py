"""What a run left on this machine, observed with the system's own tools (ps, ip, iptables), never with the
testbed's bookkeeping: the acceptance of `make clean` after a SIGKILLed run."""

from __future__ import annotations

import subprocess
from pathlib import Path


def process_tree(root: int) -> list[int]:
    """root's descendants now (ps), root excluded."""
    rows = [
        line.split()
        for line in subprocess.run(["ps", "-eo", "pid=,ppid="], capture_output=True, text=True).stdout.splitlines()
    ]
    children: dict[int, list[int]] = {}
    for pid, ppid in rows:
        children.setdefault(int(ppid), []).append(int(pid))
    out, todo = [], [root]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def running(pids: list[int]) -> list[int]:
    """Those of pids that ps still shows alive (zombies, which hold nothing, excepted)."""
    if not pids:
        return []
    out = subprocess.run(["ps", "-o", "pid=,stat=", "-p", ",".join(map(str, pids))], capture_output=True, text=True)
    return [int(p) for p, stat in (line.split() for line in out.stdout.splitlines()) if not stat.startswith("Z")]


def left_behind(pids: list[int], workdir: str | None = None) -> dict:
    """Processes of pids still running, root-namespace links named pdd-*, FORWARD rules commented pddlab,
    and whether workdir still exists: all empty / False once a run is gone."""
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    rules = subprocess.run(["iptables", "-S", "FORWARD"], capture_output=True, text=True).stdout
    return {
        "processes": running(pids),
        "links": [line.split(":")[1].strip() for line in links.splitlines() if ": pdd-" in line],
        "iptables": [line for line in rules.splitlines() if "pddlab" in line],
        "workdir": bool(workdir) and Path(workdir).exists(),
    }


NOTHING_LEFT = {"processes": [], "links": [], "iptables": [], "workdir": False}
