"""The KV receiver against broken or hostile peers, over real loopback TCP (issue: nothing lost, nobody in).

Each finding had the receiver disabled, its memory grown or a thread dead; here each must end as a
`kv_frame_error` (or `kv_conn_refused`) event, the connection closed, nothing kept, and a normal transfer
completing afterwards.
"""

from __future__ import annotations

import json
import socket
import time
import tracemalloc

import pytest
from crc32c import crc32c

from tests.roles.test_kvwire_resilience import FP, HEAD_DIM, N_KV_HEAD, N_LAYER, Recorder, transfer
from workers.kvwire import BEGIN, END, LAYER, Inbox, KVReceiver, TransferMeta, pack_frame
from workers.kvwire.limits import ReceiverLimits
from workers.roles.config import PathConfig

SETTINGS = PathConfig(connections=2, frame_bytes=4096, stall_timeout_ms=500, max_retries=1)


def connect(receiver: KVReceiver) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", receiver.port), timeout=10)
    return s


def closed_by_peer(s: socket.socket, within_s: float) -> bool:
    """Whether the receiver closes s within within_s (EOF or reset), draining what it sends first."""
    s.settimeout(within_s)
    try:
        while s.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def wait_until(pred, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return pred()


def still_serves(receiver: KVReceiver, inbox: Inbox, rid: str) -> None:
    result, same = transfer(f"127.0.0.1:{receiver.port}", rid, 64, SETTINGS, inbox, Recorder())
    assert result.ok and same, result


def errors(events: Recorder) -> list[str]:
    return [f["reason"] for f in events.named("kv_frame_error")]


def end_frame(tid: int) -> bytes:
    body = json.dumps({"next_token": -1, "chunks": 1}).encode()
    return pack_frame(END, tid, payload_len=len(body), crc=crc32c(body)) + body


def test_stray_end_frames_leave_nothing_behind():
    # Each END for a transfer nobody began used to create a record no connection owned: after 1024 of
    # them every transfer was refused ("too many transfers in progress") until the worker restarted.
    inbox, events = Inbox(), Recorder()
    with KVReceiver("127.0.0.1", 0, FP, inbox, events) as receiver:
        with connect(receiver) as s:
            s.sendall(b"".join(end_frame(1000 + i) for i in range(1100)))
            assert closed_by_peer(s, 5)
        assert wait_until(lambda: receiver.active_transfers == 0), receiver.active_transfers
        assert any("never began" in r for r in errors(events)), errors(events)
        still_serves(receiver, inbox, "after-ends")


def test_a_layer_header_alone_does_not_allocate_its_length():
    # Four LAYER headers of 32 MiB with 1 KB behind them (no BEGIN) took 128 MiB at once.
    inbox, events = Inbox(), Recorder()
    plen = 32 << 20
    with KVReceiver("127.0.0.1", 0, FP, inbox, events) as receiver:
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            socks = [connect(receiver) for _ in range(4)]
            for i, s in enumerate(socks):
                s.sendall(pack_frame(LAYER, 77 + i, 0, 0, 8, plen, 0) + bytes(1024))
            assert wait_until(lambda: receiver.active_transfers == 4)
            time.sleep(0.2)
            grown = tracemalloc.get_traced_memory()[0] - base
        finally:
            tracemalloc.stop()
        print(f"4 stalled half-frames of {plen >> 20} MiB: {grown / 2**20:.1f} MiB allocated")
        assert grown < 16 << 20, f"{grown / 2**20:.0f} MiB allocated for 4 KB received"
        for s in socks:
            s.close()
        assert wait_until(lambda: receiver.active_transfers == 0)
        still_serves(receiver, inbox, "after-headers")


def test_bytes_held_before_begin_are_bounded():
    inbox, events = Inbox(), Recorder()
    with KVReceiver("127.0.0.1", 0, FP, inbox, events, limits=ReceiverLimits(early_max_bytes=1 << 20)) as receiver:
        payload = bytes(64 << 10)
        frame = pack_frame(LAYER, 9, 0, 0, 1, len(payload), crc32c(payload)) + payload
        with connect(receiver) as s:
            try:
                for _ in range(32):  # 2 MiB of chunks for a transfer that never begins
                    s.sendall(frame)
            except (BrokenPipeError, ConnectionResetError):
                pass  # refused midway: what the test wants
            assert closed_by_peer(s, 5)
        assert any("too much KV before BEGIN" in r for r in errors(events)), errors(events)
        assert wait_until(lambda: receiver.active_transfers == 0)
        with receiver._lock:
            assert receiver.early.held_bytes == 0  # the bytes held went back with the connection
        still_serves(receiver, inbox, "after-early")


def test_a_frame_that_stops_halfway_is_dropped_but_an_idle_connection_is_not():
    inbox, events = Inbox(), Recorder()
    with KVReceiver("127.0.0.1", 0, FP, inbox, events, limits=ReceiverLimits(frame_idle_s=0.3)) as receiver:
        idle, half = connect(receiver), connect(receiver)
        try:
            half.sendall(pack_frame(LAYER, 11, 0, 0, 8, 4096, 0) + bytes(100))
            assert closed_by_peer(half, 3), "a half-received frame held its connection"
            assert any("no byte for 0.3 s inside a frame" in r for r in errors(events)), errors(events)
            assert not closed_by_peer(idle, 1.0), "an idle connection between frames was dropped"
        finally:
            idle.close()
            half.close()
        still_serves(receiver, inbox, "after-half")


def _begin(**changes) -> bytes:
    meta = TransferMeta("bad", "prompt", 0, 4, (1, 2, 3, 4), FP, N_LAYER, N_KV_HEAD, HEAD_DIM, "float32")
    d = {**json.loads(meta.to_json()), **changes}
    return json.dumps(d).encode()


@pytest.mark.parametrize(
    "payload,needle",
    [
        (_begin(n_kv_head=-1), "n_kv_head is not positive"),
        (_begin(start="x"), "start is not an integer"),
        (_begin(request_id=5), "request_id is not a string"),
        (_begin(token_ids=[1, 2, 3, 4.5]), "token_ids"),
        (_begin(kind="weights"), "kind 'weights'"),
        (_begin(extra=1), "unknown field 'extra'"),
        (b"[1, 2]", "not an object"),
    ],
)
def test_malformed_begin_is_a_frame_error(payload, needle):
    inbox, events = Inbox(), Recorder()
    inbox.expect("bad", "prompt")  # only the description itself may stop it
    with KVReceiver("127.0.0.1", 0, FP, inbox, events) as receiver:
        with connect(receiver) as s:
            s.sendall(pack_frame(BEGIN, 3, payload_len=len(payload), crc=crc32c(payload)) + payload)
            assert closed_by_peer(s, 5)
        assert wait_until(lambda: errors(events)), "no kv_frame_error event"
        assert needle in errors(events)[0] and "BEGIN payload" in errors(events)[0], errors(events)
        still_serves(receiver, inbox, "after-begin")


def test_connections_past_the_limit_are_refused():
    inbox, events = Inbox(), Recorder()
    with KVReceiver("127.0.0.1", 0, FP, inbox, events, limits=ReceiverLimits(max_connections=3)) as receiver:
        held = [connect(receiver) for _ in range(3)]
        try:
            assert wait_until(lambda: len(receiver._conns) == 3)
            extra = connect(receiver)
            assert closed_by_peer(extra, 3), "a fourth connection was served"
            extra.close()
            assert events.named("kv_conn_refused"), events.events
        finally:
            for s in held:
                s.close()
        assert wait_until(lambda: len(receiver._conns) == 0)
        still_serves(receiver, inbox, "after-limit")
