"""A hostile KV peer for the fault suite: abusive connections to a role's KV port for a while (hostile_kv).

Responsible for: `python -m experiments.run.hostile_peer ADDRESS PORT DURATION_S`, run in the client host
by the fault player (experiments.run.faults): for DURATION_S (or until SIGTERM), at once, the abuses the KV
receiver must shrug off (tests/roles/test_kvwire_abuse.py, test_kvwire_hostile.py): zero-length LAYER frames
before any BEGIN, tiny LAYER frames for transfers that never begin, a frame claiming 8 MiB dripped a byte at
a time, a few dozen idle connections; each connection the receiver closes is opened again. Prints one JSON
line of counts at the end. Only to loopback or the topology's subnets (topology.naming).
Not responsible for: judging the receiver (the run's requests are: they must all complete).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import signal
import socket
import sys
import threading
import time
from collections import Counter

from crc32c import crc32c

from topology.naming import SUBNET_A, SUBNET_B
from workers.kvwire import LAYER, pack_frame

ALLOWED = tuple(ipaddress.ip_network(n) for n in ("127.0.0.0/8", SUBNET_A, SUBNET_B))
EMPTY_FRAMES = 1024  # zero-length LAYER frames per connection (issue 28: this many filled the transfer table)
TINY_FRAMES = 64  # 2-byte LAYER frames per connection, each for a transfer that never begins
DRIP_CLAIM = 8 << 20  # the dripped frame's claimed payload
DRIP_EVERY_S = 0.2  # one byte this often
IDLE_CONNECTIONS = 32
PAUSE_S = 0.2  # between one abusive connection closed and the next
TICK_S = 0.25  # blocking calls wake this often to see the end


class Peer:
    """The abuses against one address:port, each in a thread, until stop is set; counts what happened."""

    def __init__(self, address: str, port: int):
        self.address, self.port = address, port
        self.stop = threading.Event()
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._tid = 1 << 40  # transfer ids far from a sender's

    def count(self, what: str, n: int = 1) -> None:
        with self._lock:
            self.counts[what] += n

    def tid(self) -> int:
        with self._lock:
            self._tid += 1
            return self._tid

    def connect(self) -> socket.socket | None:
        try:
            s = socket.create_connection((self.address, self.port), timeout=2)
        except OSError:
            self.count("connect_failed")
            self.stop.wait(PAUSE_S)
            return None
        self.count("connections")
        s.settimeout(TICK_S)
        return s

    def closed_by_peer(self, s: socket.socket) -> bool:
        """Wait (until stop) for the receiver to close s; True if it did."""
        while not self.stop.is_set():
            try:
                if not s.recv(65536):
                    break
            except TimeoutError:
                continue
            except OSError:
                break
        else:
            return False
        self.count("closed_by_peer")
        return True

    def send_then_wait(self, frames: bytes, n: int, what: str) -> None:
        s = self.connect()
        if s is None:
            return
        with s:
            try:
                s.sendall(frames)
                self.count(what, n)
            except OSError:
                self.count(f"{what}_cut")  # refused midway
            self.closed_by_peer(s)
        self.stop.wait(PAUSE_S)

    def empty_frames(self) -> None:
        while not self.stop.is_set():
            frames = b"".join(pack_frame(LAYER, self.tid(), 0, 0, 1, 0, 0) for _ in range(EMPTY_FRAMES))
            self.send_then_wait(frames, EMPTY_FRAMES, "empty_frames")

    def tiny_frames(self) -> None:
        payload = b"kv"
        while not self.stop.is_set():
            frames = b"".join(
                pack_frame(LAYER, self.tid(), 0, 0, 1, len(payload), crc32c(payload)) + payload
                for _ in range(TINY_FRAMES)
            )
            self.send_then_wait(frames, TINY_FRAMES, "tiny_frames")

    def drip(self) -> None:
        while not self.stop.is_set():
            s = self.connect()
            if s is None:
                continue
            with s:
                try:
                    s.sendall(pack_frame(LAYER, self.tid(), 0, 0, 8, DRIP_CLAIM, 0))
                    while not self.stop.wait(DRIP_EVERY_S):
                        s.sendall(b"\0")
                        self.count("drip_bytes")
                except OSError:
                    self.count("closed_by_peer")  # the receiver dropped the dripping frame

    def idle(self) -> None:
        held: list[socket.socket] = []
        try:
            while not self.stop.is_set():
                for s in list(held):
                    try:
                        s.setblocking(False)
                        if s.recv(1) == b"":
                            raise ConnectionResetError
                    except BlockingIOError:
                        continue
                    except OSError:
                        pass
                    held.remove(s)
                    s.close()
                    self.count("closed_by_peer")
                while len(held) < IDLE_CONNECTIONS and not self.stop.is_set():
                    s = self.connect()
                    if s is None:
                        break
                    held.append(s)
                self.stop.wait(1.0)
        finally:
            for s in held:
                s.close()

    def run(self, duration_s: float) -> dict:
        """Every abuse at once for duration_s (or until stop); the counts."""
        threads = [
            threading.Thread(target=fn, name=fn.__name__, daemon=True)
            for fn in (self.empty_frames, self.tiny_frames, self.drip, self.idle)
        ]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        self.stop.wait(duration_s)
        self.stop.set()
        for t in threads:
            t.join(5)
        return {"address": f"{self.address}:{self.port}", "s": round(time.monotonic() - t0, 2), **self.counts}


def allowed(address: str) -> bool:
    """Whether address is loopback or in the topology's subnets (nothing outside our namespaces)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in net for net in ALLOWED)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.run.hostile_peer", description=__doc__.split("\n")[0])
    ap.add_argument("address", help="the target's IP: loopback or the topology's subnets")
    ap.add_argument("port", type=int, help="its KV port")
    ap.add_argument("duration_s", type=float, help="how long to keep at it (SIGTERM ends it sooner)")
    args = ap.parse_args(argv)
    if not allowed(args.address):
        nets = ", ".join(str(n) for n in ALLOWED)
        ap.error(f"address {args.address!r}: only an IP in {nets} (hosts in the project's namespaces)")
    if not 0 < args.port < 65536 or args.duration_s <= 0:
        ap.error(f"port {args.port} must be 1..65535 and duration_s {args.duration_s} above 0")
    peer = Peer(args.address, args.port)
    signal.signal(signal.SIGTERM, lambda *_: peer.stop.set())
    print(json.dumps(peer.run(args.duration_s)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
