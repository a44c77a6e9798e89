"""Continuous batching over one Engine: admission, batched decode steps, backpressure.

Responsible for: a bounded FIFO waiting queue (QueueFull past the bound);
admitting waiting requests, oldest first, when the engine's KV capacity and
the batch limit allow; one batched decode step per `step()` over every active
request; finishing requests and resolving their futures; streaming tokens to
per-request callbacks; an optional background thread that calls `step()`.
Not responsible for: the model or KV (`workers.engine`), or how tokens reach
a client (the PDD roles pass `on_token`).

Use it synchronously (tests, simulations): `submit()` then `step()` until
`idle`. Or call `start()`/`stop()` (or use it as a context manager) and wait
on the futures `submit()` returns; then only the loop thread touches the
engine.
"""
from __future__ import annotations

import logging
import threading
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Callable

from workers.engine import Engine, GenerationRequest, GenerationResult
from workers.errors import CapacityExceeded, DuplicateRequest, EngineError, QueueFull

log = logging.getLogger(__name__)

TokenCallback = Callable[[str, int], None]  # (request_id, token)
IDLE_WAIT_S = 0.05  # loop thread's longest sleep when idle; submit() wakes it at once


@dataclass(frozen=True)
class TokenEvent:
    """index: 0 for the first generated token"""
    request_id: str
    index: int
    token: int


@dataclass(frozen=True)
class Rejection:
    request_id: str
    error: EngineError


@dataclass(frozen=True)
class StepReport:
    """What one step() did."""
    admitted: tuple[str, ...]
    tokens: tuple[TokenEvent, ...]
    finished: tuple[GenerationResult, ...]
    rejected: tuple[Rejection, ...]
    batch_size: int  # requests in this step's decode pass


@dataclass
class _Entry:
    request: GenerationRequest
    future: Future
    on_token: TokenCallback | None


