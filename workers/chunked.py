"""Chunked prefill: a token budget per engine step, and the scheduler that fills each step with chunks.

Responsible for: `plan_step`, the policy (pure): which requests the next
engine step runs and how many tokens each — decode tokens first (one per
running session: their time per output token is what a long prompt must not
stall), then the rest of the budget to requests waiting for KV, oldest first,
each as much of its remaining tokens as fits (Sarathi-Serve's and vLLM's
chunked prefill), so a prompt's tail chunk shares its step with the next
prompt's first chunk whenever there is one. `ChunkScheduler`: the requests
waiting for KV, one `Engine.step` per call under that plan, each request's
layers handed to its own callback as they are stored, its next token (a
prefill's first token) sampled after its last chunk, and a `StepRecord` of
every step: which chunks ran, and whether one was a lone tail chunk.
Not responsible for: opening, finishing or aborting requests (their owners),
which sessions decode (the decode roles' StepBatcher), or the network.

API, and how the roles use it (the engine is not thread-safe: `lock` is the
engine's lock, held for each step; everything else here is thread-safe):

    sched = ChunkScheduler(engine, budget_tokens=256, lock=engine_lock)
    sched.submit(rid, on_layer)    # an open request with tokens lacking KV (a prompt after open(),
                                   # or IDs after append_tokens()); on_layer(LayerWrite) per layer and chunk
    sched.step(decode=ids)         # one engine step: those decode tokens + chunks under the budget -> StepRecord
    sched.prefill(rid, on_layer)   # submit, then block until rid's last chunk ran -> ChunkedResult
    sched.wait(rid)                # that block alone, for one submitted earlier (a decode role: under the lock)
    sched.take(rid)                # or, driving step() yourself: rid's ChunkedResult once its last chunk ran
    sched.cancel(rid)              # stop computing rid (call it before engine.abort(rid))

- P: each Prefill RPC opens its request (under the engine lock) and calls
  `sched.prefill(rid, on_layer)`. Concurrent calls share steps: whichever
  caller finds no step running runs the next one, for everybody's chunks,
  so no thread is dedicated and a prompt's chunks batch with other
  prompts'. `on_layer` gets `LayerWrite(request_id, layer, start, slots)`:
  the KV of positions start..start+len(slots)-1 of that layer is in the
  cache (read it with `layerhook.read_layer`), and a layer of a prompt
  arrives once per chunk, in position order.
- Decode roles (`workers/roles/steps.py`): `StepBatcher(lambda ids:
  sched.step(decode=ids).decoded, None)` (the scheduler takes the lock) runs
  each decode step with up to `budget - len(ids)` tokens of a waiting
  prefill or extend mixed in; the session that needs it calls
  `sched.prefill(rid)` (after `append_tokens` for an extend) and leads steps
  itself only when no decode step ran for `decode_grace_s`: while sessions
  decode, their steps carry its chunks (a chunk-only step of its own between
  two of theirs would double their time per token).

A lone tail chunk: a request's last chunk, shorter than the budget, in a
step with no other request's chunk: the step had room it could not fill
(decode tokens aside). PDD.md blames such tail chunks for the throughput
valleys of its bathtub curve; `StepRecord.lone_tail` counts them.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field

from workers.engine import Engine, LayerWrite, StepResult
from workers.errors import BadRequestState, EngineError
from workers.fairlock import FairLock

# tokens per step: chunks of 256 prefill at ~92% of the whole prompt's throughput on default (make bench; 64: ~71%,
# 512: ~95%), and a step of 8 decode tokens + 248 prompt tokens holds those sessions ~0.3-0.4 s instead of a
# whole 2K prompt's ~3 s
DEFAULT_BUDGET_TOKENS = 256
RECORDS_KEPT = 4096  # most recent steps kept in ChunkScheduler.records


def plan_step(waiting: Sequence[tuple[str, int]], decode: Sequence[str], budget_tokens: int) -> list[tuple[str, int]]:
    """The next step's (request_id, tokens) parts: a token for each decode request (at most the budget), then
    waiting requests in order, each min(its remaining tokens, what is left of the budget)."""
    if budget_tokens < 1:
        raise ValueError(f"budget_tokens={budget_tokens}; must be at least 1")
    plan = [(rid, 1) for rid in decode[:budget_tokens]]
    left = budget_tokens - len(plan)
    for rid, remaining in waiting:
        if left <= 0:
            break
        n = min(remaining, left)
        plan.append((rid, n))
        left -= n
    return plan


@dataclass(frozen=True)
class Chunk:
    """A request's chunk in a step: positions start..start+n_tokens-1; last: its tokens all have KV after it."""

    request_id: str
    start: int
    n_tokens: int
    last: bool


