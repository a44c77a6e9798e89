"""A TCP proxy standing in for the WAN between P (or the RLD) and the MD's KV listener, for tests.

Responsible for: forwarding each accepted connection to the target, with
faults the tests switch on: a rate limit (Mbit/s, so the RLD gets time to
decode eagerly), cutting the next connection after some bytes, stalling the
next connection (holding its bytes), corrupting one byte of the next
connection's stream, holding every connection past the first N. Counts the bytes that went through towards the MD.
Not responsible for: emulating delay/loss (topology/ does that for real).
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, replace


@dataclass
class Faults:
    rate_mbit: float = 0.0  # 0 = unlimited
    cut_after_bytes: int = -1  # next connection: close both sides after this many bytes (once)
    stall_after_bytes: int = -1  # next connection: stop forwarding after this many bytes (once)
    corrupt_at_byte: int = -1  # next connection: flip a byte at this offset (once)
    blackhole: bool = False  # every connection: forward nothing until switched off (persistent)
    blackhole_after: int = -1  # connections past this many (since reset_counters) forward nothing
    # (persistent): lets a transfer through and holds the next one


class WanProxy:
    """listen on 127.0.0.1:<port>, forward to target (host, port)."""

    def __init__(self, target: tuple[str, int], port: int = 0):
        self.target = target
        self.faults = Faults()
        # every connection, live: the sender -> MD direction forwards nothing while set, and loses nothing (what
        # it read waits here, the rest in the sockets' buffers); clearing it lets the held bytes through at once
        self.hold = False
        self.bytes_forwarded = 0
        self.connections = 0
        self.events: list[str] = []
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", port))
        self.port = self._listener.getsockname()[1]
        self._socks: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._stop = False
        self._accept = threading.Thread(target=self._accept_loop, daemon=True)
        self._accept.start()

    def set_receive_buffer(self, nbytes: int) -> None:
        """Connections accepted from now on read into a receive buffer of about nbytes (the kernel doubles it):
        with a rate limit, the sender's window then follows this proxy's rate, so its TCP_INFO delivery rate
        measures the limit instead of loopback's speed (a large buffer would absorb a small transfer whole)."""
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, nbytes)

    def reset_counters(self) -> None:
        with self._lock:
            self.bytes_forwarded = 0
            self.connections = 0

    def close(self) -> None:
        self._stop = True
        self._listener.close()
        for s in list(self._socks):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        for t in self._threads:
            t.join(2)

    def _accept_loop(self) -> None:
        while not self._stop:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self.connections += 1
                f, self.faults = (
                    self.faults,
                    Faults(
                        rate_mbit=self.faults.rate_mbit,
                        blackhole=self.faults.blackhole,
                        blackhole_after=self.faults.blackhole_after,
                    ),
                )
                if 0 <= f.blackhole_after < self.connections:
                    f = replace(f, blackhole=True)
            self._socks += [client, upstream]
            for src, dst, faults, count in ((client, upstream, f, True), (upstream, client, Faults(), False)):
                t = threading.Thread(target=self._pump, args=(src, dst, faults, count), daemon=True)
                self._threads.append(t)
                t.start()

    def _pump(self, src: socket.socket, dst: socket.socket, f: Faults, count: bool) -> None:
        """Forward src -> dst; count: add to bytes_forwarded (the sender -> MD direction only)."""
        sent, t0 = 0, time.monotonic()
        try:
            while True:
                data = src.recv(4096 if f.rate_mbit > 0 else 65536)
                if not data:
                    break
                if 0 <= f.corrupt_at_byte < sent + len(data) and f.corrupt_at_byte >= sent:
                    i = f.corrupt_at_byte - sent
                    data = data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1 :]
                    self.events.append("corrupted")
                if 0 <= f.cut_after_bytes <= sent + len(data):
                    dst.sendall(data[: max(0, f.cut_after_bytes - sent)])
                    self.events.append("cut")
                    break
                if f.blackhole or 0 <= f.stall_after_bytes <= sent + len(data):
                    dst.sendall(data[: max(0, f.stall_after_bytes - sent)])
                    self.events.append("stalled")
                    while not self._stop and src.recv(65536):  # swallow everything, forward nothing
                        pass
                    break
                if f.rate_mbit > 0:  # a byte leaves no earlier than the rate allows (serialisation delay)
                    ahead = (sent + len(data)) * 8 / (f.rate_mbit * 1e6) - (time.monotonic() - t0)
                    if ahead > 0:
                        time.sleep(ahead)
                while count and self.hold and not self._stop:
                    time.sleep(0.001)
                dst.sendall(data)
                sent += len(data)
                if count:
                    with self._lock:
                        self.bytes_forwarded += len(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
