"""Read a classic pcap file (what tcpdump writes) into per-frame (time, bytes, direction) and throughput bins.

Responsible for: reading a pcap's records (through scapy's RawPcapReader: the one reader of captures), the
Ethernet + IPv4 source address to tell the WAN direction (cluster A's subnet -> a_to_b), choosing each
direction's receiving end (after the shaper), and binning bytes into Mbit/s over time. Frames are counted by
their original length, so a headers-only capture (snaplen 128) still counts every byte on the wire.
Not responsible for: capturing (topology.capture) or plotting.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

LINKTYPE_ETHERNET = 1
ETH_IPV4 = 0x0800


class PcapError(ValueError):
    """Not a pcap file we can read."""


@dataclass(frozen=True)
class Frame:
    """t_s: capture time (Unix s); wire_bytes: original frame length; direction: a_to_b | b_to_a | other"""

    t_s: float
    wire_bytes: int
    direction: str


def records(path: Path):
    """(time (Unix s), original length, frame bytes) of every record of a classic pcap file (scapy's
    RawPcapReader: micro- and nanosecond magic, either byte order); a truncated last record (a killed tcpdump)
    ends it. The one pcap reader: frames below and experiments.analysis.flows both read through here."""
    from scapy.utils import RawPcapReader

    try:
        reader = RawPcapReader(str(path))
    except Exception as err:  # scapy raises its own Scapy_Exception for a bad magic
        raise PcapError(f"{path}: not a pcap file ({err})") from err
    with reader:
        if not hasattr(reader, "nano"):
            raise PcapError(f"{path}: pcapng is not supported")
        if reader.linktype != LINKTYPE_ETHERNET:
            raise PcapError(f"{path}: link type {reader.linktype}, expected Ethernet (1)")
        scale = 1e-9 if reader.nano else 1e-6
        for data, meta in reader:
            if len(data) < meta.caplen:
                return
            yield meta.sec + meta.usec * scale, meta.wirelen, data


def read_frames(path: Path, site_a: frozenset[bytes] | None = None) -> list[Frame]:
    """Every frame of a pcap file with its direction. site_a: the packed IPv4 addresses of site A on a real
    cluster (None: the emulated topology's cluster A)."""
    return [Frame(t, wire, _direction_of(data[:30], site_a)) for t, wire, data in records(path)]


_A_PREFIX = bytes([10, 1, 0])  # cluster A's /24 (topology.naming.SUBNET_A)
_GWA_WAN = bytes([10, 0, 0, 1])  # gwa's WAN address (topology.naming.WAN_A_IP)


def _direction_of(head: bytes, site_a: frozenset[bytes] | None = None) -> str:
    """Direction from the Ethernet + IPv4 header: source in cluster A (or gwa) -> a_to_b."""
    if len(head) < 30 or head[12:14] != b"\x08\x00":
        return "other"
    return "a_to_b" if in_site_a(head[26:30], site_a) else "b_to_a"


def in_site_a(src: bytes, site_a: frozenset[bytes] | None = None) -> bool:
    """Whether a packed IPv4 source is site A's: one of site_a's addresses (a real cluster), else in the
    emulated cluster A's /24 or gwa's WAN address."""
    if site_a is not None:
        return src in site_a
    return src[:3] == _A_PREFIX or src == _GWA_WAN


def direction(src: str, subnet_a: str = "10.1.0.0/24") -> str:
    """a_to_b when a dotted source address is in cluster A (or gwa's WAN address), else b_to_a."""
    if not src:
        return "other"
    ip = ipaddress.IPv4Address(src)
    return "a_to_b" if ip in ipaddress.IPv4Network(subnet_a) or src == "10.0.0.1" else "b_to_a"


def delivered(frames_a: list[Frame], frames_b: list[Frame]) -> list[Frame]:
    """What the WAN delivered: a_to_b as seen at gwb (wan-b.pcap), b_to_a as seen at gwa (wan-a.pcap).

    The receiving end is after the shaper on either backend (the userspace
    emulator sits between the gateways), so these are the link's real rates.
    """
    out = [f for f in frames_b if f.direction == "a_to_b"] + [f for f in frames_a if f.direction == "b_to_a"]
    return sorted(out, key=lambda f: f.t_s)


def throughput(
    frames: list[Frame], bin_s: float = 0.25, t0: float | None = None
) -> dict[str, list[tuple[float, float]]]:
    """direction -> [(bin start from t0 (s), Mbit/s)], bins without traffic included as 0."""
    if not frames:
        return {}
    t0 = frames[0].t_s if t0 is None else t0
    n = int((frames[-1].t_s - t0) / bin_s) + 1
    bins: dict[str, list[int]] = {}
    for f in frames:
        d = f.direction
        i = int((f.t_s - t0) / bin_s)
        if 0 <= i < n:
            bins.setdefault(d, [0] * n)[i] += f.wire_bytes
    return {d: [(i * bin_s, b * 8 / bin_s / 1e6) for i, b in enumerate(v)] for d, v in bins.items()}


def bytes_between(frames: list[Frame], start_s: float, end_s: float) -> dict[str, int]:
    """Wire bytes per direction captured in [start_s, end_s) (Unix s)."""
    out: dict[str, int] = {}
    for f in frames:
        if start_s <= f.t_s < end_s:
            out[f.direction] = out.get(f.direction, 0) + f.wire_bytes
    return out
