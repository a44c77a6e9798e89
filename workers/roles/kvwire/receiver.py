"""The receiving side of the KV data plane: verify frames, assemble transfers, deliver them.

Responsible for: KVReceiver (listener, one thread per connection, frame
checks, assembly in place, the ACK) and Inbox (complete transfers waiting
for the session that expects them).
Not responsible for: importing KV into an engine (the decode role).
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from crc32c import crc32c

from workers.crc import crc32c_combine
from workers.roles.events import EventLog
from workers.roles.kvwire.blob import BufferPool, ChunkCrcs, blob_buffer, seal_blob
from workers.roles.kvwire.frame import (
    ACK,
    BEGIN,
    CANCEL,
    END,
    EXPECT_WAIT_S,
    FRAME_HEADER,
    FRAME_MAGIC,
    FRAME_TYPES,
    FRAME_VERSION,
    HAVE,
    LAYER,
    MAX_META_BYTES,
    RESUME,
    FrameError,
    TransferMeta,
    pack_frame,
)
from workers.roles.kvwire.sockets import recv_exact

log = logging.getLogger(__name__)

RESUME_KEEP_S = 60.0  # a transfer whose connection died waits this long for its sender's RESUME
COMPLETED_KEPT = 4096  # ids of recently completed transfers remembered for a RESUME that lost its ACK


@dataclass(frozen=True)
class ReceivedTransfer:
    """A complete, verified transfer. blob: an engine KV blob (1-D uint8); next_token: -1 if none.

    Call release() once the blob has been imported: its memory goes back to the receiver's pool (the
    blob must not be read after that)."""

    meta: TransferMeta
    blob: np.ndarray
    next_token: int
    wire_bytes: int
    first_byte_ns: int
    done_ns: int
    pool: BufferPool | None = field(default=None, repr=False)

    def release(self) -> None:
        if self.pool is not None:
            self.pool.give(self.blob)


class Inbox:
    """Complete transfers waiting for the session that expects them, keyed by (request_id, kind).

    A transfer nobody expects is refused at BEGIN, so nothing accumulates."""

    def __init__(self):
        self._cond = threading.Condition()
        self._expected: set[tuple[str, str]] = set()
        self._ready: dict[tuple[str, str], ReceivedTransfer] = {}
        self._forget_hooks: list[Callable[[str], None]] = []

    def on_forget(self, hook: Callable[[str], None]) -> None:
        """hook(request_id) runs whenever a request is forgotten (a receiver drops what it kept for it)."""
        self._forget_hooks.append(hook)

    def expect(self, request_id: str, kind: str) -> None:
        with self._cond:
            self._expected.add((request_id, kind))
            self._cond.notify_all()

    def is_expected(self, request_id: str, kind: str, wait_s: float = 0.0) -> bool:
        """Whether a session expects this transfer; waits up to wait_s for one to (KV may overtake the
        call that opens the session)."""
        with self._cond:
            return self._cond.wait_for(lambda: (request_id, kind) in self._expected, wait_s)

    def forget(self, request_id: str) -> None:
        """Stop expecting anything for request_id and drop what arrived."""
        with self._cond:
            self._expected = {k for k in self._expected if k[0] != request_id}
            for k in [k for k in self._ready if k[0] == request_id]:
                self._ready.pop(k).release()
        for hook in self._forget_hooks:
            hook(request_id)

    def put(self, transfer: ReceivedTransfer) -> bool:
        key = (transfer.meta.request_id, transfer.meta.kind)
        with self._cond:
            if key not in self._expected:
                return False
            old = self._ready.get(key)
            self._ready[key] = transfer  # a retry's copy replaces an unclaimed earlier one
            if old is not None:
                old.release()
            self._cond.notify_all()
            return True

    def wait(
        self, request_id: str, kind: str, timeout_s: float, stop: Callable[[], bool] = lambda: False
    ) -> ReceivedTransfer | None:
        """The transfer once it is complete; None on timeout or when stop() turns true."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while (request_id, kind) not in self._ready:
                left = deadline - time.monotonic()
                if left <= 0 or stop():
                    return None
                self._cond.wait(min(left, 0.05))
            return self._ready.pop((request_id, kind))

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    @property
    def pending(self) -> int:
        with self._cond:
            return len(self._ready)


def _verify_chunk(k, v, crc: int, layer: int, off: int) -> tuple[int, int]:
    """(crc32c(k), crc32c(v)) of a LAYER payload k + v whose frame says crc32c(k + v) == crc."""
    crc_k, crc_v = crc32c(k), crc32c(v)
    got = crc32c_combine(crc_k, crc_v, len(v))
    if got != crc:
        raise FrameError(f"LAYER payload checksum mismatch (layer {layer}, offset {off}: {got:#010x} != {crc:#010x})")
    return crc_k, crc_v


