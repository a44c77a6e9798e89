"""The simulated roles' engines in the event loop: a prefill worker (FIFO) and a decode worker (continuous batching).

Responsible for: `PrefillWorker` (first come first served: steps of prefill.step_budget_tokens in which chunks
of every prompt in flight share a step, as the emulated P's workers/chunked.py, each taking the roofline's time
of its chunks together; budget 0: whole prompts one at a time, each the roofline's prefill of its uncached tokens
on top of its cached ones), `DecodeWorker` (each engine step decodes one
token for up to max_batch of its sessions, in turn, plus every extend or local prefill that waits, in one
roofline step), and `Session`, one request's stay on a decode worker: its tokens' times, the batch sizes that
made them, and a stop a handoff asks for (honoured at the next step's end).
Not responsible for: which worker takes a request or what happens between workers (experiments.sim.pipeline).

Simplifications (docs/simulator.md): KV room (experiments.sim.kvroom) is asked for here by P only; a decode
worker's sessions hold theirs through the pipeline, which opens them before P's prefill as the router does.
"""

from __future__ import annotations

import bisect
import math
from itertools import accumulate

from experiments.sim import clock
from experiments.sim.config import WorkerModel
from experiments.sim.kvroom import PrefixCache
from experiments.sim.realcompute import MeasuredRoofline, kv_import_s
from workers.chunked import plan_step
from workers.errors import CapacityExceeded
from workers.modelled.roofline import Part, Roofline
from workers.roles.routing import WorkerLoad, pick_p


_MARGIN = 1 + 1e-9  # one roof's time over the other's past which float rounding cannot swap them
RUN_STEPS = 64  # steps planned at once at most (an interruption wastes the rest of the plan)


class StepSeconds:
    """The roofline's time of a step of parts given as (new tokens, cached tokens, logit rows) tuples: equal to
    `roofline.step([Part(*p) for p in parts]).seconds` (tested), the same floating-point operations in the same
    order, without the Part and StepCost objects or the catalogue's properties per step (a published-scale P plans
    ~1 step a prompt: Roofline.step was ~6% of a run). A roofline of another kind (real compute's measured one)
    goes through its own step."""

    def __init__(self, roofline: Roofline):
        self.roofline, self.exact = roofline, type(roofline) is Roofline
        m, e = roofline.model, roofline.efficiency
        share = m.experts_per_token / m.experts if m.experts else 0.0  # roofline._routed_share
        self._body2 = 2 * (m.dense_body_params + m.routed_params * share)
        self._head2, self._pair = 2 * m.lm_head_params, m.attention_flops_per_pair
        self._experts, self._unrouted = m.experts, 1 - share
        self._dense, self._routed, self._head = m.dense_body_params, m.routed_params, m.lm_head_params
        self._weight_bytes, self._kv = m.weight_bytes, m.kv_bytes_per_token
        self._step_s, self._part_s, self._ramp = e.step_overhead_s, e.part_overhead_s, e.ramp_tokens
        self._flops_per_s, self._bytes_per_s = roofline.flops_per_s, roofline.bytes_per_s

    def __call__(self, parts: list[tuple[int, int, int]]) -> float:
        if not self.exact:
            return self.roofline.step([Part(*p) for p in parts]).seconds
        if len(parts) == 1:  # the usual step: the sums of one term are the term (0 + x is x)
            ((tokens, c, rows),) = parts
            pairs, kv_tokens, logits = tokens * c + tokens * (tokens + 1) / 2, c + 2 * tokens, rows
        else:  # Roofline.flops, .bytes and .step, inlined
            tokens = sum(n for n, _c, _r in parts)
            rows = sum(r for _n, _c, r in parts)
            pairs = sum(n * c + n * (n + 1) / 2 for n, c, _r in parts)
            kv_tokens, logits = sum(c + 2 * n for n, c, _r in parts), any(r for _n, _c, r in parts)
        flops = self._body2 * tokens + self._head2 * rows + self._pair * pairs
        touched = 1 - self._unrouted**tokens if self._experts else 0.0
        head = self._head if logits else 0
        nbytes = (self._dense + self._routed * touched + head) * self._weight_bytes + kv_tokens * self._kv
        compute_s = flops / (self._flops_per_s * tokens / (tokens + self._ramp))
        memory_s = nbytes / self._bytes_per_s
        return max(compute_s, memory_s) + (self._step_s + self._part_s * len(parts))


