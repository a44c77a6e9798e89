"""TCP seen from inside: a connection's TCP_INFO and the congestion control it really uses.

Responsible for: reading `struct tcp_info` (getsockopt TCP_INFO) into a
typed record, and reading back TCP_CONGESTION (what the kernel gave the
socket, not what was asked: a process without CAP_NET_ADMIN may only set what
net.ipv4.tcp_allowed_congestion_control lists).
Not responsible for: deciding what a sample means (sender.py's stall rule)
or recording it (the sender emits `kv_tcp_info` events).

Layout: include/uapi/linux/tcp.h, fields up to tcpi_snd_wnd (232 bytes,
Linux >= 5.4); an older kernel returns fewer bytes and the missing fields
read 0. Units as the kernel's: times in microseconds, rates in bytes/s,
windows in segments.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import asdict, dataclass

# 8 x u8 (state .. bitfields), 24 x u32 (rto .. total_retrans), pacing/max_pacing/bytes_acked/bytes_received
# (u64), segs_out/segs_in, notsent_bytes/min_rtt/data_segs_in/data_segs_out (u32), delivery_rate/busy_time/
# rwnd_limited/sndbuf_limited (u64), delivered/delivered_ce (u32), bytes_sent/bytes_retrans (u64),
# dsack_dups/reord_seen/rcv_ooopack/snd_wnd (u32)
TCP_INFO_STRUCT = struct.Struct("<8B24I4Q2I4I4Q2I2Q4I")
_U32_NAMES = (
    "rto_us",
    "ato_us",
    "snd_mss",
    "rcv_mss",
    "unacked",
    "sacked",
    "lost",
    "retrans",
    "fackets",
    "last_data_sent_ms",
    "last_ack_sent_ms",
    "last_data_recv_ms",
    "last_ack_recv_ms",
    "pmtu",
    "rcv_ssthresh",
    "rtt_us",
    "rttvar_us",
    "snd_ssthresh",
    "snd_cwnd",
    "advmss",
    "reordering",
    "rcv_rtt_us",
    "rcv_space",
    "total_retrans",
)
CONGESTION_NAME_BYTES = 16  # TCP_CA_NAME_MAX


@dataclass(frozen=True)
class TcpInfo:
    """One TCP_INFO sample (kernel units: us, bytes, bytes/s, segments)."""

    state: int
    ca_state: int
    retransmits: int  # RTO retransmissions of the current segment (consecutive timeouts)
    backoff: int  # RTO exponential backoff count
    rto_us: int  # current retransmission timeout, backoff included
    snd_mss: int
    unacked: int  # segments in flight
    lost: int
    retrans: int  # segments retransmitted and not yet acked
    rtt_us: int  # smoothed RTT
    rttvar_us: int
    snd_cwnd: int  # segments
    total_retrans: int  # segments retransmitted over the connection's life
    pacing_rate: int  # bytes/s
    bytes_acked: int  # cumulative
    bytes_received: int
    notsent_bytes: int  # written by the application, not yet sent
    min_rtt_us: int
    delivery_rate: int  # bytes/s, the most recent sample
    app_limited: bool  # that sample was limited by the application, not the path (a lower bound)
    bytes_sent: int  # cumulative, retransmissions included
    segs_out: int  # segments sent, cumulative, retransmissions included
    bytes_retrans: int  # cumulative

    def event_fields(self) -> dict:
        """The fields a `kv_tcp_info` event carries."""
        d = asdict(self)
        del d["state"], d["ca_state"], d["bytes_received"]
        return d


def parse_tcp_info(raw: bytes) -> TcpInfo:
    """struct tcp_info bytes (possibly shorter, from an older kernel) -> TcpInfo (pure)."""
    v = TCP_INFO_STRUCT.unpack(bytes(raw[: TCP_INFO_STRUCT.size]).ljust(TCP_INFO_STRUCT.size, b"\0"))
    u8, u32 = v[:8], dict(zip(_U32_NAMES, v[8:32]))
    (
        pacing,
        _max_pacing,
        acked,
        received,
        segs_out,
        _segs_in,
        notsent,
        min_rtt,
        _dsi,
        _dso,
        delivery,
        _busy,
        _rwnd_lim,
        _sndbuf_lim,
        _delivered,
        _delivered_ce,
        sent,
        retrans_bytes,
    ) = v[32:50]
    return TcpInfo(
        state=u8[0],
        ca_state=u8[1],
        retransmits=u8[2],
        backoff=u8[4],
        rto_us=u32["rto_us"],
        snd_mss=u32["snd_mss"],
        unacked=u32["unacked"],
        lost=u32["lost"],
        retrans=u32["retrans"],
        rtt_us=u32["rtt_us"],
        rttvar_us=u32["rttvar_us"],
        snd_cwnd=u32["snd_cwnd"],
        total_retrans=u32["total_retrans"],
        pacing_rate=pacing,
        bytes_acked=acked,
        bytes_received=received,
        notsent_bytes=notsent,
        min_rtt_us=min_rtt,
        delivery_rate=delivery,
        app_limited=bool(u8[7] & 1),
        bytes_sent=sent,
        segs_out=segs_out,
        bytes_retrans=retrans_bytes,
    )


def read_tcp_info(sock: socket.socket) -> TcpInfo | None:
    """The socket's TCP_INFO now; None if it is closed or not TCP."""
    try:
        return parse_tcp_info(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCP_INFO_STRUCT.size))
    except OSError:
        return None


def congestion_of(sock: socket.socket) -> str:
    """The congestion control the socket really uses (read back), or '' if it cannot be read."""
    try:
        raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, CONGESTION_NAME_BYTES)
    except OSError:
        return ""
    return raw.split(b"\0", 1)[0].decode(errors="replace")
