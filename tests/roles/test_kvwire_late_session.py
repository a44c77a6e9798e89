"""A transfer whose session opens late, and the sender's RESUME that races the first connection's BEGIN (issue 28).

The receiver holds a BEGIN no session expects yet for up to EXPECT_WAIT_S and reads nothing more from that
connection meanwhile; a sender whose stall limit is shorter gives the connection up and resumes on a new one.
When the session opens, the first connection's stale BEGIN must be dropped quietly (that connection closed,
no frame error) and the live attempt must carry the transfer to one delivery. Real KVReceiver, real KVSender
or hand-made frames, real TCP on loopback.
"""

from __future__ import annotations

import json
import socket
import threading
import time

import numpy as np
import pytest
from crc32c import crc32c

from workers.kvwire import ConnectionPool, Inbox, KVReceiver, KVSender, TransferMeta
from workers.kvwire.frame import ACK, BEGIN, END, FRAME_HEADER, HAVE, LAYER, RESUME, pack_frame
from workers.roles.config import PathConfig
from workers.roles.events import NullLog

FP = "33" * 16
N_LAYER, N_KV_HEAD, HEAD_DIM, N_TOKENS = 2, 2, 8, 40
HALF = N_TOKENS // 2
TID = 28


class Recorder(NullLog):
    """Keeps every event (name, request_id, fields)."""

    def __init__(self):
        super().__init__()
        self.events: list[tuple[str, str | None, dict]] = []
        self._lock = threading.Lock()

    def emit(self, event, request_id=None, t_ns=None, **fields):
        with self._lock:
            self.events.append((event, request_id, fields))
        return time.monotonic_ns()

    def named(self, name: str) -> list[dict]:
        with self._lock:
            return [f for e, _, f in self.events if e == name]


def make(rid: str) -> tuple[TransferMeta, list[np.ndarray]]:
    meta = TransferMeta(rid, "prompt", 0, N_TOKENS, tuple(range(N_TOKENS)), FP, N_LAYER, N_KV_HEAD, HEAD_DIM, "float32")
    rng = np.random.default_rng(28)
    return meta, [rng.integers(0, 255, (2, N_TOKENS, meta.row_bytes), dtype=np.uint8) for _ in range(N_LAYER)]


def same_blob(got, meta: TransferMeta, layers: list[np.ndarray]) -> bool:
    body = np.frombuffer(got.blob, np.uint8, offset=len(got.blob) - meta.kv_bytes).reshape(N_LAYER, 2, N_TOKENS, -1)
    return all((body[i] == layers[i]).all() for i in range(N_LAYER))


