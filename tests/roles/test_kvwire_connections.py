"""KV transfers over real loopback TCP: kept connections are reused, dropped when the peer closed them.

A KVReceiver in this process, KVSenders with their own ConnectionPool: three transfers in a row open
the path's connections once; a transfer after the receiver restarted finds the kept connections dead
and opens new ones without a retry; persistent=false opens new ones every time.
"""
import numpy as np

from workers.roles.config import PathConfig
from workers.roles.events import NullLog
from workers.roles.kvwire import ConnectionPool, Inbox, KVReceiver, KVSender, TransferMeta

FP = "11" * 16
N_LAYER, N_KV_HEAD, HEAD_DIM, N_TOKENS = 2, 2, 8, 40


def send(port: int, pool: ConnectionPool, rid: str, inbox: Inbox, settings: PathConfig):
    meta = TransferMeta(rid, "prompt", 0, N_TOKENS, tuple(range(N_TOKENS)), FP, N_LAYER, N_KV_HEAD, HEAD_DIM,
                        "float32")
    inbox.expect(rid, "prompt")
    rng = np.random.default_rng(len(rid))
    layers = [rng.integers(0, 255, (2, N_TOKENS, meta.row_bytes), dtype=np.uint8) for _ in range(N_LAYER)]
    sender = KVSender(f"127.0.0.1:{port}", meta, settings, "wan", NullLog(), pool=pool).start()
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
