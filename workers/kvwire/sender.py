"""The sending side of the KV data plane: one transfer over N connections, fed layer by layer.

Responsible for: KVSender (connections from the pool, frames, progress
events, the end-to-end ACK, retries, deadline, cancellation) and SendResult.
Not responsible for: frames' layout (frame.py) or the sockets' plumbing (sockets.py).
"""

from __future__ import annotations

import json
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
from crc32c import crc32c

from workers.kvwire.frame import (
    ACK,
    BEGIN,
    CANCEL,
    END,
    FRAME_HEADER,
    FRAME_MAGIC,
    HAVE,
    LAYER,
    RESUME,
    TransferFailed,
    TransferMeta,
    pack_frame,
)
from workers.kvwire.seam import EventSink, SendSettings
from workers.kvwire.sockets import CONNECTIONS, ConnectionPool, parse_address, send_all, set_congestion
from workers.kvwire.tcpinfo import TcpInfo
from workers.kvwire.watch import ConnectionWatch

POLL_S = 0.1  # a blocked send or reply wait looks at its connections' TCP_INFO this often


@dataclass(frozen=True)
class SendResult:
    """Outcome of one transfer. wire_bytes counts headers and retries too (bytes)."""

    ok: bool
    reason: str  # done | cancelled | failed: ...
    kv_bytes: int
    wire_bytes: int
    attempts: int
    duration_ns: int
    resumed_kv_bytes: int = 0  # KV bytes a retry did not send again: the receiver already held them
    retrans_segs: int = 0  # TCP segments retransmitted on this transfer's connections (TCP_INFO)
    segs_out: int = 0  # TCP segments sent on them, retransmissions included
    bytes_retrans: int = 0
    congestion_used: tuple[str, ...] = ()  # per connection, as read back from the socket


@dataclass
class _Chunk:
    layer: int
    offset: int
    count: int
    parts: tuple[np.ndarray, np.ndarray]  # K rows, V rows: (count, row_bytes) uint8 each, contiguous


def send_blob(
    address: str,
    meta: TransferMeta,
    kv: np.ndarray,
    settings: SendSettings,
    path: str,
    events: EventSink,
    next_token: int | None = None,
    pool: ConnectionPool = CONNECTIONS,
) -> SendResult:
    """Send a whole KV region that already exists (kv: (n_layer, 2, n, row_bytes), e.g.
    kvcache.blob_kv_view of an exported blob) and wait for the outcome (start_blob, then its wait)."""
    return start_blob(address, meta, kv, settings, path, events, next_token, pool).wait()


def start_blob(
    address: str,
    meta: TransferMeta,
    kv: np.ndarray,
    settings: SendSettings,
    path: str,
    events: EventSink,
    next_token: int | None = None,
    pool: ConnectionPool = CONNECTIONS,
) -> KVSender:
    """A whole existing KV region handed to a sender that runs on: the caller does what it must meanwhile (the
    RLD's KV handoff sends its gRPC while the KV is on the wire) and waits for the outcome with .wait()."""
    sender = KVSender(address, meta, settings, path, events, pool=pool).start()
    for layer in range(meta.n_layer):
        sender.put_layer(layer, kv[layer])
    sender.finish(next_token)
    return sender


