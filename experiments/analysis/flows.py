"""The WAN's flows from both ends' captures (flows.json), and KV / cross / other traffic over time.

Responsible for: one row per flow (5-tuple, one direction of a connection)
with its bytes and packets as sent and as delivered, duration, retransmitted
segments and two RTT estimates; classifying flows by port (KV data plane,
cross traffic, other) and binning each class's delivered bytes over time.
Not responsible for: per-direction totals of every frame (experiments.analysis.pcap),
which ports are which (the caller passes them, from the run's deployment and
metadata), plotting.

Reading: scapy's RawPcapReader reads the pcap records (experiments.analysis.pcap.records); the Ethernet, IPv4,
TCP and UDP headers are decoded here with struct, because dissecting every
frame into scapy layers costs ~100 µs a frame: minutes for the millions of
frames of a default run on the 2-core machine, against ~3 µs decoded by hand.
Frames are counted by their original length (captures keep headers only).

Which capture counts what (the shaper sits between gwa and gwb):
    sent       bytes, packets, retransmitted segments, RTT: the capture at the
               sender's end (wan-a.pcap for A->B), before any loss or reordering;
    delivered  bytes, packets: the capture at the receiving end (after loss).
A retransmitted segment is a TCP segment with payload whose sequence range
starts below the highest sequence the flow had already sent.
RTT, two estimates, both at the capture of the end that opened or sends:
    rtt_handshake_ms  SYN to SYN-ACK at the initiator's end: the WAN both ways,
                      the far LAN and the responder's stack, before any queue;
    rtt_data_ms       a data segment to the first ACK covering it at the
                      sender's end (Karn's rule: nothing sent before a
                      retransmission is sampled): includes the shaper's queue,
                      so it is the RTT under load; a delayed ACK can add up to
                      its timer (~40 ms) to a sample.
"""

from __future__ import annotations

import logging
import struct
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from experiments.rundir.metadata import VariantRecord
from experiments.analysis.metrics import stats
from experiments.progress import Progress
from experiments.analysis.pcap import in_site_a, records

TCP, UDP = 6, 17
SYN, ACK = 0x02, 0x10
MOD, HALF = 1 << 32, 1 << 31
BIN_S = 0.25  # throughput bins (s), as wan_throughput.png's
CLASSES = ("kv", "cross", "other")
_IP = struct.Struct("!xxHxxxxxBxx4s4s")  # IPv4: total length, protocol, source, destination
_TCP = struct.Struct("!HHIIBB")  # ports, seq, ack, data offset, flags
_UDP = struct.Struct("!HH")
PCAP_HEADER, PCAP_RECORD_HEADER = 24, 16  # classic pcap: the file's header, each record's
PROGRESS_EVERY = 20_000  # records between two progress updates
log = logging.getLogger(__name__)


class Flow:
    """One direction of one connection (or a UDP 5-tuple), as both captures saw it."""

    __slots__ = (
        "proto",
        "src",
        "sport",
        "dst",
        "dport",
        "direction",
        "first_s",
        "last_s",
        "packets_sent",
        "bytes_sent",
        "payload_sent",
        "packets_delivered",
        "bytes_delivered",
        "retrans_segs",
        "isn",
        "high",
        "epoch",
        "outstanding",
        "rtt_ms",
        "syn_s",
        "rtt_handshake_ms",
        "bins",
    )

    def __init__(self, proto: int, src: bytes, sport: int, dst: bytes, dport: int, direction: str):
        self.proto, self.src, self.sport, self.dst, self.dport = proto, src, sport, dst, dport
        self.direction = direction
        self.first_s, self.last_s = float("inf"), 0.0
        self.packets_sent = self.bytes_sent = self.payload_sent = 0
        self.packets_delivered = self.bytes_delivered = self.retrans_segs = 0
        self.isn, self.high, self.epoch = None, 0, 0  # sequence numbers relative to the first seen, unwrapped
        self.outstanding: deque = deque()  # (relative seq end, sent at s) awaiting an ACK
        self.rtt_ms: list[float] = []
        self.syn_s, self.rtt_handshake_ms = None, None
        self.bins: dict[int, int] = {}  # delivered bytes per BIN_S bin (absolute time // BIN_S)

    def _rel(self, seq: int) -> int:
        """seq relative to the first one seen, unwrapped against the highest so far."""
        s = (seq - self.isn) % MOD + self.epoch
        if s < self.high - HALF:
            self.epoch += MOD
            s += MOD
        return s

    def sent(self, t: float, wire: int, seq: int, flags: int, payload: int) -> None:
        """A frame of this flow seen at its sender's end."""
        self.packets_sent += 1
        self.bytes_sent += wire
        self.payload_sent += payload
        if self.proto != TCP:
            return
        if flags & SYN:
            self.isn, self.high, self.epoch = seq, 1, 0
            self.syn_s = self.syn_s or t
            return
        if self.isn is None:
            self.isn = seq
        if payload:
            s = self._rel(seq)
            if s < self.high:
                self.retrans_segs += 1
                self.outstanding.clear()  # Karn: nothing already in flight is sampled
            else:
                self.outstanding.append((s + payload, t))
            self.high = max(self.high, s + payload)

    def acked(self, t: float, ack: int) -> None:
        """An ACK for this flow seen at its sender's end: one RTT sample from the latest segment it covers."""
        if self.isn is None or not self.outstanding:
            return
        a = (ack - self.isn) % MOD + self.epoch
        if a < self.high - HALF:
            a += MOD
        last = None
        while self.outstanding and self.outstanding[0][0] <= a:
            last = self.outstanding.popleft()
        if last is not None:
            self.rtt_ms.append((t - last[1]) * 1e3)

    def delivered(self, t: float, wire: int) -> None:
        self.packets_delivered += 1
        self.bytes_delivered += wire
        b = int(t / BIN_S)
        self.bins[b] = self.bins.get(b, 0) + wire

    def seen(self, t: float) -> None:
        if t < self.first_s:
            self.first_s = t
        if t > self.last_s:
            self.last_s = t