@dataclass(frozen=True)
class StepRecord:
    """One step the scheduler ran.

    chunks: the waiting requests' chunks, in the pass's order
    decoded: request_id -> token, for each decode request of the step
    budget_tokens: the budget it was planned under (tokens)
    t_start: time.monotonic() when the step began (s); duration_s: its wall time (s)
    """

    chunks: tuple[Chunk, ...]
    decoded: dict[str, int]
    budget_tokens: int
    t_start: float
    duration_s: float

    @property
    def tokens(self) -> int:
        """Tokens the step computed: chunks and decode tokens."""
        return sum(c.n_tokens for c in self.chunks) + len(self.decoded)

    @property
    def lone_tail(self) -> bool:
        """A last chunk shorter than the budget ran without any other request's chunk."""
        return len(self.chunks) == 1 and self.chunks[0].last and self.chunks[0].n_tokens < self.budget_tokens


@dataclass(frozen=True)
class ChunkedResult:
    """A submitted request whose tokens all have KV now.

    next_token: sampled after its last chunk (a prefill's first token)
    start: positions it had in the cache when submitted (a prefill: its cached prefix) (tokens)
    computed_tokens: positions computed for it (tokens); steps: engine steps its chunks ran in
    """

    request_id: str
    next_token: int
    start: int
    computed_tokens: int
    steps: int


@dataclass
class _Waiting:
    start: int
    remaining: int
    on_layer: Callable[[LayerWrite], None] | None
    steps: int = 0
    failed: Exception | None = field(default=None)


