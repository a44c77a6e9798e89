"""KV transfers over real loopback TCP: kept connections are reused, dropped when the peer closed them.

A KVReceiver in this process, KVSenders with their own ConnectionPool: three transfers in a row open
the path's connections once; a transfer after the receiver restarted finds the kept connections dead
and opens new ones without a retry; persistent=false opens new ones every time. A chunk that overtakes
its transfer's BEGIN (hand-made frames on two connections) waits for it and is sealed into the blob.
"""

import time

import numpy as np

from workers.kvwire import ConnectionPool, Inbox, KVReceiver, KVSender, TransferMeta
from workers.roles.config import PathConfig
from workers.roles.events import NullLog

FP = "11" * 16
N_LAYER, N_KV_HEAD, HEAD_DIM, N_TOKENS = 2, 2, 8, 40


def send(port: int, pool: ConnectionPool, rid: str, inbox: Inbox, settings: PathConfig):
    meta = TransferMeta(rid, "prompt", 0, N_TOKENS, tuple(range(N_TOKENS)), FP, N_LAYER, N_KV_HEAD, HEAD_DIM, "float32")
    inbox.expect(rid, "prompt")
    rng = np.random.default_rng(len(rid))
    layers = [rng.integers(0, 255, (2, N_TOKENS, meta.row_bytes), dtype=np.uint8) for _ in range(N_LAYER)]
    sender = KVSender(f"127.0.0.1:{port}", meta, settings.send_settings(), "wan", NullLog(), pool=pool).start()
    for i, kv in enumerate(layers):
        sender.put_layer(i, kv)
    sender.finish(None)
    result = sender.wait(10)
    got = inbox.wait(rid, "prompt", 10)
    assert result.ok and got is not None, result
    body = np.frombuffer(got.blob, np.uint8, offset=len(got.blob) - meta.kv_bytes).reshape(N_LAYER, 2, N_TOKENS, -1)
    assert all((body[i] == layers[i]).all() for i in range(N_LAYER))
    got.release()
    return result, sender._reused


def accepted(receiver: KVReceiver) -> int:
    with receiver._lock:
        return len(receiver._conns)


def test_kept_connections_are_reused_and_dead_ones_replaced():
    pool, inbox = ConnectionPool(), Inbox()
    settings = PathConfig(connections=2, frame_bytes=1024)
    receiver = KVReceiver("127.0.0.1", 0, FP, inbox, NullLog()).start()
    port = receiver.port
    try:
        reused = [send(port, pool, f"r{i}", inbox, settings)[1] for i in range(3)]
        assert reused == [0, 2, 2] and pool.idle == 2 and accepted(receiver) == 2
    finally:
        receiver.stop()
    receiver = KVReceiver("127.0.0.1", port, FP, inbox, NullLog()).start()  # the peer restarted
    try:
        result, reused = send(port, pool, "after-restart", inbox, settings)
        assert reused == 0 and result.attempts == 1 and pool.idle == 2
    finally:
        receiver.stop()
        pool.close()
    assert pool.idle == 0


def test_persistent_false_opens_new_connections_every_time():
    pool, inbox = ConnectionPool(), Inbox()
    settings = PathConfig(connections=2, frame_bytes=1024, persistent=False)
    with KVReceiver("127.0.0.1", 0, FP, inbox, NullLog()) as receiver:
        reused = [send(receiver.port, pool, f"n{i}", inbox, settings)[1] for i in range(2)]
    assert reused == [0, 0] and pool.idle == 0


def test_chunks_before_begin_are_kept_verified_and_sealed():
    """Connection 1's chunk overtakes BEGIN on connection 0: it waits, lands in place, and the delivered
    blob's checksum (folded from the chunks') is the checksum of its bytes."""
    import json
    import socket

    from crc32c import crc32c

    from workers.kvcache import BLOB_HEADER
    from workers.kvwire import ACK, BEGIN, END, FRAME_HEADER, LAYER, pack_frame

    meta = TransferMeta(
        "early", "prompt", 0, N_TOKENS, tuple(range(N_TOKENS)), FP, N_LAYER, N_KV_HEAD, HEAD_DIM, "float32"
    )
    rng = np.random.default_rng(7)
    layers = [rng.integers(0, 255, (2, N_TOKENS, meta.row_bytes), dtype=np.uint8) for _ in range(N_LAYER)]
    half = N_TOKENS // 2
    chunks = [(layer, off) for layer in range(N_LAYER) for off in (0, half)]

    def layer_frame(layer, off):
        payload = layers[layer][0, off : off + half].tobytes() + layers[layer][1, off : off + half].tobytes()
        return pack_frame(LAYER, 5, layer, off, half, len(payload), crc32c(payload)) + payload

    inbox = Inbox()
    inbox.expect("early", "prompt")
    with KVReceiver("127.0.0.1", 0, FP, inbox, NullLog()) as receiver:
        c0 = socket.create_connection(("127.0.0.1", receiver.port))
        c1 = socket.create_connection(("127.0.0.1", receiver.port))
        try:
            c1.sendall(layer_frame(*chunks[-1]))  # before BEGIN exists anywhere
            for _ in range(100):  # until the receiver holds it
                with receiver._lock:
                    if receiver._assemblies.get(5) is not None and receiver._assemblies[5].early:
                        break
                time.sleep(0.01)
            else:
                raise AssertionError("the early chunk never arrived")
            begin = meta.to_json()
            end = json.dumps({"next_token": -1, "chunks": len(chunks)}).encode()
            c0.sendall(
                pack_frame(BEGIN, 5, payload_len=len(begin), crc=crc32c(begin))
                + begin
                + b"".join(layer_frame(*c) for c in chunks[:-1])
                + pack_frame(END, 5, payload_len=len(end), crc=crc32c(end))
                + end
            )
            c0.settimeout(10)
            ack = c0.recv(FRAME_HEADER.size, socket.MSG_WAITALL)
            assert FRAME_HEADER.unpack(ack)[2] == ACK
            got = inbox.wait("early", "prompt", 10)
        finally:
            c0.close()
            c1.close()
    body = np.frombuffer(got.blob, np.uint8, offset=len(got.blob) - meta.kv_bytes).reshape(N_LAYER, 2, N_TOKENS, -1)
    assert all((body[i] == layers[i]).all() for i in range(N_LAYER))
    assert BLOB_HEADER.unpack_from(got.blob)[9] == crc32c(got.blob[BLOB_HEADER.size :])


def test_waiting_on_a_sender_never_started_returns_at_once():
    # P's close() waits on every sender it registered; one made but not yet started when the worker stops
    # raised "cannot join thread before it is started" and P exited 1 at teardown (faults tier, stop-rld)
    meta = TransferMeta(
        "never", "prompt", 0, N_TOKENS, tuple(range(N_TOKENS)), FP, N_LAYER, N_KV_HEAD, HEAD_DIM, "float32"
    )
    sender = KVSender("127.0.0.1:9", meta, PathConfig().send_settings(), "wan", NullLog(), pool=ConnectionPool())
    sender.cancel("worker stopping")
    assert sender.wait(5) is None and not sender.done
