"""Receive buffers and engine KV blobs assembled from frames.

Responsible for: the pool of reusable receive buffers, room for a blob that
frames land in place in, and sealing a blob (token IDs, header, checksum
folded from the chunks' own checksums).
Not responsible for: the blob layout itself (workers/kvcache.py: header, offsets, views) or the wire.
"""

from __future__ import annotations

import threading

import numpy as np
from crc32c import crc32c

from workers.crc import crc32c_combine
from workers.kvcache import BLOB_HEADER, blob_kv_offset, pack_blob_header
from workers.kvwire.frame import FrameError, TransferMeta


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
    tok_end = blob_kv_offset(meta.n_tokens)
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
    blob[BLOB_HEADER.size : BLOB_HEADER.size + tok.nbytes] = tok
    if chunks is None:
        crc = crc32c(blob[BLOB_HEADER.size :])
    else:
        crc = fold_chunk_crcs(meta, crc32c(tok), chunks)
    pack_blob_header(
        blob,
        meta.dtype,
        bytes.fromhex(meta.fingerprint),
        meta.n_layer,
        meta.n_kv_head,
        meta.head_dim,
        meta.start,
        meta.end,
        crc,
        meta.kv_bytes,
    )
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
                raise FrameError(
                    f"layer {layer}: chunks leave tokens [{min(off, end)}, {max(off, end)}) missing or twice"
                )
            end = off + cnt
        if end != meta.n_tokens:
            raise FrameError(f"layer {layer}: chunks cover {end} of {meta.n_tokens} tokens")
        for half in (2, 3):  # K rows then V rows
            for part in parts:
                crc = crc32c_combine(crc, part[half], part[1] * meta.row_bytes)
    return crc