class _Prompt:
    """A prompt in P's steps: left: new tokens still lacking KV; pos: tokens with KV (cached + computed);
    done: fires at the end of the step that ran its last chunk; started: when the step of its first chunk began
    (s; None before it ran)."""

    __slots__ = ("left", "pos", "done", "started")

    def __init__(self, left: int, pos: int, done: clock.Event):
        self.left, self.pos, self.done, self.started = left, pos, done, None


class PrefillWorker:
    """A P worker. model: its name and roofline;
    room: its KV blocks (None: unlimited); max_waiting, wait_s: prefill.max_waiting and room_wait_ms (s), the
    bounds of the queue of prompts waiting for KV room; budget_tokens: prefill.step_budget_tokens (0: whole
    prompts, one at a time); jitter: each step's time factor by the step's ordinal (real compute's
    experiments.sim.realcompute.StepJitter: P's steps spread; None: the roofline's time exactly); lan_Bps: the
    goodput of its link in cluster A, the LAN (B/s; inf: unlimited).

    Chunked (budget_tokens > 0), as the emulated P's ChunkScheduler (workers/chunked.py): each step runs chunks
    of the prompts in flight under the budget, first come first served (`plan_step`), a prompt's tail chunk
    sharing its step with the next prompt's first chunk; a step takes the roofline's time of its chunks
    together; a prompt ends (its first token, its KV whole) with the step of its last chunk. The steps are
    planned at once up to the first prompt's end (one wait); a prompt that arrives meanwhile joins from
    the step after the one under way. Whole: a prompt ends at max(now, the previous one's end) + its prefill
    time, one wait per prompt. A prompt holds its KV blocks from its admission to its prefill's end; then its
    whole blocks are P's prefix cache (`cache`, prefill_prompt: evictable, so free in the room)."""

    def __init__(
        self,
        env: clock.Environment,
        model: WorkerModel,
        room=None,
        max_waiting: int = 0,
        wait_s: float = 0.0,
        budget_tokens: int = 0,
        jitter=None,
        lan_Bps: float = math.inf,
    ):
        self.env, self.model, self.name = env, model, model.name
        self.lan_Bps, self.lan_free = lan_Bps, 0.0  # its link in cluster A (goodput, B/s); when it carried its copies
        self.jitter = jitter
        self.room, self.max_waiting, self.wait_s = room, max_waiting, wait_s
        self.budget = budget_tokens
        self.cost = StepSeconds(model.roofline)
        self.cache = PrefixCache(room.block) if room is not None else None  # its engine's radix tree (prefill_prompt)
        self.pinned_blocks = 0  # cached blocks the prompts in flight matched (the engine pins them)
        # prefill_prompt's prompts from their call to their first token, and their tokens: the router's load of
        # a P (workers/roles/pools.py's holding around the Prefill call), which policy.pick_p least_load reads
        self.in_flight = self.in_flight_tokens = 0
        self.free_at = 0.0  # whole prompts: when the last prompt queued ends (s)
        self.busy_s = 0.0
        self.steps = 0  # engine steps run (chunked; whole: prompts)
        self.lone_tail_steps = 0  # of them, steps whose only chunk was a prompt's last, short one (chunked.py)
        self._queue: list[_Prompt] = []  # chunked: prompts in flight, oldest first
        self._plan_steps: list | None = None  # the chunked steps planned from _plan_start (None: idle)
        self._plan_ends: list[float] = []  # their ends (s from _plan_start)
        self._plan_start, self._replan, self._timer = 0.0, False, 0

    def prefill(self, new_tokens: int, cached_tokens: int, blocks: int = 0, request_id: str = ""):
        """A process (generator): KV room for `blocks` (the roomqueue's rules), then its turn, then the prefill of
        new_tokens on top of cached_tokens. Returns '' or why P refused it (RESOURCE_EXHAUSTED's text)."""
        if problem := (yield from self._admit(new_tokens + cached_tokens, blocks, request_id)):
            return problem
        yield from self._compute(new_tokens, cached_tokens)
        if self.room is not None:
            self.room.release(blocks)
        return ""

    def prefill_prompt(self, prompt_len: int, chain: list[int], blocks: int = 0, request_id: str = ""):
        """A process (generator): prefill's, with the cached tokens P's own prefix cache (`cache`) holds of the
        prompt (prompt_len tokens, its whole blocks named chain: kvroom.prompt_chain) once it is admitted, as the
        engine's open matches; its whole blocks are cached after. Returns ('' or why P refused it, cached, when its
        first step began: s; the refusal's time where it was refused). Needs a room: the cache keeps what the
        room's reservations leave (capacity - reserved, the pinned blocks counted once), as the engine's cache
        keeps what its open requests leave."""
        self.in_flight += 1
        self.in_flight_tokens += prompt_len
        if problem := (yield from self._admit(prompt_len, blocks, request_id)):
            self.in_flight -= 1
            self.in_flight_tokens -= prompt_len
            return problem, 0, self.env.now
        cache, room = self.cache, self.room
        cached = cache.match(chain, prompt_len, request_id)
        pinned = cached // cache.block
        self.pinned_blocks += pinned  # in the room's reservations and in the cache: once in the engine
        cache.trim(room.capacity - room.reserved + self.pinned_blocks)
        started = yield from self._compute(prompt_len - cached, cached)
        self.pinned_blocks -= pinned
        cache.unpin(request_id)
        room.release(blocks)  # its whole blocks stay, as the cache's (the engine's finish); the rest are free
        cache.insert(chain, room.capacity - room.reserved + self.pinned_blocks)
        self.in_flight -= 1
        self.in_flight_tokens -= prompt_len
        return "", cached, started

    def prefix_hit(self) -> dict:
        """Its prefix hit as the emulated per_worker reports it: n prefills, token_weighted (cached / prompt
        tokens), and the blocks its cache evicted."""
        c = self.cache
        return {
            "n": c.lookups,
            "token_weighted": c.hit_tokens / c.prompt_tokens if c.prompt_tokens else None,
            "evicted_blocks": c.evictions,
        }

    def lan_copy(self, nbytes: float, started: float) -> float:
        """When P's link has carried a copy of nbytes (a fast-path copy, at the end of its prefill) that streamed
        from started (P's first step of its prompt): behind the copies it still carries, one at a time in the order
        their prefills end (fair sharing would end the earlier ones later, the last at the same time), and not
        before now; an unlimited LAN: now."""
        if self.lan_Bps < math.inf:
            self.lan_free = max(self.env.now, max(started, self.lan_free) + nbytes / self.lan_Bps)
            return self.lan_free
        return self.env.now

    def _admit(self, prompt_len: int, blocks: int, request_id: str):
        """A process (generator): KV room for `blocks` (the roomqueue's rules). Returns '' or why P refused."""
        room = self.room
        if room is not None and (problem := room.refusal(request_id, prompt_len + 1)):
            return problem
        if room is not None and not room.open(blocks):
            cause = (
                f"{len(room.waiting)} earlier requests wait for KV room"
                if room.waiting
                else str(CapacityExceeded(request_id, blocks, room.capacity - room.reserved, room.capacity, room.block))
            )
            if len(room.waiting) >= self.max_waiting:
                return f"{cause}; {len(room.waiting)} requests already wait for room (prefill.max_waiting)"
            if not (yield room.wait(blocks, self.env.now + self.wait_s)):
                return f"no KV room within {self.wait_s * 1000:.0f} ms (prefill.room_wait_ms): {cause}"
        return ""

    def _compute(self, new_tokens: int, cached_tokens: int):
        """A process (generator): P's turn, then the prefill of new_tokens on top of cached_tokens. Returns when
        its first step began (s)."""
        if self.budget:
            prompt = _Prompt(max(1, new_tokens), cached_tokens, self.env.event())
            self._arrive(prompt)
            yield prompt.done
            return prompt.started
        else:
            seconds = self.model.roofline.prefill_s(max(1, new_tokens), cached_tokens)
            if self.jitter is not None:
                seconds *= self.jitter(self.steps)
                self.jitter.forget(self.steps + 1)
            self.busy_s += seconds
            self.steps += 1
            started = max(self.env.now, self.free_at)
            self.free_at = started + seconds
            yield self.free_at - self.env.now  # a delay (s): the process waits it (experiments.sim.clock)
            return started

    def _arrive(self, prompt: _Prompt) -> None:
        """A prompt joins the chunked steps: planned at once when P is idle; else from the step after the one
        under way (the plan's timer moves to that step's end)."""
        self._queue.append(prompt)
        if self._plan_steps is None:
            return self._start()
        if self._replan:
            return
        self._replan = True
        elapsed = self.env.now - self._plan_start
        done = bisect.bisect_right(self._plan_ends, elapsed + 1e-12)
        if done == 0 and elapsed <= 0:  # nothing ran yet: plan again now, with it
            return self._start()
        if done < len(self._plan_ends):
            self._arm(self._plan_start + self._plan_ends[done] - self.env.now)

    def _start(self) -> None:
        self._plan_steps, self._plan_ends = self._plan()
        self._plan_start, self._replan = self.env.now, False
        self._arm(self._plan_ends[-1])

    def _arm(self, delay_s: float) -> None:
        """The plan's timer: a callback (no process) at now + delay_s; an earlier timer of this worker lapses."""
        self._timer += 1
        self.env.call_in(max(0.0, delay_s), self._tick, self._timer)

    def _tick(self, timer: int) -> None:
        """The plan's steps up to now ran: account them; plan again while prompts are in flight (timer: the
        timer's number: a later one stands, this one lapsed)."""
        if timer != self._timer:
            return
        ends = self._plan_ends
        done = bisect.bisect_right(ends, self.env.now - self._plan_start + 1e-12)
        self._commit(self._plan_steps[:done], ends[:done])
        self._plan_steps = None
        if self._queue:
            self._start()

    def _plan(self) -> tuple[list[list[tuple[int, int]]], list[float]]:
        """The steps from now to the end of the oldest prompt's last chunk: each step's (prompt index, tokens)
        chunks (workers.chunked.plan_step over the prompts in order), and each step's end from now (s)."""
        queue, seconds, budget, jitter = self._queue, self.cost, self.budget, self.jitter
        if len(queue) == 1 and queue[0].left <= budget:  # the usual plan: one prompt, one step (what the loop gives)
            p = queue[0]
            t = seconds([(p.left, p.pos, 1)])
            return [[(0, p.left)]], [t if jitter is None else t * jitter(self.steps)]
        left = [p.left for p in queue]
        pos = [p.pos for p in queue]
        plan, ends, t, head = [], [], 0.0, 0
        while left[0] > 0:
            while not left[head]:
                head += 1
            chunks = plan_step([(i, left[i]) for i in range(head, len(queue))], (), budget)
            parts = []
            for i, n in chunks:
                parts.append((n, pos[i], 1 if n == left[i] else 0))
                left[i] -= n
                pos[i] += n
            t += seconds(parts) if jitter is None else seconds(parts) * jitter(self.steps + len(plan))
            plan.append(chunks)
            ends.append(t)
        return plan, ends

    def _commit(self, steps: list[list[tuple[int, int]]], ends: list[float]) -> None:
        """These planned steps ran (ends: each one's end from _plan_start): their chunks' tokens have KV; a prompt
        whose first chunk ran started with its step; prompts whose last chunk ran are done."""
        queue, budget = self._queue, self.budget
        begin = self._plan_start
        for k, chunks in enumerate(steps):
            for i, n in chunks:
                if queue[i].started is None:
                    queue[i].started = begin
                queue[i].left -= n
                queue[i].pos += n
            begin = self._plan_start + ends[k]
            i, n = chunks[0]
            self.lone_tail_steps += len(chunks) == 1 and not queue[i].left and n < budget
        self.steps += len(steps)
        if self.jitter is not None:
            self.jitter.forget(self.steps)
        self.busy_s += ends[-1] if ends else 0.0
        finished = [p for p in queue if not p.left]
        if finished:
            self._queue = [p for p in queue if p.left]
            for p in finished:
                p.done.succeed()


