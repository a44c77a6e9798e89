"""KV transfers that survive a struggling path, over real loopback TCP and the test WAN proxy.

A cut connection resumes the same transfer (only the chunks the receiver lacks cross again); a path slower
than the stall timeout's worth of buffered bytes is not a stall (the old rule failed it at the ACK wait);
a producer that takes its time is not a stall; TCP_INFO is read from a live socket and recorded per
connection; the congestion control in effect is read back.
"""

from __future__ import annotations

import socket
import time

import numpy as np

from tests.e2e.wanproxy import WanProxy
from workers.kvwire import ConnectionPool, Inbox, KVReceiver, KVSender, TransferMeta
from workers.kvwire.tcpinfo import TCP_INFO_STRUCT, congestion_of, parse_tcp_info, read_tcp_info
from workers.kvwire.watch import STALL_RTO_FACTOR, stall_limit_ns
from workers.roles.config import PathConfig
from workers.roles.events import NullLog

FP = "22" * 16
N_LAYER, N_KV_HEAD, HEAD_DIM = 2, 2, 8  # 64 B per token per layer for K (and V)


class Recorder(NullLog):
    """Keeps every event (name, request_id, fields)."""

    def __init__(self):
        super().__init__()
        self.events: list[tuple[str, str | None, dict]] = []

    def emit(self, event, request_id=None, t_ns=None, **fields):
        self.events.append((event, request_id, fields))
        return time.monotonic_ns()

    def named(self, name: str) -> list[dict]:
        return [f for e, _, f in self.events if e == name]


def transfer(
    address: str, rid: str, n_tokens: int, settings: PathConfig, inbox: Inbox, events: Recorder, pause_s: float = 0.0
):
    """Send n_tokens of random KV; return (SendResult, delivered blob matches)."""
    meta = TransferMeta(rid, "prompt", 0, n_tokens, tuple(range(n_tokens)), FP, N_LAYER, N_KV_HEAD, HEAD_DIM, "float32")
    inbox.expect(rid, "prompt")
    rng = np.random.default_rng(n_tokens)
    layers = [rng.integers(0, 255, (2, n_tokens, meta.row_bytes), dtype=np.uint8) for _ in range(N_LAYER)]
    sender = KVSender(address, meta, settings.send_settings(), "wan", events, pool=ConnectionPool()).start()
    for i, kv in enumerate(layers):
        if i and pause_s:
            time.sleep(pause_s)
        sender.put_layer(i, kv)
    sender.finish(None)
    result = sender.wait(30)
    got = inbox.wait(rid, "prompt", 5)
    if got is None:
        return result, False
    body = np.frombuffer(got.blob, np.uint8, offset=len(got.blob) - meta.kv_bytes).reshape(N_LAYER, 2, n_tokens, -1)
    same = all((body[i] == layers[i]).all() for i in range(N_LAYER))
    got.release()
    return result, same


def test_cut_connection_resumes_and_sends_only_what_is_missing():
    inbox, rx_events, tx_events = Inbox(), Recorder(), Recorder()
    n_tokens = 400  # 102,400 KV bytes in 26 chunks of 32 tokens
    kv_bytes = N_LAYER * 2 * n_tokens * 64
    with KVReceiver("127.0.0.1", 0, FP, inbox, rx_events) as receiver:
        proxy = WanProxy(("127.0.0.1", receiver.port))
        try:
            proxy.faults.cut_after_bytes = kv_bytes // 2
            settings = PathConfig(connections=1, frame_bytes=4096, stall_timeout_ms=500, max_retries=2)
            result, same = transfer(f"127.0.0.1:{proxy.port}", "cut", n_tokens, settings, inbox, tx_events)
        finally:
            proxy.close()
    assert result.ok and same and result.attempts == 2, result
    resumes = rx_events.named("kv_recv_resume")
    assert resumes and resumes[0]["state"] == "partial" and resumes[0]["chunks_held"] > 0, resumes
    assert result.resumed_kv_bytes == resumes[0]["kv_bytes_held"] > 0
    # Without resuming, the retry sends all 102,400 bytes again on top of the ~51,200 before the cut.
    assert proxy.bytes_forwarded < 1.25 * kv_bytes, (proxy.bytes_forwarded, kv_bytes)


