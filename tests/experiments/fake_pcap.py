"""Synthetic WAN captures with real headers (built with scapy), both ends, headers-only records (snaplen).

One KV connection A->B (10.1.0.21:40000 -> md1:50063) with a handshake, KV_SEGMENTS data segments of which
one (LOST_INDEX) is lost between the gateways and retransmitted, ACKs ONE_WAY_S after each delivery; a UDP
cross-traffic stream to port CROSS_PORT; a gRPC exchange (port 50053). The expected figures are the
constants below.
"""

import struct
from pathlib import Path

from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

SNAPLEN = 128
ONE_WAY_S = 0.015  # gwa <-> gwb, each way
HANDSHAKE_RTT_MS = 31.0  # SYN at gwa .. SYN-ACK back at gwa: 2 x 15 ms + 1 ms at the server
DATA_RTT_MS = 40.0  # data at gwa .. its ACK back at gwa
MSS = 1448
KV_SEGMENTS = 12  # data segments first sent (one more is the retransmission)
LOST_INDEX = 3
CROSS_PORT, CROSS_DATAGRAMS, CROSS_PAYLOAD = 5201, 5, 1000
A, B, GRPC_A = "10.1.0.21", "10.2.0.61", "10.1.0.11"
ISN_A, ISN_B = 1_000_000, 7_000_000


def _tcp(src, sport, dst, dport, flags, seq, ack, payload=0):
    return (
        Ether()
        / IP(src=src, dst=dst)
        / TCP(sport=sport, dport=dport, flags=flags, seq=seq, ack=ack)
        / Raw(b"k" * payload)
    )


def _kv_frames(t0: float) -> tuple[list, list]:
    """(at gwa, at gwb): (time, frame) of the KV connection."""
    at_a, at_b = [], []

    def a_to_b(t, pkt, lost=False):
        at_a.append((t, pkt))
        if not lost:
            at_b.append((t + ONE_WAY_S, pkt))

    def b_to_a(t_at_b, pkt):
        at_b.append((t_at_b, pkt))
        at_a.append((t_at_b + ONE_WAY_S, pkt))

    a_to_b(t0, _tcp(A, 40000, B, 50063, "S", ISN_A, 0))
    b_to_a(t0 + ONE_WAY_S + 0.001, _tcp(B, 50063, A, 40000, "SA", ISN_B, ISN_A + 1))
    seq = ISN_A + 1
    sends = [(t0 + 0.040 + k * 0.001, k) for k in range(10)] + [(t0 + 0.150, 10), (t0 + 0.151, 11)]
    for t, k in sends:
        s = seq + k * MSS
        a_to_b(t, _tcp(A, 40000, B, 50063, "A", s, ISN_B + 1, MSS), lost=k == LOST_INDEX)
        acked = s + MSS if k < LOST_INDEX or k >= 10 else seq + LOST_INDEX * MSS  # duplicate ACKs after the hole
        b_to_a(t + DATA_RTT_MS / 1e3 - ONE_WAY_S, _tcp(B, 50063, A, 40000, "A", ISN_B + 1, acked))
    t_re = t0 + 0.100
    a_to_b(t_re, _tcp(A, 40000, B, 50063, "A", seq + LOST_INDEX * MSS, ISN_B + 1, MSS))
    b_to_a(t_re + DATA_RTT_MS / 1e3 - ONE_WAY_S, _tcp(B, 50063, A, 40000, "A", ISN_B + 1, seq + 10 * MSS))
    return at_a, at_b


def _other_frames(t0: float) -> tuple[list, list]:
    at_a, at_b = [], []
    for k in range(CROSS_DATAGRAMS):
        pkt = (
            Ether()
            / IP(src="10.1.0.10", dst="10.2.0.62")
            / UDP(sport=40001, dport=CROSS_PORT)
            / Raw(b"u" * CROSS_PAYLOAD)
        )
        at_a.append((t0 + 0.2 + k * 0.01, pkt))
        at_b.append((t0 + 0.2 + k * 0.01 + ONE_WAY_S, pkt))
    grpc = _tcp(GRPC_A, 40002, B, 50053, "PA", 5, 9, 200)
    at_a.append((t0 + 0.3, grpc))
    at_b.append((t0 + 0.3 + ONE_WAY_S, grpc))
    return at_a, at_b


def _write(path: Path, frames: list) -> None:
    out = bytearray(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, SNAPLEN, 1))
    for t, pkt in sorted(frames, key=lambda f: f[0]):
        data = bytes(pkt)
        usec = round(t * 1e6)
        out += struct.pack("<IIII", usec // 1_000_000, usec % 1_000_000, min(len(data), SNAPLEN), len(data))
        out += data[:SNAPLEN]
    path.write_bytes(bytes(out))


def write_wan_pcaps(pcap_dir: Path, t0_s: float) -> None:
    """pcap_dir/wan-a.pcap and wan-b.pcap, traffic starting at t0_s (Unix s)."""
    pcap_dir.mkdir(parents=True, exist_ok=True)
    kv_a, kv_b = _kv_frames(t0_s + 0.5)
    ot_a, ot_b = _other_frames(t0_s + 0.5)
    _write(pcap_dir / "wan-a.pcap", kv_a + ot_a)
    _write(pcap_dir / "wan-b.pcap", kv_b + ot_b)


def frame_len(payload: int, udp: bool = False) -> int:
    """Bytes on the wire of one frame: Ethernet 14 + IPv4 20 + TCP 20 (or UDP 8) + payload."""
    return 14 + 20 + (8 if udp else 20) + payload
