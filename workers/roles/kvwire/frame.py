"""KV data-plane frames and transfer descriptions (pure: no sockets).

Responsible for: the frame header and its types, TransferMeta (what a
transfer carries) and the errors of the wire. The frame layout is written
down once, in the package docstring (workers/roles/kvwire/__init__.py).
Not responsible for: sockets (sockets.py), sending (sender.py), receiving
(receiver.py), receive buffers and sealing blobs (blob.py).
"""

from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass

FRAME_HEADER = struct.Struct("<4sBBHQIIII")
FRAME_MAGIC = b"PKVF"
FRAME_VERSION = 2
BEGIN, LAYER, END, CANCEL, ACK, RESUME, HAVE = 1, 2, 3, 4, 5, 6, 7
FRAME_TYPES = {BEGIN: "BEGIN", LAYER: "LAYER", END: "END", CANCEL: "CANCEL", ACK: "ACK", RESUME: "RESUME", HAVE: "HAVE"}
EXPECT_WAIT_S = 4.0  # a BEGIN no session expects yet waits this long for one to open
MAX_META_BYTES = 16 << 20  # BEGIN/END payloads are JSON; a token list of 1M ids stays far below
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
            raise FrameError(
                f"BEGIN describes an inconsistent transfer: dtype {meta.dtype!r}, "
                f"range [{meta.start}, {meta.end}), {len(meta.token_ids)} token ids"
            )
        return meta


def meta_for(engine, request_id: str, kind: str, start: int, end: int, token_ids) -> TransferMeta:
    """TransferMeta for positions [start, end) of a request on this engine's model."""
    c = engine.config
    return TransferMeta(
        request_id,
        kind,
        start,
        end,
        tuple(int(t) for t in token_ids),
        engine.fingerprint.hex(),
        c.n_layer,
        c.n_kv_head,
        c.head_dim,
        c.dtype,
    )


def pack_frame(
    ftype: int,
    transfer_id: int,
    layer: int = 0,
    token_offset: int = 0,
    token_count: int = 0,
    payload_len: int = 0,
    crc: int = 0,
) -> bytes:
    """One frame header (pure)."""
    return FRAME_HEADER.pack(
        FRAME_MAGIC, FRAME_VERSION, ftype, layer, transfer_id, token_offset, token_count, payload_len, crc
    )
