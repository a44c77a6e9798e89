"""Processes the project starts: run a command and raise with its stderr, end one by its PID, wait until
a server listens.

Responsible for: the three process chores every part of the testbed needs
(the topology, the userspace emulator, the calibration, the test helpers), so
that each is done one way: by the PID we started, never by name.
Not responsible for: where a command runs (callers prefix `ip netns exec` or
`mnexec` themselves).
"""

from __future__ import annotations

import logging
import subprocess
import time
from typing import Callable, Sequence

log = logging.getLogger(__name__)


def check_output(argv: Sequence[str], timeout_s: float | None = 60, error: type[Exception] = RuntimeError) -> str:
    """Run argv and return its stdout; raise `error` naming the command and its stderr when it fails."""
    argv = list(argv)
    log.debug("run: %s", " ".join(argv))
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise error(f"command failed ({proc.returncode}): {' '.join(argv)}: {proc.stderr.strip()}")
    return proc.stdout


def terminate(proc: subprocess.Popen, grace_s: float = 3.0) -> None:
    """End a process we started, by its PID: SIGTERM, then SIGKILL after a grace period; reap it."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(grace_s)


def reap(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """Wait for a process we started that should end on its own; terminate it if it lingers."""
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        terminate(proc)


def wait_listening(
    run: Callable[[list[str]], str],
    port: int,
    what: str,
    timeout_s: float = 15.0,
    alive: Callable[[], bool] = lambda: True,
) -> None:
    """Readiness: return once a TCP socket listens on port, as `ss` reports it where the server runs
    (`run` executes an argv there and returns its stdout). Raises RuntimeError after timeout_s or once
    alive() turns false (the server exited)."""
    deadline = time.monotonic() + timeout_s
    while f":{port} " not in run(["ss", "-Hltn", f"sport = :{port}"]) + " ":
        if not alive():
            raise RuntimeError(f"{what}: the server exited before listening on port {port}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: nothing listens on port {port} after {timeout_s} s")
        time.sleep(0.02)
