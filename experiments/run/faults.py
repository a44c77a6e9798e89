"""Playing one variant's faults: a thread that kills, stops and resumes, or floods each target when due.

Responsible for: `FaultPlayer`: each fault of the spec (experiments.spec.faults) played when due, on its clock
or on an event cue, through the callables the runner gives it (SIGKILL; SIGSTOP then SIGCONT duration_s later,
always resumed; a hostile KV peer started and stopped by PID), and the record of what it did, for
metadata.json; `actions`: those callables for a testbed and its roles.
Not responsible for: what a fault is (experiments.spec.faults), how a target is killed (the runtime's and
the testbed's kill by PID), the hostile peer itself (experiments.run.hostile_peer), or what the system makes
of it (the analysis counts the failures by cause).
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from experiments.run import deploy
from experiments.spec.deployment import KV_PORTS, role_of
from experiments.spec.faults import Fault

log = logging.getLogger(__name__)
CUE_POLL_S = 0.005  # how often the roles' event logs are read for a fault's cue
PEER_GRACE_S = 5.0  # a hostile peer past its duration: SIGTERM, then SIGKILL after this

Signal = Callable[[str, int], "int | None"]  # (target, signal number) -> the PID signalled (None: not running)
Hostile = Callable[[str, float], subprocess.Popen]  # (target, duration_s) -> the hostile peer started


class FaultPlayer:
    """Plays one variant's faults from t0_ns (time.monotonic_ns()).

    killers: target -> a callable that SIGKILLs it and returns the PID killed (None: nothing was running)
    events_dir: the variant's event logs (<worker>.jsonl), read for the faults' `after` cues
    signal: sends a signal to a role's process (stop faults: SIGSTOP, then SIGCONT)
    hostile: starts a hostile KV peer against a role for duration_s (hostile_kv faults)
    records: one dict per fault once played (kill | stop | hostile_kv: its target, at_s, offset_s, pid, or
      error; the cue's event; a stop's resumed and resumed_offset_s; a peer's exit and summary), for
      metadata.json
    """

    def __init__(
        self,
        faults: tuple[Fault, ...],
        t0_ns: int,
        killers: dict[str, Callable[[], int | None]],
        events_dir: Path | None = None,
        signal: Signal | None = None,
        hostile: Hostile | None = None,
    ):
        self.faults, self.t0_ns, self.killers, self.events_dir = faults, t0_ns, killers, events_dir
        self.signal, self.hostile = signal, hostile
        self.records: list[dict] = []
        self._played: set[int] = set()  # ids of the faults played
        self._ends: list[tuple[int, Callable[[bool], None]]] = []  # (due ns, what ends a stop or a peer: now?)
        self._ends_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._play, name="faults", daemon=True)

    def start(self) -> FaultPlayer:
        if self.faults:
            self._thread.start()
        return self

    def stop(self) -> list[dict]:
        """Stop playing: every stopped role resumed and every hostile peer ended now; faults not yet due
        recorded as not played; the records."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        self._run_ends(None)
        for f in self.faults:
            if id(f) not in self._played:
                self.records.append({f.kind: f.target, "at_s": f.at_s, "played": False})
        return self.records

    def _play(self) -> None:
        for f in self.faults:
            due_ns = self.t0_ns + int(f.at_s * 1e9)
            if not self._wait_until(due_ns):
                return
            record = {f.kind: f.target, "at_s": f.at_s, "played": True}
            if f.kind != "kill":
                record["duration_s"] = f.duration_s
            if f.after:
                cue = self._await_event(f.after, due_ns)
                if cue is None:
                    return
                record["after"] = {k: cue.get(k) for k in ("event", "worker", "request_id", "t_ns")}
            try:
                end = {"kill": self._kill, "stop": self._sigstop, "hostile_kv": self._flood}[f.kind](f, record)
            except Exception as err:  # noqa: BLE001 — a fault that could not be played is recorded, not raised
                record["error"] = f"{type(err).__name__}: {err}"
                end = None
            t = time.monotonic_ns()
            record.update(t_ns=t, offset_s=self._offset(t))
            if end is not None:
                with self._ends_lock:
                    self._ends.append((t + int(f.duration_s * 1e9), end))
            log.warning("fault: %s %s at %.1f s (pid %s)", f.kind, f.target, record["offset_s"], record.get("pid"))
            self.records.append(record)
            self._played.add(id(f))
        self._wait_until(None)

    def _offset(self, t_ns: int) -> float:
        return round((t_ns - self.t0_ns) / 1e9, 3)

    def _kill(self, f: Fault, record: dict) -> None:
        record["pid"] = self.killers[f.kill]()

    def _sigstop(self, f: Fault, record: dict) -> Callable[[bool], None] | None:
        """SIGSTOP the role; what SIGCONTs it (recorded in place: resumed, resumed_t_ns, resumed_offset_s)."""
        if self.signal is None:
            raise RuntimeError("this runtime cannot signal a role's process")
        pid = record["pid"] = self.signal(f.stop, signal.SIGSTOP)
        if pid is None:
            return None

        def resume(now: bool) -> None:
            try:
                record["resumed"] = self.signal(f.stop, signal.SIGCONT) == pid
            except Exception as err:  # noqa: BLE001 — recorded: the role stays stopped
                record.update(resumed=False, resume_error=f"{type(err).__name__}: {err}")
            t = time.monotonic_ns()
            record.update(resumed_t_ns=t, resumed_offset_s=self._offset(t))
            log.warning("fault: %s resumed at %.1f s (pid %s)", f.stop, record["resumed_offset_s"], pid)

        record["resumed"] = False
        return resume

    def _flood(self, f: Fault, record: dict) -> Callable[[bool], None]:
        """Start the hostile peer; what ends it (when due: its own exit, awaited PEER_GRACE_S; then, or at once when
        the player stops, SIGTERM and SIGKILL after PEER_GRACE_S) and records its exit status and its summary
        line (experiments.run.hostile_peer)."""
        if self.hostile is None:
            raise RuntimeError("no hostile KV peer can be started here")
        proc = self.hostile(f.hostile_kv, f.duration_s)
        record["pid"] = proc.pid

        def end(now: bool) -> None:
            out = None
            if not now:  # due: it ends by itself after duration_s (counted from its own start)
                try:
                    out, _ = proc.communicate(timeout=PEER_GRACE_S)
                except subprocess.TimeoutExpired:
                    pass
            if out is None:
                proc.terminate()
                try:
                    out, _ = proc.communicate(timeout=PEER_GRACE_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    out, _ = proc.communicate()
            t = time.monotonic_ns()
            record.update(exit=proc.returncode, ended_t_ns=t, ended_offset_s=self._offset(t))
            lines = (out or "").strip().splitlines()
            try:
                record["peer"] = json.loads(lines[-1]) if lines else None
            except ValueError:
                record["peer"] = {"output": lines[-1][-300:]}

        return end

    def _run_ends(self, until_ns: int | None) -> None:
        """Run the ends due by until_ns (None: all of them, now: the player stops), each once."""
        while True:
            with self._ends_lock:
                due = [e for e in self._ends if until_ns is None or e[0] <= until_ns]
                if not due:
                    return
                first = min(due, key=lambda e: e[0])
                self._ends.remove(first)
            first[1](until_ns is None)

    def _wait_until(self, due_ns: int | None) -> bool:
        """Wait until due_ns (None: until every end ran), running the ends that fall due meanwhile; False once
        stopped first."""
        while not self._stop.is_set():
            with self._ends_lock:
                next_end = min((e[0] for e in self._ends), default=None)
            if next_end is None and due_ns is None:
                return True
            until = min(t for t in (next_end, due_ns) if t is not None)
            if self._stop.wait(max(0.0, (until - time.monotonic_ns()) / 1e9)):
                return False
            self._run_ends(time.monotonic_ns())
            if due_ns is not None and time.monotonic_ns() >= due_ns:
                return True
        return False

    def _await_event(self, name: str, since_ns: int) -> dict | None:
        """The first event `name` (final, where it says) any role logged at or after since_ns; None once
        stopped first. Reads each log from where it last stopped (a line still being written waits); the
        ends that fall due meanwhile run."""
        offsets: dict[Path, int] = {}
        while not self._stop.is_set():
            for path in sorted(self.events_dir.glob("*.jsonl")) if self.events_dir else ():
                with open(path, "rb") as fh:
                    fh.seek(offsets.get(path, 0))
                    for line in iter(fh.readline, b""):
                        if not line.endswith(b"\n"):
                            break
                        offsets[path] = offsets.get(path, 0) + len(line)
                        if name.encode() not in line:
                            continue
                        e = json.loads(line)
                        if e.get("event") == name and e.get("t_ns", 0) >= since_ns and e.get("final", True):
                            return e
            self._run_ends(time.monotonic_ns())
            self._stop.wait(CUE_POLL_S)
        return None


def actions(tb, runtime) -> dict:
    """FaultPlayer's signal and hostile for a testbed and its roles (a runtime without `signal`, e.g. Ray's:
    no stop): the hostile peer runs in the client host, against the target's first worker's KV port."""

    def hostile(target: str, duration_s: float) -> subprocess.Popen:
        name = next((w for w in runtime.workers if w == target or role_of(w) == target), target)
        host = runtime.address(name).rsplit(":", 1)[0]
        argv = [sys.executable, "-m", "experiments.run.hostile_peer", host, str(KV_PORTS[role_of(name)])]
        return tb.popen(
            "client",
            [*argv, str(duration_s)],
            cwd=deploy.REPO,
            env=deploy.worker_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    return {"signal": getattr(runtime, "signal", None), "hostile": hostile}