def test_slow_path_with_bytes_in_flight_is_not_a_stall():
    """1 MB through an 8 Mbit/s proxy takes ~1 s after the sender's last write; with a 300 ms stall timeout
    the old rule ("no ACK 300 ms after the last byte") gave up on this working path."""
    inbox, events = Inbox(), Recorder()
    n_tokens = 4000  # 1,024,000 KV bytes
    with KVReceiver("127.0.0.1", 0, FP, inbox, NullLog()) as receiver:
        proxy = WanProxy(("127.0.0.1", receiver.port))
        try:
            proxy.faults.rate_mbit = 8
            settings = PathConfig(
                connections=1, frame_bytes=65536, stall_timeout_ms=300, max_retries=0, congestion="reno"
            )
            result, same = transfer(f"127.0.0.1:{proxy.port}", "slow", n_tokens, settings, inbox, events)
        finally:
            proxy.close()
    assert result.ok and same and result.attempts == 1, result
    assert result.duration_ns > 0.8e9, "the proxy's rate did not hold the transfer back"
    samples = events.named("kv_tcp_info")
    phases = [s["phase"] for s in samples]
    assert phases[0] == "start" and phases[-1] == "end" and phases.count("sample") >= 5, phases
    assert all(s["cc"] == "reno" for s in samples) and result.congestion_used == ("reno",)
    assert samples[-1]["bytes_acked"] - samples[0]["bytes_acked"] >= 1_024_000
    assert not events.named("kv_congestion_refused")


def test_a_producer_that_takes_its_time_is_not_a_stall():
    inbox, events = Inbox(), Recorder()
    with KVReceiver("127.0.0.1", 0, FP, inbox, NullLog()) as receiver:
        settings = PathConfig(connections=2, frame_bytes=4096, stall_timeout_ms=100, max_retries=0)
        result, same = transfer(f"127.0.0.1:{receiver.port}", "paused", 200, settings, inbox, events, pause_s=0.5)
    assert result.ok and same and result.attempts == 1, result


def test_tcp_info_of_a_live_connection_and_the_congestion_read_back():
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    try:
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, b"reno")
        client.sendall(b"x" * 200_000)
        got = 0
        while got < 200_000:
            got += len(peer.recv(65536))
        deadline = time.monotonic() + 2
        while (info := read_tcp_info(client)).bytes_acked < 200_000 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert info.bytes_acked >= 200_000 and info.bytes_sent >= 200_000 and info.snd_mss > 0
        assert 0 < info.rtt_us < 1_000_000 and info.rto_us >= 200_000 and info.snd_cwnd > 0
        assert congestion_of(client) == "reno"
    finally:
        for s in (client, peer, server):
            s.close()
    assert read_tcp_info(client) is None and congestion_of(client) == ""


def test_short_tcp_info_from_an_older_kernel_reads_zeros():
    raw = bytearray(TCP_INFO_STRUCT.size)
    raw[8:12] = (300_000).to_bytes(4, "little")  # tcpi_rto
    info = parse_tcp_info(bytes(raw[:104]))  # up to tcpi_total_retrans: Linux 2.6-era length
    assert info.rto_us == 300_000 and info.bytes_acked == 0 and info.delivery_rate == 0


def test_stall_limit_follows_the_backed_off_rto():
    class Info:
        rto_us, rtt_us = 3_200_000, 80_000  # four timeouts in a row from 200 ms

    assert stall_limit_ns(2000, None) == 2_000_000_000
    assert stall_limit_ns(2000, Info) == STALL_RTO_FACTOR * 3_200_000_000 + 80_000_000
    Info.rto_us = 200_000
    assert stall_limit_ns(2000, Info) == 2_000_000_000  # never below the configured floor
