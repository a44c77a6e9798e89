"""Paged KV cache: fixed-size blocks, per-worker capacity, export/import as bytes.

Responsible for: the KV storage tensor of one worker, split into blocks of
`block_size` token slots; allocating blocks (consecutive ones where it can,
so attention reads a request's KV in place) and freeing them; binding a
forward pass's requests to the model's attention (`workers.attention.PassKV`);
serialising any token range of a request's KV to a self-describing blob and
importing one back, refusing a blob whose header, model fingerprint or
checksum does not match.
Not responsible for: which blocks a request owns or shares (the engine keeps
block tables; `workers.radix` owns cached prefixes), eviction policy, how a
pass attends, or moving blobs over the network.

Slot numbering: token slot = block_id * block_size + offset in block. A
request's `slot_map` lists the slot of each of its token positions. Storage:
(n_layer, 2, n_kv_head, slots, head_dim), head-major (see workers.attention);
blobs and `read_layer` rows are token-major, (tokens, n_kv_head, head_dim).

Blob layout (little-endian), version 2:

    header  BLOB_HEADER (see below), BLOB_HEADER.size bytes
    tokens  int32[end - start]        the token IDs of the range
    kv      dtype[n_layer, 2, end - start, n_kv_head, head_dim]   K then V

The crc32c (Castagnoli, hardware-accelerated: ~9 GB/s here, 3x zlib's crc32)
covers tokens and kv. The fingerprint names model + weights
(`workers.model.model_fingerprint`): KV is portable only between equal ones.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from crc32c import crc32c

from workers.attention import PassKV, Span
from workers.errors import CapacityExceeded, KVChecksumError, KVHeaderError
from workers.model import ModelConfig

log = logging.getLogger(__name__)

BLOB_MAGIC = b"PDKV"
BLOB_VERSION = 2  # 2: crc32c instead of zlib's crc32
# magic, version, dtype code, fingerprint, n_layer, n_kv_head, head_dim, start, end, crc32c, kv bytes
BLOB_HEADER = struct.Struct("<4sHH16sIIIIIIQ")
DTYPE_CODE_BY_NAME = {"float32": 0, "bfloat16": 1, "float16": 2}  # the one dtype table of the format
DTYPE_CODES = {getattr(torch, name): code for name, code in DTYPE_CODE_BY_NAME.items()}
DTYPE_BY_CODE = {code: dtype for dtype, code in DTYPE_CODES.items()}
TOKEN_ID_BYTES = 4  # int32


def blob_kv_offset(n_tokens: int) -> int:
    """Where a blob of n_tokens positions has its KV region (bytes from its start)."""
    return BLOB_HEADER.size + n_tokens * TOKEN_ID_BYTES


def blob_kv_view(blob, n_layer: int, n_tokens: int, row_bytes: int) -> np.ndarray:
    """A blob's KV region as a (n_layer, 2, n_tokens, row_bytes) uint8 view (K then V rows; no copy)."""
    offset = blob_kv_offset(n_tokens)
    return np.frombuffer(blob, np.uint8, n_layer * 2 * n_tokens * row_bytes, offset).reshape(
        n_layer, 2, n_tokens, row_bytes
    )


def pack_blob_header(
    blob,
    dtype: str,
    fingerprint: bytes,
    n_layer: int,
    n_kv_head: int,
    head_dim: int,
    start: int,
    end: int,
    crc: int,
    kv_bytes: int,
) -> None:
    """Write the header into a writable blob buffer (dtype by name: float32 | bfloat16 | float16)."""
    BLOB_HEADER.pack_into(
        blob,
        0,
        BLOB_MAGIC,
        BLOB_VERSION,
        DTYPE_CODE_BY_NAME[dtype],
        fingerprint,
        n_layer,
        n_kv_head,
        head_dim,
        start,
        end,
        crc,
        kv_bytes,
    )


@dataclass(frozen=True)
class KVBlob:
    """A parsed, verified blob. kv: (n_layer, 2, end - start, n_kv_head, head_dim) on the CPU."""

    start: int
    end: int
    token_ids: tuple[int, ...]
    kv: torch.Tensor

    @property
    def n_tokens(self) -> int:
        return self.end - self.start


