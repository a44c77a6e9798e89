"""Playing one variant's faults: a thread that SIGKILLs each target when due, on its clock or on an event cue.

Responsible for: `FaultPlayer`: each fault of the spec (experiments.spec.faults) killed when due through the
callable the runner gives it, watching the roles' event logs for a cue, and the record of what it did, for
metadata.json.
Not responsible for: what a fault is (experiments.spec.faults), how a target is killed (the runtime's and
the testbed's kill by PID), or what the system makes of it (the analysis counts the failures by cause).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from experiments.spec.faults import Fault

log = logging.getLogger(__name__)
CUE_POLL_S = 0.005  # how often the roles' event logs are read for a fault's cue


class FaultPlayer:
    """Plays one variant's faults from t0_ns (time.monotonic_ns()).

    killers: target -> a callable that SIGKILLs it and returns the PID killed (None: nothing was running)
    events_dir: the variant's event logs (<worker>.jsonl), read for the faults' `after` cues
    records: one dict per fault once played (kill, at_s, offset_s, pid, or error; the cue's event), for
      metadata.json
    """

    def __init__(
        self,
        faults: tuple[Fault, ...],
        t0_ns: int,
        killers: dict[str, Callable[[], int | None]],
        events_dir: Path | None = None,
    ):
        self.faults, self.t0_ns, self.killers, self.events_dir = faults, t0_ns, killers, events_dir
        self.records: list[dict] = []
        self._played: set[int] = set()  # ids of the faults played
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._play, name="faults", daemon=True)

    def start(self) -> FaultPlayer:
        if self.faults:
            self._thread.start()
        return self

    def stop(self) -> list[dict]:
        """Stop playing (faults not yet due are recorded as not played); the records."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        for f in self.faults:
            if id(f) not in self._played:
                self.records.append({"kill": f.kill, "at_s": f.at_s, "played": False})
        return self.records

    def _play(self) -> None:
        for f in self.faults:
            due_ns = self.t0_ns + int(f.at_s * 1e9)
            if self._stop.wait(max(0.0, (due_ns - time.monotonic_ns()) / 1e9)):
                return
            record = {"kill": f.kill, "at_s": f.at_s, "played": True}
            if f.after:
                cue = self._await_event(f.after, due_ns)
                if cue is None:
                    return
                record["after"] = {k: cue.get(k) for k in ("event", "worker", "request_id", "t_ns")}
            try:
                record["pid"] = self.killers[f.kill]()
            except Exception as err:  # noqa: BLE001 — a fault that could not be played is recorded, not raised
                record["error"] = f"{type(err).__name__}: {err}"
            t = time.monotonic_ns()
            record.update(t_ns=t, offset_s=round((t - self.t0_ns) / 1e9, 3))
            log.warning("fault: %s killed at %.1f s (pid %s)", f.kill, record["offset_s"], record.get("pid"))
            self.records.append(record)
            self._played.add(id(f))

    def _await_event(self, name: str, since_ns: int) -> dict | None:
        """The first event `name` (final, where it says) any role logged at or after since_ns; None once
        stopped first. Reads each log from where it last stopped (a line still being written waits)."""
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
            self._stop.wait(CUE_POLL_S)
        return None
