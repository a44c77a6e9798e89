"""One data-plane connection watched through TCP_INFO: samples for the record, and the stall rule.

Responsible for: `kv_tcp_info` events (at an attempt's start and end and every
SAMPLE_INTERVAL_NS while it runs), the congestion control the socket really
uses, and deciding when a connection has stalled.
Not responsible for: sending (sender.py) or reading TCP_INFO (tcpinfo.py).

The stall rule. Under bursty loss TCP recovers by retransmission timeouts
that double each time (RTO backoff): 0.2, 0.4, 0.8 ... s without a byte
acknowledged is TCP working, not a dead path, and abandoning the connection
then throws its congestion state and every byte in flight away. So a
connection has stalled only when it owes bytes (unacknowledged or not yet
sent) and none was acknowledged for longer than
max(stall_timeout_ms, STALL_RTO_FACTOR x RTO + RTT), with the connection's
own current (backed-off) RTO and smoothed RTT. A connection that owes
nothing (it waits for the producer) never stalls.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Callable

from workers.kvwire.tcpinfo import TcpInfo, congestion_of, read_tcp_info

SAMPLE_INTERVAL_NS = 100_000_000  # one kv_tcp_info sample per connection per 100 ms while it works
STALL_RTO_FACTOR = 2  # the next retransmission is due within one RTO; its ACK within one more


def stall_limit_ns(stall_timeout_ms: int, info: TcpInfo | None) -> int:
    """How long a connection that owes bytes may go without an acknowledged byte (pure)."""
    floor = stall_timeout_ms * 1_000_000
    if info is None:
        return floor
    return max(floor, STALL_RTO_FACTOR * info.rto_us * 1000 + info.rtt_us * 1000)


def owes_bytes(info: TcpInfo | None) -> bool:
    """Bytes written but not acknowledged (in flight or still queued)."""
    return info is not None and (info.unacked > 0 or info.notsent_bytes > 0)


class ConnectionWatch:
    """sock: one connection of a transfer attempt; emit(**fields): records a kv_tcp_info event."""

    def __init__(
        self,
        sock: socket.socket,
        index: int,
        attempt: int,
        stall_timeout_ms: int,
        emit,
        observe: Callable[[TcpInfo], None] | None = None,
    ):
        self.sock, self.index, self.attempt = sock, index, attempt
        self.stall_timeout_ms = stall_timeout_ms
        self._emit, self._observe = emit, observe
        self._lock = threading.Lock()
        self.cc = congestion_of(sock)
        now = time.monotonic_ns()
        self.first = self.last = read_tcp_info(sock)
        self._acked = self.first.bytes_acked if self.first else 0
        self._progress_ns = now
        self._sample_ns = now
        self._record("start", self.first)

    def tick(self) -> TcpInfo | None:
        """Read TCP_INFO; note progress; a sample event when one is due."""
        info = read_tcp_info(self.sock)
        now = time.monotonic_ns()
        with self._lock:
            if info is None:
                return self.last
            if info.bytes_acked > self._acked or not owes_bytes(info):
                self._acked, self._progress_ns = info.bytes_acked, now
            self.last = info
            due = now - self._sample_ns >= SAMPLE_INTERVAL_NS
            if due:
                self._sample_ns = now
        if due:
            self._record("sample", info)
        return info

    def stalled(self) -> str:
        """'' while the connection is working (or owes nothing); else why it counts as stalled."""
        info = self.tick()
        limit = stall_limit_ns(self.stall_timeout_ms, info)
        with self._lock:
            idle = time.monotonic_ns() - self._progress_ns
        if not owes_bytes(info) or idle <= limit:
            return ""
        rto = f", RTO {info.rto_us / 1000:.0f} ms x{info.backoff} backoff" if info else ""
        return (
            f"stalled: nothing acknowledged for {idle / 1e6:.0f} ms (limit {limit / 1e6:.0f} ms{rto}; "
            f"{info.unacked if info else '?'} segments in flight, {info.notsent_bytes if info else '?'} "
            "bytes unsent)"
        )

    def all_acked(self) -> bool:
        return not owes_bytes(self.tick())

    def end(self) -> tuple[int, int, int]:
        """Record the last sample; (segments sent, segments retransmitted, bytes retransmitted) during
        this attempt."""
        info = read_tcp_info(self.sock) or self.last
        self._record("end", info)
        if info is None or self.first is None:
            return 0, 0, 0
        f = self.first
        return info.segs_out - f.segs_out, info.total_retrans - f.total_retrans, info.bytes_retrans - f.bytes_retrans

    def _record(self, phase: str, info: TcpInfo | None) -> None:
        if info is not None:
            self._emit(attempt=self.attempt, conn=self.index, phase=phase, cc=self.cc, **info.event_fields())
            if self._observe is not None:
                self._observe(info)
