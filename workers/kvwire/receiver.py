"""The receiving side of the KV data plane: verify frames, assemble transfers, deliver them.

Responsible for: KVReceiver (listener, one thread per connection, frame
checks, assembly in place, the ACK, which transfers exist and for how long,
which connection a transfer lives on: a RESUME makes the others stale).
Complete transfers go to an Inbox (inbox.py); the bounds a broken or hostile
peer meets (deadlines, what is held before a BEGIN) are limits.py's.
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

import numpy as np
from crc32c import crc32c

from workers.kvwire.blob import BufferPool, ChunkCrcs, blob_buffer, seal_blob
from workers.kvwire.frame import (
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
    verify_chunk,
)
from workers.kvwire.inbox import Inbox, ReceivedTransfer
from workers.kvwire.limits import ConnIdle, EarlyBudget, PeerConn, ReceiverLimits, StaleConn, make_room, supersede
from workers.kvwire.seam import EventSink

log = logging.getLogger(__name__)

RESUME_KEEP_S = 60.0  # a transfer whose connection died waits this long for its sender's RESUME
COMPLETED_KEPT = 4096  # ids of recently completed transfers remembered for a RESUME that lost its ACK
READ_PIECE_BYTES = 1 << 20  # a payload read outside its transfer's buffer grows by this much as bytes arrive
STOP_JOIN_S = 5.0  # stop(): how long the connection threads get, together, to end (they are daemons: exit goes on)


_EarlyChunk = tuple[int, int, int, bytearray, tuple[int, int], PeerConn]  # layer, offset, count, data, crcs, origin


@dataclass
class _Assembly:
    transfer_id: int
    meta: TransferMeta | None = None
    blob: np.ndarray | None = None  # blob_buffer: the engine blob being filled
    buf: np.ndarray | None = None  # its KV region, (n_layer, 2, n, row_bytes) uint8
    early: list[_EarlyChunk] = field(default_factory=list)  # chunks that came before BEGIN
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
    events: where its events go (an EventSink: the role's event log)
    limits: the bounds a broken or hostile peer meets (tests make them small)
    """

    def __init__(
        self,
        host: str,
        port: int,
        expected_fingerprint: str,
        inbox: Inbox,
        events: EventSink,
        max_transfer_bytes: int = 1 << 30,
        max_frame_bytes: int = 64 << 20,
        limits: ReceiverLimits = ReceiverLimits(),
    ):
        self.fingerprint = expected_fingerprint
        self.inbox = inbox
        self.events = events
        self.max_transfer_bytes = max_transfer_bytes
        self.max_frame_bytes = max_frame_bytes
        self.limits = limits
        self.early = EarlyBudget(limits)  # bytes held for transfers whose BEGIN has not come
        self._lock = threading.Lock()
        self._assemblies: dict[int, _Assembly] = {}
        self._completed: OrderedDict[int, None] = OrderedDict()  # recent transfer ids, for a late RESUME
        self._conns: dict[socket.socket, PeerConn] = {}
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
        deadline = time.monotonic() + STOP_JOIN_S  # one deadline for all: 60 stuck threads must not take 60 x 5 s
        self._accept_thread.join(STOP_JOIN_S)
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def _accept_loop(self) -> None:
        while not self._stopping:
            try:
                conn, peer = self._listener.accept()
            except OSError:
                return
            name = f"{peer[0]}:{peer[1]}"
            if not self._room_for(name):
                reason = f"{self.limits.max_connections} connections open"
                self.events.emit("kv_conn_refused", None, peer=name, reason=reason)
                conn.close()
                continue
            c = PeerConn(conn, name, self.limits)
            c.tune()
            t = threading.Thread(target=self._conn_main, args=(c,), name=f"kvrecv-{peer[1]}", daemon=True)
            with self._lock:
                self._conns[conn] = c
                self._threads.add(t)
            t.start()

    def _room_for(self, name: str) -> bool:
        """Whether a new connection may be served: under max_connections, or by displacing the longest idle."""
        now = time.monotonic()
        with self._lock:
            room, victim = make_room(list(self._conns.values()), self.limits.max_connections, now)
        if victim is None:
            return room
        reason = f"idle {now - victim.idle_since_s:.1f} s: closed to make room for {name}"
        self.events.emit("kv_conn_refused", None, peer=victim.peer, reason=reason)
        try:
            victim.sock.shutdown(socket.SHUT_RDWR)  # its reader sees EOF between frames and ends
        except OSError:
            pass
        return True

    def _conn_main(self, c: PeerConn) -> None:
        try:
            while self._read_frame(c):
                pass
        except ConnIdle as err:
            log.info("KV connection from %s closed: %s", c.peer, err)
        except StaleConn as err:  # its sender gave it up: closed, the transfer untouched
            self.events.emit("kv_conn_refused", None, peer=c.peer, reason=str(err))
        except FrameError as err:
            self.events.emit("kv_frame_error", self._request_of(c.mine), peer=c.peer, reason=str(err))
            log.warning("KV frame from %s refused: %s", c.peer, err)
        except OSError as err:
            if not self._stopping:
                self.events.emit("kv_conn_error", self._request_of(c.mine), peer=c.peer, reason=str(err))
        except Exception as err:  # a bug here must cost one connection, with a trace, never the receiver
            log.exception("KV connection from %s failed", c.peer)
            self.events.emit(
                "kv_frame_error", self._request_of(c.mine), peer=c.peer, reason=f"internal: {type(err).__name__}: {err}"
            )
        finally:
            self._orphan(c, f"connection from {c.peer} closed before the transfer completed")
            with self._lock:
                self._conns.pop(c.sock, None)
                self._threads.discard(threading.current_thread())
            c.sock.close()

    def _request_of(self, tids: set[int]) -> str | None:
        with self._lock:
            for tid in tids:
                a = self._assemblies.get(tid)
                if a is not None and a.meta is not None:
                    return a.meta.request_id
        return None

    def _orphan(self, c: PeerConn, reason: str) -> None:
        """A connection died: keep its begun transfers for the sender's RESUME (unless a RESUME already moved
        them to another connection); drop the rest."""
        now, dropped, kept = time.monotonic_ns(), [], []
        with self._lock:
            for t in c.mine - c.superseded:  # a superseded transfer lives on on another connection
                a = self._assemblies.get(t)
                if a is None or a.ack_sock not in (c.sock, None):
                    continue
                if a.meta is None:
                    dropped.append(self._pop(t))
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

    def _sweep(self) -> None:
        """Drop kept transfers whose sender did not come back within RESUME_KEEP_S, and transfers whose
        chunks came but whose BEGIN did not within early_keep_s (their connections may live on)."""
        now = time.monotonic_ns()
        orphan_limit, early_limit = now - int(RESUME_KEEP_S * 1e9), now - int(self.limits.early_keep_s * 1e9)
        with self._lock:
            items = self._assemblies.items()
            orphans = [t for t, a in items if a.orphaned_ns and a.orphaned_ns < orphan_limit]
            unbegun = [t for t, a in items if a.meta is None and a.first_byte_ns < early_limit]
            orphans, unbegun = [self._pop(t) for t in orphans], [self._pop(t) for t in unbegun]
        self._dropped(orphans, f"no RESUME within {RESUME_KEEP_S:.0f} s")
        self._dropped(unbegun, f"no BEGIN within {self.limits.early_keep_s:g} s of its first chunk")

    def _drop_request(self, request_id: str) -> None:
        """The request's session closed: what is kept for it is of no use."""
        with self._lock:
            mine = [
                t
                for t, a in self._assemblies.items()
                if a.orphaned_ns and a.meta is not None and a.meta.request_id == request_id
            ]
            dropped = [self._pop(t) for t in mine]
        self._dropped(dropped, "the request's session closed")

    def _pop(self, tid: int) -> _Assembly:
        """Remove a transfer (lock held), giving back what it held before its BEGIN."""
        a = self._assemblies.pop(tid)
        self._take_early(a)
        return a

    def _take_early(self, a: _Assembly) -> list:
        """The chunks a transfer held before its BEGIN, their bytes given back to the bounds (lock held)."""
        early, a.early = a.early, []
        for *_, data, _, origin in early:
            self.early.give_back(origin, len(data))
        return early

    def _read_frame(self, c: PeerConn) -> bool:
        """Read and apply one frame; False at a clean EOF between frames."""
        hdr = bytearray(FRAME_HEADER.size)
        got = c.fill(memoryview(hdr), between_frames=True)
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
        c.frame_payload(plen)
        if tid in c.superseded:
            raise StaleConn(f"transfer {tid} was resumed on another connection: this one's frames are stale")
        if ftype == LAYER:
            c.mine.add(tid)
            self._on_layer(c, tid, layer, off, cnt, plen, crc)
        else:
            c.waiting_begin = tid if ftype == BEGIN else None  # a RESUME until its wait ends makes it stale
            payload = c.read_payload(plen, crc)  # at most MAX_META_BYTES here (BEGIN, END, RESUME, CANCEL)
            if ftype == BEGIN:
                self._on_begin(tid, payload, c)
            elif ftype == RESUME:
                self._on_resume(tid, c)
            elif ftype == END:
                self._on_end(tid, payload)
            else:
                self._on_cancel(tid, c.mine)
        self._maybe_complete(tid)
        with self._lock:
            if tid not in self._assemblies:  # done or dropped: a kept connection carries many transfers
                c.mine.discard(tid)
        c.frame_done()
        return True

    def _read_held(self, c: PeerConn, plen: int, what: str, early: bool) -> bytearray:
        """A payload that cannot go straight into its transfer's buffer, its memory grown only as bytes
        arrive (a LAYER header alone must not allocate its whole length). early: its bytes count against
        the pre-BEGIN budget as they arrive (given back here if the read fails)."""
        data, piece = bytearray(), bytearray(min(plen, READ_PIECE_BYTES))
        try:
            while len(data) < plen:
                view = memoryview(piece)[: min(len(piece), plen - len(data))]
                n = c.read_some(view)
                if n == 0:
                    raise FrameError(f"truncated LAYER payload ({what})")
                if early:
                    with self._lock:
                        self.early.reserve(c, n)
                data += view[:n]
        except BaseException:
            if early:
                with self._lock:
                    self.early.give_back(c, len(data))
            raise
        return data

    def _assembly(self, tid: int) -> _Assembly:
        a = self._assemblies.get(tid)
        if a is None:
            if len(self._assemblies) >= self.limits.max_transfers:
                raise FrameError(f"too many transfers in progress ({self.limits.max_transfers})")
            a = self._assemblies[tid] = _Assembly(tid, first_byte_ns=time.monotonic_ns())
        return a

    def _early_assembly(self, c: PeerConn, tid: int, cnt: int, plen: int) -> tuple[_Assembly, list[_Assembly]]:
        """The transfer a chunk overtaking its BEGIN goes to, and the transfer that made room for it, if any
        (lock held); FrameError for an empty chunk or past the bounds on transfers held before their BEGIN."""
        if plen == 0 or cnt == 0:
            raise FrameError(f"LAYER frame before BEGIN with no payload ({cnt} tokens, {plen} bytes)")
        if plen % (2 * cnt):
            raise FrameError(f"LAYER frame before BEGIN of {plen} bytes is not the K and V of {cnt} tokens")
        lim = self.limits
        c.early = {t for t in c.early if t in self._assemblies and self._assemblies[t].meta is None}
        if tid not in c.early and len(c.early) >= lim.early_conn_max_transfers:
            raise FrameError(f"too many transfers before BEGIN on this connection ({lim.early_conn_max_transfers})")
        evicted = []
        if tid not in self._assemblies:
            unbegun = [a for a in self._assemblies.values() if a.meta is None]
            if len(unbegun) >= lim.early_max_transfers:
                oldest = min(unbegun, key=lambda a: a.first_byte_ns)
                if time.monotonic_ns() - oldest.first_byte_ns < lim.early_evict_s * 1e9:
                    raise FrameError(f"too many transfers before BEGIN in all ({lim.early_max_transfers})")
                evicted.append(self._pop(oldest.transfer_id))  # a BEGIN is late by ms, not by early_evict_s
        c.early.add(tid)
        return self._assembly(tid), evicted

    def _on_begin(self, tid: int, payload: bytes, c: PeerConn) -> None:
        meta = TransferMeta.from_json(payload)
        if meta.fingerprint != self.fingerprint:
            raise FrameError(f"KV of another model (fingerprint {meta.fingerprint[:12]}, mine {self.fingerprint[:12]})")
        if meta.kv_bytes > self.max_transfer_bytes:
            raise FrameError(f"transfer of {meta.kv_bytes} bytes exceeds the limit of {self.max_transfer_bytes}")
        expected = self.inbox.is_expected(meta.request_id, meta.kind, EXPECT_WAIT_S)
        self._sweep()
        with self._lock:
            self._check_begin(tid, c, expected, meta)
            a = self._assembly(tid)
            a.meta, a.ack_sock, a.ack_lock = meta, c.sock, c.ack_lock
            a.blob, a.buf = blob_buffer(meta, self.pool)
            a.wire_bytes += FRAME_HEADER.size + len(payload)
            early = self._take_early(a)
            c.mine.add(tid)
        for layer, off, cnt, data, crcs, _ in early:
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

    def _check_begin(self, tid: int, c: PeerConn, expected: bool, meta: TransferMeta) -> None:
        """StaleConn when the transfer went on without this BEGIN (its sender resumed it elsewhere, or another
        connection's BEGIN won the race), FrameError when it is refused (lock held)."""
        a, c.waiting_begin = self._assemblies.get(tid), None  # under the lock: a RESUME is before or after
        began = a is not None and a.meta is not None
        if tid in c.superseded or tid in self._completed or (began and a.ack_sock is not c.sock):
            raise StaleConn(f"stale BEGIN of transfer {tid}: the transfer went on on another connection")
        if not expected:
            raise FrameError(f"no open request {meta.request_id!r} expects {meta.kind} KV")
        if began:  # twice on one connection: a broken or hostile peer
            raise FrameError(f"transfer {tid} began twice")

    def _on_resume(self, tid: int, c: PeerConn) -> None:
        """A sender retrying transfer tid asks what arrived: HAVE {state: new | partial | done, chunks}. A
        partial transfer continues on this connection (its ACK goes here)."""
        self._sweep()
        with self._lock:
            supersede(list(self._conns.values()), c, tid)
            a = self._assemblies.get(tid)
            held_bytes = 0
            if tid in self._completed:
                state, chunks = "done", []
            elif a is not None and a.meta is not None:
                # List and bytes at one instant: a dead connection's reader may still place a chunk.
                state, chunks, held_bytes = "partial", [list(k) for k in a.seen], a.received_bytes
                a.ack_sock, a.ack_lock, a.orphaned_ns = c.sock, c.ack_lock, 0
                c.mine.add(tid)
            else:
                if a is not None:  # chunks without their BEGIN: the sender sends everything again
                    self._pop(tid)
                state, chunks = "new", []
        body = json.dumps({"state": state, "chunks": chunks}).encode()
        with c.ack_lock:
            c.sock.sendall(pack_frame(HAVE, tid, payload_len=len(body), crc=crc32c(body)) + body)
        self.events.emit(
            "kv_recv_resume",
            a.meta.request_id if a is not None and a.meta else None,
            transfer_id=tid,
            state=state,
            chunks_held=len(chunks),
            kv_bytes_held=held_bytes,
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

    def _on_layer(self, c: PeerConn, tid: int, layer: int, off: int, cnt: int, plen: int, crc: int) -> None:
        where = f"layer {layer}, tokens [{off}, {off + cnt})"
        if tid not in self._assemblies:
            self._sweep()  # a new transfer record: first drop what expired
        with self._lock:
            a = self._assemblies.get(tid)
            began = a is not None and a.meta is not None
            evicted = []
            if not began:  # BEGIN is still on its way on connection 0: hold the bytes, within bounds
                a, evicted = self._early_assembly(c, tid, cnt, plen)
            dup = began and self._check_chunk(a, layer, off, cnt, plen)
        self._dropped(evicted, f"made room for newer transfers: no BEGIN within {self.limits.early_evict_s:g} s")
        if not began or dup:
            data = self._read_held(c, plen, where, early=not began)
            try:
                crcs = verify_chunk(memoryview(data)[: plen // 2], memoryview(data)[plen // 2 :], crc, layer, off)
            except FrameError:
                if not began:
                    with self._lock:
                        self.early.give_back(c, plen)
                raise
            if dup:
                return
            with self._lock:
                if a.meta is None and self._assemblies.get(tid) is a:
                    a.early.append((layer, off, cnt, data, crcs, c))
                    return
                self.early.give_back(c, plen)  # BEGIN came (or the transfer went) while the bytes did
            if a.meta is not None:
                self._place(a, layer, off, cnt, data, crcs)
            return
        k_dst, v_dst = (
            memoryview(a.buf[layer, 0, off : off + cnt]).cast("B"),
            memoryview(a.buf[layer, 1, off : off + cnt]).cast("B"),
        )
        if c.fill(k_dst) < len(k_dst) or c.fill(v_dst) < len(v_dst):
            raise FrameError(f"truncated LAYER payload ({where})")
        self._count(a, layer, off, cnt, verify_chunk(k_dst, v_dst, crc, layer, off), plen)

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
            if tid in self._completed:  # a stale copy: the transfer completed (and was ACKed) meanwhile
                return
            a = self._assemblies.get(tid)
            if a is None or a.meta is None:  # END follows BEGIN on the same connection, or a RESUME's HAVE
                raise FrameError(f"END for transfer {tid}, which never began here")
            a.next_token, a.chunks_expected = next_token, chunks
            a.wire_bytes += FRAME_HEADER.size + len(payload)

    def _on_cancel(self, tid: int, mine: set[int]) -> None:
        with self._lock:
            a = self._pop(tid) if tid in self._assemblies else None
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