class Session:
    """One request on a decode worker.

    left: tokens it still makes here; context: tokens of KV it attends to; times: each token's time (s);
    steps, batch_sum: the steps that made them and their batch sizes (mean batch = batch_sum / steps);
    released: fires when it leaves the worker (all tokens made, or stopped for a handoff)"""

    __slots__ = ("left", "context", "times", "steps", "batch_sum", "stop", "released")

    def __init__(self, env: clock.Environment, left: int, context: int):
        self.left, self.context, self.times = left, context, []
        self.steps, self.batch_sum, self.stop = 0, 0, False
        self.released = env.event()

    @property
    def made(self) -> int:
        return len(self.times)


class _Job:
    """An extend (handoff) or a local prefill waiting for a step: new tokens on cached ones, rows with logits."""

    __slots__ = ("part", "done")

    def __init__(self, part: Part, done: clock.Event):
        self.part, self.done = part, done


class DecodeCost:
    """The roofline's time of a decode step of B sessions, from B and the sum of their contexts alone.

    A decode step's FLOPs and bytes are linear in its sessions' contexts for a given B (attention pairs and KV
    read grow by one per context token), so two roofline evaluations per B (contexts 0, and one context of 1)
    give both lines; the step's time is then StepCost.seconds' max(compute, memory) + overhead. Equal to
    `roofline.step([Part(1, c, 1) for c in contexts])` (tested), without building B parts per step."""

    def __init__(self, roofline):
        self.roofline, self._bytes_per_s = roofline, roofline.bytes_per_s
        self._lines: dict[int, tuple[float, float, float, float, float, float]] = {}

    def seconds(self, batch: int, context_sum: int) -> float:
        f0, df, b0, db, flops_per_s, overhead = self._lines.get(batch) or self._line(batch)
        flops, nbytes = f0 + df * context_sum, b0 + db * context_sum
        return max(flops / flops_per_s, nbytes / self._bytes_per_s) + overhead  # StepCost.seconds

    def ends(self, batch: int, context_sum: int, steps: int) -> tuple[list[float], float]:
        """The ends (s from the first's start) of `steps` consecutive steps of the same B sessions, each step's
        contexts one token longer than the last's, and the last end: `seconds` summed step by step, inlined (the
        same floats: the same sum in the same order, itertools.accumulate's; a run under one roof, the usual case,
        computes only that roof's time of each step)."""
        f0, df, b0, db, flops_per_s, overhead = self._lines.get(batch) or self._line(batch)
        bytes_per_s, contexts = self._bytes_per_s, range(context_sum, context_sum + steps * batch, batch)
        if steps > 0:  # one roof at both ends, by a margin past rounding: that roof throughout (both are linear)
            last = contexts[-1]
            compute, memory = (f0 + df * context_sum) / flops_per_s, (b0 + db * context_sum) / bytes_per_s
            compute_last, memory_last = (f0 + df * last) / flops_per_s, (b0 + db * last) / bytes_per_s
            if memory > compute * _MARGIN and memory_last > compute_last * _MARGIN:
                ends = list(accumulate([(b0 + db * c) / bytes_per_s + overhead for c in contexts]))
                return ends, ends[-1]
            if compute > memory * _MARGIN and compute_last > memory_last * _MARGIN:
                ends = list(accumulate([(f0 + df * c) / flops_per_s + overhead for c in contexts]))
                return ends, ends[-1]
        ends, t = [], 0.0
        for c in contexts:
            compute, memory = (f0 + df * c) / flops_per_s, (b0 + db * c) / bytes_per_s
            t += (memory if memory > compute else compute) + overhead
            ends.append(t)
        return ends, t

    def _line(self, batch: int):
        r = self.roofline
        zero = [Part(1, 0, 1)] * batch
        one = zero[:-1] + [Part(1, 1, 1)]
        f0, b0 = r.flops(zero), r.bytes(zero)
        overhead = r.step(zero).overhead_s
        line = (f0, r.flops(one) - f0, b0, r.bytes(one) - b0, r.step_flops_per_s(batch), overhead)
        self._lines[batch] = line
        return line


