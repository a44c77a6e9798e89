"""Bounds a broken or hostile peer meets at the KV receiver: reads with deadlines, what is held before a BEGIN.

Responsible for: ReceiverLimits (every bound in one place; tests make them small), PeerConn (one
accepted connection: its reads, which end in a FrameError when a frame stalls or misses its deadline and
in ConnIdle when no frame comes for too long), supersede (which connections a RESUME makes stale),
make_room (which idle connection a new one displaces when the table is full) and EarlyBudget (bytes
held for transfers whose BEGIN has not come, per connection and in all, counted as they arrive).
Not responsible for: what the frames mean or which transfers exist (receiver.py).
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from dataclasses import dataclass, field, fields

from crc32c import crc32c

from workers.kvwire.frame import FRAME_HEADER, FrameError

KEEPALIVE = (30, 10, 3)  # TCP keepalive: idle s, interval s, probes (a silent dead peer is found in ~60 s)
RECV_TICK_S = 0.5  # a blocked read wakes this often to check its deadlines


class ConnIdle(Exception):
    """No frame began on a connection for ReceiverLimits.conn_idle_s: it is closed (not an error)."""


class StaleConn(Exception):
    """A connection's transfer went on on another connection (its sender's RESUME, or a BEGIN that won the
    race): what it still sends is stale, and it is closed (not an error; its sender already gave it up)."""


@dataclass(frozen=True)
class ReceiverLimits:
    """The bounds of one KVReceiver (each ends as an event and a closed connection, never a dead thread)."""

    frame_idle_s: float = 60.0  # inside a frame, no byte for this long drops the connection (transfers kept for RESUME)
    frame_grace_s: float = 30.0  # a frame must be whole within this long after its first byte ...
    frame_min_rate_bytes_s: float = 64 << 10  # ... plus its length at this rate (a drip cannot hold a frame open)
    conn_idle_s: float = 300.0  # no frame for this long closes a connection (a sender's kept one reconnects)
    max_connections: int = 256  # connections served at once; past it, a new one displaces the longest idle ...
    conn_evict_idle_s: float = 10.0  # ... idle this long, carrying no transfer, or is closed on accept
    max_transfers: int = 1024  # transfers in progress at once
    early_max_bytes: int = 256 << 20  # chunk bytes held for transfers whose BEGIN has not come, all connections ...
    early_conn_max_bytes: int = 64 << 20  # ... and per connection
    early_max_transfers: int = 256  # transfers whose BEGIN has not come, in all: below max_transfers, so a
    # BEGIN always finds room however many peers send chunks for transfers that never begin
    early_conn_max_transfers: int = 8  # ... and per connection (a sender's connection carries one at a time)
    early_keep_s: float = 30.0  # a transfer whose chunks came but whose BEGIN did not is dropped after this
    early_evict_s: float = 1.0  # ... or, when early_max_transfers are held, after this (the oldest first), to
    # make room for a newer one: a real BEGIN trails its transfer's first chunk by milliseconds

    def __post_init__(self):
        for f in fields(self):
            if not getattr(self, f.name) > 0:
                raise ValueError(f"ReceiverLimits.{f.name} must be positive, not {getattr(self, f.name)!r}")
        if self.early_max_transfers >= self.max_transfers:
            raise ValueError(
                f"ReceiverLimits.early_max_transfers ({self.early_max_transfers}) must be below "
                f"max_transfers ({self.max_transfers}): begun transfers need room"
            )


@dataclass(eq=False)
class PeerConn:
    """One accepted connection: its reads under the limits, the transfers it carried, its ACK lock, the
    bytes and transfers it holds before their BEGINs."""

    sock: socket.socket
    peer: str
    limits: ReceiverLimits
    mine: set[int] = field(default_factory=set)  # dropped (or kept for RESUME) if it dies first
    early: set[int] = field(default_factory=set)  # transfers it sent chunks for before their BEGIN
    superseded: set[int] = field(default_factory=set)  # transfers a RESUME on another connection took over
    waiting_begin: int | None = None  # the transfer whose BEGIN waits for its session (reads nothing meanwhile)
    ack_lock: threading.Lock = field(default_factory=threading.Lock)
    early_bytes: int = 0
    idle_since_s: float = field(default_factory=time.monotonic)  # between frames since
    in_frame: bool = False
    evicted: bool = False  # closed to make room for a new connection
    last_byte_s: float = 0.0
    deadline_s: float = 0.0  # the frame being read must be whole by then

    def tune(self) -> None:
        """No Nagle; keepalive (a peer that vanished between frames); a kernel receive timeout of one tick
        (SO_RCVTIMEO: the socket stays blocking for Python, so MSG_WAITALL still fills whole frames)."""
        s = self.sock
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for opt, value in zip((socket.TCP_KEEPIDLE, socket.TCP_KEEPINTVL, socket.TCP_KEEPCNT), KEEPALIVE):
            s.setsockopt(socket.IPPROTO_TCP, opt, value)
        lim = self.limits
        tick = min(RECV_TICK_S, lim.frame_idle_s, lim.conn_idle_s, lim.frame_grace_s)
        sec = int(tick)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", sec, max(1, int((tick - sec) * 1e6))))

    def frame_payload(self, plen: int) -> None:
        """The header came: the frame's deadline grows by its payload at the minimum rate."""
        self.deadline_s += plen / self.limits.frame_min_rate_bytes_s

    def frame_done(self) -> None:
        self.idle_since_s, self.in_frame = time.monotonic(), False

    def displaceable(self, now_s: float) -> bool:
        """Whether a new connection may take this one's place: idle between frames, carrying no transfer."""
        idle = not self.in_frame and not self.mine and not self.evicted
        return idle and now_s - self.idle_since_s >= self.limits.conn_evict_idle_s

    def fill(self, view: memoryview, between_frames: bool = False) -> int:
        """Fill view; returns bytes read (fewer only at EOF). between_frames: view is a frame's header, and
        waiting for its first byte may last up to conn_idle_s (ConnIdle after that)."""
        got = 0
        while got < len(view):
            n = self.read_some(view[got:], between_frames and got == 0)
            if n == 0:
                return got
            got += n
        return got

    def read_payload(self, plen: int, crc: int) -> bytes:
        """A whole payload of plen bytes whose crc32c must be crc (FrameError otherwise)."""
        buf = bytearray(plen)
        if self.fill(memoryview(buf)) < plen:
            raise FrameError(f"truncated payload (connection closed inside a {plen}-byte payload)")
        got = crc32c(buf)
        if got != crc:
            raise FrameError(f"payload checksum mismatch ({got:#010x} != {crc:#010x})")
        return bytes(buf)

    def read_some(self, view: memoryview, between_frames: bool = False) -> int:
        """Read at least one byte into view (0 only at EOF); FrameError when the frame stalls for frame_idle_s
        or misses its deadline."""
        while True:
            try:
                n = self.sock.recv_into(view, 0, socket.MSG_WAITALL)
            except BlockingIOError:  # a tick passed with nothing read by this call
                n = -1
            now = time.monotonic()
            if n > 0 and between_frames:  # a frame's first byte: its clock starts
                self.in_frame = True
                self.deadline_s = (
                    now + self.limits.frame_grace_s + FRAME_HEADER.size / self.limits.frame_min_rate_bytes_s
                )
            if n > 0:
                self.last_byte_s = now
            if n == 0 or n == len(view):
                return n
            if n < 0 and between_frames:
                if now - self.idle_since_s >= self.limits.conn_idle_s:
                    raise ConnIdle(f"no frame for {self.limits.conn_idle_s:g} s")
                continue
            self._check_frame_clock(now, len(view) - max(n, 0))
            if n > 0:
                return n

    def _check_frame_clock(self, now: float, missing: int) -> None:
        if now - self.last_byte_s >= self.limits.frame_idle_s:
            raise FrameError(f"no byte for {self.limits.frame_idle_s:g} s inside a frame ({missing} bytes missing)")
        if now > self.deadline_s:
            raise FrameError(
                f"frame not complete within its deadline ({missing} bytes missing; a frame gets "
                f"{self.limits.frame_grace_s:g} s plus its length at {self.limits.frame_min_rate_bytes_s:g} B/s)"
            )


