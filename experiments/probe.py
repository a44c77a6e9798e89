"""UDP one-way-delay probes: a paced sender and a recording receiver.

Responsible for: putting sequence-numbered, timestamped datagrams on the wire
and recording when each arrived, so delay, jitter, loss, duplicates and
reordering can be computed exactly. Sender and receiver run in different
topology hosts; both read CLOCK_MONOTONIC, which network namespaces share, so
receive time minus send time is the true one-way delay.
Not responsible for: judging the numbers (see `experiments.calibration`).

    python -m experiments.probe recv --port 9000 --count 1000 --out a_to_b.json
    python -m experiments.probe send --dst 10.2.0.61 --port 9000 --count 1000 --interval-ms 20
"""
from __future__ import annotations

import argparse
import json
import socket
import struct
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

MAGIC = 0x50444450  # "PDDP"
HEADER = struct.Struct("!IIQ")  # magic, seq, send time (ns, CLOCK_MONOTONIC)
MIN_PAYLOAD_BYTES = HEADER.size
# Ethernet + IPv4 + UDP header bytes in front of each probe payload on the wire.
WIRE_OVERHEAD_BYTES = 14 + 20 + 8


@dataclass(frozen=True)
class ProbeRecord:
    """One received datagram: sequence number, send and receive times (ns)."""
    seq: int
    send_ns: int
    recv_ns: int


def send(dst: str, port: int, count: int, interval_ms: float, payload_bytes: int) -> None:
    """Send `count` probes paced `interval_ms` apart (absolute schedule, no drift)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    padding = bytes(max(0, payload_bytes - HEADER.size))
    start = time.monotonic_ns()
    for seq in range(count):
        due = start + int(seq * interval_ms * 1e6)
        while (wait := due - time.monotonic_ns()) > 0:
            time.sleep(wait / 1e9 if wait > 2_000_000 else 0)
        sock.sendto(HEADER.pack(MAGIC, seq, time.monotonic_ns()) + padding, (dst, port))
    sock.close()


def receive(port: int, count: int, idle_timeout_s: float, overall_timeout_s: float) -> list[ProbeRecord]:
    """Record probes until `count` distinct ones arrived, or no probe came for idle_timeout_s."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    sock.bind(("0.0.0.0", port))
    print("ready", flush=True)
    records, seen = [], set()
    deadline = time.monotonic() + overall_timeout_s
    sock.settimeout(idle_timeout_s)
    while len(seen) < count and time.monotonic() < deadline:
        try:
            data = sock.recv(65535)
        except socket.timeout:
            if seen:
                break
            continue
        now = time.monotonic_ns()
        if len(data) < HEADER.size:
            continue
        magic, seq, sent = HEADER.unpack_from(data)
        if magic == MAGIC:
            records.append(ProbeRecord(seq, sent, now))
            seen.add(seq)
    sock.close()
    return records


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: `send` or `recv`."""
    parser = argparse.ArgumentParser(prog="python -m experiments.probe")
    sub = parser.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("send")
    s.add_argument("--dst", required=True)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--count", type=int, required=True)
    s.add_argument("--interval-ms", type=float, default=20.0)
    s.add_argument("--payload-bytes", type=int, default=64)
    r = sub.add_parser("recv")
    r.add_argument("--port", type=int, required=True)
    r.add_argument("--count", type=int, required=True)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--idle-timeout-s", type=float, default=5.0)
    r.add_argument("--overall-timeout-s", type=float, default=600.0)
    args = parser.parse_args(argv)
    if args.mode == "send":
        send(args.dst, args.port, args.count, args.interval_ms, max(args.payload_bytes, MIN_PAYLOAD_BYTES))
        return 0
    records = receive(args.port, args.count, args.idle_timeout_s, args.overall_timeout_s)
    args.out.write_text(json.dumps([asdict(r) for r in records]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