class KVCache:
    """One worker's KV storage.

    config: model shape and dtype of the KV
    capacity_tokens: token slots in total (tokens); rounded down to whole blocks
    block_size: token slots per block (tokens)
    device: where the storage lives
    fingerprint: 16 bytes naming model + weights, written into and checked on blobs
    """

    def __init__(
        self,
        config: ModelConfig,
        capacity_tokens: int,
        block_size: int = 16,
        device: torch.device | str = "cpu",
        fingerprint: bytes = bytes(16),
    ):
        if block_size < 1 or capacity_tokens < block_size:
            raise ValueError(f"capacity_tokens {capacity_tokens} must hold at least one block of {block_size}")
        self.config = config
        self.block_size = block_size
        self.num_blocks = capacity_tokens // block_size
        self.device = torch.device(device)
        self.fingerprint = fingerprint
        # zeros, not empty: a NaN left in a never-written slot must not be what a bug reads
        self._kv = torch.zeros(
            config.n_layer,
            2,
            config.n_kv_head,
            self.num_blocks * block_size,
            config.head_dim,
            dtype=config.torch_dtype,
            device=self.device,
        )  # (nl, 2, nkv, S, hs)
        self._in_use = np.zeros(self.num_blocks, dtype=bool)

    # ------------------------------------------------------------ blocks

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def free_blocks(self) -> int:
        return self.num_blocks - int(self._in_use.sum())

    def blocks_for(self, n_tokens: int) -> int:
        """Blocks needed to hold n_tokens."""
        return -(-n_tokens // self.block_size)

    def alloc(self, n_blocks: int, request_id: str = "?") -> list[int]:
        """Take n_blocks free blocks, or raise CapacityExceeded taking none: the first run of n_blocks
        consecutive free ones if there is one, else the lowest free ones."""
        free = np.flatnonzero(~self._in_use)  # ascending
        if n_blocks > free.size:
            raise CapacityExceeded(request_id, n_blocks, int(free.size), self.num_blocks, self.block_size)
        if n_blocks == 0:
            return []
        runs = np.flatnonzero(free[n_blocks - 1 :] - free[: free.size - n_blocks + 1] == n_blocks - 1)
        first = int(runs[0]) if runs.size else 0
        blocks = free[first : first + n_blocks]
        self._in_use[blocks] = True
        return blocks.tolist()

    def free(self, block_ids: list[int]) -> None:
        """Return blocks to the free list; freeing a free block is a bug and raises (freeing none)."""
        ids = np.asarray(block_ids, dtype=np.int64)
        twice = ids[~self._in_use[ids]] if ids.size else ids
        if twice.size or np.unique(ids).size != ids.size:
            raise ValueError(f"block {int(twice[0]) if twice.size else ids.tolist()} freed twice")
        self._in_use[ids] = False

    def slot_map(self, block_ids: list[int], n_tokens: int) -> torch.Tensor:
        """Slot of each position 0..n_tokens-1 of a request with this block table, (n_tokens,) int64."""
        blocks = torch.tensor(block_ids, dtype=torch.int64)
        slots = (blocks[:, None] * self.block_size + torch.arange(self.block_size)).reshape(-1)  # (nb * bs,)
        if slots.numel() < n_tokens:
            raise ValueError(f"{len(block_ids)} blocks hold {slots.numel()} tokens, not {n_tokens}")
        return slots[:n_tokens].to(self.device)

    # ------------------------------------------------------------ attention binding

    def bind(self, spans: Sequence[Span]) -> PassKV:
        """Bind a forward pass: span i writes positions start..end-1 of a request and attends to 0..end-1."""
        return PassKV(self._kv, self.block_size, spans)

    def read_layer(self, layer: int, slots: torch.Tensor) -> torch.Tensor:
        """A copy of one layer's K and V at these slots, (2, n, n_kv_head, head_dim)."""
        return self._kv[layer].index_select(2, slots).transpose(1, 2).contiguous()

    # ------------------------------------------------------------ export / import

    def export_blob(self, slots: torch.Tensor, token_ids: list[int], start: int) -> bytes:
        """Serialise the KV at these slots (positions start..start+len(slots)) with its token IDs."""
        if len(token_ids) != slots.numel():
            raise ValueError(f"{len(token_ids)} token ids for {slots.numel()} slots")
        kv = self.read_kv(slots).cpu()  # (nl, 2, n, nkv, hs)
        kv_bytes = kv.view(torch.uint8).numpy().tobytes()
        tok_bytes = np.asarray(token_ids, dtype="<i4").tobytes()
        crc = crc32c(kv_bytes, crc32c(tok_bytes))
        c = self.config
        header = BLOB_HEADER.pack(
            BLOB_MAGIC,
            BLOB_VERSION,
            DTYPE_CODES[c.torch_dtype],
            self.fingerprint,
            c.n_layer,
            c.n_kv_head,
            c.head_dim,
            start,
            start + len(token_ids),
            crc,
            len(kv_bytes),
        )
        return b"".join((header, tok_bytes, kv_bytes))

    def parse_blob(self, blob: bytes) -> KVBlob:
        """Parse and verify a blob against this cache's model; raise a KVImportError subclass on mismatch."""
        if len(blob) < BLOB_HEADER.size:
            raise KVHeaderError("length", len(blob), f">= {BLOB_HEADER.size}")
        (magic, version, dtype_code, fingerprint, n_layer, n_kv_head, head_dim, start, end, crc, kv_len) = (
            BLOB_HEADER.unpack_from(blob)
        )
        c = self.config
        for field, got, expected in (
            ("magic", magic, BLOB_MAGIC),
            ("version", version, BLOB_VERSION),
            ("dtype", DTYPE_BY_CODE.get(dtype_code, dtype_code), c.torch_dtype),
            ("fingerprint", fingerprint.hex(), self.fingerprint.hex()),
            ("n_layer", n_layer, c.n_layer),
            ("n_kv_head", n_kv_head, c.n_kv_head),
            ("head_dim", head_dim, c.head_dim),
        ):
            if got != expected:
                raise KVHeaderError(field, got, expected)
        if end < start:
            raise KVHeaderError("token range", (start, end), "start <= end")
        n = end - start
        if kv_len != n * c.kv_bytes_per_token:
            raise KVHeaderError("kv bytes", kv_len, n * c.kv_bytes_per_token)
        expected_len = BLOB_HEADER.size + n * TOKEN_ID_BYTES + kv_len
        if len(blob) != expected_len:
            raise KVHeaderError("length", len(blob), expected_len)
        return self._decode_body(memoryview(blob)[BLOB_HEADER.size :], start, end, crc)

    def _decode_body(self, body: memoryview, start: int, end: int, crc: int) -> KVBlob:
        n = end - start
        tok_bytes, kv_bytes = body[: n * TOKEN_ID_BYTES], body[n * TOKEN_ID_BYTES :]
        got = crc32c(kv_bytes, crc32c(tok_bytes))
        if got != crc:
            raise KVChecksumError(got, crc)
        token_ids = tuple(int(t) for t in np.frombuffer(tok_bytes, dtype="<i4"))
        c = self.config
        raw = torch.frombuffer(bytearray(kv_bytes), dtype=torch.uint8)
        kv = raw.view(c.torch_dtype).view(c.n_layer, 2, n, c.n_kv_head, c.head_dim)  # (nl, 2, n, nkv, hs)
        return KVBlob(start, end, token_ids, kv)

    def write_kv(self, slots: torch.Tensor, kv: torch.Tensor) -> None:
        """Write kv (n_layer, 2, n, n_kv_head, head_dim) into these n slots."""
        self._kv.index_copy_(3, slots, kv.to(device=self.device, dtype=self._kv.dtype).transpose(2, 3))

    def read_kv(self, slots: torch.Tensor) -> torch.Tensor:
        """A copy of the KV at these slots, (n_layer, 2, n, n_kv_head, head_dim), contiguous."""
        return self._kv.index_select(3, slots).transpose(2, 3).contiguous()
