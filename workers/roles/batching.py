"""Decode steps of a worker's concurrent sessions, run as one batched engine step.

Responsible for: `StepBatcher.step(rid)`, called by each decode session's
thread for its next token. It blocks until an engine.decode_step that
includes rid has run and returns rid's new token and the size of that batch.
A caller that finds no step running leads: it waits briefly for the other
decoding sessions (`decoding(rid)` registers one) to ask too — at most half
the last step's duration, GATHER_MAX_S — then steps every request waiting
(at most max_batch, itself first) together under the engine lock; the others
wait for their results. Without the wait, sessions that got their tokens
from one step come back one by one and each leads a step of one. A lone
session never waits. A request that cannot step (finished or aborted
meanwhile) gets its error alone; the rest of its batch steps.
Not responsible for: which sessions decode or when (decode.py), or what
else a step computes: a decode role's steps carry chunks of a prefill or an
extend when its step function is a ChunkScheduler's (workers/roles/steps.py);
KV imports take the same engine lock between steps. A decode role's sessions
import KV, extend and hand off between steps on their own threads, so only
their steps are shared here (an engine-level scheduler that owned requests
from admission to finish was removed: nothing used it).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext

from workers.errors import EngineError
from workers.fairlock import FairLock

GATHER_MAX_S = 0.002


class StepBatcher:
    """engine_step(request_ids) -> {request_id: token} (the engine's decode_step, or a ChunkScheduler's step)
    lock: the engine's, held around engine_step; None where engine_step takes it itself (a ChunkScheduler)"""

    def __init__(
        self,
        engine_step: Callable[[Sequence[str]], dict[str, int]],
        lock: FairLock | threading.Lock | None,
        max_batch: int = 32,
    ):
        if max_batch < 1:
            raise ValueError(f"max_batch={max_batch}; must be at least 1")
        self._engine_step, self.max_batch = engine_step, max_batch
        self._lock = lock if lock is not None else nullcontext()
        self._cond = threading.Condition()
        self._decoding: set[str] = set()
        self._waiting: list[str] = []
        self._results: dict[str, tuple[int, int] | Exception] = {}
        self._leading = False
        self._last_step_s = 0.0
        self.steps = 0  # engine steps run
        self.stepped = 0  # request-steps in them (stepped / steps = mean batch)

    @contextmanager
    def decoding(self, rid: str) -> Iterator[None]:
        """rid is in its decode loop: a leader waits a moment for its next step."""
        with self._cond:
            self._decoding.add(rid)
        try:
            yield
        finally:
            with self._cond:
                self._decoding.discard(rid)
                self._cond.notify_all()

    def step(self, rid: str) -> tuple[int, int]:
        """rid's next token and the batch size it was decoded in; raises the error stepping rid raised."""
        with self._cond:
            if rid in self._waiting or rid in self._results:
                raise ValueError(f"request {rid!r} is already waiting for a step")
            self._waiting.append(rid)
            self._cond.notify_all()  # a gathering leader counts it
            while True:
                if rid in self._results:
                    return self._take(rid)
                if not self._leading and rid in self._waiting:
                    self._leading = True
                    break
                self._cond.wait()
            batch = self._gather(rid)
        try:
            results = self._run(batch)
        except Exception as err:  # a bug or a torch error: every request of the batch gets it
            results = {r: err for r in batch}
        with self._cond:
            self._leading = False
            self._results.update(results)
            self._cond.notify_all()
            return self._take(rid)

    def _gather(self, rid: str) -> list[str]:
        """The leader's batch (called holding the condition): rid, then whoever waits, once every
        decoding session waits or the gather time is up."""
        want = min(max(len(self._decoding), 1), self.max_batch)
        deadline = time.monotonic() + min(GATHER_MAX_S, self._last_step_s / 2)
        while len(self._waiting) < want:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._cond.wait(left)
            want = min(max(len(self._decoding), 1), self.max_batch)
        self._waiting.remove(rid)
        batch = [rid] + self._waiting[: self.max_batch - 1]
        del self._waiting[: self.max_batch - 1]
        return batch

    def _take(self, rid: str) -> tuple[int, int]:
        out = self._results.pop(rid)
        if isinstance(out, Exception):
            raise out
        return out

    def _run(self, batch: list[str]) -> dict[str, tuple[int, int] | Exception]:
        """Step the batch; if the engine refuses it (it checks every request before computing), step
        each request alone so that only the request at fault gets the error."""
        with self._lock:
            t0 = time.monotonic()
            try:
                tokens = self._engine_step(batch)
            except EngineError as err:
                if len(batch) == 1:
                    return {batch[0]: err}
                return self._one_by_one(batch)
            self._last_step_s = time.monotonic() - t0
            self.steps += 1
            self.stepped += len(batch)
            return {r: (tokens[r], len(batch)) for r in batch}

    def _one_by_one(self, batch: list[str]) -> dict[str, tuple[int, int] | Exception]:
        out: dict[str, tuple[int, int] | Exception] = {}
        for r in batch:
            try:
                out[r] = (self._engine_step([r])[r], 1)
                self.steps += 1
                self.stepped += 1
            except EngineError as err:
                out[r] = err
        return out
