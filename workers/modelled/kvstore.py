"""A KV cache without KV tensors: the real block allocator, one byte per slot, and blobs of the architecture's size.

Responsible for: `ModelledKV`, a `workers.kvcache.KVCache` whose storage is one byte per token slot (a function
of the token and its position, set when its KV is "computed" or imported) instead of the KV itself: the block
allocation, freeing and slot maps are KVCache's own; `bind` hands out a pass whose layer listeners the engine
calls; `read_layer` and `export_blob` expand each slot's byte into the K/V rows of the wire shape
(`catalogue.wire_config`), so the data plane moves the deployment's KV bytes; `parse_blob` checks a blob as
KVCache does (header, model fingerprint, size, crc32c) and also that every row holds its token's filler.
Not responsible for: the blob layout (workers/kvcache.py owns it; its helpers pack the header) or which
blocks a request owns (the engine).

Filler: row byte = (131 x token + 7 x position + 29 x layer + 101 x half) mod 256 (half 0: K, 1: V), the
same in every byte of the row: cheap to write (a broadcast), and a blob moved to the wrong positions or
request fails the check even where its checksum is intact.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from crc32c import crc32c

from workers.attention import Span
from workers.errors import KVChecksumError, KVHeaderError
from workers.kvcache import (
    BLOB_HEADER,
    BLOB_MAGIC,
    BLOB_VERSION,
    DTYPE_BY_CODE,
    TOKEN_ID_BYTES,
    KVBlob,
    KVCache,
    blob_kv_offset,
    pack_blob_header,
)
from workers.model import ModelConfig


def slot_bytes(token_ids, positions) -> np.ndarray:
    """The byte each slot holds for its token at its position, (n,) uint8."""
    t = np.asarray(token_ids, dtype=np.int64)
    p = np.asarray(positions, dtype=np.int64)
    return ((131 * t + 7 * p) % 256).astype(np.uint8)


def row_bytes(values: np.ndarray, n_layer: int) -> np.ndarray:
    """Each slot's byte per layer and half, (n_layer, 2, n) uint8."""
    layer = (29 * np.arange(n_layer, dtype=np.int64))[:, None, None]
    half = (101 * np.arange(2, dtype=np.int64))[None, :, None]
    return ((values.astype(np.int64)[None, None, :] + layer + half) % 256).astype(np.uint8)


def layer_row_bytes(values: np.ndarray, layer: int) -> np.ndarray:
    """`row_bytes(values, n)[layer]`, (2, n) uint8, without the other layers: P reads a prompt's KV one layer
    at a time as it streams it, and computing every layer's bytes for each of them made the stream
    quadratic in the layers (61 for kimi-k2: 0.68 s of P's CPU for a 14K-token prompt's rows, which set
    the pace of its KV transfers). uint8 addition wraps: it is the filler's mod 256."""
    v = np.asarray(values, dtype=np.uint8)
    return np.stack([v + np.uint8((29 * layer + 101 * half) % 256) for half in (0, 1)])


@dataclass
class ModelledPass:
    """A pass bound to the cache: its spans, and listeners called with each layer once it is 'stored'."""

    block_size: int
    spans: tuple[Span, ...]
    listeners: list[Callable[[int], None]] = field(default_factory=list)

    def slots(self, i: int) -> torch.Tensor:
        """Slots of positions 0..end-1 of the pass's i-th request, (end,) int64."""
        span = self.spans[i]
        blocks = torch.tensor(span.block_ids, dtype=torch.int64)
        return (blocks[:, None] * self.block_size + torch.arange(self.block_size)).reshape(-1)[: span.end]


