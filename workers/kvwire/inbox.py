"""Complete KV transfers waiting for the session that expects them.

Responsible for: ReceivedTransfer (a verified transfer and the pool its blob
returns to) and Inbox (which transfers are expected, by request and kind;
handing them over). Not responsible for: the wire (receiver.py).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from workers.kvwire.blob import BufferPool
from workers.kvwire.frame import TransferMeta


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
        self._forget_hooks: list[Callable[[str], None]] = []

    def on_forget(self, hook: Callable[[str], None]) -> None:
        """hook(request_id) runs whenever a request is forgotten (a receiver drops what it kept for it)."""
        self._forget_hooks.append(hook)

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
        for hook in self._forget_hooks:
            hook(request_id)

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

    def wait(
        self, request_id: str, kind: str, timeout_s: float, stop: Callable[[], bool] = lambda: False
    ) -> ReceivedTransfer | None:
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
