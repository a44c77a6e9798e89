"""The KV data plane: framed, checksummed KV cache over plain TCP, separate from gRPC control.

Responsible for: the frame format; sending one transfer (a token range of one
request's KV) over N parallel connections while its layers are still being
produced, with a per-socket congestion-control choice, progress events,
end-to-end acknowledgement, retry on a broken or stalled connection, and
cancellation (`KVSender`), connections kept open between transfers
(`ConnectionPool`); receiving and verifying transfers and handing
complete ones, as engine KV blobs, to whoever expects them (`KVReceiver`,
`Inbox`).
Not responsible for: what to send or when (the roles), importing KV into an
engine (workers/engine.py), or the emulated network under the sockets.

Frame (little-endian), FRAME_HEADER then payload_len bytes of payload:

    magic "PKVF" | version u8 | type u8 | layer u16 | transfer_id u64 |
    token_offset u32 | token_count u32 | payload_len u32 | crc32c(payload) u32

(version 2; version 1 used zlib's crc32, 3x slower than the SSE4.2 crc32c.)

Types, sender -> receiver: BEGIN (payload: JSON TransferMeta), LAYER (the K
then V of tokens [token_offset, +token_count) of one layer: payload is
2 x token_count x row_bytes), END (payload: JSON {next_token, chunks}),
CANCEL; receiver -> sender: ACK (the transfer is complete and verified).
Connection 0 of a transfer carries BEGIN, its share of LAYER chunks, END and
the ACK; connection c carries chunks c, c+N, ... Chunks may arrive before
BEGIN (other connections) and are buffered until it does. A transfer is
complete when BEGIN, END and every chunk have arrived. Any malformed,
truncated or corrupted frame closes its connection and drops the transfer
(error event); the sender then retries with a new transfer_id.
"""
from __future__ import annotations

import json
import logging
import os
import secrets
import select
import socket
import struct
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
from crc32c import crc32c

from workers.crc import crc32c_combine
from workers.kvcache import BLOB_HEADER, BLOB_MAGIC, BLOB_VERSION, TOKEN_ID_BYTES
from workers.roles.config import PathConfig, parse_address
from workers.roles.events import EventLog

log = logging.getLogger(__name__)

FRAME_HEADER = struct.Struct("<4sBBHQIIII")
FRAME_MAGIC = b"PKVF"
FRAME_VERSION = 2
BEGIN, LAYER, END, CANCEL, ACK = 1, 2, 3, 4, 5
FRAME_TYPES = {BEGIN: "BEGIN", LAYER: "LAYER", END: "END", CANCEL: "CANCEL", ACK: "ACK"}
EXPECT_WAIT_S = 2.0           # a BEGIN no session expects yet waits this long for one to open
MAX_META_BYTES = 16 << 20     # BEGIN/END payloads are JSON; a token list of 1M ids stays far below
CONGESTION_PROC = Path("/proc/sys/net/ipv4/tcp_available_congestion_control")
DTYPE_CODES = {"float32": 0, "bfloat16": 1, "float16": 2}
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


class FrameError(Exception):
    """A frame is malformed, truncated, corrupted or does not fit its transfer."""


class TransferFailed(Exception):
    """A transfer attempt failed (broken connection, stall, refusal); the sender may retry."""