class ModelledKV(KVCache):
    """KVCache's block bookkeeping over one byte per slot.

    config: the wire shape (`catalogue.wire_config`): layers, K/V row width, dtype
    capacity_tokens: token slots (tokens); rounded down to whole blocks
    block_size: token slots per block (tokens)
    fingerprint: 16 bytes naming the modelled architecture, written into and checked on blobs
    """

    def __init__(self, config: ModelConfig, capacity_tokens: int, block_size: int = 16, fingerprint: bytes = bytes(16)):
        if block_size < 1 or capacity_tokens < block_size:
            raise ValueError(f"capacity_tokens {capacity_tokens} must hold at least one block of {block_size}")
        self.config, self.block_size, self.fingerprint = config, block_size, fingerprint
        self.num_blocks = capacity_tokens // block_size
        self.device = torch.device("cpu")
        self._in_use = np.zeros(self.num_blocks, dtype=bool)  # KVCache's allocator state
        self._slot_byte = np.zeros(self.num_blocks * block_size, dtype=np.uint8)  # (S,) instead of (nl, 2, nkv, S, hs)

    @property
    def row_bytes(self) -> int:
        c = self.config
        return c.n_kv_head * c.head_dim * c.dtype_bytes

    def bind(self, spans: Sequence[Span]) -> ModelledPass:
        return ModelledPass(self.block_size, tuple(spans))

    def store(self, slots: torch.Tensor, token_ids: Sequence[int], start: int) -> None:
        """'Compute' the KV of positions start.. at these slots: each slot takes its token's byte."""
        self._slot_byte[slots.numpy()] = slot_bytes(token_ids, np.arange(start, start + len(token_ids)))

    def read_layer(self, layer: int, slots: torch.Tensor) -> torch.Tensor:
        """One layer's K and V rows at these slots, (2, n, n_kv_head, head_dim) in the wire dtype."""
        c, n = self.config, slots.numel()
        values = layer_row_bytes(self._slot_byte[slots.numpy()], layer)  # (2, n)
        rows = np.ascontiguousarray(np.broadcast_to(values[:, :, None], (2, n, self.row_bytes)))
        return torch.from_numpy(rows).view(c.torch_dtype).view(2, n, c.n_kv_head, c.head_dim)

    def export_blob(self, slots: torch.Tensor, token_ids: list[int], start: int) -> bytes:
        """The blob of these slots' KV (positions start..start+n), in workers/kvcache.py's layout."""
        c, n = self.config, len(token_ids)
        if n != slots.numel():
            raise ValueError(f"{n} token ids for {slots.numel()} slots")
        kv_bytes = n * c.kv_bytes_per_token
        blob = np.empty(blob_kv_offset(n) + kv_bytes, dtype=np.uint8)
        blob[BLOB_HEADER.size : blob_kv_offset(n)] = np.asarray(token_ids, dtype="<i4").view(np.uint8)
        kv = blob[blob_kv_offset(n) :].reshape(c.n_layer, 2, n, self.row_bytes)
        kv[...] = row_bytes(self._slot_byte[slots.numpy()], c.n_layer)[:, :, :, None]
        crc = crc32c(blob[BLOB_HEADER.size :])
        pack_blob_header(
            blob, c.dtype, self.fingerprint, c.n_layer, c.n_kv_head, c.head_dim, start, start + n, crc, kv_bytes
        )
        return blob.tobytes()

    def parse_blob(self, blob) -> KVBlob:
        """Check a blob against this model (header, size, crc32c, each row's filler); kv of the result is empty
        (there are no KV tensors), token_ids and the range are the blob's. Raises a KVImportError subclass."""
        buf = np.frombuffer(blob, dtype=np.uint8)
        if buf.size < BLOB_HEADER.size:
            raise KVHeaderError("length", buf.size, f">= {BLOB_HEADER.size}")
        magic, version, dtype_code, fp, n_layer, n_kv_head, head_dim, start, end, crc, kv_len = BLOB_HEADER.unpack_from(
            buf
        )
        c = self.config
        for name, got, expected in (
            ("magic", magic, BLOB_MAGIC),
            ("version", version, BLOB_VERSION),
            ("dtype", DTYPE_BY_CODE.get(dtype_code, dtype_code), c.torch_dtype),
            ("fingerprint", fp.hex(), self.fingerprint.hex()),
            ("n_layer", n_layer, c.n_layer),
            ("n_kv_head", n_kv_head, c.n_kv_head),
            ("head_dim", head_dim, c.head_dim),
        ):
            if got != expected:
                raise KVHeaderError(name, got, expected)
        n = end - start
        if n < 0:
            raise KVHeaderError("token range", (start, end), "start <= end")
        if kv_len != n * c.kv_bytes_per_token:
            raise KVHeaderError("kv bytes", kv_len, n * c.kv_bytes_per_token)
        if buf.size != blob_kv_offset(n) + kv_len:
            raise KVHeaderError("length", buf.size, blob_kv_offset(n) + kv_len)
        got = crc32c(buf[BLOB_HEADER.size :])
        if got != crc:
            raise KVChecksumError(got, crc)
        tokens = np.frombuffer(buf[BLOB_HEADER.size : BLOB_HEADER.size + n * TOKEN_ID_BYTES], dtype="<i4")
        rows = buf[blob_kv_offset(n) :].reshape(n_layer, 2, n, self.row_bytes)
        expected_rows = row_bytes(slot_bytes(tokens, np.arange(start, end)), n_layer)
        if n and not (np.array_equal(rows[..., 0], expected_rows) and np.array_equal(rows[..., -1], expected_rows)):
            raise KVHeaderError("kv content", "rows that are not their tokens' KV", "each position's own KV")
        return KVBlob(start, end, tuple(int(t) for t in tokens), torch.empty(0))

    def write_kv(self, slots: torch.Tensor, kv: torch.Tensor) -> None:
        raise NotImplementedError("ModelledKV holds no KV tensors: use store() with the token IDs")

    def read_kv(self, slots: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("ModelledKV holds no KV tensors: use export_blob()")
