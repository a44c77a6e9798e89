"""A decode worker's engine steps: its sessions' batched decode steps, with a prefill's or an extend's chunks mixed in.

Responsible for: how a decode role (RLD or MD) computes on its engine.
`decode.step_budget_tokens` > 0: every step is a ChunkScheduler's
(workers/chunked.py) under that budget: the sessions' decode tokens first
(StepBatcher), then chunks of whatever waits for KV — a local prefill
(colocated, a request resumed on the RLD) or the MD's recompute of handed-over
token IDs (appended, then computed) — so a long prompt or a large extend no
longer holds every session's next token for its whole duration. A prefill or
extend waits for its last chunk, leading chunk-only steps itself only while no
session decodes. 0: as before, whole (engine.prefill, engine.extend) between
decode steps, under the engine lock. Records each step that carried chunks
(`decode_step_mixed`).
Not responsible for: which sessions decode or when (decode.py), the handoff's
checks (handoff.py), KV imports (a copy, not compute: they take the engine lock
between steps).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from workers.chunked import ChunkScheduler, StepRecord
from workers.engine import Engine
from workers.fairlock import FairLock
from workers.roles.batching import StepBatcher
from workers.roles.events import EventLog

# A prefill or extend waiting for its chunks leads a step of its own only when no decode step ended this long ago:
# sessions come back for their next step within a millisecond or two (the batcher's gather is at most 2 ms),
# tens of ms on a loaded two-core host; a chunk-only step between two of theirs would double their time per token.
DECODE_GRACE_S = 0.02


class DecodeSteps:
    """engine: the worker's; lock: the engine's lock (every other use of the engine holds it too)
    budget_tokens: tokens per step, decode tokens included (decode.step_budget_tokens); 0: prefill and extend whole
    max_batch: sessions decoded in one step at most; events: the worker's log
    """

    def __init__(
        self, engine: Engine, lock: FairLock | threading.Lock, budget_tokens: int, max_batch: int, events: EventLog
    ):
        self.engine, self.lock, self.events = engine, lock, events
        self.chunks: ChunkScheduler | None = None
        if budget_tokens:
            self.chunks = ChunkScheduler(
                engine, budget_tokens, lock, decode_grace_s=DECODE_GRACE_S, on_step=self._record
            )
            self.batcher = StepBatcher(self._mixed_step, None, max_batch)
        else:
            self.batcher = StepBatcher(engine.decode_step, lock, max_batch)

    def _mixed_step(self, request_ids: Sequence[str]) -> dict[str, int]:
        return self.chunks.step(decode=request_ids).decoded

    def submit(self, request_id: str) -> None:
        """Queue a request just opened for its prefill's chunks: call it holding the engine lock, right after the
        open, so that the next step carries its first chunk (the sessions decoding here take that step as soon as
        the lock is free, before prefill() could submit it: the prompt would then wait a whole decode step more
        than an engine that admits what it has opened). Nothing to queue when prefills are whole."""
        if self.chunks is not None:
            self.chunks.submit(request_id)

    def prefill(self, request_id: str) -> tuple[int, int]:
        """Compute an open request's prompt KV beyond its cached prefix (queued first unless submit() did):
        (its first token, steps it took). Call without the engine lock."""
        if self.chunks is None:
            with self.lock:
                return self.engine.prefill(request_id).first_token, 1
        if not self.chunks.queued(request_id):
            self.chunks.submit(request_id)
        done = self.chunks.wait(request_id)
        return done.next_token, done.steps

    def extend(self, request_id: str, token_ids: Sequence[int]) -> int:
        """Append token_ids to a request whose other tokens all have KV and compute them; the next token is
        sampled and appended unless the request is done (as engine.extend). Steps it took. Raises EngineError
        (nothing appended) when the IDs cannot be appended. Call without the engine lock."""
        if self.chunks is None:
            with self.lock:
                self.engine.extend(request_id, token_ids, all_logits=False)  # the next token alone: no logits read
            return 1
        with self.lock:  # queued before the lock is free: the next step carries its first chunk (as submit)
            self.engine.append_tokens(request_id, token_ids)
            self.chunks.submit(request_id)
        return self.chunks.wait(request_id).steps

    def cancel(self, request_id: str) -> None:
        """Stop computing a request's chunks (before the engine aborts it): a prefill or extend waiting for
        them raises BadRequestState."""
        if self.chunks is not None:
            self.chunks.cancel(request_id)

    def _record(self, step: StepRecord) -> None:
        if not step.chunks:  # a plain decode step: the sessions' own events (decode_done's steps) cover it
            return
        self.events.emit(
            "decode_step_mixed",
            None,
            decode_tokens=len(step.decoded),
            chunk_tokens=sum(c.n_tokens for c in step.chunks),
            requests=[c.request_id for c in step.chunks],
            completed=[c.request_id for c in step.chunks if c.last],
            duration_ns=int(step.duration_s * 1e9),
        )