def supersede(conns: list[PeerConn], resumer: PeerConn, tid: int) -> None:
    """A RESUME of transfer tid came on resumer: every other connection that carried tid, or whose BEGIN of
    tid still waits, belongs to an attempt its sender gave up (callers hold the receiver's lock)."""
    for c in conns:
        if c is not resumer and (tid in c.mine or c.waiting_begin == tid):
            c.superseded.add(tid)


def make_room(conns: list[PeerConn], max_connections: int, now_s: float) -> tuple[bool, PeerConn | None]:
    """Whether a new connection may be served, and the one it displaces (marked evicted; the caller closes
    it): the longest idle, once max_connections are open (callers hold the receiver's lock)."""
    live = [c for c in conns if not c.evicted]
    idle = [c for c in live if c.displaceable(now_s)]
    if len(live) < max_connections or not idle:
        return len(live) < max_connections, None
    victim = min(idle, key=lambda c: c.idle_since_s)
    victim.evicted = True
    return True, victim


class EarlyBudget:
    """Bytes held for transfers whose BEGIN has not come, per connection and in all. Bytes are counted as
    they arrive, never from a header's claimed length. Callers hold the receiver's lock."""

    def __init__(self, limits: ReceiverLimits):
        self.limits = limits
        self.held_bytes = 0

    def reserve(self, c: PeerConn, n: int) -> None:
        """Count n bytes held before a BEGIN; FrameError past the bounds."""
        lim = self.limits
        if c.early_bytes + n > lim.early_conn_max_bytes or self.held_bytes + n > lim.early_max_bytes:
            raise FrameError(
                f"too much KV before BEGIN: {c.early_bytes} bytes on this connection, {self.held_bytes} in all, "
                f"+{n} (limits {lim.early_conn_max_bytes}, {lim.early_max_bytes})"
            )
        c.early_bytes += n
        self.held_bytes += n

    def give_back(self, c: PeerConn, n: int) -> None:
        """Give back what reserve counted."""
        c.early_bytes -= n
        self.held_bytes -= n
