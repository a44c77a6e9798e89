"""JSON-lines event logs, one file per worker, on the shared monotonic clock.

Responsible for: appending one JSON object per line, thread-safely, flushed at
once so a killed process leaves a readable log; reading a log back.
Not responsible for: deciding what to record (each role does) or analysis.

Line format: {"t_ns": int, "worker": str, "role": str, "event": str,
"request_id": str | null, ...event fields}. t_ns is time.monotonic_ns():
CLOCK_MONOTONIC is shared by every process and network namespace of a host,
so events of different workers order correctly. Fields carry units in their
names (kv_bytes, duration_ns).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Event:
    t_ns: int
    worker: str
    role: str
    event: str
    request_id: str | None
    fields: dict[str, Any]


class EventLog:
    """path: the .jsonl file (appended); worker, role: written on every line."""

    def __init__(self, path: Path | str, worker: str, role: str):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.worker = worker
        self.role = role
        self._lock = threading.Lock()
        self._file = open(self.path, "a", buffering=1)

    def emit(self, event: str, request_id: str | None = None, t_ns: int | None = None, **fields: Any) -> int:
        """Append one event; returns its t_ns."""
        t = time.monotonic_ns() if t_ns is None else t_ns
        line = json.dumps(
            {"t_ns": t, "worker": self.worker, "role": self.role, "event": event, "request_id": request_id, **fields},
            separators=(",", ":"),
        )
        with self._lock:
            if not self._file.closed:
                self._file.write(line + "\n")
        return t

    def close(self) -> None:
        with self._lock:
            self._file.close()


class NullLog(EventLog):
    """An EventLog that records nothing (benchmarks, unit tests)."""

    def __init__(self, worker: str = "-", role: str = "-"):
        self.worker, self.role = worker, role

    def emit(self, event: str, request_id: str | None = None, t_ns: int | None = None, **fields: Any) -> int:
        return time.monotonic_ns() if t_ns is None else t_ns

    def close(self) -> None:
        pass


def read_events(path: Path | str) -> list[Event]:
    """Every event of one log, in file order; a torn last line (killed writer) is skipped."""
    out = []
    for line in Path(path).read_text().splitlines():
        try:
            d = json.loads(line)
        except json.JSONDecodeError:
            log.warning("%s: skipping torn line %r", path, line[:80])
            continue
        out.append(Event(d.pop("t_ns"), d.pop("worker"), d.pop("role"), d.pop("event"), d.pop("request_id"), d))
    return out
