"""Processes the project starts: run a command and raise with its stderr, end one by its PID, wait until
a server listens; and the stop signals a teardown must survive.

Responsible for: the three process chores every part of the testbed needs
(the topology, the userspace emulator, the calibration, the test helpers), so
that each is done one way: by the PID we started, never by name; SIGTERM and
SIGHUP turned into KeyboardInterrupt while a topology runs, and held while it
tears down (topology.net's Testbed).
Not responsible for: where a command runs (callers prefix `ip netns exec` or
`mnexec` themselves).
"""

from __future__ import annotations

import logging
import signal
import subprocess
import threading
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


# SIGHUP too: a dropped ssh session must tear the run down like Ctrl-C, not leave it half made.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class SigtermAsInterrupt:
    """Turns SIGTERM and SIGHUP into KeyboardInterrupt while active, so `finally` blocks tear down."""

    def __enter__(self):
        self._old = {sig: signal.signal(sig, self._raise) for sig in STOP_SIGNALS}
        return self

    @staticmethod
    def _raise(signum, frame):
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    def __exit__(self, *exc):
        for sig, handler in self._old.items():
            signal.signal(sig, handler)
        return False


class HeldDuringTeardown:
    """While tearing down, SIGINT, SIGTERM and SIGHUP are noted, not raised: a second Ctrl-C or a dropped
    session used to cut the teardown short, and the next run refused with "prefix busy". Raised once the
    teardown is done. Only the main thread can set handlers; elsewhere nothing changes."""

    SIGNALS = (signal.SIGINT, *STOP_SIGNALS)

    def __enter__(self):
        self.caught: list[int] = []
        self._old = {}
        if threading.current_thread() is threading.main_thread():
            self._old = {sig: signal.signal(sig, self._note) for sig in self.SIGNALS}
        return self

    def _note(self, signum, frame):
        self.caught.append(signum)
        log.warning("%s during teardown: the teardown finishes first", signal.Signals(signum).name)

    def __exit__(self, *exc):
        for sig, handler in self._old.items():
            signal.signal(sig, handler)
        if self.caught and exc[0] is None:
            raise KeyboardInterrupt(f"signal {signal.Signals(self.caught[0]).name} during teardown")
        return False