def _direction(src: bytes, site_a: frozenset[bytes] | None = None) -> str:
    return "a_to_b" if in_site_a(src, site_a) else "b_to_a"


def scan(path: Path, side: str, flows: dict, site_a: frozenset[bytes] | None = None) -> int:
    """Add one capture (side "a": wan-a.pcap at gwa, "b": wan-b.pcap at gwb) to flows; returns its frame count.
    Its bytes read so far are shown as progress (a default run's captures are ~200 MB each)."""
    n, read = 0, PCAP_HEADER
    bar = Progress(f"reading {path.name}", path.stat().st_size, log, as_bytes=True)
    for t, wire, data in records(path):
        n, read = n + 1, read + PCAP_RECORD_HEADER + len(data)
        if n % PROGRESS_EVERY == 0:
            bar.update(read)
        if len(data) < 34 or data[12:14] != b"\x08\x00":
            continue  # not IPv4 (ARP, IPv6): not a flow
        ihl = (data[14] & 0x0F) * 4
        total, proto, src, dst = _IP.unpack_from(data, 14)
        l4 = 14 + ihl
        if proto == TCP and len(data) >= l4 + 14:
            sport, dport, seq, ack, off, flags = _TCP.unpack_from(data, l4)
            payload = total - ihl - (off >> 4) * 4
        elif proto == UDP and len(data) >= l4 + 4:
            (sport, dport), seq, ack, flags, payload = _UDP.unpack_from(data, l4), 0, 0, 0, total - ihl - 8
        else:
            continue
        key = (proto, src, sport, dst, dport)
        f = flows.get(key)
        if f is None:
            f = flows[key] = Flow(proto, src, sport, dst, dport, _direction(src, site_a))
        f.seen(t)
        if (f.direction == "a_to_b") == (side == "a"):
            f.sent(t, wire, seq, flags, payload)
            continue
        f.delivered(t, wire)
        if proto == TCP and flags & ACK:  # an ACK arriving at the far flow's sender end
            back = flows.get((proto, dst, dport, src, sport))
            if back is not None:
                if flags & SYN and back.syn_s is not None and back.rtt_handshake_ms is None:
                    back.rtt_handshake_ms = (t - back.syn_s) * 1e3
                back.acked(t, ack)
    bar.update(read)
    bar.close()
    return n


def read_wan(pcap_dir: Path, site_a: frozenset[bytes] | None = None) -> tuple[dict, dict]:
    """Flows of pcap_dir/wan-a.pcap and wan-b.pcap, and {file: frames}; ({}, {}) without both captures.
    site_a: site A's packed addresses on a real cluster (None: the emulated topology's)."""
    caps = {side: Path(pcap_dir) / f"wan-{side}.pcap" for side in "ab"}
    if not all(c.exists() for c in caps.values()):
        return {}, {}
    flows: dict = {}
    return flows, {c.name: scan(c, side, flows, site_a) for side, c in caps.items()}


@dataclass
class WanFlows:
    """The WAN's flows of one run with the ports that classify them."""

    flows: dict  # 5-tuple -> Flow
    frames: dict[str, int]  # capture file -> frames read
    kv_ports: set[int]
    cross_ports: set[int]
    rows: list[dict]  # flows.json rows (see table)

    def to_json(self) -> dict:
        """flows.json."""
        return {
            "captures": self.frames,
            "kv_ports": sorted(self.kv_ports),
            "cross_ports": sorted(self.cross_ports),
            "classes": {
                "kv": "TCP to or from a decode worker's kv_port",
                "cross": "a cross-traffic port",
                "other": "everything else (gRPC, ICMP, ...)",
            },
            "counted": {
                "sent": "at the sender's end capture (retrans_segs, rtt_data_ms too)",
                "delivered": "at the receiver's end capture (after the shaper's loss)",
            },
            "rtt": {
                "rtt_handshake_ms": "SYN to SYN-ACK at the initiator's end",
                "rtt_data_ms": "data segment to the first ACK covering it at the sender's end (Karn)",
            },
            "flows": self.rows,
        }