class ChunkScheduler:
    """engine: the engine it steps
    budget_tokens: most tokens one step computes, decode tokens included (tokens)
    lock: held around each engine step (the engine's lock, where other threads use the engine); None: no lock
    decode_grace_s: a prefill() caller leaves the next step to the decode steps while one ended less than this
      long ago (s): their steps carry its chunks; 0: it leads whenever no step runs (P has no decode steps)
    on_step: called with each step's record, after the step, without the lock (a role's event log)
    """

    def __init__(
        self,
        engine: Engine,
        budget_tokens: int = DEFAULT_BUDGET_TOKENS,
        lock: FairLock | threading.Lock | None = None,
        decode_grace_s: float = 0.0,
        on_step: Callable[[StepRecord], None] | None = None,
    ):
        if budget_tokens < 1:
            raise ValueError(f"budget_tokens={budget_tokens}; must be at least 1")
        self.engine, self.budget_tokens = engine, budget_tokens
        self.decode_grace_s, self._on_step = decode_grace_s, on_step
        self._lock = lock if lock is not None else nullcontext()
        self._cond = threading.Condition()
        self._waiting: dict[str, _Waiting] = {}  # insertion order: oldest first
        self._done: dict[str, ChunkedResult | Exception] = {}  # until taken (prefill() takes its own)
        self._blocked: set[str] = set()  # requests a prefill() call waits for
        self._leading = False  # a prefill() caller runs a step
        self._stepping = 0  # step() calls under way (waiting for the lock, or stepping)
        self._decode_end = -math.inf  # time.monotonic() when the last step with decode tokens ended
        self.records: deque[StepRecord] = deque(maxlen=RECORDS_KEPT)
        self.steps = 0  # steps run
        self.lone_tail_steps = 0  # of them, steps whose only chunk was a lone tail chunk

    # ------------------------------------------------------------ requests

    def submit(self, request_id: str, on_layer: Callable[[LayerWrite], None] | None = None) -> None:
        """Queue an open request whose last tokens lack KV; raise (queueing nothing) if it has none or waits.
        Reads the request without taking the engine lock (only its owner changes it): its owner may call it with or
        without that lock held (held: right after opening or appending, so the next step carries its chunks)."""
        start = self.engine.kv_len(request_id)  # UnknownRequest if not open
        pending = len(self.engine.tokens(request_id)) - start
        with self._cond:
            if request_id in self._waiting or request_id in self._done:
                raise BadRequestState(request_id, "submit", "already submitted")
            if pending < 1:
                raise BadRequestState(request_id, "submit", "every token already has KV")
            self._waiting[request_id] = _Waiting(start, pending, on_layer)

    def cancel(self, request_id: str) -> bool:
        """Forget a submitted request, waiting or done (its owner aborts it); a prefill() blocked on it raises
        BadRequestState. Whether there was anything to forget."""
        with self._cond:
            known = self._waiting.pop(request_id, None) is not None or self._done.pop(request_id, None) is not None
            if request_id in self._blocked:
                self._done[request_id] = BadRequestState(request_id, "prefill", "cancelled")
                self._cond.notify_all()
            return known

    def take(self, request_id: str) -> ChunkedResult | None:
        """The result of a request whose last chunk ran (once), None if it has none yet; raises the error that
        failed it. For callers that drive step() themselves (prefill() takes its own)."""
        with self._cond:
            out = self._done.pop(request_id, None)
        if isinstance(out, Exception):
            raise out
        return out

    @property
    def waiting(self) -> list[str]:
        with self._cond:
            return list(self._waiting)

    def queued(self, request_id: str) -> bool:
        """Whether request_id was submitted and not yet taken (waiting for its chunks, or done)."""
        with self._cond:
            return request_id in self._waiting or request_id in self._done

    def prefill(self, request_id: str, on_layer: Callable[[LayerWrite], None] | None = None) -> ChunkedResult:
        """Submit, then block until the request's last chunk has run (wait)."""
        self.submit(request_id, on_layer)
        return self.wait(request_id)

    def wait(self, request_id: str) -> ChunkedResult:
        """Block until a submitted request's last chunk has run, and take its result. Concurrent callers share
        steps: one that finds no step running runs the next one (for every waiting request), the others wait.
        Submitting first and waiting later lets the steps in between carry its chunks: a session opened under
        the engine lock and submitted there rides the very next step (else that step, begun as the lock was
        released, runs without it). Raises BadRequestState for a request not queued (never submitted,
        cancelled, or taken)."""
        with self._cond:
            if request_id not in self._waiting and request_id not in self._done:
                raise BadRequestState(request_id, "wait", "not submitted")
            self._blocked.add(request_id)
            try:
                self._lead_until_done(request_id)
            finally:
                self._blocked.discard(request_id)
            out = self._done.pop(request_id)
        if isinstance(out, Exception):
            raise out
        return out

    def _lead_until_done(self, request_id: str) -> None:
        """Wait (holding the condition) until request_id is done, running a step whenever none is running
        and no decode step is due (one ended within decode_grace_s)."""
        while request_id not in self._done:
            if self._leading or self._stepping:
                self._cond.wait()
                continue
            due_s = self._decode_end + self.decode_grace_s - time.monotonic()
            if due_s > 0:
                self._cond.wait(due_s)
                continue
            self._leading = True
            self._cond.release()
            try:
                self.step()
            except BaseException:
                self._cond.acquire()
                self._waiting.pop(request_id, None)  # nobody waits for it any more
                self._leading = False
                self._cond.notify_all()
                raise
            self._cond.acquire()
            self._leading = False
            self._cond.notify_all()

    # ------------------------------------------------------------ steps

    def step(self, decode: Sequence[str] = ()) -> StepRecord | None:
        """One engine step: a token for each decode request, then waiting requests' chunks under the budget.
        None when there was nothing to run. A decode request must be decodable (as for engine.decode_step:
        not done, one token without KV) and there may be at most budget_tokens of them. An engine error naming
        a waiting request fails that request alone (the step is planned again without it); any other error is
        raised (the engine is unchanged)."""
        if len(decode) > self.budget_tokens:
            raise ValueError(f"{len(decode)} decode requests exceed the step budget of {self.budget_tokens} tokens")
        with self._cond:
            self._stepping += 1
        record = None
        try:
            with self._lock:
                record = self._step_locked(decode)
        finally:
            with self._cond:
                self._stepping -= 1
                if decode:
                    self._decode_end = time.monotonic()
                self._cond.notify_all()
        if record is not None and self._on_step is not None:
            self._on_step(record)
        return record

    def _step_locked(self, decode: Sequence[str]) -> StepRecord | None:
        for rid in decode:
            self.engine.check_decodable(rid)
        while True:
            with self._cond:
                waiting = [(rid, w.remaining) for rid, w in self._waiting.items()]
            plan = plan_step(waiting, decode, self.budget_tokens)
            if not plan:
                return None
            t0 = time.monotonic()
            try:
                result = self.engine.step(plan, on_layer=self._dispatch)
            except EngineError as err:
                if not self._fail(getattr(err, "request_id", None), err):
                    raise
                continue
            return self._record(result, set(decode), t0)

    def _dispatch(self, write: LayerWrite) -> None:
        """Hand a layer to its request's callback; a callback's error fails that request only, after the step."""
        w = self._waiting.get(write.request_id)
        if w is None or w.on_layer is None or w.failed is not None:
            return
        try:
            w.on_layer(write)
        except Exception as err:  # the owner's sender broke: its request fails, the batch goes on
            w.failed = err

    def _fail(self, request_id: str | None, err: Exception) -> bool:
        with self._cond:
            if request_id not in self._waiting:
                return False
            del self._waiting[request_id]
            self._done[request_id] = err
            self._cond.notify_all()
            return True

    def _record(self, result: StepResult, decode: set[str], t0: float) -> StepRecord:
        parts = [p for p in result.parts if p.request_id not in decode]
        chunks = tuple(Chunk(p.request_id, p.start, p.n_tokens, p.completed) for p in parts)
        decoded = {rid: tok for rid, tok in result.tokens.items() if rid in decode}
        record = StepRecord(chunks, decoded, self.budget_tokens, t0, time.monotonic() - t0)
        with self._cond:
            for c in chunks:
                w = self._waiting.get(c.request_id)
                if w is None:  # cancelled during the step
                    continue
                w.remaining -= c.n_tokens
                w.steps += 1
                if w.failed is not None:
                    self._fail(c.request_id, w.failed)
                elif c.last:
                    del self._waiting[c.request_id]
                    computed = c.start + c.n_tokens - w.start
                    self._done[c.request_id] = ChunkedResult(
                        c.request_id, result.tokens[c.request_id], w.start, computed, w.steps
                    )
            self.records.append(record)
            self.steps += 1
            self.lone_tail_steps += record.lone_tail
            self._cond.notify_all()
        return record