class Scheduler:
    """Continuous batching loop.

    engine: the engine it drives (no one else may drive it while the loop thread runs)
    max_waiting: bound of the waiting queue (requests); submit() past it raises QueueFull
    max_batch: most requests active at once (requests)
    max_prefills_per_step: prefills run per step, so decode steps keep flowing while requests arrive
    """

    def __init__(self, engine: Engine, max_waiting: int = 64, max_batch: int = 32, max_prefills_per_step: int = 1):
        if max_waiting < 0 or max_batch < 1 or max_prefills_per_step < 1:
            raise ValueError("need max_waiting >= 0, max_batch >= 1, max_prefills_per_step >= 1")
        self.engine = engine
        self.max_waiting = max_waiting
        self.max_batch = max_batch
        self.max_prefills_per_step = max_prefills_per_step
        self._waiting: deque[_Entry] = deque()
        self._active: dict[str, _Entry] = {}
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False

    # ------------------------------------------------------------ submit

    def submit(self, request: GenerationRequest, on_token: TokenCallback | None = None) -> Future:
        """Queue a request; its future resolves to a GenerationResult. Raises at once (queuing nothing)
        for a bad request, one that can never fit the KV cache, or a full queue."""
        self.engine.validate(request)
        self._check_fits_ever(request)
        entry = _Entry(request, Future(), on_token)
        with self._cond:
            rid = request.request_id
            if rid in self._active or any(e.request.request_id == rid for e in self._waiting):
                raise DuplicateRequest(rid)
            if len(self._waiting) >= self.max_waiting:
                raise QueueFull(rid, self.max_waiting)
            self._waiting.append(entry)
            self._cond.notify()
        return entry.future

    def _check_fits_ever(self, request: GenerationRequest) -> None:
        kv = self.engine.kv
        needed = kv.blocks_for(len(request.prompt_tokens) + request.max_tokens)
        if needed > kv.num_blocks:
            raise CapacityExceeded(request.request_id, needed, kv.num_blocks, kv.num_blocks, kv.block_size)

    @property
    def waiting(self) -> int:
        with self._cond:
            return len(self._waiting)

    @property
    def active(self) -> int:
        return len(self._active)

    @property
    def idle(self) -> bool:
        return not self._active and self.waiting == 0

    # ------------------------------------------------------------ step

    def step(self) -> StepReport:
        """Admit what fits, run one batched decode step, finish what is done."""
        tokens: list[TokenEvent] = []
        finished: list[GenerationResult] = []
        rejected: list[Rejection] = []
        admitted = self._admit(tokens, rejected)
        decodable = [rid for rid in self._active if not self.engine.is_done(rid)]
        for rid, token in self.engine.decode_step(decodable).items():
            self._emit(rid, token, tokens)
        for rid in [rid for rid in self._active if self.engine.is_done(rid)]:
            finished.append(self._finish(rid))
        return StepReport(tuple(admitted), tuple(tokens), tuple(finished), tuple(rejected), len(decodable))

    def _admit(self, tokens: list[TokenEvent], rejected: list[Rejection]) -> list[str]:
        admitted: list[str] = []
        while len(admitted) < self.max_prefills_per_step and len(self._active) < self.max_batch:
            with self._cond:
                if not self._waiting:
                    break
                entry = self._waiting[0]
            rid = entry.request.request_id
            try:
                self.engine.open(entry.request)
            except CapacityExceeded as err:
                if not err.never_fits:
                    break  # head of line waits for capacity; FIFO keeps big requests from starving
                self._reject(entry, err, rejected)
                continue
            except EngineError as err:
                self._reject(entry, err, rejected)
                continue
            with self._cond:
                self._waiting.popleft()
            self._active[rid] = entry
            admitted.append(rid)
            self._emit(rid, self.engine.prefill(rid).first_token, tokens)
        return admitted

    def _reject(self, entry: _Entry, err: EngineError, rejected: list[Rejection]) -> None:
        with self._cond:
            self._waiting.popleft()
        log.warning("rejected %s: %s", entry.request.request_id, err)
        entry.future.set_exception(err)
        rejected.append(Rejection(entry.request.request_id, err))

    def _emit(self, request_id: str, token: int, tokens: list[TokenEvent]) -> None:
        entry = self._active[request_id]
        event = TokenEvent(request_id, len(self.engine.tokens(request_id)) - len(entry.request.prompt_tokens) - 1,
                           token)
        tokens.append(event)
        if entry.on_token is not None:
            try:
                entry.on_token(request_id, token)
            except Exception:  # a client's callback must not stop the batch
                log.exception("on_token callback of %s failed", request_id)

    def _finish(self, request_id: str) -> GenerationResult:
        entry = self._active.pop(request_id)
        result = self.engine.finish(request_id)
        entry.future.set_result(result)
        return result

    def run_until_idle(self, max_steps: int = 1_000_000) -> list[StepReport]:
        """Step until nothing is waiting or active (synchronous use)."""
        reports = []
        while not self.idle and len(reports) < max_steps:
            reports.append(self.step())
        return reports

    # ------------------------------------------------------------ thread

    def start(self) -> None:
        """Run step() on a background thread until stop()."""
        if self._thread is not None:
            raise RuntimeError("scheduler loop already running")
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="scheduler", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the loop thread after its current step; requests still open stay open."""
        if self._thread is None:
            return
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout_s)
        self._thread = None

    def __enter__(self) -> Scheduler:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _loop(self) -> None:
        try:
            while True:
                with self._cond:
                    if self._stopping:
                        return
                    if not self._waiting and not self._active:
                        self._cond.wait(IDLE_WAIT_S)
                        continue
                self.step()
        except BaseException as err:
            log.exception("scheduler loop died")
            self._fail_all(err)

    def _fail_all(self, err: BaseException) -> None:
        with self._cond:
            entries = list(self._waiting) + list(self._active.values())
            self._waiting.clear()
        for rid in list(self._active):
            self.engine.abort(rid)
        self._active.clear()
        for entry in entries:
            if not entry.future.done():
                entry.future.set_exception(err)