def open_late(inbox: Inbox, rid: str, after_s: float) -> threading.Thread:
    t = threading.Thread(target=lambda: (time.sleep(after_s), inbox.expect(rid, "prompt")), daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("connections", [1, 2])
def test_a_session_opening_after_the_stall_limit_gets_its_transfer_once(connections):
    """The session opens 1.2 s after BEGIN: past the sender's 300 ms stall limit (so it retries with RESUME,
    maybe twice) and within EXPECT_WAIT_S. Every waiting BEGIN wakes at once; before the fix two of them
    raced ("transfer ... began twice")."""
    inbox, rx, tx = Inbox(), Recorder(), Recorder()
    meta, layers = make(f"late{connections}")
    settings = PathConfig(connections=connections, frame_bytes=1024, stall_timeout_ms=300, max_retries=6)
    with KVReceiver("127.0.0.1", 0, FP, inbox, rx) as receiver:
        opener = open_late(inbox, meta.request_id, 1.2)
        sender = KVSender(
            f"127.0.0.1:{receiver.port}", meta, settings.send_settings(), "fast", tx, pool=ConnectionPool()
        )
        sender.start()
        for i, kv in enumerate(layers):
            sender.put_layer(i, kv)
        sender.finish(None)
        result = sender.wait(15)
        got = inbox.wait(meta.request_id, "prompt", 5)
        opener.join()
        time.sleep(0.3)  # the stale connections' readers end
        left = receiver.active_transfers
    assert result is not None and result.ok and result.attempts >= 2, result  # it did retry: the race was run
    assert got is not None and same_blob(got, meta, layers)
    got.release()
    assert rx.named("kv_frame_error") == [], rx.named("kv_frame_error")
    ends = rx.named("kv_recv_end")
    assert len(ends) == 1 and ends[0]["delivered"], ends
    assert rx.named("kv_recv_orphaned") == [] and left == 0 and inbox.pending == 0


def frame(ftype: int, payload: bytes, tid: int = TID) -> bytes:
    return pack_frame(ftype, tid, payload_len=len(payload), crc=crc32c(payload)) + payload


def layer_frame(layers, layer: int, off: int) -> bytes:
    payload = layers[layer][0, off : off + HALF].tobytes() + layers[layer][1, off : off + HALF].tobytes()
    return pack_frame(LAYER, TID, layer, off, HALF, len(payload), crc32c(payload)) + payload


CHUNKS = [(layer, off) for layer in range(N_LAYER) for off in (0, HALF)]
END_PAYLOAD = json.dumps({"next_token": -1, "chunks": len(CHUNKS)}).encode()


def reply(sock: socket.socket) -> tuple[int, bytes]:
    hdr = sock.recv(FRAME_HEADER.size, socket.MSG_WAITALL)
    assert len(hdr) == FRAME_HEADER.size, f"connection closed instead of a reply ({hdr!r})"
    fields = FRAME_HEADER.unpack(hdr)
    body = sock.recv(fields[7], socket.MSG_WAITALL) if fields[7] else b""
    return fields[2], body


def closed_by_receiver(sock: socket.socket, timeout_s: float = 3.0) -> bool:
    sock.settimeout(timeout_s)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def wait_for(check, timeout_s: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.01)
    return False


def test_a_begin_superseded_by_a_resume_is_dropped_quietly():
    """C1's BEGIN waits for the session; C2 resumes ('new'), begins and sends everything; the session opens.
    C2 gets the ACK, C1 is closed, and no frame error is written whichever BEGIN wakes first."""
    inbox, rx = Inbox(), Recorder()
    meta, layers = make("superseded")
    with KVReceiver("127.0.0.1", 0, FP, inbox, rx) as receiver:
        c1 = socket.create_connection(("127.0.0.1", receiver.port))
        c2 = socket.create_connection(("127.0.0.1", receiver.port))
        c2.settimeout(10)
        try:
            c1.sendall(frame(BEGIN, meta.to_json()) + b"".join(layer_frame(layers, *c) for c in CHUNKS))
            time.sleep(0.2)  # C1's reader is now waiting inside its BEGIN
            c2.sendall(pack_frame(RESUME, TID))
            ftype, body = reply(c2)
            assert ftype == HAVE and json.loads(body)["state"] == "new"
            c2.sendall(
                frame(BEGIN, meta.to_json())
                + b"".join(layer_frame(layers, *c) for c in CHUNKS)
                + frame(END, END_PAYLOAD)
            )
            time.sleep(0.2)  # C2's BEGIN waits too
            inbox.expect(meta.request_id, "prompt")
            assert reply(c2)[0] == ACK
            got = inbox.wait(meta.request_id, "prompt", 5)
            assert closed_by_receiver(c1)
        finally:
            c1.close()
            c2.close()
    assert got is not None and same_blob(got, meta, layers)
    got.release()
    assert rx.named("kv_frame_error") == [], rx.named("kv_frame_error")
    assert len(rx.named("kv_recv_end")) == 1 and rx.named("kv_recv_orphaned") == []


def test_a_resume_after_the_first_begin_won_continues_and_the_old_connection_is_dropped():
    """The reverse order: C1's BEGIN and half its chunks land; C2's RESUME answers 'partial' and takes the
    transfer over; C1's stale frames that follow (the rest and END) are not applied; C2 sends what HAVE
    lacked and END, gets the ACK; one delivery, no frame error."""
    inbox, rx = Inbox(), Recorder()
    meta, layers = make("reverse")
    inbox.expect(meta.request_id, "prompt")
    with KVReceiver("127.0.0.1", 0, FP, inbox, rx) as receiver:
        c1 = socket.create_connection(("127.0.0.1", receiver.port))
        c2 = socket.create_connection(("127.0.0.1", receiver.port))
        c2.settimeout(10)
        try:
            c1.sendall(frame(BEGIN, meta.to_json()) + b"".join(layer_frame(layers, *c) for c in CHUNKS[:2]))

            def held() -> int:
                with receiver._lock:
                    a = receiver._assemblies.get(TID)
                    return 0 if a is None else len(a.seen)

            assert wait_for(lambda: held() == 2)
            c2.sendall(pack_frame(RESUME, TID))
            ftype, body = reply(c2)
            have = json.loads(body)
            assert ftype == HAVE and have["state"] == "partial" and len(have["chunks"]) == 2, have
            c1.sendall(b"".join(layer_frame(layers, *c) for c in CHUNKS[2:]) + frame(END, END_PAYLOAD))
            assert closed_by_receiver(c1)
            missing = [c for c in CHUNKS if list(c) not in have["chunks"]]
            c2.sendall(b"".join(layer_frame(layers, *c) for c in missing) + frame(END, END_PAYLOAD))
            assert reply(c2)[0] == ACK
            got = inbox.wait(meta.request_id, "prompt", 5)
        finally:
            c1.close()
            c2.close()
    assert got is not None and same_blob(got, meta, layers)
    got.release()
    assert rx.named("kv_frame_error") == [], rx.named("kv_frame_error")
    assert len(rx.named("kv_recv_end")) == 1


def test_begin_twice_on_one_connection_is_still_a_frame_error():
    """What stays refused: a peer that sends one transfer's BEGIN twice on the same connection."""
    inbox, rx = Inbox(), Recorder()
    meta, _ = make("twice")
    inbox.expect(meta.request_id, "prompt")
    with KVReceiver("127.0.0.1", 0, FP, inbox, rx) as receiver:
        c1 = socket.create_connection(("127.0.0.1", receiver.port))
        try:
            c1.sendall(frame(BEGIN, meta.to_json()) * 2)
            assert closed_by_receiver(c1)
        finally:
            c1.close()
        assert wait_for(lambda: rx.named("kv_frame_error"))
    assert "began twice" in rx.named("kv_frame_error")[0]["reason"]
