"""A role's queue of requests waiting for KV room: first come, first served, bounded in length and in time.

Responsible for: `RoomQueue.admit(rid, try_open)`: try_open (which opens the
request in the engine, raising CapacityExceeded while the cache is full for
now) runs at once when nobody waits, exactly as without a queue. When it finds
no room, or others already wait, the request queues behind them; only the
queue's head tries again, each time `freed()` says blocks came back (and every
POLL_S, for room that comes back unannounced), so a later, smaller request
never overtakes an earlier one that waits (no starvation). Refused with
RESOURCE_EXHAUSTED (a QueueFull) when max_waiting requests already wait, or
once it waited wait_s; at once, as without a queue, when it can never fit.
Not responsible for: the engine's block accounting, the role's events (the
caller's on_queue and the wait admit returns), or what a refusal becomes at
the front door (HTTP 429/503).

Lock order: the queue's condition, then whatever try_open takes (the engine's
lock); nobody holding the engine's lock may call into the queue.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TypeVar

from workers.errors import CapacityExceeded, QueueFull

T = TypeVar("T")
POLL_S = 0.05  # the head looks for room this often even without a freed() (an eviction, a clock)


class RoomRefused(QueueFull):
    """A request that could not wait for KV room (queue full, waited too long, its caller left)."""

    def __init__(self, request_id: str, max_waiting: int, reason: str):
        self.request_id, self.max_waiting = request_id, max_waiting
        Exception.__init__(self, reason)


class RoomQueue:
    """max_waiting: requests that may wait at once (0: none, refused as without a queue)
    wait_s: how long one may wait (s); setting: the config's name for these, in refusals (e.g. "prefill")"""

    def __init__(self, max_waiting: int, wait_s: float, setting: str):
        if max_waiting < 0 or wait_s < 0:
            raise ValueError(f"max_waiting={max_waiting}, wait_s={wait_s}; both must be >= 0")
        self.max_waiting, self.wait_s, self.setting = max_waiting, wait_s, setting
        self._cond = threading.Condition()
        self._waiting: deque[str] = deque()

    def __len__(self) -> int:
        with self._cond:
            return len(self._waiting)

    def freed(self) -> None:
        """KV blocks came back (a request finished or aborted): the head tries again now.
        Call without the engine's lock."""
        with self._cond:
            self._cond.notify_all()

    def admit(
        self,
        rid: str,
        try_open: Callable[[], T],
        stop: Callable[[], bool] = lambda: False,
        on_queue: Callable[[int], None] = lambda ahead: None,
        too_big: Callable[[], None] = lambda: None,
    ) -> tuple[T, int]:
        """try_open()'s value once it succeeds, and how long rid waited for it (ns; 0: at once).
        stop: the caller left (stop waiting); on_queue(ahead): called when rid queues behind `ahead` others;
        too_big: raises CapacityExceeded when rid can never fit (asked instead of try_open when others wait).
        Raises CapacityExceeded (never fits, or no queue) or RoomRefused (queue full, wait_s past, stopped)."""
        with self._cond:
            if not self._waiting:
                try:
                    return try_open(), 0
                except CapacityExceeded as err:
                    if err.never_fits or self.max_waiting == 0:
                        raise
                    cause = str(err)
            else:
                too_big()
                cause = f"{len(self._waiting)} earlier requests wait for KV room"
            if len(self._waiting) >= self.max_waiting:
                raise RoomRefused(
                    rid,
                    self.max_waiting,
                    f"{cause}; {len(self._waiting)} requests already wait for room ({self.setting}.max_waiting)",
                )
            on_queue(len(self._waiting))
            self._waiting.append(rid)
        t0 = time.monotonic_ns()
        try:
            return self._wait_turn(rid, try_open, stop, t0), time.monotonic_ns() - t0
        finally:
            with self._cond:
                self._waiting.remove(rid)
                self._cond.notify_all()  # the next in line tries now

    def _wait_turn(self, rid: str, try_open: Callable[[], T], stop: Callable[[], bool], t0: int) -> T:
        deadline = t0 + int(self.wait_s * 1e9)
        cause = "earlier requests wait for KV room"
        with self._cond:
            while True:
                if self._waiting[0] == rid:
                    try:
                        return try_open()
                    except CapacityExceeded as err:
                        if err.never_fits:
                            raise
                        cause = str(err)
                left_s = (deadline - time.monotonic_ns()) / 1e9
                if left_s <= 0:
                    raise RoomRefused(
                        rid,
                        self.max_waiting,
                        f"no KV room within {self.wait_s * 1000:.0f} ms ({self.setting}.room_wait_ms): {cause}",
                    )
                if stop():
                    raise RoomRefused(rid, self.max_waiting, f"request {rid!r} left while waiting for KV room")
                self._cond.wait(min(POLL_S, left_s))