@dataclass(frozen=True)
class TransferMeta:
    """What a transfer carries: KV of positions [start, end) of one request.

    kind: "prompt" (P -> decode worker) or "handoff" (RLD -> MD, generated tokens' KV)
    token_ids: the IDs of positions start..end-1
    fingerprint: hex model+weights fingerprint; receivers refuse another model's KV
    """
    request_id: str
    kind: str
    start: int
    end: int
    token_ids: tuple[int, ...]
    fingerprint: str
    n_layer: int
    n_kv_head: int
    head_dim: int
    dtype: str

    @property
    def n_tokens(self) -> int:
        return self.end - self.start

    @property
    def row_bytes(self) -> int:
        """Bytes of one token's K (or V) in one layer."""
        return self.n_kv_head * self.head_dim * DTYPE_BYTES[self.dtype]

    @property
    def kv_bytes(self) -> int:
        return self.n_layer * 2 * self.n_tokens * self.row_bytes

    def to_json(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @staticmethod
    def from_json(payload: bytes) -> TransferMeta:
        try:
            d = json.loads(payload)
            d["token_ids"] = tuple(int(t) for t in d["token_ids"])
            meta = TransferMeta(**d)
        except (ValueError, TypeError, KeyError) as err:
            raise FrameError(f"BEGIN payload is not a transfer description: {err}") from None
        if meta.dtype not in DTYPE_BYTES or not 0 <= meta.start <= meta.end or len(meta.token_ids) != meta.n_tokens:
            raise FrameError(f"BEGIN describes an inconsistent transfer: dtype {meta.dtype!r}, "
                             f"range [{meta.start}, {meta.end}), {len(meta.token_ids)} token ids")
        return meta


def meta_for(engine, request_id: str, kind: str, start: int, end: int, token_ids) -> TransferMeta:
    """TransferMeta for positions [start, end) of a request on this engine's model."""
    c = engine.config
    return TransferMeta(request_id, kind, start, end, tuple(int(t) for t in token_ids), engine.fingerprint.hex(),
                        c.n_layer, c.n_kv_head, c.head_dim, c.dtype)


def pack_frame(ftype: int, transfer_id: int, layer: int = 0, token_offset: int = 0, token_count: int = 0,
               payload_len: int = 0, crc: int = 0) -> bytes:
    """One frame header (pure)."""
    return FRAME_HEADER.pack(FRAME_MAGIC, FRAME_VERSION, ftype, layer, transfer_id, token_offset, token_count,
                             payload_len, crc)


class BufferPool:
    """Receive buffers kept for reuse. Writing into fresh memory pays a page fault per page on every
    transfer: on this 2-core host 128 MiB arrived at 15 Gbit/s into fresh buffers and at 26 Gbit/s into
    reused ones. Buffers below min_bytes come from malloc; at most max_bytes are kept.

    take(n) hands out a private n-byte array; give(array) returns it once its owner is done with it (a
    buffer never given back is simply freed by the garbage collector)."""

    def __init__(self, max_bytes: int = 512 << 20, min_bytes: int = 4 << 20):
        self.max_bytes, self.min_bytes = max_bytes, min_bytes
        self._lock = threading.Lock()
        self._free: list[np.ndarray] = []

    def take(self, nbytes: int) -> np.ndarray:
        if nbytes >= self.min_bytes:
            with self._lock:  # the smallest free buffer that fits and wastes at most half of itself
                fits = [b for b in self._free if nbytes <= b.nbytes <= 2 * nbytes]
                if fits:
                    best = min(fits, key=lambda b: b.nbytes)
                    self._free = [b for b in self._free if b is not best]
                    return best[:nbytes]
            base = np.empty(-(-nbytes // self.min_bytes) * self.min_bytes, dtype=np.uint8)
            return base[:nbytes]
        return np.empty(nbytes, dtype=np.uint8)

    def give(self, array: np.ndarray) -> None:
        base = array.base if isinstance(array.base, np.ndarray) else array
        if base.nbytes < self.min_bytes:
            return
        with self._lock:
            if any(b is base for b in self._free):
                return  # given back twice
            if sum(b.nbytes for b in self._free) + base.nbytes <= self.max_bytes:
                self._free.append(base)

    @property
    def free_bytes(self) -> int:
        with self._lock:
            return sum(b.nbytes for b in self._free)


def blob_buffer(meta: TransferMeta, pool: BufferPool | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Room for an engine KV blob (workers/kvcache.py layout) of meta's range, header and token IDs still
    blank, and its KV region as a (n_layer, 2, n, row_bytes) view: frames land in place, nothing is copied
    when the transfer completes."""
    tok_end = BLOB_HEADER.size + meta.n_tokens * TOKEN_ID_BYTES
    size = tok_end + meta.kv_bytes
    blob = pool.take(size) if pool is not None else np.empty(size, dtype=np.uint8)
    return blob, blob[tok_end:].reshape(meta.n_layer, 2, meta.n_tokens, meta.row_bytes)


# what a receiver knows of one verified chunk: (layer, token_offset) -> (token_count, crc32c(K), crc32c(V))
ChunkCrcs = dict[tuple[int, int], tuple[int, int, int]]


def seal_blob(meta: TransferMeta, blob: np.ndarray, chunks: ChunkCrcs | None = None) -> np.ndarray:
    """Fill in a blob_buffer's token IDs and header (crc32c over tokens then KV); returns the blob.
    With `chunks` (every chunk of the KV region and its checksums) the blob's checksum is folded from
    theirs instead of read from the bytes again; chunks that do not tile each layer raise FrameError."""
    tok = np.asarray(meta.token_ids, dtype="<i4").view(np.uint8)
    blob[BLOB_HEADER.size:BLOB_HEADER.size + tok.nbytes] = tok
    if chunks is None:
        crc = crc32c(blob[BLOB_HEADER.size:])
    else:
        crc = fold_chunk_crcs(meta, crc32c(tok), chunks)
    BLOB_HEADER.pack_into(blob, 0, BLOB_MAGIC, BLOB_VERSION, DTYPE_CODES[meta.dtype], bytes.fromhex(meta.fingerprint),
                          meta.n_layer, meta.n_kv_head, meta.head_dim, meta.start, meta.end, crc, meta.kv_bytes)
    return blob


def fold_chunk_crcs(meta: TransferMeta, crc: int, chunks: ChunkCrcs) -> int:
    """crc32c of (what crc covers) + the KV region in blob order (layer, then K rows, then V rows),
    from the chunks' own checksums."""
    by_layer: list[list[tuple[int, int, int, int]]] = [[] for _ in range(meta.n_layer)]
    for (layer, off), (cnt, crc_k, crc_v) in chunks.items():
        if not 0 <= layer < meta.n_layer:
            raise FrameError(f"chunk of layer {layer} in a transfer of {meta.n_layer} layers")
        by_layer[layer].append((off, cnt, crc_k, crc_v))
    for layer, parts in enumerate(by_layer):
        parts.sort()
        end = 0
        for off, cnt, _, _ in parts:
            if off != end:
                raise FrameError(f"layer {layer}: chunks leave tokens [{min(off, end)}, {max(off, end)}) "
                                 f"missing or twice")
            end = off + cnt
        if end != meta.n_tokens:
            raise FrameError(f"layer {layer}: chunks cover {end} of {meta.n_tokens} tokens")
        for half in (2, 3):   # K rows then V rows
            for part in parts:
                crc = crc32c_combine(crc, part[half], part[1] * meta.row_bytes)
    return crc


# ---------------------------------------------------------------- sockets


def available_congestion() -> tuple[str, ...]:
    """Congestion-control algorithms this kernel offers."""
    try:
        return tuple(CONGESTION_PROC.read_text().split())
    except OSError:
        return ()


def set_congestion(sock: socket.socket, name: str) -> str:
    """Set TCP_CONGESTION on sock; returns what the socket uses (a logged fallback if name is unavailable)."""
    if name == "default":
        return "default"
    if name not in available_congestion():
        log.warning("congestion control %r not available (have %s); using the kernel default",
                    name, available_congestion())
        return "default"
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, name.encode())
    except OSError as err:
        log.warning("cannot set congestion control %r: %s; using the kernel default", name, err)
        return "default"
    return name


def recv_exact(sock: socket.socket, view: memoryview) -> int:
    """Fill view from sock; returns bytes read (less than len(view) only at EOF). MSG_WAITALL lets the
    kernel fill a whole frame in one call on a blocking socket (with a timeout set it returns what is there)."""
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:], 0, socket.MSG_WAITALL)
        if n == 0:
            return got
        got += n
    return got


def send_all(sock: socket.socket, parts: list) -> None:
    """Send every byte of parts (bytes-like) with scatter-gather sendmsg: one system call per frame
    instead of one per part. Raises socket.timeout when the socket's timeout passes without progress."""
    views = [memoryview(p).cast("B") for p in parts]
    while views:
        sent = sock.sendmsg(views)
        while views and sent >= len(views[0]):
            sent -= len(views.pop(0))
        if views and sent:
            views[0] = views[0][sent:]


def count_socket_fds() -> int:
    """Open socket file descriptors of this process."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                n += 1
        except OSError:
            pass
    return n


class ConnectionPool:
    """Idle data-plane connections kept open between transfers, per (peer address, congestion control).

    A new connection per transfer pays the TCP handshake (one WAN round trip: 60 ms on the cross-country
    profile) before the first KV byte; a kept one does not. (Its congestion window still restarts after
    an idle RTO, the kernel's tcp_slow_start_after_idle.) A connection is given back only after a
    transfer that completed cleanly; one that the peer closed while idle is noticed and dropped on take.
    At most max_idle connections per key are kept."""

    def __init__(self, max_idle: int = 8):
        self.max_idle = max_idle
        self._lock = threading.Lock()
        self._idle: dict[tuple[str, str], list[socket.socket]] = {}

    def take(self, key: tuple[str, str]) -> socket.socket | None:
        """An open idle connection for key, or None."""
        while True:
            with self._lock:
                idle = self._idle.get(key)
                if not idle:
                    return None
                sock = idle.pop()
            if _still_open(sock):
                return sock
            sock.close()

    def give(self, key: tuple[str, str], socks: list[socket.socket]) -> None:
        with self._lock:
            idle = self._idle.setdefault(key, [])
            keep = max(0, min(len(socks), self.max_idle - len(idle)))
            idle.extend(socks[:keep])
        for sock in socks[keep:]:
            sock.close()

    def close(self) -> None:
        """Close every idle connection (a role shutting down)."""
        with self._lock:
            socks = [s for idle in self._idle.values() for s in idle]
            self._idle.clear()
        for sock in socks:
            sock.close()

    @property
    def idle(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._idle.values())


def _still_open(sock: socket.socket) -> bool:
    """An idle data-plane connection is usable when nothing is readable on it: the receiver only ever
    sends an ACK for a transfer in flight, so EOF, a reset or stray bytes all mean: do not reuse."""
    poller = select.poll()
    try:
        poller.register(sock, select.POLLIN | select.POLLERR | select.POLLHUP)
        return not poller.poll(0)   # anything to report: EOF, a reset or a stray byte
    except (OSError, ValueError):
        return False


# Every sender of this process shares it (P's fast and WAN paths, the RLD's KV handoff).
CONNECTIONS = ConnectionPool()


# ---------------------------------------------------------------- sender


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


# ---------------------------------------------------------------- receiver


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

    def wait(self, request_id: str, kind: str, timeout_s: float,
             stop: Callable[[], bool] = lambda: False) -> ReceivedTransfer | None:
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
        raise FrameError(f"LAYER payload checksum mismatch (layer {layer}, offset {off}: "
                         f"{got:#010x} != {crc:#010x})")
    return crc_k, crc_v


@dataclass
class _Assembly:
    transfer_id: int
    meta: TransferMeta | None = None
    blob: np.ndarray | None = None                # blob_buffer: the engine blob being filled
    buf: np.ndarray | None = None                 # its KV region, (n_layer, 2, n, row_bytes) uint8
    early: list[tuple[int, int, int, bytearray, tuple[int, int]]] = field(default_factory=list)  # before BEGIN
    seen: ChunkCrcs = field(default_factory=dict)   # verified chunks
    received_bytes: int = 0
    chunks_expected: int = -1
    next_token: int = -1
    wire_bytes: int = 0
    first_byte_ns: int = 0
    ack_sock: socket.socket | None = None
    ack_lock: threading.Lock | None = None


class KVReceiver:
    """Listens for KV transfers and delivers complete ones to an Inbox.

    host, port: listen address
    expected_fingerprint: hex fingerprint of this worker's model; other KV is refused
    inbox: where complete transfers go
    max_transfer_bytes, max_frame_bytes: refuse larger (memory bound)
    events: event log
    """

    def __init__(self, host: str, port: int, expected_fingerprint: str, inbox: Inbox, events: EventLog,
                 max_transfer_bytes: int = 1 << 30, max_frame_bytes: int = 64 << 20):
        self.fingerprint = expected_fingerprint
        self.inbox = inbox
        self.events = events
        self.max_transfer_bytes = max_transfer_bytes
        self.max_frame_bytes = max_frame_bytes
        self._lock = threading.Lock()
        self._assemblies: dict[int, _Assembly] = {}
        self._conns: set[socket.socket] = set()
        self._threads: set[threading.Thread] = set()
        self._stopping = False
        self.pool = BufferPool()
        self._listener = socket.create_server((host, port), backlog=128, reuse_port=False)
        self.port = self._listener.getsockname()[1]
        self._accept_thread = threading.Thread(target=self._accept_loop, name="kvrecv-accept", daemon=True)

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
            t = threading.Thread(target=self._conn_main, args=(conn, f"{peer[0]}:{peer[1]}"),
                                 name=f"kvrecv-{peer[1]}", daemon=True)
            with self._lock:
                self._conns.add(conn)
                self._threads.add(t)
            t.start()

    def _conn_main(self, conn: socket.socket, peer: str) -> None:
        mine: set[int] = set()   # transfers this connection carried (dropped if it dies before they complete)
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
            self._drop_incomplete(mine, f"connection from {peer} closed before the transfer completed")
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

    def _drop_incomplete(self, tids: set[int], reason: str) -> None:
        with self._lock:
            dropped = [self._assemblies.pop(t) for t in tids if t in self._assemblies]
        for a in dropped:
            self.events.emit("kv_recv_dropped", a.meta.request_id if a.meta else None, transfer_id=a.transfer_id,
                             reason=reason, kv_bytes_received=a.received_bytes)

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
        if ftype not in (BEGIN, LAYER, END, CANCEL):
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
            elif ftype == END:
                self._on_end(tid, payload)
            else:
                self._on_cancel(tid, mine)
        self._maybe_complete(tid)
        with self._lock:
            if tid not in self._assemblies:   # done or dropped: a kept connection carries many transfers
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

    def _on_begin(self, tid: int, payload: bytes, conn: socket.socket, ack_lock: threading.Lock,
                  mine: set[int]) -> None:
        meta = TransferMeta.from_json(payload)
        if meta.fingerprint != self.fingerprint:
            raise FrameError(f"KV of another model (fingerprint {meta.fingerprint[:12]}, "
                             f"mine {self.fingerprint[:12]})")
        if meta.kv_bytes > self.max_transfer_bytes:
            raise FrameError(f"transfer of {meta.kv_bytes} bytes exceeds the limit of {self.max_transfer_bytes}")
        if not self.inbox.is_expected(meta.request_id, meta.kind, EXPECT_WAIT_S):
            raise FrameError(f"no open request {meta.request_id!r} expects {meta.kind} KV")
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
        self.events.emit("kv_recv_begin", meta.request_id, kind=meta.kind, transfer_id=tid, start=meta.start,
                         end=meta.end, kv_bytes=meta.kv_bytes)

    def _check_chunk(self, a: _Assembly, layer: int, off: int, cnt: int, plen: int) -> None:
        m = a.meta
        if layer >= m.n_layer or cnt == 0 or off + cnt > m.n_tokens or plen != 2 * cnt * m.row_bytes:
            raise FrameError(f"chunk layer {layer} tokens [{off}, {off + cnt}) of {plen} bytes does not fit "
                             f"a transfer of {m.n_layer} layers x {m.n_tokens} tokens")
        if (layer, off) in a.seen:
            raise FrameError(f"chunk layer {layer} offset {off} arrived twice")

    def _on_layer(self, conn: socket.socket, tid: int, layer: int, off: int, cnt: int, plen: int, crc: int) -> None:
        with self._lock:
            a = self._assembly(tid)
            began = a.meta is not None
            if began:
                self._check_chunk(a, layer, off, cnt, plen)
        if not began:  # BEGIN is still on its way on connection 0: keep the bytes
            data = bytearray(plen)
            view = memoryview(data)
            if recv_exact(conn, view) < plen:
                raise FrameError(f"truncated LAYER payload (layer {layer}, tokens [{off}, {off + cnt}))")
            crcs = _verify_chunk(view[:plen // 2], view[plen // 2:], crc, layer, off)
            with self._lock:
                if a.meta is None:
                    if sum(len(e[3]) for e in a.early) + plen > self.max_transfer_bytes:
                        raise FrameError("too much KV before BEGIN")
                    a.early.append((layer, off, cnt, data, crcs))
                    return
            self._place(a, layer, off, cnt, data, crcs)
            return
        k_dst, v_dst = memoryview(a.buf[layer, 0, off:off + cnt]).cast("B"), \
            memoryview(a.buf[layer, 1, off:off + cnt]).cast("B")
        if recv_exact(conn, k_dst) < len(k_dst) or recv_exact(conn, v_dst) < len(v_dst):
            raise FrameError(f"truncated LAYER payload (layer {layer}, tokens [{off}, {off + cnt}))")
        self._count(a, layer, off, cnt, _verify_chunk(k_dst, v_dst, crc, layer, off), plen)

    def _place(self, a: _Assembly, layer: int, off: int, cnt: int, data: bytearray, crcs: tuple[int, int]) -> None:
        with self._lock:
            self._check_chunk(a, layer, off, cnt, len(data))
        half = len(data) // 2
        a.buf[layer, 0, off:off + cnt] = np.frombuffer(data, np.uint8, half).reshape(cnt, -1)
        a.buf[layer, 1, off:off + cnt] = np.frombuffer(data, np.uint8, half, half).reshape(cnt, -1)
        self._count(a, layer, off, cnt, crcs, len(data))

    def _count(self, a: _Assembly, layer: int, off: int, cnt: int, crcs: tuple[int, int], plen: int) -> None:
        with self._lock:
            a.seen[layer, off] = (cnt, *crcs)
            a.received_bytes += plen
            a.wire_bytes += FRAME_HEADER.size + plen

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
            self.events.emit("kv_recv_cancelled", a.meta.request_id if a.meta else None, transfer_id=tid,
                             kv_bytes_received=a.received_bytes)

    def _maybe_complete(self, tid: int) -> None:
        with self._lock:
            a = self._assemblies.get(tid)
            if a is None or a.meta is None or a.chunks_expected < 0 or len(a.seen) < a.chunks_expected:
                return
            if a.received_bytes != a.meta.kv_bytes:
                self._assemblies.pop(tid)
                raise FrameError(f"transfer {tid}: {a.received_bytes} KV bytes in {len(a.seen)} chunks, "
                                 f"expected {a.meta.kv_bytes}")
            del self._assemblies[tid]
        try:
            blob = seal_blob(a.meta, a.blob, a.seen)
        except FrameError:
            self.pool.give(a.blob)
            raise
        done_ns = time.monotonic_ns()
        with a.ack_lock:  # every frame's crc checked: the data plane's part is done; delivery is local
            a.ack_sock.sendall(pack_frame(ACK, tid))
        transfer = ReceivedTransfer(a.meta, blob, a.next_token, a.wire_bytes, a.first_byte_ns, done_ns, self.pool)
        accepted = self.inbox.put(transfer)
        if not accepted:
            transfer.release()
        self.events.emit("kv_recv_end", a.meta.request_id, kind=a.meta.kind, transfer_id=tid,
                         kv_bytes=a.meta.kv_bytes, wire_bytes=a.wire_bytes, duration_ns=done_ns - a.first_byte_ns,
                         delivered=accepted)
