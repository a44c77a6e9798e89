"""KV data-plane frames and transfer descriptions (pure: no sockets).

Responsible for: the frame header and its types, TransferMeta (what a
transfer carries), the errors of the wire and a LAYER payload's checksum
check (verify_chunk). The frame layout is written
down once, in the package docstring (workers/kvwire/__init__.py).
Not responsible for: sockets (sockets.py), sending (sender.py), receiving
(receiver.py), receive buffers and sealing blobs (blob.py).
"""

from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass

from crc32c import crc32c

from workers.crc import crc32c_combine

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
        """Parse a BEGIN payload; FrameError unless every field has its type and the shape adds up."""
        try:
            d = json.loads(payload)
            if not isinstance(d, dict):
                raise TypeError(f"a JSON {type(d).__name__}, not an object")
            problems = _meta_problems(d)
            if problems:
                raise TypeError("; ".join(problems))
            meta = TransferMeta(**{**d, "token_ids": tuple(d["token_ids"])})
        except (ValueError, TypeError, KeyError) as err:
            raise FrameError(f"BEGIN payload is not a transfer description: {err}") from None
        if meta.dtype not in DTYPE_BYTES or not 0 <= meta.start <= meta.end or len(meta.token_ids) != meta.n_tokens:
            raise FrameError(
                f"BEGIN describes an inconsistent transfer: dtype {meta.dtype!r}, "
                f"range [{meta.start}, {meta.end}), {len(meta.token_ids)} token ids"
            )
        return meta


_META_STR = ("request_id", "kind", "fingerprint", "dtype")
_META_INT = ("start", "end", "n_layer", "n_kv_head", "head_dim")
META_KINDS = ("prompt", "handoff")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _meta_problems(d: dict) -> list[str]:
    """What is wrong with a decoded BEGIN payload's fields (pure; empty: nothing)."""
    fields = set(_META_STR + _META_INT + ("token_ids",))
    problems = [f"unknown field {k!r}" for k in d if k not in fields]
    problems += [f"missing field {k!r}" for k in sorted(fields - set(d))]
    problems += [f"{k} is not a string" for k in _META_STR if k in d and not isinstance(d[k], str)]
    problems += [f"{k} is not an integer" for k in _META_INT if k in d and not _is_int(d[k])]
    shape = ("n_layer", "n_kv_head", "head_dim")
    problems += [f"{k} is not positive" for k in shape if _is_int(d.get(k)) and d[k] <= 0]
    if isinstance(d.get("kind"), str) and d["kind"] not in META_KINDS:
        problems.append(f"kind {d['kind']!r} is not one of {list(META_KINDS)}")
    ids = d.get("token_ids")
    if "token_ids" in d and not (isinstance(ids, list) and all(_is_int(t) and t >= 0 for t in ids)):
        problems.append("token_ids is not a list of non-negative integers")
    return problems


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


def verify_chunk(k, v, crc: int, layer: int, off: int) -> tuple[int, int]:
    """(crc32c(k), crc32c(v)) of a LAYER payload k + v whose frame says crc32c(k + v) == crc; FrameError if not."""
    crc_k, crc_v = crc32c(k), crc32c(v)
    got = crc32c_combine(crc_k, crc_v, len(v))
    if got != crc:
        raise FrameError(f"LAYER payload checksum mismatch (layer {layer}, offset {off}: {got:#010x} != {crc:#010x})")
    return crc_k, crc_v
