"""A FIFO ("ticket") lock: threading.Lock's interface, granted to waiters strictly in arrival order.

Why: threading.Lock is not fair. Its release wakes a waiter, but CPython lets the releasing thread take the
lock again before the woken waiter runs, so a thread that loops "acquire, work, release" (P's ChunkScheduler
step loop, a decode role's step batcher) keeps the engine lock for many steps while another thread (opening a
KV session, importing KV) waits. Here release() hands ownership directly to the longest waiter, so the
releasing thread queues behind it if it asks again.

Responsible for: acquire / release / locked / the context manager, and a read-only count of waiters (tests).
Not responsible for: reentrancy (like threading.Lock, a thread that acquires twice deadlocks) or use as a
threading.Condition's lock (no _is_owned / _release_save).
"""

from __future__ import annotations

import threading
from collections import deque


class FairLock:
    """A lock granted in arrival order; any thread may release it (as threading.Lock)."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()  # guards _held and _queue; held only for a few statements
        self._held = False
        self._queue: deque[threading.Lock] = deque()  # one locked gate per waiter, oldest first

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """As threading.Lock.acquire: True once this thread owns the lock; False if not blocking or timed out."""
        if not blocking and timeout != -1:
            raise ValueError("can't specify a timeout for a non-blocking call")
        if timeout < 0 and timeout != -1:
            raise ValueError("timeout value must be a non-negative number")
        with self._mutex:
            if not self._held:  # not held implies nobody queued: release() hands over while anyone waits
                self._held = True
                return True
            if not blocking:
                return False
            gate = threading.Lock()
            gate.acquire()
            self._queue.append(gate)
        try:
            if gate.acquire(timeout=timeout):
                return True
        except BaseException:  # interrupted (KeyboardInterrupt): leave the queue, or pass on what was handed over
            if not self._leave(gate):
                self.release()
            raise
        return not self._leave(gate)  # handed over between the timeout and _leave: it is ours after all

    def _leave(self, gate: threading.Lock) -> bool:
        """Take a waiter that gave up out of the queue: True if it was still there, False if it was granted."""
        with self._mutex:
            try:
                self._queue.remove(gate)
            except ValueError:
                return False
            return True

    def release(self) -> None:
        """Hand the lock to the oldest waiter, or free it; RuntimeError if it is not held."""
        with self._mutex:
            if not self._held:
                raise RuntimeError("release unlocked lock")
            if self._queue:
                self._queue.popleft().release()  # stays held: the waiter owns it now
            else:
                self._held = False

    def locked(self) -> bool:
        """True while some thread owns the lock."""
        return self._held

    @property
    def waiting(self) -> int:
        """Threads blocked in acquire right now."""
        return len(self._queue)

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"<FairLock {'locked' if self._held else 'unlocked'}, {self.waiting} waiting>"
