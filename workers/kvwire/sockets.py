"""Sockets of the KV data plane: congestion control, whole-frame send and receive, kept connections.

Responsible for: a peer's address (host:port), choosing and reading back
TCP_CONGESTION, sending and receiving whole frames, the pool of idle
connections kept between transfers.
Not responsible for: what travels on them (sender.py, receiver.py).
"""

from __future__ import annotations

import logging
import os
import select
import socket
import threading
from pathlib import Path
from typing import Callable

log = logging.getLogger(__name__)

CONGESTION_PROC = Path("/proc/sys/net/ipv4/tcp_available_congestion_control")


def parse_address(address: str) -> tuple[str, int]:
    """'host:port' -> (host, port); ValueError on anything else."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"address {address!r} is not host:port")
    return host, int(port)


def available_congestion() -> tuple[str, ...]:
    """Congestion-control algorithms this kernel offers."""
    try:
        return tuple(CONGESTION_PROC.read_text().split())
    except OSError:
        return ()


def set_congestion(sock: socket.socket, name: str) -> str:
    """Set TCP_CONGESTION on sock; returns what the socket uses (a logged fallback if name is unavailable)."""
    if name == "default":
        return "default"
    if name not in available_congestion():
        log.warning(
            "congestion control %r not available (have %s); using the kernel default", name, available_congestion()
        )
        return "default"
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, name.encode())
    except OSError as err:
        log.warning("cannot set congestion control %r: %s; using the kernel default", name, err)
        return "default"
    return name


def recv_exact(sock: socket.socket, view: memoryview) -> int:
    """Fill view from sock; returns bytes read (less than len(view) only at EOF). MSG_WAITALL lets the
    kernel fill a whole frame in one call on a blocking socket (with a timeout set it returns what is there)."""
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:], 0, socket.MSG_WAITALL)
        if n == 0:
            return got
        got += n
    return got


def send_all(sock: socket.socket, parts: list, on_wait: Callable[[], None] | None = None) -> None:
    """Send every byte of parts (bytes-like) with scatter-gather sendmsg: one system call per frame
    instead of one per part. When the socket's timeout passes without room in its send buffer, on_wait()
    decides (it raises to give up) and the send resumes where it was; without on_wait, socket.timeout."""
    views = [memoryview(p).cast("B") for p in parts]
    while views:
        try:
            sent = sock.sendmsg(views)
        except socket.timeout:
            if on_wait is None:
                raise
            on_wait()
            continue
        while views and sent >= len(views[0]):
            sent -= len(views.pop(0))
        if views and sent:
            views[0] = views[0][sent:]


def count_socket_fds() -> int:
    """Open socket file descriptors of this process."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                n += 1
        except OSError:
            pass
    return n


class ConnectionPool:
    """Idle data-plane connections kept open between transfers, per (peer address, congestion control).

    A new connection per transfer pays the TCP handshake (one WAN round trip: 60 ms on the cross-country
    profile) before the first KV byte; a kept one does not. (Its congestion window still restarts after
    an idle RTO, the kernel's tcp_slow_start_after_idle.) A connection is given back only after a
    transfer that completed cleanly; one that the peer closed while idle is noticed and dropped on take.
    At most max_idle connections per key are kept."""

    def __init__(self, max_idle: int = 8):
        self.max_idle = max_idle
        self._lock = threading.Lock()
        self._idle: dict[tuple[str, str], list[socket.socket]] = {}

    def take(self, key: tuple[str, str]) -> socket.socket | None:
        """An open idle connection for key, or None."""
        while True:
            with self._lock:
                idle = self._idle.get(key)
                if not idle:
                    return None
                sock = idle.pop()
            if _still_open(sock):
                return sock
            sock.close()

    def give(self, key: tuple[str, str], socks: list[socket.socket]) -> None:
        with self._lock:
            idle = self._idle.setdefault(key, [])
            keep = max(0, min(len(socks), self.max_idle - len(idle)))
            idle.extend(socks[:keep])
        for sock in socks[keep:]:
            sock.close()

    def close(self) -> None:
        """Close every idle connection (a role shutting down)."""
        with self._lock:
            socks = [s for idle in self._idle.values() for s in idle]
            self._idle.clear()
        for sock in socks:
            sock.close()

    @property
    def idle(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._idle.values())


def _still_open(sock: socket.socket) -> bool:
    """An idle data-plane connection is usable when nothing is readable on it: the receiver only ever
    sends an ACK for a transfer in flight, so EOF, a reset or stray bytes all mean: do not reuse."""
    poller = select.poll()
    try:
        poller.register(sock, select.POLLIN | select.POLLERR | select.POLLHUP)
        return not poller.poll(0)  # anything to report: EOF, a reset or a stray byte
    except (OSError, ValueError):
        return False


# Every sender of this process shares it (P's fast and WAN paths, the RLD's KV handoff).
CONNECTIONS = ConnectionPool()
