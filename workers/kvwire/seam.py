"""What the KV data plane asks of whoever uses it: the settings of a path, and a sink for its events.

Responsible for: `SendSettings` (how one path sends a transfer: connections,
congestion control, frame size, the stall rule's floor, retries, deadline,
progress interval, kept connections) and the `EventSink` protocol (the one
method the sender and receiver call to record an event).
Not responsible for: where the values come from or where the events go. The
roles validate their config and build SendSettings from a path's PathConfig
(`PathConfig.send_settings`, workers/roles/config.py); their EventLog
(workers/roles/events.py, where every event name is registered) is an
EventSink. The data plane imports nothing of the roles above it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class SendSettings:
    """How one path sends a transfer. No defaults here: the roles' PathConfig holds them, with their ranges."""

    connections: int  # parallel TCP connections per transfer
    congestion: str  # TCP_CONGESTION per socket; "default": the kernel's
    frame_bytes: int  # target KV payload per LAYER frame (bytes): bounds memory and interleaves connections
    stall_timeout_ms: int  # the stall rule's floor (watch.py); also the handshake's and a late reply's limit
    max_retries: int  # new attempts after a broken or stalled connection
    deadline_ms: int  # the transfer gives up after this long
    progress_interval_ms: int  # at most one kv_progress event per transfer per interval
    persistent: bool  # take connections from the pool and give them back (no handshake per transfer)


class EventSink(Protocol):
    """Where the data plane's events go (kv_send_start, kv_tcp_info, kv_recv_end, ...)."""

    def emit(self, event: str, request_id: str | None = None, **fields: Any) -> object: ...  # one event, now
