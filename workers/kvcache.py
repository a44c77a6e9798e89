"""Paged KV cache: fixed-size blocks, per-worker capacity, export/import as bytes.

Responsible for: the KV storage tensor of one worker, split into blocks of
`block_size` token slots; allocating and freeing blocks; binding a batch's
slots to the model's attention (`BatchKV`); serialising any token range of a
request's KV to a self-describing blob and importing one back, refusing a
blob whose header, model fingerprint or checksum does not match.
Not responsible for: which blocks a request owns or shares (the engine keeps
block tables; `workers.radix` owns cached prefixes), eviction policy, or
moving blobs over the network.

Slot numbering: token slot = block_id * block_size + offset in block. A
request's `slot_map` lists the slot of each of its token positions.

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
from collections import deque
from dataclasses import dataclass

import numpy as np
import torch
from crc32c import crc32c

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
        # zeros, not empty: padded gathers read slot 0, and garbage NaNs would leak through 0-weights
        self._kv = torch.zeros(
            config.n_layer,
            2,
            self.num_blocks * block_size,
            config.n_kv_head,
            config.head_dim,
            dtype=config.torch_dtype,
            device=self.device,
        )  # (nl, 2, S, nkv, hs)
        self._free: deque[int] = deque(range(self.num_blocks))
        self._in_use = [False] * self.num_blocks
        self._scratch = torch.empty(0, dtype=config.torch_dtype, device=self.device)

    # ------------------------------------------------------------ blocks

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    def blocks_for(self, n_tokens: int) -> int:
        """Blocks needed to hold n_tokens."""
        return -(-n_tokens // self.block_size)

    def alloc(self, n_blocks: int, request_id: str = "?") -> list[int]:
        """Take n_blocks free blocks, or raise CapacityExceeded taking none."""
        if n_blocks > len(self._free):
            raise CapacityExceeded(request_id, n_blocks, len(self._free), self.num_blocks, self.block_size)
        blocks = [self._free.popleft() for _ in range(n_blocks)]
        for b in blocks:
            self._in_use[b] = True
        return blocks

    def free(self, block_ids: list[int]) -> None:
        """Return blocks to the free list; freeing a free block is a bug and raises."""
        for b in block_ids:
            if not self._in_use[b]:
                raise ValueError(f"block {b} freed twice")
            self._in_use[b] = False
            self._free.append(b)

    def slot_map(self, block_ids: list[int], n_tokens: int) -> torch.Tensor:
        """Slot of each position 0..n_tokens-1 of a request with this block table, (n_tokens,) int64."""
        blocks = torch.tensor(block_ids, dtype=torch.int64)
        slots = (blocks[:, None] * self.block_size + torch.arange(self.block_size)).reshape(-1)  # (nb * bs,)
        if slots.numel() < n_tokens:
            raise ValueError(f"{len(block_ids)} blocks hold {slots.numel()} tokens, not {n_tokens}")
        return slots[:n_tokens].to(self.device)

    # ------------------------------------------------------------ attention binding

    def layer_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Flat K and V storage of one layer, (S, n_kv_head, head_dim) each."""
        return self._kv[layer, 0], self._kv[layer, 1]

    def gather_buffers(self, n_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Two reusable (n_rows, n_kv_head, head_dim) buffers for gathered K and V.

        Reused by every layer and step: a fresh multi-MB tensor per gather costs more in page
        faults than the copy itself. Valid until the next call."""
        c = self.config
        row = c.n_kv_head * c.head_dim
        if self._scratch.numel() < 2 * n_rows * row:
            self._scratch = torch.empty(2 * n_rows * row, dtype=c.torch_dtype, device=self.device)
        k, v = self._scratch[: 2 * n_rows * row].view(2, n_rows, c.n_kv_head, c.head_dim)
        return k, v

    def bind(self, slot_maps: list[torch.Tensor], starts: list[int], n_new: int) -> BatchKV:
        """Bind a forward pass: request i writes positions starts[i]..+n_new and attends to 0..starts[i]+n_new.
        Either one request (any n_new) or many with n_new == 1 (a decode step)."""
        return BatchKV(self, slot_maps, starts, n_new)

    # ------------------------------------------------------------ export / import

    def export_blob(self, slots: torch.Tensor, token_ids: list[int], start: int) -> bytes:
        """Serialise the KV at these slots (positions start..start+len(slots)) with its token IDs."""
        if len(token_ids) != slots.numel():
            raise ValueError(f"{len(token_ids)} token ids for {slots.numel()} slots")
        kv = self._kv.index_select(2, slots).cpu().contiguous()  # (nl, 2, n, nkv, hs)
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
        self._kv.index_copy_(2, slots, kv.to(device=self.device, dtype=self._kv.dtype))

    def read_kv(self, slots: torch.Tensor) -> torch.Tensor:
        """A copy of the KV at these slots, (n_layer, 2, n, n_kv_head, head_dim)."""
        return self._kv.index_select(2, slots)


class BatchKV:
    """The model's view of the cache for one forward pass (implements `workers.model.KVBinding`).

    slot_maps: per request, the slots of its positions (at least starts[i] + n_new long)
    starts: per request, the first position written this pass (= tokens already in cache)
    n_new: positions written per request this pass
    """

    def __init__(self, cache: KVCache, slot_maps: list[torch.Tensor], starts: list[int], n_new: int):
        if len(slot_maps) > 1 and n_new != 1:
            raise ValueError("a batch of several requests must write exactly one position each")
        self.cache = cache
        device = cache.device
        self.write_slots = torch.stack([m[s : s + n_new] for m, s in zip(slot_maps, starts)])  # (B, T)
        lengths = [s + n_new for s in starts]
        self.only_new = len(starts) == 1 and starts[0] == 0  # plain causal prefill: attend to this pass's k, v
        self.gather_slots = torch.nn.utils.rnn.pad_sequence(
            [m[:n] for m, n in zip(slot_maps, lengths)], batch_first=True
        )  # (B, L); padding reads slot 0
        self.mask = self._mask(starts, n_new, lengths, device)

    @staticmethod
    def _mask(starts: list[int], n_new: int, lengths: list[int], device: torch.device) -> torch.Tensor | None:
        L = max(lengths)
        if len(starts) == 1:
            if n_new == 1 or starts[0] == 0:
                return None  # decode of one request: attend to all; fresh prefill: is_causal
            q_pos = starts[0] + torch.arange(n_new, device=device)  # (T,)
            return (torch.arange(L, device=device)[None, :] <= q_pos[:, None])[None, None]  # (1, 1, T, L)
        if len(set(lengths)) == 1:
            return None
        valid = torch.arange(L, device=device)[None, :] < torch.tensor(lengths, device=device)[:, None]  # (B, L)
        return valid[:, None, None, :]  # (B, 1, 1, L)

    def attend(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, bool]:
        B, T, nkv, hs = k.shape
        k_store, v_store = self.cache.layer_kv(layer)  # (S, nkv, hs)
        flat_write = self.write_slots.reshape(-1)  # (B*T,)
        k_store.index_copy_(0, flat_write, k.reshape(B * T, nkv, hs))
        v_store.index_copy_(0, flat_write, v.reshape(B * T, nkv, hs))
        if self.only_new:
            return k, v, None, True
        L = self.gather_slots.shape[1]
        flat_read = self.gather_slots.reshape(-1)  # (B*L,)
        k_buf, v_buf = self.cache.gather_buffers(B * L)  # (B*L, nkv, hs) each
        # 2-D views: index_select copies whole rows of nkv*hs values, several times faster than 3-D
        torch.index_select(k_store.flatten(1), 0, flat_read, out=k_buf.flatten(1))
        torch.index_select(v_store.flatten(1), 0, flat_read, out=v_buf.flatten(1))
        return k_buf.view(B, L, nkv, hs), v_buf.view(B, L, nkv, hs), self.mask, False  # (B, L, nkv, hs)
