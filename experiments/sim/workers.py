"""The simulated roles' engines as SimPy processes: a prefill worker (FIFO) and a decode worker (continuous batching).

Responsible for: `PrefillWorker` (one prompt at a time, first come first served, each taking the roofline's
prefill time of its uncached tokens on top of its cached ones), `DecodeWorker` (each engine step decodes one
token for up to max_batch of its sessions, in turn, plus every extend or local prefill that waits, in one
roofline step), and `Session`, one request's stay on a decode worker: its tokens' times, the batch sizes that
made them, and a stop a handoff asks for (honoured at the next step's end).
Not responsible for: which worker takes a request or what happens between workers (experiments.sim.pipeline).

Simplifications (docs/simulator.md): P does not chunk or batch prompts (the emulated P shares a step's
budget between prompts); KV capacity is not enforced (no admission queue, no eviction).
"""

from __future__ import annotations

import simpy

from experiments.sim.config import WorkerModel
from workers.modelled.roofline import Part


class PrefillWorker:
    """A P worker. model: its name and roofline; queued_tokens: prompt tokens waiting or running (its load)."""

    def __init__(self, env: simpy.Environment, model: WorkerModel):
        self.env, self.model, self.name = env, model, model.name
        self._engine = simpy.Resource(env, capacity=1)
        self.queued_tokens = 0
        self.busy_s = 0.0

    def prefill(self, new_tokens: int, cached_tokens: int):
        """A SimPy generator: wait its turn, then the prefill of new_tokens on top of cached_tokens."""
        self.queued_tokens += new_tokens
        with self._engine.request() as turn:
            yield turn
            seconds = self.model.roofline.prefill_s(max(1, new_tokens), cached_tokens)
            self.busy_s += seconds
            yield self.env.timeout(seconds)
        self.queued_tokens -= new_tokens


class Session:
    """One request on a decode worker.

    left: tokens it still makes here; context: tokens of KV it attends to; times: each token's time (s);
    steps, batch_sum: the steps that made them and their batch sizes (mean batch = batch_sum / steps);
    released: fires when it leaves the worker (all tokens made, or stopped for a handoff)"""

    __slots__ = ("left", "context", "times", "steps", "batch_sum", "stop", "released")

    def __init__(self, env: simpy.Environment, left: int, context: int):
        self.left, self.context, self.times = left, context, []
        self.steps, self.batch_sum, self.stop = 0, 0, False
        self.released = env.event()

    @property
    def made(self) -> int:
        return len(self.times)


class _Job:
    """An extend (handoff) or a local prefill waiting for a step: new tokens on cached ones, rows with logits."""

    __slots__ = ("part", "done")

    def __init__(self, part: Part, done: simpy.Event):
        self.part, self.done = part, done


class DecodeWorker:
    """An RLD or MD worker: continuous batching over its sessions; sessions: how many it holds (its load)."""

    def __init__(self, env: simpy.Environment, model: WorkerModel):
        self.env, self.model, self.name = env, model, model.name
        self.active: list[Session] = []
        self.jobs: list[_Job] = []
        self._wake: simpy.Event | None = None
        self.busy_s = 0.0
        self.tokens = 0
        env.process(self._run())

    @property
    def sessions(self) -> int:
        return len(self.active)

    def join(self, session: Session) -> Session:
        """Decode session here from the next step on (it leaves at once if it has nothing to make)."""
        if session.left <= 0:
            session.released.succeed()
            return session
        self.active.append(session)
        self._poke()
        return session

    def step_job(self, new_tokens: int, cached_tokens: int, logit_rows: int = 1) -> simpy.Event:
        """An extend or a prefill of new_tokens on cached_tokens in the next step; the event fires at its end."""
        done = self.env.event()
        self.jobs.append(_Job(Part(new_tokens, cached_tokens, logit_rows), done))
        self._poke()
        return done

    def _poke(self) -> None:
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def _run(self):
        env, cap = self.env, self.model.max_batch
        while True:
            if not self.active and not self.jobs:
                self._wake = env.event()
                yield self._wake
                self._wake = None
            batch = self.active[:cap]
            if len(self.active) > cap:  # in turn: those that waited go first next step
                self.active = self.active[cap:] + batch
            jobs, self.jobs = self.jobs, []
            parts = [Part(1, s.context, 1) for s in batch] + [j.part for j in jobs]
            seconds = self.model.roofline.step(parts).seconds
            self.busy_s += seconds
            yield env.timeout(seconds)
            self._finish_step(batch, jobs)

    def _finish_step(self, batch: list[Session], jobs: list[_Job]) -> None:
        now, n = self.env.now, len(batch)
        gone = []
        for s in batch:
            s.times.append(now)
            s.context += 1
            s.left -= 1
            s.steps += 1
            s.batch_sum += n
            if s.left <= 0 or s.stop:
                gone.append(s)
        self.tokens += n
        if gone:
            ids = {id(s) for s in gone}
            self.active = [s for s in self.active if id(s) not in ids]
            for s in gone:
                s.released.succeed()
        for j in jobs:
            j.done.succeed()