def load(
    pcap_dir: Path,
    kv_ports: set[int],
    cross_ports: set[int],
    windows: dict[str, VariantRecord],
    site_a: frozenset[bytes] | None = None,
) -> WanFlows | None:
    """Both WAN captures of a run, classified and attributed to variants; None without both captures."""
    flows, frames = read_wan(pcap_dir, site_a)
    if not frames:
        return None
    return WanFlows(flows, frames, set(kv_ports), set(cross_ports), table(flows, kv_ports, cross_ports, windows))


def classify(f: Flow, kv_ports: set[int], cross_ports: set[int]) -> str:
    """kv (a data-plane port at either end), cross (a cross-traffic port), or other (gRPC, ICMP, ...)."""
    if f.proto == TCP and (f.sport in kv_ports or f.dport in kv_ports):
        return "kv"
    if f.sport in cross_ports or f.dport in cross_ports:
        return "cross"
    return "other"


def _ip(b: bytes) -> str:
    return ".".join(str(x) for x in b)


def row(f: Flow, cls: str, variant: str | None) -> dict:
    """One flows.json row (times: Unix s, as the capture; RTTs: ms)."""
    r = stats(f.rtt_ms)
    return {
        "proto": {TCP: "tcp", UDP: "udp"}.get(f.proto, str(f.proto)),
        "src": _ip(f.src),
        "sport": f.sport,
        "dst": _ip(f.dst),
        "dport": f.dport,
        "direction": f.direction,
        "class": cls,
        "variant": variant,
        "first_s": f.first_s,
        "last_s": f.last_s,
        "duration_s": max(0.0, f.last_s - f.first_s),
        "packets_sent": f.packets_sent,
        "bytes_sent": f.bytes_sent,
        "payload_bytes_sent": f.payload_sent,
        "packets_delivered": f.packets_delivered,
        "bytes_delivered": f.bytes_delivered,
        "retrans_segs": f.retrans_segs,
        "rtt_handshake_ms": f.rtt_handshake_ms,
        "rtt_data_ms": {k: r[k] for k in ("n", "p50", "p90", "max") if k in r},
    }


def variant_of(t_s: float, windows: dict[str, VariantRecord]) -> str | None:
    """The variant whose wall-clock window [wall_start, wall_end) holds t_s (one still open: to the end)."""
    for v, w in windows.items():
        end = w.wall_end if w.wall_end is not None else float("inf")
        if w.wall_start is not None and w.wall_start <= t_s < end:
            return v
    return None


def table(flows: dict, kv_ports: set[int], cross_ports: set[int], windows: dict[str, VariantRecord]) -> list[dict]:
    """Every flow's row, largest first."""
    rows = [row(f, classify(f, kv_ports, cross_ports), variant_of(f.first_s, windows)) for f in flows.values()]
    return sorted(rows, key=lambda r: -(r["bytes_sent"] + r["bytes_delivered"]))


def by_class(rows: list[dict], variant: str) -> dict:
    """{class: {flows, bytes_offered, bytes_delivered, retrans_segs, rtt_data_ms_p50}} of one variant's A->B flows;
    offered: what the senders put on the WAN (the capture before the shaper: drops, headers and retransmissions
    count), delivered: what arrived past it."""
    out = {}
    for cls in CLASSES:
        mine = [r for r in rows if r["variant"] == variant and r["class"] == cls and r["direction"] == "a_to_b"]
        p50s = [r["rtt_data_ms"]["p50"] for r in mine if r["rtt_data_ms"].get("p50") is not None]
        out[cls] = {
            "flows": len(mine),
            "bytes_offered": sum(r["bytes_sent"] for r in mine),
            "bytes_delivered": sum(r["bytes_delivered"] for r in mine),
            "retrans_segs": sum(r["retrans_segs"] for r in mine),
            "rtt_data_ms_p50": sorted(p50s)[len(p50s) // 2] if p50s else None,
        }
    return out


def class_throughput(
    flows: dict, kv_ports: set[int], cross_ports: set[int], t0: float, direction: str = "a_to_b"
) -> dict[str, list[tuple[float, float]]]:
    """class -> [(bin start from t0 (s), delivered Mbit/s)] in one direction; classes without traffic left out."""
    bins: dict[str, dict[int, int]] = {}
    for f in flows.values():
        if f.direction == direction and f.bins:
            acc = bins.setdefault(classify(f, kv_ports, cross_ports), {})
            for b, n in f.bins.items():
                acc[b] = acc.get(b, 0) + n
    if not bins:
        return {}
    lo, hi = min(min(b) for b in bins.values()), max(max(b) for b in bins.values())
    return {
        cls: [(b * BIN_S - t0, acc.get(b, 0) * 8 / BIN_S / 1e6) for b in range(lo, hi + 1)] for cls, acc in bins.items()
    }
