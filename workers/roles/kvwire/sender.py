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

from workers.roles.config import PathConfig, parse_address
from workers.roles.events import EventLog
from workers.roles.kvwire.frame import (ACK, BEGIN, CANCEL, END, FRAME_HEADER, FRAME_MAGIC, LAYER, TransferFailed,
                                        TransferMeta, pack_frame)
from workers.roles.kvwire.sockets import CONNECTIONS, ConnectionPool, recv_exact, send_all, set_congestion


@dataclass(frozen=True)
class SendResult:
    """Outcome of one transfer. wire_bytes counts headers and retries too (bytes)."""
    ok: bool
    reason: str                     # done | cancelled | failed: ...
    kv_bytes: int
    wire_bytes: int
    attempts: int
    duration_ns: int


@dataclass
class _Chunk:
    layer: int
    offset: int
    count: int
    parts: tuple[np.ndarray, np.ndarray]   # K rows, V rows: (count, row_bytes) uint8 each, contiguous


class KVSender:
    """One outgoing transfer, fed layer by layer while the producer computes them.

    address: receiver's host:port
    meta: what is sent
    settings: the path's PathConfig (connections, congestion, timeouts)
    path: path name for events (fast | wan | handoff)
    events: event log
    on_done: called with the SendResult from the sender's thread
    pool: where kept connections come from and go back to (settings.persistent)
    """

    def __init__(self, address: str, meta: TransferMeta, settings: PathConfig, path: str, events: EventLog,
                 on_done: Callable[[SendResult], None] | None = None, pool: ConnectionPool = CONNECTIONS):
        self.address = address
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
        self._thread = threading.Thread(target=self._run, name=f"kvsend-{path}-{meta.request_id}", daemon=True)
        rows = max(1, settings.frame_bytes // max(1, 2 * meta.row_bytes))
        self._chunk_tokens = rows

    # producer side

    def start(self) -> KVSender:
        self._thread.start()
        return self

    def put_layer(self, layer: int, kv: np.ndarray) -> None:
        """Queue one layer: kv (2, n_tokens, row_bytes) uint8 (K then V), already a private copy."""
        n = self.meta.n_tokens
        if kv.shape != (2, n, self.meta.row_bytes):
            raise ValueError(f"layer {layer}: shape {kv.shape}, expected {(2, n, self.meta.row_bytes)}")
        with self._cond:
            for off in range(0, n, self._chunk_tokens):
                cnt = min(self._chunk_tokens, n - off)
                self._chunks.append(_Chunk(layer, off, cnt, (kv[0, off:off + cnt], kv[1, off:off + cnt])))
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
        self.events.emit("kv_send_start", m.request_id, path=self.path, kind=m.kind, target=self.address,
                         start=m.start, end=m.end, kv_bytes=m.kv_bytes, connections=self.settings.connections,
                         congestion=self.settings.congestion)
        attempts, reason = 0, "failed"
        while attempts <= self.settings.max_retries and not self._cancelled:
            attempts += 1
            try:
                self._attempt(deadline_ns)
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
        self._complete(SendResult(reason == "done", reason, m.kv_bytes if reason == "done" else 0,
                                  self._wire_bytes, attempts, time.monotonic_ns() - t0))

    def _complete(self, result: SendResult) -> None:
        with self._cond:
            self._result = result
        event = "kv_send_end" if result.ok else ("kv_send_cancelled_end" if result.reason == "cancelled"
                                                 else "kv_send_failed")
        self.events.emit(event, self.meta.request_id, path=self.path, kind=self.meta.kind, kv_bytes=result.kv_bytes,
                         wire_bytes=result.wire_bytes, attempts=result.attempts, duration_ns=result.duration_ns,
                         reason=result.reason, reused_connections=self._reused)
        if self.on_done is not None:
            self.on_done(result)

    def _attempt(self, deadline_ns: int) -> None:
        """One try: N connections (kept ones first when the path is persistent), send everything, wait for
        the ACK; raise TransferFailed. Connections go back to the pool only after a clean transfer."""
        transfer_id = secrets.randbits(63)
        socks: list[socket.socket] = []
        failure: list[str] = []
        self._attempt_kv_bytes = 0
        key = (self.address, self.settings.congestion)
        try:
            for _ in range(self.settings.connections):
                socks.append(self._connect(key))
            threads = [threading.Thread(target=self._conn_main, args=(i, socks, transfer_id, failure, deadline_ns),
                                        name=f"kvconn{i}-{self.meta.request_id}", daemon=True)
                       for i in range(len(socks))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        except OSError as err:
            failure.append(f"connect to {self.address}: {err}")
        finally:
            if failure or not self.settings.persistent:
                for s in socks:
                    s.close()
            else:
                self.pool.give(key, socks)
        if failure:
            raise TransferFailed(failure[0])

    def _connect(self, key: tuple[str, str]) -> socket.socket:
        sock = self.pool.take(key) if self.settings.persistent else None
        if sock is not None:
            sock.settimeout(self.settings.stall_timeout_ms / 1000)
            self._reused += 1
            return sock
        host, port = parse_address(self.address)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            set_congestion(sock, self.settings.congestion)
            sock.settimeout(self.settings.stall_timeout_ms / 1000)
            sock.connect((host, port))
        except OSError:
            sock.close()
            raise
        return sock

    def _conn_main(self, index: int, socks: list[socket.socket], transfer_id: int, failure: list[str],
                   deadline_ns: int) -> None:
        sock = socks[index]
        try:
            if index == 0:
                meta = self.meta.to_json()
                self._send(sock, [pack_frame(BEGIN, transfer_id, payload_len=len(meta), crc=crc32c(meta)), meta])
            n_sent = self._send_chunks(index, len(socks), sock, transfer_id, failure, deadline_ns)
            if index == 0:
                end = json.dumps({"next_token": self._next_token, "chunks": n_sent}).encode()
                self._send(sock, [pack_frame(END, transfer_id, payload_len=len(end), crc=crc32c(end)), end])
                self._wait_ack(sock, transfer_id, failure)
        except (OSError, TransferFailed) as err:
            if not failure:
                failure.append(f"connection {index}: {type(err).__name__}: {err}")
            self._abort_attempt(socks, transfer_id)

    def _send_chunks(self, index: int, n_conns: int, sock: socket.socket, transfer_id: int, failure: list[str],
                     deadline_ns: int) -> int:
        """Send chunks index, index+n_conns, ... as they are produced; returns the total chunk count."""
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
            if time.monotonic_ns() > deadline_ns:
                raise TransferFailed(f"deadline {self.settings.deadline_ms} ms passed")
            k, v = chunk.parts
            crc = crc32c(v, crc32c(k))   # here, not ahead on another thread: the send then copies from cache
            hdr = pack_frame(LAYER, transfer_id, chunk.layer, chunk.offset, chunk.count, k.nbytes + v.nbytes, crc)
            self._send(sock, [hdr, k, v])
            self._progress(k.nbytes + v.nbytes)
            j += n_conns

    def _send(self, sock: socket.socket, parts: list) -> None:
        try:
            send_all(sock, parts)
        except socket.timeout:
            raise TransferFailed(f"stalled: no progress for {self.settings.stall_timeout_ms} ms") from None
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
            self.events.emit("kv_progress", self.meta.request_id, path=self.path, kv_bytes_sent=sent,
                             kv_bytes_total=self.meta.kv_bytes)

    def _wait_ack(self, sock: socket.socket, transfer_id: int, failure: list[str]) -> None:
        buf = bytearray(FRAME_HEADER.size)
        try:
            while True:  # the ACK waits for the other connections' chunks too
                try:
                    got = recv_exact(sock, memoryview(buf))
                    break
                except socket.timeout:
                    with self._cond:
                        if self._cancelled or failure:
                            raise TransferFailed("cancelled" if self._cancelled else "another connection failed")
                    if self._attempt_kv_bytes < self.meta.kv_bytes:
                        continue  # other connections still sending: their own timeouts watch for stalls
                    raise TransferFailed(f"stalled: no ACK {self.settings.stall_timeout_ms} ms after the last byte")
        except OSError as err:
            raise TransferFailed(f"waiting for ACK: {err}") from None
        if got < len(buf):
            raise TransferFailed("receiver closed the connection before acknowledging")
        magic, version, ftype, _, tid, *_ = FRAME_HEADER.unpack(buf)
        if magic != FRAME_MAGIC or ftype != ACK or tid != transfer_id:
            raise TransferFailed(f"expected ACK of transfer {transfer_id}, got type {ftype} of {tid}")

    def _abort_attempt(self, socks: list[socket.socket], transfer_id: int) -> None:
        """Tell the receiver (best effort) and unblock the other connections."""
        if self._cancelled:
            try:
                socks[0].settimeout(0.2)
                socks[0].sendall(pack_frame(CANCEL, transfer_id))
            except OSError:
                pass
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

