"""UDP one-way delay probe across namespaces of one machine.

Responsible for: sending numbered, timestamped UDP datagrams at a fixed
interval, and receiving them to report each one's one-way delay, loss and
order. Namespaces share CLOCK_MONOTONIC, so `time.monotonic_ns()` in the
sender and the receiver is one clock and the difference is the one-way delay.
The receiver uses the kernel's arrival timestamp (SO_TIMESTAMPNS, realtime,
mapped to the monotonic clock), so its own wake-up latency is not counted.
Not responsible for: starting processes inside namespaces (the caller wraps
the command, e.g. `ip netns exec NS python -m topology.udp_probe ...`).

    python -m topology.udp_probe recv --port P --count N --idle-timeout-s S  # prints "ready", then JSON
    python -m topology.udp_probe send --dst ADDR --port P --count N --interval-us U --size-bytes B
"""

from __future__ import annotations

import argparse
import json
import logging
import socket
import struct
import sys
import time
from dataclasses import asdict, dataclass, field

log = logging.getLogger(__name__)

HEADER = struct.Struct("!QQ")  # seq, send time (monotonic ns)
# Ethernet + IPv4 + UDP header bytes in front of each probe payload on the wire.
WIRE_OVERHEAD_BYTES = 14 + 20 + 8
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
TIMESPEC = struct.Struct("qq")


@dataclass
class ProbeResult:
    """What the receiver saw.

    sent_count: datagrams the sender was asked to send
    delays_ns: one-way delay of each received datagram, in arrival order (ns)
    seqs: sequence numbers in arrival order
    """

    sent_count: int
    delays_ns: list[int] = field(default_factory=list)
    seqs: list[int] = field(default_factory=list)

    @property
    def received(self) -> int:
        return len(set(self.seqs))

    @property
    def loss_fraction(self) -> float:
        return 1 - self.received / self.sent_count if self.sent_count else 0.0

    @property
    def reordered(self) -> int:
        """Datagrams that arrived after one with a higher sequence number."""
        count, highest = 0, -1
        for seq in self.seqs:
            if seq < highest:
                count += 1
            highest = max(highest, seq)
        return count

    @property
    def duplicates(self) -> int:
        return len(self.seqs) - self.received


def send(dst: str, port: int, count: int, interval_us: float, size_bytes: int) -> None:
    """Send `count` probes, one every `interval_us` (paced on the monotonic clock)."""
    pad = bytes(max(0, size_bytes - HEADER.size))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        start = time.monotonic_ns()
        for seq in range(count):
            target = start + int(seq * interval_us * 1000)
            while (now := time.monotonic_ns()) < target:
                if target - now > 200_000:
                    time.sleep((target - now - 100_000) / 1e9)
            sock.sendto(HEADER.pack(seq, time.monotonic_ns()) + pad, (dst, port))


def receive(
    port: int, count: int, idle_timeout_s: float, ready=lambda: None, first_timeout_s: float = 60.0
) -> ProbeResult:
    """Receive until each of the `count` probes arrived (duplicates are kept, and do not count towards it) or
    none came for idle_timeout_s.

    The first probe may take up to first_timeout_s: the sender is a separate
    process that still has to start (seconds under an emulated CPU).
    """
    result = ProbeResult(sent_count=count)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        sock.bind(("0.0.0.0", port))
        sock.settimeout(first_timeout_s)
        ready()
        distinct: set[int] = set()
        while len(distinct) < count:  # not len(seqs): duplicates would end the probe before its last probes came
            try:
                data, ancdata, _, _ = sock.recvmsg(65536, 64)
            except TimeoutError:
                break
            sock.settimeout(idle_timeout_s)
            now = _arrival_monotonic_ns(ancdata)
            seq, sent_ns = HEADER.unpack_from(data)
            result.seqs.append(seq)
            result.delays_ns.append(now - sent_ns)
            distinct.add(seq)
    return result


def _arrival_monotonic_ns(ancdata) -> int:
    """The kernel's arrival time of a datagram on the monotonic clock (now, if absent)."""
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
            sec, nsec = TIMESPEC.unpack_from(payload)
            # realtime -> monotonic: the offset is sampled now; it drifts by ppm at most.
            return sec * 1_000_000_000 + nsec - (time.time_ns() - time.monotonic_ns())
    return time.monotonic_ns()


PORT = 9000  # the probe's UDP port on the receiving host


def recv_argv(count: int, idle_timeout_s: float, port: int = PORT) -> list[str]:
    """The receiver's command line (pure): `python -m topology.udp_probe recv ...`, run in the receiving host."""
    return [sys.executable, "-m", "topology.udp_probe", "recv", "--port", str(port), "--count", str(count),
            "--idle-timeout-s", str(idle_timeout_s)]  # fmt: skip


def send_argv(dst: str, count: int, interval_us: float, size_bytes: int, port: int = PORT) -> list[str]:
    """The sender's command line (pure): `count` datagrams of size_bytes to dst, one every interval_us."""
    return [sys.executable, "-m", "topology.udp_probe", "send", "--dst", dst, "--port", str(port), "--count",
            str(count), "--interval-us", str(interval_us), "--size-bytes", str(size_bytes)]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """CLI: `send` or `recv` (recv prints "ready" then one JSON line)."""
    parser = argparse.ArgumentParser(prog="python -m topology.udp_probe")
    sub = parser.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("send")
    s.add_argument("--dst", required=True)
    s.add_argument("--size-bytes", type=int, default=64)
    s.add_argument("--interval-us", type=float, default=1000)
    r = sub.add_parser("recv")
    r.add_argument("--idle-timeout-s", type=float, default=2.0)
    r.add_argument("--first-timeout-s", type=float, default=60.0)
    for p in (s, r):
        p.add_argument("--port", type=int, required=True)
        p.add_argument("--count", type=int, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    if args.mode == "send":
        send(args.dst, args.port, args.count, args.interval_us, args.size_bytes)
        return 0
    result = receive(
        args.port,
        args.count,
        args.idle_timeout_s,
        ready=lambda: (sys.stdout.write("ready\n"), sys.stdout.flush()),
        first_timeout_s=args.first_timeout_s,
    )
    sys.stdout.write(json.dumps(asdict(result)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
