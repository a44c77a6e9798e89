"""The KV receiver against peers that hold it instead of breaking it, over real loopback TCP (issue 28).

Each abuse used to disable the receiver for as long as the abusive connections stayed open: empty or tiny
LAYER frames before a BEGIN filling the transfer table, a frame dripped one byte at a time holding its
claimed length of the pre-BEGIN byte budget, idle connections holding the connection table. Here each
abusive connection is closed (or its records dropped) and a normal transfer completes *while* the abusive
peer is still connected.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest
from crc32c import crc32c

from tests.roles.test_kvwire_hostile import closed_by_peer, connect, errors, still_serves, wait_until
from tests.roles.test_kvwire_resilience import FP, Recorder
from workers.kvwire import LAYER, Inbox, KVReceiver, pack_frame
from workers.kvwire.limits import ReceiverLimits


def tiny_chunk(tid: int) -> bytes:
    """A well-formed one-token LAYER frame of 2 bytes for a transfer that never begins."""
    payload = b"kv"
    return pack_frame(LAYER, tid, 0, 0, 1, len(payload), crc32c(payload)) + payload


def test_empty_layer_frames_before_begin_are_refused():
    # 1,024 zero-length LAYER frames on one open connection filled the transfer table for good:
    # every legitimate transfer was refused ("too many transfers in progress").
    inbox, events = Inbox(), Recorder()
    with KVReceiver("127.0.0.1", 0, FP, inbox, events) as receiver:
        with connect(receiver) as abuser:
            try:
                abuser.sendall(b"".join(pack_frame(LAYER, 5000 + i, 0, 0, 1, 0, 0) for i in range(1024)))
            except (BrokenPipeError, ConnectionResetError):
                pass  # refused midway: what the test wants
            time.sleep(0.3)
            still_serves(receiver, inbox, "beside-empty-frames")  # the abuser is still connected
            assert closed_by_peer(abuser, 5), "a connection sending empty pre-BEGIN frames was kept"
        assert any("before BEGIN" in r and "no payload" in r for r in errors(events)), errors(events)
        assert wait_until(lambda: receiver.active_transfers == 0), receiver.active_transfers


def test_one_connection_holds_few_transfers_before_begin():
    inbox, events = Inbox(), Recorder()
    with KVReceiver("127.0.0.1", 0, FP, inbox, events) as receiver:
        with connect(receiver) as abuser:
            try:
                abuser.sendall(b"".join(tiny_chunk(6000 + i) for i in range(64)))
            except (BrokenPipeError, ConnectionResetError):
                pass
            assert closed_by_peer(abuser, 5), "one connection held 64 transfers that never began"
        assert any("transfers before BEGIN" in r for r in errors(events)), errors(events)
        assert wait_until(lambda: receiver.active_transfers == 0), receiver.active_transfers


def test_many_connections_cannot_fill_the_transfer_table():
    # 128 connections x 8 pre-BEGIN records = 1,024: the table was full while they stayed open.
    inbox, events = Inbox(), Recorder()
    with KVReceiver("127.0.0.1", 0, FP, inbox, events) as receiver:
        abusers = [connect(receiver) for _ in range(130)]
        try:
            for n, s in enumerate(abusers):
                try:
                    s.sendall(b"".join(tiny_chunk(10_000 + 8 * n + i) for i in range(8)))
                except (BrokenPipeError, ConnectionResetError):
                    pass
            time.sleep(receiver.limits.early_evict_s + 0.2)  # theirs are then the oldest, and make room
            still_serves(receiver, inbox, "beside-many-abusers")
            assert receiver.active_transfers <= receiver.limits.early_max_transfers
        finally:
            for s in abusers:
                s.close()
        assert wait_until(lambda: receiver.active_transfers == 0, 10), receiver.active_transfers


def test_transfers_that_never_begin_expire_while_their_connection_lives():
    inbox, events = Inbox(), Recorder()
    with KVReceiver("127.0.0.1", 0, FP, inbox, events, limits=ReceiverLimits(early_keep_s=0.3)) as receiver:
        with connect(receiver) as abuser:
            abuser.sendall(tiny_chunk(7000))
            assert wait_until(lambda: receiver.active_transfers == 1)
            time.sleep(0.5)
            still_serves(receiver, inbox, "after-expiry")  # its BEGIN sweeps what expired
            assert receiver.active_transfers == 0
            dropped = [f["reason"] for f in events.named("kv_recv_dropped") if f["transfer_id"] == 7000]
            assert dropped and "no BEGIN within" in dropped[0], events.named("kv_recv_dropped")
            assert not closed_by_peer(abuser, 0.2)  # a late chunk is not an attack: only its record went


def drip(s: socket.socket, data: bytes, gap_s: float, stop: threading.Event) -> None:
    for i in range(len(data)):
        if stop.is_set():
            return
        try:
            s.sendall(data[i : i + 1])
        except OSError:
            return
        time.sleep(gap_s)


def test_a_dripped_frame_misses_its_deadline():
    # One byte every 0.05 s never let the per-recv idle timeout fire: the frame stayed open for ever.
    inbox, events = Inbox(), Recorder()
    limits = ReceiverLimits(frame_idle_s=0.3, frame_grace_s=0.5, frame_min_rate_bytes_s=64 << 20)
    with KVReceiver("127.0.0.1", 0, FP, inbox, events, limits=limits) as receiver:
        with connect(receiver) as abuser:
            stop = threading.Event()
            frame = pack_frame(LAYER, 8000, 0, 0, 8, 8 << 20, 0) + bytes(200)
            t = threading.Thread(target=drip, args=(abuser, frame, 0.05, stop), daemon=True)
            t.start()
            try:
                assert closed_by_peer(abuser, 4), "a frame dripped at 20 B/s held its connection"
            finally:
                stop.set()
                t.join(2)
        assert any("not complete within" in r for r in errors(events)), errors(events)
        assert wait_until(lambda: receiver.active_transfers == 0)
        still_serves(receiver, inbox, "after-drip")


def test_a_frame_reserves_the_bytes_that_arrived_not_its_claimed_length():
    # Four frames claiming 64 MiB each, a few bytes sent, reserved the whole 256 MiB before-BEGIN budget:
    # a legitimate chunk overtaking its BEGIN was then refused ("too much KV before BEGIN").
    inbox, events = Inbox(), Recorder()
    with KVReceiver("127.0.0.1", 0, FP, inbox, events) as receiver:
        drippers = [connect(receiver) for _ in range(4)]
        try:
            for i, s in enumerate(drippers):
                s.sendall(pack_frame(LAYER, 9000 + i, 0, 0, 8, 64 << 20, 0) + bytes(10))
            assert wait_until(lambda: receiver.active_transfers == 4)
            payload = bytes(64 << 10)
            with connect(receiver) as honest:
                honest.sendall(pack_frame(LAYER, 9100, 0, 0, 1, len(payload), crc32c(payload)) + payload)
                assert not closed_by_peer(honest, 1.0), errors(events)
            assert not any("too much KV before BEGIN" in r for r in errors(events)), errors(events)
            with receiver._lock:
                held = receiver.early.held_bytes
            assert held < 1 << 20, f"{held} bytes reserved for 40 bytes received"
            still_serves(receiver, inbox, "beside-drippers")
        finally:
            for s in drippers:
                s.close()


def test_an_idle_connection_times_out():
    inbox, events = Inbox(), Recorder()
    with KVReceiver("127.0.0.1", 0, FP, inbox, events, limits=ReceiverLimits(conn_idle_s=0.5)) as receiver:
        idle = connect(receiver)
        try:
            assert closed_by_peer(idle, 4), "an idle connection was kept for ever"
        finally:
            idle.close()
        assert wait_until(lambda: len(receiver._conns) == 0)
        still_serves(receiver, inbox, "after-idle")


def test_limits_are_checked_once_with_the_field_named():
    with pytest.raises(ValueError, match="frame_grace_s must be positive"):
        ReceiverLimits(frame_grace_s=0)
    with pytest.raises(ValueError, match="early_max_transfers .* must be below max_transfers"):
        ReceiverLimits(early_max_transfers=1024, max_transfers=1024)


def test_a_new_peer_displaces_idle_connections_when_the_table_is_full():
    # max_connections idle connections locked every new peer out for as long as they stayed open.
    inbox, events = Inbox(), Recorder()
    limits = ReceiverLimits(max_connections=3, conn_evict_idle_s=0.2)
    with KVReceiver("127.0.0.1", 0, FP, inbox, events, limits=limits) as receiver:
        held = [connect(receiver) for _ in range(3)]
        try:
            assert wait_until(lambda: len(receiver._conns) == 3)
            time.sleep(0.4)
            still_serves(receiver, inbox, "displacing-idle")  # its two connections displace two idle ones
            assert sum(closed_by_peer(s, 1) for s in held) == 2
        finally:
            for s in held:
                s.close()
