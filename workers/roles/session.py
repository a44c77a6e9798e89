"""A decode session: one request on a decode worker, shared by the decode loop and the handoff.

Responsible for: the Session record, the stream messages a session yields, and
the names of the handoff modes.
Not responsible for: what a session does (decode.py, handoff.py).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from workers.proto import pdd_pb2

H = pdd_pb2  # enum values: H.HANDOFF_ONESHOT, ...
HANDOFF_NAMES = {
    H.HANDOFF_NONE: "none",
    H.HANDOFF_ONESHOT: "oneshot",
    H.HANDOFF_CHUNKED: "chunked",
    H.HANDOFF_AUTO: "auto",
    H.HANDOFF_KV: "kv",
}


@dataclass
class Session:
    """One request on this decode worker."""

    request: pdd_pb2.DecodeRequest
    cached_tokens: int
    cond: threading.Condition = field(default_factory=threading.Condition)
    handoff_lock: threading.Lock = field(default_factory=threading.Lock)
    cancelled: bool = False
    kv_ready: bool = False  # this worker holds the prompt KV
    md_ready: bool = False  # RLD: the MD holds the prompt KV
    pending_index: int = 0  # MD: index of its token without KV
    handed_final: bool = False  # MD: the final handoff is applied
    emit_from: int = 1  # first index this worker streams
    first_sent: bool = False  # this worker's first_token event is out (one a session: the first index it streams)
    p_token: int | None = None  # P's first token, imported with the prompt KV
    relay_lost: bool = False  # MD: the RLD is unreachable
    relay_output: tuple[int, ...] | None = None  # MD: the RLD finished alone; its whole output (RelayOutput)
    waits_for_room: bool = False  # opened once the cache has room (it was full for now at arrival)
    after: Session | None = None  # MD: the earlier session whose WAN copy still brings this one's prefix
    closed: threading.Event = field(default_factory=threading.Event)  # set once the session left the engine

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def prompt_len(self) -> int:
        return len(self.request.prompt_tokens)

    def promised_tokens(self) -> tuple[int, ...]:
        """MD: what this session leaves in the DRC if it ends well: its prompt, and the relay's output
        once the RLD has sent it (recomputed here after the prompt KV lands)."""
        return tuple(self.request.prompt_tokens) + (self.relay_output or ())

    def cancel(self) -> None:
        with self.cond:
            self.cancelled = True
            self.cond.notify_all()


def token_msg(index: int, token: int, worker: str) -> pdd_pb2.DecodeEvent:
    return pdd_pb2.DecodeEvent(token=pdd_pb2.Token(index=index, token=token, worker=worker, t_ns=time.monotonic_ns()))


def end_msg(reason: str) -> pdd_pb2.DecodeEvent:
    return pdd_pb2.DecodeEvent(end=pdd_pb2.DecodeEnd(reason=reason))