@dataclass
class _Assembly:
    transfer_id: int
    meta: TransferMeta | None = None
    blob: np.ndarray | None = None  # blob_buffer: the engine blob being filled
    buf: np.ndarray | None = None  # its KV region, (n_layer, 2, n, row_bytes) uint8
    early: list[tuple[int, int, int, bytearray, tuple[int, int]]] = field(default_factory=list)  # before BEGIN
    seen: ChunkCrcs = field(default_factory=dict)  # verified chunks
    received_bytes: int = 0
    chunks_expected: int = -1
    next_token: int = -1
    wire_bytes: int = 0
    first_byte_ns: int = 0
    ack_sock: socket.socket | None = None
    ack_lock: threading.Lock | None = None
    orphaned_ns: int = 0  # its connection died; kept for a RESUME until RESUME_KEEP_S


class KVReceiver:
    """Listens for KV transfers and delivers complete ones to an Inbox.

    host, port: listen address
    expected_fingerprint: hex fingerprint of this worker's model; other KV is refused
    inbox: where complete transfers go
    max_transfer_bytes, max_frame_bytes: refuse larger (memory bound)
    events: event log
    """

    def __init__(
        self,
        host: str,
        port: int,
        expected_fingerprint: str,
        inbox: Inbox,
        events: EventLog,
        max_transfer_bytes: int = 1 << 30,
        max_frame_bytes: int = 64 << 20,
    ):
        self.fingerprint = expected_fingerprint
        self.inbox = inbox
        self.events = events
        self.max_transfer_bytes = max_transfer_bytes
        self.max_frame_bytes = max_frame_bytes
        self._lock = threading.Lock()
        self._assemblies: dict[int, _Assembly] = {}
        self._completed: OrderedDict[int, None] = OrderedDict()  # recent transfer ids, for a late RESUME
        self._conns: set[socket.socket] = set()
        self._threads: set[threading.Thread] = set()
        self._stopping = False
        self.pool = BufferPool()
        self._listener = socket.create_server((host, port), backlog=128, reuse_port=False)
        self.port = self._listener.getsockname()[1]
        self._accept_thread = threading.Thread(target=self._accept_loop, name="kvrecv-accept", daemon=True)
        inbox.on_forget(self._drop_request)

    def start(self) -> KVReceiver:
        self._accept_thread.start()
        return self

    def __enter__(self) -> KVReceiver:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def active_transfers(self) -> int:
        with self._lock:
            return len(self._assemblies)

    def stop(self) -> None:
        """Close the listener and every connection; join the threads."""
        self._stopping = True
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        with self._lock:
            conns, threads = list(self._conns), list(self._threads)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._accept_thread.join(5)
        for t in threads:
            t.join(5)

    def _accept_loop(self) -> None:
        while not self._stopping:
            try:
                conn, peer = self._listener.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            t = threading.Thread(
                target=self._conn_main, args=(conn, f"{peer[0]}:{peer[1]}"), name=f"kvrecv-{peer[1]}", daemon=True
            )
            with self._lock:
                self._conns.add(conn)
                self._threads.add(t)
            t.start()

    def _conn_main(self, conn: socket.socket, peer: str) -> None:
        mine: set[int] = set()  # transfers this connection carried (dropped if it dies before they complete)
        ack_lock = threading.Lock()
        try:
            while self._read_frame(conn, peer, mine, ack_lock):
                pass
        except FrameError as err:
            self.events.emit("kv_frame_error", self._request_of(mine), peer=peer, reason=str(err))
            log.warning("KV frame from %s refused: %s", peer, err)
        except OSError as err:
            if not self._stopping:
                self.events.emit("kv_conn_error", self._request_of(mine), peer=peer, reason=str(err))
        finally:
            self._orphan(mine, conn, f"connection from {peer} closed before the transfer completed")
            with self._lock:
                self._conns.discard(conn)
                self._threads.discard(threading.current_thread())
            conn.close()

    def _request_of(self, tids: set[int]) -> str | None:
        with self._lock:
            for tid in tids:
                a = self._assemblies.get(tid)
                if a is not None and a.meta is not None:
                    return a.meta.request_id
        return None

    def _orphan(self, tids: set[int], conn: socket.socket, reason: str) -> None:
        """A connection died: keep its begun transfers for the sender's RESUME (unless a RESUME already moved
        them to another connection); drop the rest."""
        now, dropped, kept = time.monotonic_ns(), [], []
        with self._lock:
            for t in tids:
                a = self._assemblies.get(t)
                if a is None or a.ack_sock not in (conn, None):
                    continue
                if a.meta is None:
                    dropped.append(self._assemblies.pop(t))
                else:
                    a.orphaned_ns, a.ack_sock = now, None
                    kept.append(a)
        for a in kept:
            self.events.emit(
                "kv_recv_orphaned",
                a.meta.request_id,
                transfer_id=a.transfer_id,
                reason=reason,
                kv_bytes_received=a.received_bytes,
            )
        self._dropped(dropped, reason)

    def _dropped(self, assemblies: list[_Assembly], reason: str) -> None:
        for a in assemblies:
            if a.blob is not None:
                self.pool.give(a.blob)
            self.events.emit(
                "kv_recv_dropped",
                a.meta.request_id if a.meta else None,
                transfer_id=a.transfer_id,
                reason=reason,
                kv_bytes_received=a.received_bytes,
            )

    def _sweep_orphans(self) -> None:
        """Drop kept transfers whose sender did not come back within RESUME_KEEP_S."""
        limit = time.monotonic_ns() - int(RESUME_KEEP_S * 1e9)
        with self._lock:
            old = [t for t, a in self._assemblies.items() if a.orphaned_ns and a.orphaned_ns < limit]
            dropped = [self._assemblies.pop(t) for t in old]
        self._dropped(dropped, f"no RESUME within {RESUME_KEEP_S:.0f} s")

    def _drop_request(self, request_id: str) -> None:
        """The request's session closed: what is kept for it is of no use."""
        with self._lock:
            mine = [
                t
                for t, a in self._assemblies.items()
                if a.orphaned_ns and a.meta is not None and a.meta.request_id == request_id
            ]
            dropped = [self._assemblies.pop(t) for t in mine]
        self._dropped(dropped, "the request's session closed")

    def _read_frame(self, conn: socket.socket, peer: str, mine: set[int], ack_lock: threading.Lock) -> bool:
        """Read and apply one frame; False at a clean EOF between frames."""
        hdr = bytearray(FRAME_HEADER.size)
        got = recv_exact(conn, memoryview(hdr))
        if got == 0:
            return False
        if got < len(hdr):
            raise FrameError(f"truncated frame header ({got} of {len(hdr)} bytes)")
        magic, version, ftype, layer, tid, off, cnt, plen, crc = FRAME_HEADER.unpack(hdr)
        if magic != FRAME_MAGIC or version != FRAME_VERSION:
            raise FrameError(f"bad magic/version {magic!r}/{version} (expected {FRAME_MAGIC!r}/{FRAME_VERSION})")
        if ftype not in (BEGIN, LAYER, END, CANCEL, RESUME):
            raise FrameError(f"unexpected frame type {ftype}")
        limit = self.max_frame_bytes if ftype == LAYER else MAX_META_BYTES
        if plen > limit:
            raise FrameError(f"{FRAME_TYPES[ftype]} payload of {plen} bytes exceeds the limit of {limit}")
        if ftype == LAYER:
            mine.add(tid)
            self._on_layer(conn, tid, layer, off, cnt, plen, crc)
        else:
            payload = self._read_payload(conn, plen, crc)
            if ftype == BEGIN:
                self._on_begin(tid, payload, conn, ack_lock, mine)
            elif ftype == RESUME:
                self._on_resume(tid, conn, ack_lock, mine)
            elif ftype == END:
                self._on_end(tid, payload)
            else:
                self._on_cancel(tid, mine)
        self._maybe_complete(tid)
        with self._lock:
            if tid not in self._assemblies:  # done or dropped: a kept connection carries many transfers
                mine.discard(tid)
        return True

    def _read_payload(self, conn: socket.socket, plen: int, crc: int) -> bytes:
        buf = bytearray(plen)
        if recv_exact(conn, memoryview(buf)) < plen:
            raise FrameError(f"truncated payload (connection closed inside a {plen}-byte payload)")
        got = crc32c(buf)
        if got != crc:
            raise FrameError(f"payload checksum mismatch ({got:#010x} != {crc:#010x})")
        return bytes(buf)

    def _assembly(self, tid: int) -> _Assembly:
        a = self._assemblies.get(tid)
        if a is None:
            if len(self._assemblies) >= 1024:
                raise FrameError("too many transfers in progress (1024)")
            a = self._assemblies[tid] = _Assembly(tid, first_byte_ns=time.monotonic_ns())
        return a

    def _on_begin(
        self, tid: int, payload: bytes, conn: socket.socket, ack_lock: threading.Lock, mine: set[int]
    ) -> None:
        meta = TransferMeta.from_json(payload)
        if meta.fingerprint != self.fingerprint:
            raise FrameError(f"KV of another model (fingerprint {meta.fingerprint[:12]}, mine {self.fingerprint[:12]})")
        if meta.kv_bytes > self.max_transfer_bytes:
            raise FrameError(f"transfer of {meta.kv_bytes} bytes exceeds the limit of {self.max_transfer_bytes}")
        if not self.inbox.is_expected(meta.request_id, meta.kind, EXPECT_WAIT_S):
            raise FrameError(f"no open request {meta.request_id!r} expects {meta.kind} KV")
        self._sweep_orphans()
        with self._lock:
            a = self._assembly(tid)
            if a.meta is not None:
                raise FrameError(f"transfer {tid} began twice")
            a.meta, a.ack_sock, a.ack_lock = meta, conn, ack_lock
            a.blob, a.buf = blob_buffer(meta, self.pool)
            a.wire_bytes += FRAME_HEADER.size + len(payload)
            early, a.early = a.early, []
            mine.add(tid)
        for layer, off, cnt, data, crcs in early:
            self._place(a, layer, off, cnt, data, crcs)
        self.events.emit(
            "kv_recv_begin",
            meta.request_id,
            kind=meta.kind,
            transfer_id=tid,
            start=meta.start,
            end=meta.end,
            kv_bytes=meta.kv_bytes,
        )

    def _on_resume(self, tid: int, conn: socket.socket, ack_lock: threading.Lock, mine: set[int]) -> None:
        """A sender retrying transfer tid asks what arrived: HAVE {state: new | partial | done, chunks}. A
        partial transfer continues on this connection (its ACK goes here)."""
        self._sweep_orphans()
        with self._lock:
            a = self._assemblies.get(tid)
            if tid in self._completed:
                state, chunks = "done", []
            elif a is not None and a.meta is not None:
                state, chunks = "partial", [list(k) for k in a.seen]
                a.ack_sock, a.ack_lock, a.orphaned_ns = conn, ack_lock, 0
                mine.add(tid)
            else:
                if a is not None:  # chunks without their BEGIN: the sender sends everything again
                    self._assemblies.pop(tid)
                state, chunks = "new", []
        body = json.dumps({"state": state, "chunks": chunks}).encode()
        with ack_lock:
            conn.sendall(pack_frame(HAVE, tid, payload_len=len(body), crc=crc32c(body)) + body)
        self.events.emit(
            "kv_recv_resume",
            a.meta.request_id if a is not None and a.meta else None,
            transfer_id=tid,
            state=state,
            chunks_held=len(chunks),
            kv_bytes_held=a.received_bytes if state == "partial" else 0,
        )

    def _check_chunk(self, a: _Assembly, layer: int, off: int, cnt: int, plen: int) -> bool:
        """Whether the chunk fits the transfer (else FrameError); True when it is already held (a copy
        that raced its connection's death: read, checked and not counted again)."""
        m = a.meta
        if layer >= m.n_layer or cnt == 0 or off + cnt > m.n_tokens or plen != 2 * cnt * m.row_bytes:
            raise FrameError(
                f"chunk layer {layer} tokens [{off}, {off + cnt}) of {plen} bytes does not fit "
                f"a transfer of {m.n_layer} layers x {m.n_tokens} tokens"
            )
        held = a.seen.get((layer, off))
        if held is not None and held[0] != cnt:
            raise FrameError(f"chunk layer {layer} offset {off} arrived twice with {held[0]} and {cnt} tokens")
        return held is not None

    def _on_layer(self, conn: socket.socket, tid: int, layer: int, off: int, cnt: int, plen: int, crc: int) -> None:
        with self._lock:
            a = self._assembly(tid)
            began = a.meta is not None
            dup = began and self._check_chunk(a, layer, off, cnt, plen)
        if not began or dup:  # BEGIN is still on its way on connection 0: keep the bytes
            data = bytearray(plen)
            view = memoryview(data)
            if recv_exact(conn, view) < plen:
                raise FrameError(f"truncated LAYER payload (layer {layer}, tokens [{off}, {off + cnt}))")
            crcs = _verify_chunk(view[: plen // 2], view[plen // 2 :], crc, layer, off)
            if dup:
                return
            with self._lock:
                if a.meta is None:
                    if sum(len(e[3]) for e in a.early) + plen > self.max_transfer_bytes:
                        raise FrameError("too much KV before BEGIN")
                    a.early.append((layer, off, cnt, data, crcs))
                    return
            self._place(a, layer, off, cnt, data, crcs)
            return
        k_dst, v_dst = (
            memoryview(a.buf[layer, 0, off : off + cnt]).cast("B"),
            memoryview(a.buf[layer, 1, off : off + cnt]).cast("B"),
        )
        if recv_exact(conn, k_dst) < len(k_dst) or recv_exact(conn, v_dst) < len(v_dst):
            raise FrameError(f"truncated LAYER payload (layer {layer}, tokens [{off}, {off + cnt}))")
        self._count(a, layer, off, cnt, _verify_chunk(k_dst, v_dst, crc, layer, off), plen)

    def _place(self, a: _Assembly, layer: int, off: int, cnt: int, data: bytearray, crcs: tuple[int, int]) -> None:
        with self._lock:
            if self._check_chunk(a, layer, off, cnt, len(data)):
                return
        half = len(data) // 2
        a.buf[layer, 0, off : off + cnt] = np.frombuffer(data, np.uint8, half).reshape(cnt, -1)
        a.buf[layer, 1, off : off + cnt] = np.frombuffer(data, np.uint8, half, half).reshape(cnt, -1)
        self._count(a, layer, off, cnt, crcs, len(data))

    def _count(self, a: _Assembly, layer: int, off: int, cnt: int, crcs: tuple[int, int], plen: int) -> None:
        with self._lock:
            a.wire_bytes += FRAME_HEADER.size + plen
            if (layer, off) in a.seen:
                return  # two copies raced (see _check_chunk): count one
            a.seen[layer, off] = (cnt, *crcs)
            a.received_bytes += plen

    def _on_end(self, tid: int, payload: bytes) -> None:
        try:
            d = json.loads(payload)
            next_token, chunks = int(d["next_token"]), int(d["chunks"])
        except (ValueError, TypeError, KeyError) as err:
            raise FrameError(f"END payload malformed: {err}") from None
        with self._lock:
            a = self._assembly(tid)
            a.next_token, a.chunks_expected = next_token, chunks
            a.wire_bytes += FRAME_HEADER.size + len(payload)

    def _on_cancel(self, tid: int, mine: set[int]) -> None:
        with self._lock:
            a = self._assemblies.pop(tid, None)
        mine.discard(tid)
        if a is not None:
            self.events.emit(
                "kv_recv_cancelled",
                a.meta.request_id if a.meta else None,
                transfer_id=tid,
                kv_bytes_received=a.received_bytes,
            )

    def _maybe_complete(self, tid: int) -> None:
        with self._lock:
            a = self._assemblies.get(tid)
            if a is None or a.meta is None or a.chunks_expected < 0 or len(a.seen) < a.chunks_expected:
                return
            if a.received_bytes != a.meta.kv_bytes:
                self._assemblies.pop(tid)
                raise FrameError(
                    f"transfer {tid}: {a.received_bytes} KV bytes in {len(a.seen)} chunks, expected {a.meta.kv_bytes}"
                )
            del self._assemblies[tid]
            self._completed[tid] = None
            while len(self._completed) > COMPLETED_KEPT:
                self._completed.popitem(last=False)
        try:
            blob = seal_blob(a.meta, a.blob, a.seen)
        except FrameError:
            self.pool.give(a.blob)
            raise
        done_ns = time.monotonic_ns()
        self._ack(a, tid)
        transfer = ReceivedTransfer(a.meta, blob, a.next_token, a.wire_bytes, a.first_byte_ns, done_ns, self.pool)
        accepted = self.inbox.put(transfer)
        if not accepted:
            transfer.release()
        self.events.emit(
            "kv_recv_end",
            a.meta.request_id,
            kind=a.meta.kind,
            transfer_id=tid,
            kv_bytes=a.meta.kv_bytes,
            wire_bytes=a.wire_bytes,
            duration_ns=done_ns - a.first_byte_ns,
            delivered=accepted,
        )

    def _ack(self, a: _Assembly, tid: int) -> None:
        """Every frame's crc checked: the data plane's part is done; delivery is local. Best effort: a
        connection that died meanwhile takes the ACK with it, and the sender's RESUME learns 'done'."""
        if a.ack_sock is None or a.ack_lock is None:
            return
        try:
            with a.ack_lock:
                a.ack_sock.sendall(pack_frame(ACK, tid))
        except OSError as err:
            log.info("ACK of transfer %d not sent (%s); a RESUME will learn it is done", tid, err)
