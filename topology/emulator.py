"""The client side of the userspace link emulator: start, drive, read and stop its forwarder process.

Responsible for: `UserspaceEmulator` (starting `python -m topology.userspace`
in the wire's namespace, the readiness ping, live parameter changes, counters
and health over the JSON-lines control socket, stopping it by its PID),
`control_request`, and `health_between`: the forwarder's health over a window.
Not responsible for: the forwarder itself (topology.userspace) or netem's
per-packet decisions (topology.netem_model).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Sequence

from topology.netem_model import lateness_between
from topology.proc import terminate
from topology.profiles import DIRECTIONS, LinkParams
from topology.userspace import READY_POLL_S, REPO_ROOT, DirectionStats, EmulatorError, emulator_cmd

log = logging.getLogger(__name__)


def control_request(path: str | Path, request: dict[str, Any], timeout_s: float = 5.0) -> dict[str, Any]:
    """Send one request to a control socket and return the decoded reply."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect(str(path))
        sock.sendall(json.dumps(request).encode() + b"\n")
        reply = b""
        while not reply.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                raise EmulatorError(f"control socket {path} closed without a reply to {request}")
            reply += chunk
    return json.loads(reply)


LATE_P99_US = 1000.0  # a window whose p99 lateness exceeds this measured the machinery, not the link


def health_between(before: dict[str, Any] | None, after: dict[str, Any]) -> dict[str, Any]:
    """The forwarder's health over a window between two `UserspaceEmulator.health()` snapshots (pure):
    per direction frames sent, lateness p50/p99/max (us) and frames dropped for lack of CPU (the kernel's
    socket buffer overflowed: rx_drops; the wire refused them: tx_errors); its CPU share; and `late`:
    some direction's p99 lateness above LATE_P99_US."""
    before = before or {}
    out: dict[str, Any] = {}
    for d in DIRECTIONS:
        lat = lateness_between((before.get("lateness") or {}).get(d), after["lateness"][d])
        old = (before.get("drops") or {}).get(d, {})
        out[d] = {**lat, **{k: v - old.get(k, 0) for k, v in after["drops"][d].items()}}
    span_s = (after["t_ns"] - before.get("t_ns", after["t_ns"])) / 1e9
    out["cpu_share"] = round((after["cpu_s"] - before.get("cpu_s", 0.0)) / span_s, 3) if span_s > 0 else None
    out["late"] = any((out[d]["p99_us"] or 0) > LATE_P99_US for d in DIRECTIONS)
    out["scheduling"] = after.get("scheduling")  # "fifo:<priority>" or "other" (None: an older forwarder)
    return out


class UserspaceEmulator:
    """Starts the forwarder process, drives it over its control socket, stops it."""

    def __init__(
        self,
        if_a: str,
        if_b: str,
        a_to_b: LinkParams,
        b_to_a: LinkParams,
        control_path: str | Path,
        seed: int = 0,
        prefix: Sequence[str] = (),
        log_path: str | Path | None = None,
        ready_timeout_s: float = 10.0,
        cpu: int | None = None,
    ):
        """if_a/if_b: wire interfaces (in the namespace `prefix` enters);
        a_to_b/b_to_a: initial impairments; control_path: UNIX socket path;
        seed: random seed; prefix: command prefix, e.g. ["ip", "netns", "exec", "NS"]
        or ["mnexec", "-a", PID]; log_path: file for the process's stderr (None: inherit);
        ready_timeout_s: how long to wait for the first ping answer (s); cpu: the one core the forwarder runs on
        (None: any)."""
        self.cmd = emulator_cmd(if_a, if_b, control_path, seed, a_to_b, b_to_a, prefix, cpu=cpu)
        self.control_path = Path(control_path)
        self.log_path = Path(log_path) if log_path else None
        self.ready_timeout_s = ready_timeout_s
        self.proc: subprocess.Popen | None = None
        self._log_file = None

    @property
    def pid(self) -> int | None:
        """PID of the forwarder (prefixes like `ip netns exec` exec into it)."""
        return self.proc.pid if self.proc else None

    def start(self) -> "UserspaceEmulator":
        """Start the process and return once its control socket answers a ping."""
        self.control_path.unlink(missing_ok=True)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
        }
        self._log_file = open(self.log_path, "ab") if self.log_path else None
        log.info("starting: %s", " ".join(self.cmd))
        self.proc = subprocess.Popen(
            self.cmd, env=env, cwd=REPO_ROOT, stdin=subprocess.DEVNULL, stdout=self._log_file, stderr=self._log_file
        )
        self._wait_ready()
        log.info("userspace emulator ready (pid %d)", self.proc.pid)
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while True:
            if self.proc.poll() is not None:
                raise EmulatorError(
                    f"emulator exited with status {self.proc.returncode} before it was ready "
                    f"(see {self.log_path or 'stderr'}): {' '.join(self.cmd)}"
                )
            try:
                if self._request({"cmd": "ping"}, timeout_s=1.0).get("ok"):
                    return
            except (OSError, EmulatorError, json.JSONDecodeError):
                pass  # not listening yet
            if time.monotonic() > deadline:
                terminate(self.proc, 2.0)
                raise EmulatorError(f"emulator did not answer a ping within {self.ready_timeout_s} s")
            time.sleep(READY_POLL_S)

    def _request(self, request: dict[str, Any], timeout_s: float = 5.0) -> dict[str, Any]:
        return control_request(self.control_path, request, timeout_s)

    def _checked(self, request: dict[str, Any]) -> dict[str, Any]:
        if self.proc is None or self.proc.poll() is not None:
            raise EmulatorError("emulator is not running")
        reply = self._request(request)
        if not reply.get("ok"):
            raise EmulatorError(f"{request.get('cmd')}: {reply.get('error')}")
        return reply

    def set_params(self, direction: str, params: LinkParams) -> None:
        """Change one direction's impairments live (queued frames keep their times)."""
        self._checked({"cmd": "set", "direction": direction, "params": params.to_dict()})

    def stats(self) -> dict[str, DirectionStats]:
        """Counters per direction ("a_to_b", "b_to_a")."""
        reply = self._checked({"cmd": "stats"})
        return {d: DirectionStats(**reply[d]) for d in DIRECTIONS}

    def health(self) -> dict[str, Any]:
        """A snapshot of the forwarder's health (CPU seconds, lateness histograms, drops) for
        `health_between`; each one starts a new window's lateness maximum."""
        reply = self._checked({"cmd": "stats", "reset_recent": True})
        return {
            **reply["health"],
            "drops": {d: {k: reply[d].get(k, 0) for k in ("rx_drops", "tx_errors", "tx_retries")} for d in DIRECTIONS},
        }

    def stop(self, grace_s: float = 5.0) -> None:
        """Ask the process to stop; SIGTERM then SIGKILL its PID if it does not."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                self._request({"cmd": "stop"}, timeout_s=grace_s)
            except (OSError, EmulatorError, json.JSONDecodeError) as exc:
                log.warning("graceful stop failed (%s); terminating pid %d", exc, self.proc.pid)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                terminate(self.proc, 2.0)
        self.control_path.unlink(missing_ok=True)
        if self._log_file:
            self._log_file.close()
            self._log_file = None
        self.proc = None

    def __enter__(self) -> "UserspaceEmulator":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()
