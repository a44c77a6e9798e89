"""JSON-lines event logs, one file per worker, on the shared monotonic clock.

Responsible for: appending one JSON object per line, thread-safely, flushed at
once so a killed process leaves a readable log; reading a log back; `NAMES`,
every event name a role writes, with what it means (the roles and the analysis
share it; tests/unit/test_event_names.py fails on a name missing from it, or
one nobody writes).
Not responsible for: deciding what to record (each role does; the KV data
plane below them writes its kv_* events through an EventLog, which is its
EventSink: workers/kvwire/seam.py) or analysis.

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

# Every event name, by the role that writes it, and what it means (its fields: the emitting code).
NAMES: dict[str, str] = {
    # every role, once, as its process ends (workers/roles/server.py record_cpu; none after a SIGKILL)
    "role_cpu": "the role's process stopped: its CPU time (user, system; before and since serving), its age, and "
    "a modelled engine's pace (modelled time, and how late its passes ended)",
    # router
    "arrival": "a client's request reached the router",
    "rejected": "the router refused the request (bad input, no capacity)",
    "route": "the route decided, with its inputs (DRC estimate, WAN estimate, mode)",
    "wan_blocked": "a singular request is kept off the WAN: decoded on the RLD alone (KV bytes saved)",
    "drc_lookup_failed": "the router's mirror of the MD's DRC could not answer",
    "session_open": "a decode session accepted the request (worker, its cached tokens)",
    "prefill_reply": "P's answer came back: the first token",
    "first_token": (
        "the first token streamed (router: to the client; decode worker: by it, once a request: index 0, or an MD's"
        " first after a handoff)"
    ),
    "route_fallback": "the request left its route for another (from_route, to_route, reason)",
    "resumed_on_rld": "the MD's stream failed after tokens: the rest decodes on the RLD from the client's tokens",
    "source_failed": "a decode stream the router read from failed (source, reason)",
    "cancel_failed": "cancelling a worker's part of the request failed",
    "drc_learned": "the router's DRC mirror learnt what the MD now holds (tokens, cause)",
    "complete": "the request's last token reached the client (route, duplicates dropped)",
    "failed": "the request ended without its tokens (status code, reason)",
    # P
    "prefill_arrival": "P received a prefill and the targets its KV goes to",
    "drc_query": "P asked the MD's DRC where the WAN copy may start (cached tokens)",
    "drc_query_failed": "that question got no answer: the whole prompt goes",
    "prefill_start": "a prefill began (P, or a decode worker prefilling locally)",
    "prefill_done": "a prefill ended (cached and computed tokens, first token)",
    "prefill_step": (
        "P: one engine step of chunked prefill (the prompts whose chunks shared it; lone_tail: a prompt's last, "
        "short chunk ran alone)"
    ),
    # the KV data plane (sender on P, receiver on RLD and MD)
    "kv_send_start": "a KV transfer began on a path (bytes, connections, congestion control)",
    "kv_progress": "a KV transfer's bytes sent so far",
    "kv_tcp_info": "TCP_INFO of a KV connection (the kernel's view: cwnd, RTT, retransmits)",
    "kv_send_retry": "a KV transfer's connection failed; it resumes on a new one",
    "kv_congestion_refused": "the congestion control asked for was refused by the kernel; another is used",
    "kv_send_cancelled": "a KV transfer was cancelled before it ended (reason)",
    "kv_send_end": "a KV transfer delivered every byte",
    "kv_send_cancelled_end": "a cancelled KV transfer's sender ended",
    "kv_send_failed": "a KV transfer gave up (reason)",
    "kv_conn_refused": "the receiver refused a KV connection (peer, reason)",
    "kv_conn_error": "a KV connection broke at the receiver",
    "kv_frame_error": "a KV frame failed its checks (checksum, bounds): the connection is dropped",
    "kv_recv_begin": "the receiver began a transfer (its range and bytes)",
    "kv_recv_resume": "a resumed transfer continues from the chunks already held",
    "kv_recv_end": "the receiver holds a whole transfer",
    "kv_recv_cancelled": "a transfer being received was cancelled by its sender",
    "kv_recv_dropped": "a transfer being received was dropped (reason)",
    "kv_recv_orphaned": "a transfer whose session is gone was discarded",
    # decode workers (RLD and MD)
    "decode_arrival": "a decode session was asked for",
    "decode_open": "a decode session opened (cached tokens, where its KV comes from)",
    "kv_room_wait": (
        "the cache was full for now: the session (decode worker) or the prompt (P, queued behind `ahead` others) "
        "opens once others' ends free room"
    ),
    "kv_room_ready": "a session or a prompt that waited for room opened (how long it waited: wait_ns)",
    "drc_inflight": "a session waits for the prefix another session is still bringing",
    "drc_inflight_ready": "that prefix landed: the session opens on it",
    "prefix_lost": "the prefix waited for was not left in the DRC: the session is not opened on it",
    "kv_imported": "a KV range was imported into the session's cache",
    "kv_timeout": "the session's KV did not come in time",
    "md_ready": "the RLD heard from the MD that it holds the prompt's KV (KVReady)",
    "decode_done": "a session decoded its last token (steps, mean batch)",
    "decode_step_mixed": "a step that carried chunks of a local prefill or an extend (which requests, chunk and "
    "decode tokens, duration): the sessions decoded on meanwhile",
    "decode_close": "a decode session closed (tokens generated, cancelled or not)",
    # the handoff (RLD sends, MD receives)
    "kv_ready_sent": "the MD told its relay (the RLD) that it holds the prompt's KV",
    "handoff_start": "the RLD began handing over (mode, start index, tokens, payload)",
    "handoff_end": "a handoff step ended at the RLD (final or not, duration, MD's extend time)",
    "handoff_failed": "the handoff could not be made: the RLD decodes to the end",
    "handoff_recv_start": "the MD received a handoff step",
    "handoff_recv_end": "the MD absorbed a handoff step (extend time)",
    "extend": "the MD recomputed handed-over tokens (engine steps it took: chunked or whole, its time)",
    "handoff_diverged": "a handed-over token differs from the MD's own at that index",
    "completed_on_rld": "the RLD decoded the request to its end (reason: md_never_ready, finished_first, ...)",
    "relay_output": "the MD received the RLD's whole output (a request the RLD finished alone)",
    "relay_output_sent": "the RLD sent its whole output to the MD",
    "relay_output_failed": "sending it failed",
    "relay_absorbed": "the MD recomputed the RLD's output, so its DRC keeps prompt + output (steps, time)",
    "relay_absorb_failed": "it could not (diverged, no room): the MD keeps the prompt alone",
    "relay_done": "the relay finished the request alone (reason)",
    "relay_lost": "the relay is gone: the MD decodes alone",
}


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