class KVSender:
    """One outgoing transfer, fed layer by layer while the producer computes them.

    address: receiver's host:port
    meta: what is sent
    settings: the path's SendSettings (connections, congestion, timeouts)
    path: path name for events (fast | wan | handoff)
    events: where its events go (an EventSink: the role's event log)
    on_done: called with the SendResult from the sender's thread
    pool: where kept connections come from and go back to (settings.persistent)
    observe: called with (TcpInfo, connections) for every TCP_INFO sample (P's WAN estimate)
    """

    def __init__(
        self,
        address: str,
        meta: TransferMeta,
        settings: SendSettings,
        path: str,
        events: EventSink,
        on_done: Callable[[SendResult], None] | None = None,
        pool: ConnectionPool = CONNECTIONS,
        observe: Callable[[TcpInfo, int], None] | None = None,
    ):
        self.address = address
        self.observe = observe
        self.pool = pool
        self._reused = 0
        self.meta = meta
        self.settings = settings
        self.path = path
        self.events = events
        self.on_done = on_done
        self._cond = threading.Condition()
        self._chunks: list[_Chunk] = []
        self._produced = False
        self._next_token = -1
        self._cancelled = False
        self._result: SendResult | None = None
        self._wire_bytes = 0
        self._attempt_kv_bytes = 0
        self._last_progress_ns = 0
        self._transfer_id = secrets.randbits(63)  # kept across retries: a retry resumes the same transfer
        self._skip: set[tuple[int, int]] = set()  # chunks the receiver holds (learnt by RESUME)
        self._resumed_kv_bytes = 0
        self._tcp = [0, 0, 0]  # segments sent, segments and bytes retransmitted
        self._congestion_used: list[str] = []
        self._refusal_noted = False
        self._skip_begin = False  # the receiver already has BEGIN (a resumed transfer)
        self._already_done = False  # RESUME found the transfer complete (only its ACK was lost)
        self._thread = threading.Thread(target=self._run, name=f"kvsend-{path}-{meta.request_id}", daemon=True)
        rows = max(1, settings.frame_bytes // max(1, 2 * meta.row_bytes))
        self._chunk_tokens = rows

    # producer side

    def start(self) -> KVSender:
        self._thread.start()
        return self

    def put_layer(self, layer: int, kv: np.ndarray) -> None:
        """Queue one whole layer: kv (2, n_tokens, row_bytes) uint8 (K then V), already a private copy."""
        n = self.meta.n_tokens
        if kv.shape != (2, n, self.meta.row_bytes):
            raise ValueError(f"layer {layer}: shape {kv.shape}, expected {(2, n, self.meta.row_bytes)}")
        self.put_rows(layer, 0, kv)

    def put_rows(self, layer: int, offset: int, kv: np.ndarray) -> None:
        """Queue rows offset..offset+k-1 of one layer (offsets from the transfer's start): kv (2, k, row_bytes)
        uint8, a private copy. A chunked prefill writes a layer in pieces; every row must come exactly once."""
        k = kv.shape[1]
        if kv.shape != (2, k, self.meta.row_bytes) or not 0 <= offset <= offset + k <= self.meta.n_tokens:
            raise ValueError(
                f"layer {layer}: rows [{offset}, {offset + k}) shaped {kv.shape}, expected within "
                f"[0, {self.meta.n_tokens}) and (2, k, {self.meta.row_bytes})"
            )
        with self._cond:
            for off in range(0, k, self._chunk_tokens):
                cnt = min(self._chunk_tokens, k - off)
                rows = (kv[0, off : off + cnt], kv[1, off : off + cnt])
                self._chunks.append(_Chunk(layer, offset + off, cnt, rows))
            self._cond.notify_all()

    def finish(self, next_token: int | None) -> None:
        """Every layer is queued; next_token (the first token without KV, or None) travels in END."""
        with self._cond:
            self._produced = True
            self._next_token = -1 if next_token is None else int(next_token)
            self._cond.notify_all()

    def cancel(self, reason: str = "cancelled") -> None:
        """Stop sending; the receiver is told (best effort) and drops what it has."""
        with self._cond:
            if self._result is None and not self._cancelled:
                self._cancelled = True
                self.events.emit("kv_send_cancelled", self.meta.request_id, path=self.path, reason=reason)
            self._cond.notify_all()

    def wait(self, timeout_s: float | None = None) -> SendResult | None:
        """The result once the sender's thread ended (None past timeout_s); a sender never started (its worker
        stopping between making it and starting it) has nothing to wait for: None at once."""
        if self._thread.ident is not None:
            self._thread.join(timeout_s)
        return self._result

    @property
    def done(self) -> bool:
        return self._result is not None

    # sender thread

    def _run(self) -> None:
        t0 = time.monotonic_ns()
        deadline_ns = t0 + self.settings.deadline_ms * 1_000_000
        m = self.meta
        self.events.emit(
            "kv_send_start",
            m.request_id,
            path=self.path,
            kind=m.kind,
            target=self.address,
            start=m.start,
            end=m.end,
            kv_bytes=m.kv_bytes,
            connections=self.settings.connections,
            congestion=self.settings.congestion,
        )
        attempts, reason = 0, "failed"
        while attempts <= self.settings.max_retries and not self._cancelled:
            attempts += 1
            try:
                self._attempt(attempts, deadline_ns)
                reason = "done"
                break
            except TransferFailed as err:
                reason = f"failed: {err}"
                if self._cancelled:
                    reason = "cancelled"
                    break
                self.events.emit("kv_send_retry", m.request_id, path=self.path, attempt=attempts, reason=str(err))
                if time.monotonic_ns() > deadline_ns:
                    reason = f"failed: deadline {self.settings.deadline_ms} ms passed ({err})"
                    break
        if self._cancelled and reason != "done":
            reason = "cancelled"
        ok = reason == "done"
        self._complete(
            SendResult(
                ok,
                reason,
                m.kv_bytes if ok else 0,
                self._wire_bytes,
                attempts,
                time.monotonic_ns() - t0,
                self._resumed_kv_bytes,
                self._tcp[1],
                self._tcp[0],
                self._tcp[2],
                tuple(self._congestion_used),
            )
        )

    def _complete(self, result: SendResult) -> None:
        with self._cond:
            self._result = result
        event = (
            "kv_send_end"
            if result.ok
            else ("kv_send_cancelled_end" if result.reason == "cancelled" else "kv_send_failed")
        )
        self.events.emit(
            event,
            self.meta.request_id,
            path=self.path,
            kind=self.meta.kind,
            kv_bytes=result.kv_bytes,
            wire_bytes=result.wire_bytes,
            attempts=result.attempts,
            duration_ns=result.duration_ns,
            reason=result.reason,
            reused_connections=self._reused,
            resumed_kv_bytes=result.resumed_kv_bytes,
            retrans_segs=result.retrans_segs,
            segs_out=result.segs_out,
            bytes_retrans=result.bytes_retrans,
            congestion_requested=self.settings.congestion,
            congestion_used=list(result.congestion_used),
        )
        if self.on_done is not None:
            self.on_done(result)

    def _attempt(self, attempt: int, deadline_ns: int) -> None:
        """One try: N connections (kept ones first when the path is persistent), send what the receiver
        lacks, wait for the ACK; raise TransferFailed. Connections go back to the pool only after a clean
        transfer. A retry (attempt > 1) first asks the receiver what it holds (RESUME)."""
        socks: list[socket.socket] = []
        watches: list[ConnectionWatch] = []
        failure: list[str] = []
        key = (self.address, self.settings.congestion)
        with self._cond:
            self._attempt_kv_bytes = 0
        try:
            for i in range(self.settings.connections):
                socks.append(self._connect(key))
                watches.append(self._watch(socks[-1], i, attempt))
            resume = threading.Event()
            if attempt == 1:
                resume.set()
            threads = [
                threading.Thread(
                    target=self._conn_main,
                    args=(i, socks, watches, failure, deadline_ns, resume),
                    name=f"kvconn{i}-{self.meta.request_id}",
                    daemon=True,
                )
                for i in range(len(socks))
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        except OSError as err:
            failure.append(f"connect to {self.address}: {err}")
        finally:
            if self._already_done:
                failure.clear()
            self._end_watches(watches)
            if failure or not self.settings.persistent:
                for s in socks:
                    s.close()
            else:
                self.pool.give(key, socks)
        if failure:
            raise TransferFailed(failure[0])

    def _watch(self, sock: socket.socket, index: int, attempt: int) -> ConnectionWatch:
        n, observe = self.settings.connections, self.observe
        w = ConnectionWatch(
            sock,
            index,
            attempt,
            self.settings.stall_timeout_ms,
            lambda **f: self.events.emit("kv_tcp_info", self.meta.request_id, path=self.path, **f),
            None if observe is None else lambda info: observe(info, n),
        )
        asked = self.settings.congestion
        if asked != "default" and w.cc and w.cc != asked and not self._refusal_noted:
            self._refusal_noted = True
            self.events.emit(
                "kv_congestion_refused",
                self.meta.request_id,
                path=self.path,
                requested=asked,
                used=w.cc,
                reason="the kernel kept another algorithm (see the role's log)",
            )
        return w

    def _end_watches(self, watches: list[ConnectionWatch]) -> None:
        for w in watches:
            for i, n in enumerate(w.end()):
                self._tcp[i] += n
            if len(self._congestion_used) < self.settings.connections:
                self._congestion_used.append(w.cc)

    def _connect(self, key: tuple[str, str]) -> socket.socket:
        sock = self.pool.take(key) if self.settings.persistent else None
        if sock is not None:
            sock.settimeout(POLL_S)
            self._reused += 1
            return sock
        host, port = parse_address(self.address)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            set_congestion(sock, self.settings.congestion)
            sock.settimeout(self.settings.stall_timeout_ms / 1000)  # the handshake: no TCP_INFO to judge yet
            sock.connect((host, port))
            sock.settimeout(POLL_S)
        except OSError:
            sock.close()
            raise
        return sock

    def _conn_main(
        self,
        index: int,
        socks: list[socket.socket],
        watches: list[ConnectionWatch],
        failure: list[str],
        deadline_ns: int,
        resume: threading.Event,
    ) -> None:
        sock, watch, tid = socks[index], watches[index], self._transfer_id
        try:
            if index == 0:
                if not resume.is_set():
                    self._resume(sock, watches, failure, deadline_ns)
                    resume.set()
                if not self._skip_begin:
                    meta = self.meta.to_json()
                    self._send(sock, watch, [pack_frame(BEGIN, tid, payload_len=len(meta), crc=crc32c(meta)), meta])
            else:
                self._wait_resume(resume, failure)
            n_sent = self._send_chunks(index, len(socks), sock, watch, failure, deadline_ns)
            if index == 0:
                end = json.dumps({"next_token": self._next_token, "chunks": n_sent}).encode()
                self._send(sock, watch, [pack_frame(END, tid, payload_len=len(end), crc=crc32c(end)), end])
                self._read_reply(sock, ACK, watches, failure, deadline_ns)
        except _AlreadyDone:
            self._already_done = True
            failure.append("done")  # stops the other connections; _attempt reports success
            resume.set()
        except (OSError, TransferFailed) as err:
            if not failure:
                failure.append(f"connection {index}: {type(err).__name__}: {err}")
            resume.set()
            self._abort_attempt(socks)

    def _resume(
        self, sock: socket.socket, watches: list[ConnectionWatch], failure: list[str], deadline_ns: int
    ) -> None:
        """A retry: ask the receiver what it holds of this transfer and skip that."""
        self._send(sock, watches[0], [pack_frame(RESUME, self._transfer_id)])
        payload = self._read_reply(sock, HAVE, watches, failure, deadline_ns)
        try:
            have = json.loads(payload)
            state, held = have["state"], {(int(c[0]), int(c[1])) for c in have["chunks"]}
        except (ValueError, TypeError, KeyError, IndexError) as err:
            raise TransferFailed(f"HAVE payload malformed: {err}") from None
        if state == "done":  # the ACK was lost with the old connection: the transfer is complete
            raise _AlreadyDone()
        with self._cond:
            self._skip_begin = state == "partial"
            self._skip = held if state == "partial" else set()

    @staticmethod
    def _wait_resume(resume: threading.Event, failure: list[str]) -> None:
        while not resume.wait(POLL_S):
            pass
        if failure:
            raise TransferFailed("another connection failed")

    def _send_chunks(
        self,
        index: int,
        n_conns: int,
        sock: socket.socket,
        watch: ConnectionWatch,
        failure: list[str],
        deadline_ns: int,
    ) -> int:
        """Send chunks index, index+n_conns, ... as they are produced (those the receiver lacks); returns the
        total chunk count."""
        j = index
        while True:
            with self._cond:
                while j >= len(self._chunks) and not self._produced and not self._cancelled and not failure:
                    self._cond.wait(0.1)
                if self._cancelled:
                    raise TransferFailed("cancelled")
                if failure:
                    raise TransferFailed("another connection failed")
                if j >= len(self._chunks):  # produced and nothing left for this connection
                    return len(self._chunks)
                chunk = self._chunks[j]
                held = (chunk.layer, chunk.offset) in self._skip
            if time.monotonic_ns() > deadline_ns:
                raise TransferFailed(f"deadline {self.settings.deadline_ms} ms passed")
            k, v = chunk.parts
            if held:
                with self._cond:
                    self._resumed_kv_bytes += k.nbytes + v.nbytes
                self._progress(k.nbytes + v.nbytes)
                j += n_conns
                continue
            crc = crc32c(v, crc32c(k))  # here, not ahead on another thread: the send then copies from cache
            hdr = pack_frame(LAYER, self._transfer_id, chunk.layer, chunk.offset, chunk.count, k.nbytes + v.nbytes, crc)
            self._send(sock, watch, [hdr, k, v])
            self._progress(k.nbytes + v.nbytes)
            j += n_conns

    def _send(self, sock: socket.socket, watch: ConnectionWatch, parts: list) -> None:
        def check() -> None:
            reason = watch.stalled()
            if reason:
                raise TransferFailed(reason)
            if self._cancelled:
                raise TransferFailed("cancelled")

        send_all(sock, parts, on_wait=check)
        watch.tick()
        with self._cond:
            self._wire_bytes += sum(memoryview(p).nbytes for p in parts)

    def _progress(self, kv_bytes: int) -> None:
        now = time.monotonic_ns()
        with self._cond:
            self._attempt_kv_bytes += kv_bytes
            sent = self._attempt_kv_bytes
            due = now - self._last_progress_ns >= self.settings.progress_interval_ms * 1_000_000
            if due:
                self._last_progress_ns = now
        if due or sent == self.meta.kv_bytes:
            self.events.emit(
                "kv_progress",
                self.meta.request_id,
                path=self.path,
                kv_bytes_sent=sent,
                kv_bytes_total=self.meta.kv_bytes,
            )

    def _read_reply(
        self, sock: socket.socket, ftype: int, watches: list[ConnectionWatch], failure: list[str], deadline_ns: int
    ) -> bytes:
        """The receiver's ACK (or HAVE) of this transfer; its payload. While it waits, every connection of the
        attempt is judged by the stall rule; once the receiver's TCP has acknowledged every byte on all of
        them, the reply must come within stall_timeout_ms."""
        buf, got, acked_since = bytearray(FRAME_HEADER.size), 0, 0
        view = memoryview(buf)
        while got < len(buf):
            try:
                n = sock.recv_into(view[got:])
            except socket.timeout:
                if time.monotonic_ns() > deadline_ns:
                    raise TransferFailed(f"deadline {self.settings.deadline_ms} ms passed") from None
                acked_since = self._reply_overdue(ftype, watches, failure, acked_since)
                continue
            except OSError as err:
                raise TransferFailed(f"waiting for {'ACK' if ftype == ACK else 'HAVE'}: {err}") from None
            if n == 0:
                raise TransferFailed("receiver closed the connection before answering")
            got += n
        magic, _, rtype, _, tid, _, _, plen, _ = FRAME_HEADER.unpack(buf)
        if magic != FRAME_MAGIC or rtype != ftype or tid != self._transfer_id:
            raise TransferFailed(
                f"expected frame type {ftype} of transfer {self._transfer_id}, got type {rtype} of {tid}"
            )
        return self._read_payload(sock, plen)

    def _reply_overdue(self, ftype: int, watches: list[ConnectionWatch], failure: list[str], acked_since: int) -> int:
        with self._cond:
            if self._cancelled or failure:
                raise TransferFailed("cancelled" if self._cancelled else "another connection failed")
            written = ftype != ACK or self._attempt_kv_bytes >= self.meta.kv_bytes
        for w in watches:
            reason = w.stalled()
            if reason:
                raise TransferFailed(f"connection {w.index}: {reason}")
        if not written or not all(w.all_acked() for w in watches):
            return 0  # bytes still on their way: the stall rule watches them
        now = time.monotonic_ns()
        if acked_since and now - acked_since > self.settings.stall_timeout_ms * 1_000_000:
            raise TransferFailed(
                f"stalled: no {'ACK' if ftype == ACK else 'HAVE'} "
                f"{self.settings.stall_timeout_ms} ms after the receiver's TCP acknowledged "
                "every byte"
            )
        return acked_since or now

    def _read_payload(self, sock: socket.socket, plen: int) -> bytes:
        if plen > MAX_REPLY_BYTES:
            raise TransferFailed(f"reply payload of {plen} bytes exceeds {MAX_REPLY_BYTES}")
        out = bytearray(plen)
        view, got = memoryview(out), 0
        deadline = time.monotonic() + self.settings.stall_timeout_ms / 1000
        while got < plen:
            try:
                n = sock.recv_into(view[got:])
            except socket.timeout:
                if time.monotonic() > deadline:
                    raise TransferFailed("reply payload stalled") from None
                continue
            if n == 0:
                raise TransferFailed("receiver closed the connection inside a reply")
            got += n
        return bytes(out)

    def _abort_attempt(self, socks: list[socket.socket]) -> None:
        """Tell the receiver (best effort) and unblock the other connections."""
        if self._cancelled:
            try:
                socks[0].settimeout(0.2)
                socks[0].sendall(pack_frame(CANCEL, self._transfer_id))
            except OSError:
                pass
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


MAX_REPLY_BYTES = 64 << 20  # a HAVE lists held chunks: far below this


class _AlreadyDone(TransferFailed):
    """RESUME found the transfer complete at the receiver (only its ACK was lost)."""