class DecodeWorker:
    """An RLD or MD worker: continuous batching over its sessions; sessions: how many it holds (its load)."""

    def __init__(self, env: clock.Environment, model: WorkerModel):
        self.env, self.model, self.name = env, model, model.name
        self.active: list[Session] = []
        self.jobs: list[_Job] = []
        self.cost = DecodeCost(model.roofline)
        self._plan = RUN_STEPS  # steps the next run plans (halved after an interruption, doubled after none)
        self._wait = 0  # the number of the worker's wait under way or last (idle, or a run of steps)
        self._woken = None  # while it waits: what a change schedules now (a change during a step: nothing)
        self._running: tuple | None = None  # the run of steps under way: (its sessions, start, step ends)
        self._step_end = 0.0  # when the last single step (_one_step) ends
        self.busy_s = 0.0
        self.tokens = 0
        env.start(self._begin())

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

    def times_so_far(self, session: Session) -> list[float]:
        """session's token times up to now: those accounted, and those of the run under way's ended steps."""
        run = self._running
        if run is None or not any(s is session for s in run[0]):
            return session.times
        _batch, start, ends = run
        done = bisect.bisect_right(ends, self.env.now - start + 1e-12)
        return session.times + [start + e for e in ends[:done]]

    def to_step_end(self) -> float:
        """Seconds until the step under way ends (0 when none runs): when a KV import, which takes the emulated
        engine between two steps (its lock), can begin."""
        run = self._running
        if run is not None:
            _batch, start, ends = run
            i = bisect.bisect_right(ends, self.env.now - start + 1e-12)
            return start + ends[i] - self.env.now if i < len(ends) else 0.0
        return max(0.0, self._step_end - self.env.now)

    def import_s(self, tokens: int) -> float:
        """Importing tokens of KV here, from now (s). Modelled compute: the host link's time after the step under
        way (to_step_end), as the emulated worker imports between two steps under its engine lock; the copy does not
        delay the next step. Real compute: the measured import (kv_imported - kv_recv_end), which holds that wait."""
        roofline = self.model.roofline
        if isinstance(roofline, MeasuredRoofline):
            return kv_import_s(roofline, tokens)
        return self.to_step_end() + kv_import_s(roofline, tokens)

    def step_job(self, new_tokens: int, cached_tokens: int, logit_rows: int = 1) -> clock.Event:
        """An extend or a prefill of new_tokens on cached_tokens in the next step; the event fires at its end."""
        done = self.env.event()
        self.jobs.append(_Job(Part(new_tokens, cached_tokens, logit_rows), done))
        self._poke()
        return done

    def stop(self, session: Session) -> None:
        """Let session go after the step under way (a handoff)."""
        session.stop = True
        self._poke()

    def _poke(self) -> None:
        woken = self._woken
        if woken is not None:
            self._woken = None
            self.env.call_in(0.0, woken)

    # The worker's loop, as callbacks: while it has nothing it waits (a change wakes it); else one step (a job
    # waits, more sessions than max_batch, or a stop) or a run of steps (one timer to its end; a change wakes it
    # early and the step under way runs to its end); then again. Each queue entry is where a process looping over
    # the same steps (its start, `yield wake`, `yield seconds`) has its own, so the order of events is the same;
    # only no Event, callback list and generator resume per wake.

    def _begin(self):
        """The worker's start: an urgent queue entry, as a process's."""
        self._next()
        yield from ()

    def _next(self, _arg=None) -> None:
        if self.active or self.jobs:
            return self._go()
        self._wait += 1
        self._woken = self._go

    def _go(self, _arg=None) -> None:
        cap = self.model.max_batch
        if self.jobs or len(self.active) > cap or any(s.stop for s in self.active):
            self._one_step(cap)
        else:
            self._run_of_steps()

    def _one_step(self, cap: int) -> None:
        batch = self.active[:cap]
        if len(self.active) > cap:  # in turn: those that waited go first next step
            self.active = self.active[cap:] + batch
        jobs, self.jobs = self.jobs, []
        if jobs:
            parts = [Part(1, s.context, 1) for s in batch] + [j.part for j in jobs]
            seconds = self.model.roofline.step(parts).seconds
        else:
            seconds = self.cost.seconds(len(batch), sum(s.context for s in batch))
        self.busy_s += seconds
        self._step_end = self.env.now + seconds
        self.env.call_in(seconds, self._one_step_end, (batch, jobs, seconds))

    def _one_step_end(self, step: tuple[list[Session], list[_Job], float]) -> None:
        batch, jobs, seconds = step
        self._account(batch, [seconds], 1, self.env.now - seconds)
        for j in jobs:
            j.done.succeed()
        self._next()

    def _run_of_steps(self) -> None:
        """Every session in every step, until the first of them is done or something changes (a session joins
        or is stopped, a job arrives: the step under way ends, then the worker plans again). One timer for
        the whole run instead of one per step; the same step times."""
        env, batch = self.env, list(self.active)
        n, ctx = len(batch), sum(s.context for s in batch)
        k = min(self._plan, min(s.left for s in batch))
        ends, t = self.cost.ends(n, ctx, k)
        self._wait += 1
        env.call_in(t, self._run_timer, self._wait)
        self._woken = self._run_woken  # the run's end or a change, whichever comes first
        self._running = (batch, env.now, ends)

    def _run_timer(self, wait: int) -> None:
        """A run of steps' end: wakes the worker unless a change woke it first."""
        if wait == self._wait and self._woken is not None:
            self._woken = None
            self.env.call_in(0.0, self._run_woken)

    def _run_woken(self, _arg=None) -> None:
        _batch, start, ends = self._running
        done = bisect.bisect_right(ends, self.env.now - start + 1e-12)
        if done < len(ends):  # interrupted: the step under way runs to its end
            self.env.call_in(start + ends[done] - self.env.now, self._run_end, (done + 1, True))
        else:
            self._run_end((done, False))

    def _run_end(self, end: tuple[int, bool]) -> None:
        done, interrupted = end
        if interrupted:
            self._plan = max(2, self._plan // 2)  # plan fewer steps: their times would be wasted again
        else:
            self._plan = min(RUN_STEPS, self._plan * 2)
        batch, start, ends = self._running
        self.busy_s += ends[done - 1]
        self._running = None
        self._account(batch, ends, done, start)
        self._next()

    def _account(self, batch: list[Session], ends: list[float], done: int, start: float) -> None:
        """done steps of batch ended at start + ends[i]: their tokens, and the sessions that leave."""
        n = len(batch)
        times = [start + e for e in ends[:done]]
        gone = []
        for s in batch:
            s.times += times
            s.context += done
            s.left -= done
            s.steps += done
            s.batch_sum += n * done
            if s.left <= 0 or s.stop:
                gone.append(s)
        self.tokens += n * done
        if gone:
            leaving = set(gone)  # a Session compares by identity
            self.active = [s for s in self.active if s not in leaving]
            for s in gone:
                s.released.succeed()


def pick_prefill(pool: list[PrefillWorker], chain: list[int], prompt_len: int) -> PrefillWorker:
    """policy.pick_p cache_aware's P of pool (routing.pick_p's rule, the emulated router's): each P's load (its
    prefills in flight, their tokens) and the prompt's prefix its own cache holds (the router's mirror of what each
    P prefilled; here the cache itself, which a mirror follows but for evictions)."""
    hits = [p.cache.held(chain, prompt_len) if p.cache else 0 for p in pool]
    top = max(hits)  # the rule's first key is the hit: only the Ps that hold the most can win (in pool order)
    best = [p for p, h in zip(pool, hits) if h == top]
    loads = [WorkerLoad(p.name, p.in_flight, p.in_flight_tokens, hit_tokens=top) for p in best]
    return best[[w.name for w in loads].index(pick_p(loads, "cache_aware", 0).worker)]
