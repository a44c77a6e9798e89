"""The simulated PDD pipeline: each request routed as the router routes it and carried through the roles (processes).

Responsible for: `Simulation` (one variant: its P, RLD and MD pools, the A->B line, the MDs' and Ps' prefix caches,
the names of each prompt's blocks) and, per request, its path: the route decision
(workers.roles.routing.decide_route, the emulated router's own pure function), the worker picks, P's prefill, the
fast path to the RLD (the LAN, P's link; the host links' KV export and import), the WAN copy to the MD (export,
line, import), eager decoding on the RLD, the handoff by token IDs (or by KV, mode kv) and the MD's extend, the
singular filter and the ablation's P->RLD; then one experiments.analysis.records.RequestRecord per request, as the
emulated run's analysis reads it (experiments.sim.record).
Not responsible for: step times (the roofline, through experiments.sim.workers) or the line (experiments.sim.wan).

KV room (experiments.sim.kvroom), as the roles keep it: the decode sessions a request needs are opened first, before
P's prefill, as the router opens them, each reserving prompt + max_tokens; one that finds no room waits, first come
first served (an MD's then reports no cached prefix: the whole prompt's KV comes), until decode.kv_wait_ms from its
open, which also bounds the wait for the prompt's KV; P holds a prompt's blocks from its admission (a FIFO bounded
by prefill.max_waiting and room_wait_ms) to its prefill's end. A request that can never fit is refused
(RESOURCE_EXHAUSTED). An MD's DRC keeps each session's last turn until the room is needed (least recently used).

Timeouts, as the emulated client and roles apply them: past timeouts.request_s the request fails
(DEADLINE_EXCEEDED, with the tokens it had; its sessions stop, the next turn follows); an MD whose KV misses
kv_wait_ms gives up (kv_timeout): in pdd P->RLD->MD the RLD decodes to the end (completed_on_rld:md_never_ready),
pdd's P->MD falls back to P->RLD (route p-rld-fallback), pd-cross fails (no fallback), as does an RLD whose KV or
room misses it. A copy whose MD gave up still crosses the line.

The decode-side hit (the MD's DRC): the workload's expected hit of a request (what an MD that saw every earlier
turn holds) where the request's previous turn ended at this MD, else what this MD holds of the session (its
last turn that ended here, or the shared system prompt). So the ablation, whose low-hit turns end on the RLD,
sees the MD's hit fall behind P's. The in-flight DRC (workers/roles/decode.py's _inflight_prefix, _open_after): a
P->RLD->MD turn whose previous turn's MD session on the same MD is still open (its WAN copy under way, or the RLD's
output not yet recomputed) takes that session's promise (its prompt; its prompt and output once its RLD finished)
as cached: P ships only what lies beyond, and its MD, once its own copy is in, waits (within kv_wait_ms) for the
earlier session to end; if that one left less in the DRC (its KV never came, or its blocks were evicted) the
prefix is lost (fallback prefix_lost) and the RLD decodes to the end. On a slow line this is what keeps the copies
small: without it every later turn ships its whole prompt while the earlier copy still crosses.

P's hit is its own prefix cache's (experiments.sim.kvroom.PrefixCache, one per P, as each emulated P's engine keeps
its radix tree): the whole blocks of the prompts it prefilled (never their outputs: P does not decode), and the
warm-up's prompt (the system prompt) on every P; a session whose turns land on another P (policy.pick_p: round_robin,
least_load by prompt tokens in flight, cache_aware by the prefix each P's cache holds: workers.pick_prefill) finds
there only what that P prefilled of it; least recently used blocks go when P's KV room is short. A Mooncake slice's
shared prefixes are matched block by block (its prompts' tokens); a later turn's prompt continues its previous
turn's blocks, then its own (the reply's tokens are the reference run's). A fallback prefills again on the same P.

Times are the client's: a token when the decode side sends it (P's first once that side holds the prompt's KV), an
MD's a crossing later (a message's: the one-way delay and its frames' largest jitter, wan.CONTROL_FRAMES); ttft_decode:
the first token a decode worker made. pdd's P->MD copy starts at the MD's DRC answer at the earliest (P asks as it
starts; the MD answers once the router's open crossed the line and its step ended). Handoffs are simulated one-shot.
"""

from __future__ import annotations

import contextlib
import gc
import operator
import random
import zlib
from collections import defaultdict
from dataclasses import replace

from experiments.analysis.records import fallback_cause
from experiments.sim import clock
from experiments.sim.config import HANDOFF_ID_BYTES, SimConfig
from experiments.sim.kvroom import Deadlines, KVRoom, extend_chain, kv_capacity_tokens, prompt_chain
from experiments.sim.realcompute import MeasuredRoofline, kv_export_s, kv_import_s, the_jitter
from experiments.sim.record import DEADLINE_EXCEEDED, Rec, cut_at_end, streams_ended
from experiments.sim.wan import CONTROL_FRAMES, Calibration, Line
from experiments.sim.workers import DecodeWorker, PrefillWorker, Session, pick_prefill
from experiments.spec.workload import WorkloadRequest
from workers.roles.routing import Route, decide_route

MD_NEVER_READY = fallback_cause({"event": "completed_on_rld", "reason": "md_never_ready"})
PREFIX_LOST = fallback_cause({"event": "prefix_lost"})
KV_TIMEOUT = "kv_timeout"  # a decode session's end reason past decode.kv_wait_ms (workers/roles/decode.py)
# The collector's young generation while a simulation runs (Python's default: 700): its events, closures and
# generators make few cycles (~100 objects in cycles a 10,000-request run), so collecting every 700 allocations
# cost up to ~15% of the run for no memory back, and at 100,000 two or three young collections of ~50 ms each
# still took 0.11-0.14 s of a published-scale variant's ~1.5 s (gc.callbacks); at 1,000,000 a 10,000-request
# run has none, and the young generation stays bounded (bench_sim's 3 variants: peak RSS 497 MB either way).
GC_YOUNG_OBJECTS = 1_000_000
# loads, as the router's policies read them (workers/roles/routing.py): a P's prompt tokens in flight, then prefills
_SESSIONS, _P_LOAD = operator.attrgetter("sessions"), operator.attrgetter("in_flight_tokens", "in_flight")


@contextlib.contextmanager
def few_collections(young_objects: int = GC_YOUNG_OBJECTS):
    """The collector while a simulation or its analysis runs: what exists on entry (the workload, the model, the
    records) stays out of its full passes (gc.freeze), and the young generation holds young_objects."""
    gc.freeze()
    thresholds = gc.get_threshold()
    gc.set_threshold(young_objects, *thresholds[1:])
    try:
        yield
    finally:
        gc.freeze()  # with what it made (the records): to the oldest generation, unscanned
        gc.set_threshold(*thresholds)
        gc.unfreeze()


class Simulation:
    """One variant of a spec over a workload.

    cfg: the variant (experiments.sim.config.sim_config); requests: the workload (a warm-up is not simulated:
    its prompt is put in every P's prefix cache, and the system prompt is taken as cached on every decode worker,
    as after the emulated warm-up); seed: the line's jitter and real compute's P step spread (realcompute.the_jitter:
    each P its own draws); calibration: the WAN table (None: formula only); request_s: timeouts.request_s, the
    client's deadline of one request (0: none)"""

    def __init__(self, cfg: SimConfig, requests: list[WorkloadRequest], seed: int = 0,
                 calibration: Calibration | None = None, request_s: float = 0.0):  # fmt: skip
        self.cfg, self.env = cfg, clock.Environment()
        env, dep = self.env, cfg.deployment
        self.request_s, self.kv_wait_s = request_s, dep.decode.kv_wait_ms / 1000
        self._block = dep.block_size  # tokens a KV block
        rng, cc = random.Random(seed), cfg.wan_congestion
        self.line = Line(env, cfg.line, calibration, rng, congestion=cc, schedule=cfg.line_schedule)
        self.back_s = cfg.line.one_way_s + cfg.line.mean_max_jitter_s(CONTROL_FRAMES)  # a message across (as A->B)
        self.deadlines = Deadlines(env)  # timeouts.request_s, and the MDs' kv_wait_ms on the WAN copies
        self.rooms = {
            w.name: KVRoom(env, kv_capacity_tokens(w), dep.block_size) for ws in cfg.workers.values() for w in ws
        }
        queue = (dep.prefill.max_waiting, dep.prefill.room_wait_ms / 1000, dep.prefill.step_budget_tokens)
        jitter = {w.name: the_jitter(w.roofline, seed, w.name) for w in cfg.workers["p"]}  # each P its own draws
        lan = cfg.lan.rate_bps / 8  # each P's link in cluster A: the LAN's goodput (B/s)
        self.p = [PrefillWorker(env, w, self.rooms[w.name], *queue, jitter[w.name], lan) for w in cfg.workers["p"]]
        self.rld, self.md = ([DecodeWorker(env, w) for w in cfg.workers[role]] for role in ("rld", "md"))
        self.pools = {"p": self.p, "rld": self.rld, "md": self.md}
        self.requests = [r for r in requests if r.kind != "warmup"]
        self._by_id = {r.request_id: r for r in self.requests}
        self._salt = {r.request_id: i + 1 for i, r in enumerate(self.requests)}  # extend_chain's, per request
        self._chains: dict[str, list[int]] = {}  # request -> its prompt's block names, until its next turn's
        self.p_cached: dict[str, int] = {}  # request -> the tokens of its prompt P's prefix cache held (its last P)
        for warm in (r for r in requests if r.kind == "warmup"):  # the warm-up's prompt: on every P (module doc)
            for p in self.p:
                p.cache.insert(prompt_chain(warm.head_tokens, self._block), p.room.capacity)
        self.next_turns: dict[str, list[WorkloadRequest]] = defaultdict(list)
        self.base: dict[str, int] = {}  # session -> its shared head's cached tokens (the system prompt)
        self.records, self._turns = [], {"p": 0, "rld": 0, "md": 0}  # _turns: each pool's picks (round_robin's turn)
        self._md_sessions: dict[str, Rec] = {}  # request -> its record while its pdd MD session is open (in-flight DRC)
        self.wan_ends: dict[str, float] = {}  # request -> when its WAN copy's last byte arrived (s)

    def run(self):
        """Simulate every request to its end; the records (RequestRecord) in the workload's order."""
        with few_collections():
            ids = {r.request_id for r in self.requests}
            for r in self.requests:
                if r.after and r.after in ids:
                    self.next_turns[r.after].append(r)
                else:
                    self.base.setdefault(r.session, r.cached_tokens)
                    self.env.start(self._client(r, r.arrival_s))
            self.env.run()
        order = {r.request_id: i for i, r in enumerate(self.requests)}
        return sorted(cut_at_end(self.records, self.wan_ends, self.back_s), key=lambda rec: order[rec.request_id])

    def _client(self, req: WorkloadRequest, at_s: float):
        """The load generator's chain of a session: each turn after the previous one's answer (a failed one too:
        the emulated client takes its history from the reference run) and its think time."""
        issue_s = self.cfg.issue_s
        if issue_s and max(at_s, self.env.now) > issue_s:  # as the load generator: this turn and the rest unsent
            self._not_issued(req, f"not issued: due past the variant's issue deadline ({issue_s:g} s)")
            return
        if at_s > self.env.now:
            yield at_s - self.env.now  # a delay (s): the process waits it (experiments.sim.clock)
        rec = Rec(req, self.env.now, self.cfg)
        if self.request_s:
            self.deadlines.watch(
                self.env.now + self.request_s, lambda: rec.final is not None, lambda: self._deadline(rec)
            )
        yield from self._serve(req, rec)  # the next turn leaves once the client has the answer (_end)

    def _not_issued(self, req: WorkloadRequest, error: str) -> None:
        """req and every later turn of its session recorded as never sent (issued false, as the client does)."""
        rec = Rec(req, self.env.now, self.cfg).record(self.env.now)
        self.records.append(replace(rec, ok=False, issued=False, error=error))
        for nxt in self.next_turns.get(req.request_id, ()):
            self._not_issued(nxt, error)

    def _end(self, rec: Rec) -> None:
        """The client has its answer (once); a failed request's open sessions stop, its KV blocks come back."""
        live = list(rec.live) if rec.error is not None else ()
        if rec.final is None:
            self.records.append(rec.record(self.env.now))
            nxt_turns = self.next_turns.get(rec.req.request_id, ())
            if not nxt_turns:
                self._chains.pop(rec.req.request_id, None)
            for nxt in nxt_turns:
                self.env.start(self._client(nxt, self.env.now + nxt.think_s))
        if rec.error is not None:
            for worker, s in live:
                worker.stop(s)
            for role in list(rec.rooms):
                self._free(rec, role)

    def _fail(self, rec: Rec, error: str) -> None:
        if rec.error is None:
            rec.error = error
        self._end(rec)

    def _deadline(self, rec: Rec) -> None:
        """timeouts.request_s passed: the client's call fails (DEADLINE_EXCEEDED) with the tokens it got."""
        if rec.final is None:
            self._fail(rec, DEADLINE_EXCEEDED)

    # ------------------------------------------------------------ KV room

    def _blocks(self, req: WorkloadRequest, extra: int) -> int:
        """Blocks req reserves for prompt + extra tokens, beside its session's shared head (kvroom docstring)."""
        return max(0, -(-(req.prompt_len + extra) // self._block) - self.base.get(req.session, 0) // self._block)

    def _open(self, rec: Rec, role: str, worker: DecodeWorker, req: WorkloadRequest) -> str | None:
        """Open req's session on a decode worker as the engine opens it: None when open now, or waiting for room
        (first come first served, until decode.kv_wait_ms from now); else the refused stream's note."""
        room = self.rooms[worker.name]
        if problem := room.refusal(req.request_id, req.prompt_len + req.max_tokens):
            return f"{role}: {worker.name}: RESOURCE_EXHAUSTED: {problem}"
        blocks, pin = self._blocks(req, req.max_tokens), req.session if role == "md" else None
        waits = None if room.open(blocks, pin) else room.wait(blocks, self.env.now + self.kv_wait_s, pin)
        rec.rooms[role] = [room, blocks, waits]
        if pin is not None and rec.drc_hit is not None:  # pdd: the router's open reaches the MD a one-way later
            self.env.call_in(self.back_s, self._answer, (rec, worker))
        return None

    def _answer(self, opened: tuple[Rec, DecodeWorker]) -> None:
        """When the MD's DRC answer (PrefixLength, pdd: _wan_in) reaches P: the MD's step end, a one-way later."""
        opened[0].answer_at = self.env.now + opened[1].to_step_end() + self.back_s

    def _deferred(self, rec: Rec, role: str) -> bool:
        """The session found no room at its open: it reports no cached prefix (the whole prompt's KV comes)."""
        return role in rec.rooms and rec.rooms[role][2] is not None

    def _room_ready(self, rec: Rec, role: str):
        """True when the session holds its blocks, False when it has none (it gave up, or it left); else the
        event that says which (True: it got them; False: its deadline passed). Yield the event."""
        room = rec.rooms.get(role)
        if room is None:
            return False
        waits = room[2]
        if waits is None:
            return True
        return waits.value if waits.triggered else waits

    def _free(self, rec: Rec, role: str, keep: tuple[str, int, int] | None = None) -> None:
        """The session on role leaves: its blocks come back (keep: those its DRC keeps); once only."""
        if role not in rec.rooms:
            return
        room, blocks, waits = rec.rooms.pop(role)
        if role == "md" and rec.md_closed is not None:  # its DRC is what it is now: later turns' waits end
            self._md_sessions.pop(rec.req.request_id, None)
            rec.md_closed.succeed()
        if waits is None or (waits.triggered and waits.value):
            room.release(blocks, keep)
        elif not waits.triggered:  # still queued: gives its blocks back as soon as it gets them
            waits.callbacks.append(lambda e: e.value and room.release(blocks))

    def _keep(self, req: WorkloadRequest) -> tuple[str, int, int]:
        """What an MD's DRC keeps of req: prompt + output but the last token, whole blocks; (session, tokens,
        its blocks beyond the shared head)."""
        tokens = (req.prompt_len + req.max_tokens - 1) // self._block * self._block
        return req.session, tokens, max(0, tokens // self._block - self.base.get(req.session, 0) // self._block)

    # ------------------------------------------------------------ picks

    def _pick_md(self, session: str) -> DecodeWorker:
        pol = self.cfg.policy
        if pol.pick_md == "cache_aware":  # where the session's prefix lives: its sticky MD
            return self.md[zlib.crc32(session.encode()) % len(self.md)]
        return self._pick("md", pol.pick_md, _SESSIONS)

    def _pick(self, role: str, how: str, load):
        """A worker of role's pool: round_robin by the pool's own turn (workers/roles/pools.py), else the least
        loaded, the first of equals (routing._least)."""
        pool = self.pools[role]
        turn = self._turns[role]
        self._turns[role] = turn + 1
        if how == "round_robin" or len(pool) == 1:
            return pool[turn % len(pool)]
        return min(pool, key=load)

    def md_hit(self, req: WorkloadRequest, md: DecodeWorker) -> int:
        """Tokens of req's prompt the MD's DRC holds (module docstring)."""
        held = self.rooms[md.name].held(req.session)
        held = self.base.get(req.session, 0) if held is None else held
        return min(req.cached_tokens, held) if req.after else req.cached_tokens

    def _inflight(self, req: WorkloadRequest, md: DecodeWorker, cached_now: int) -> tuple[Rec | None, int]:
        """The earlier turn whose MD session on md is still open (its WAN copy under way, or its RLD's output not
        yet recomputed) and promises more of req's prompt than md's DRC holds now, and how many tokens (whole
        blocks, at most all but the prompt's last token): workers/roles/decode.py's _inflight_prefix. P then ships
        only what lies beyond. (None, 0) where none does."""
        prev = self._md_sessions.get(req.after) if req.after else None
        if prev is None or prev.workers.get("md") != md.name:
            return None, 0
        block = self._block
        n = min(req.cached_tokens, prev.promised // block * block, (req.prompt_len - 1) // block * block)
        return (prev, n) if n > cached_now else (None, 0)

    def _rld(self) -> DecodeWorker:
        return self._pick("rld", self.cfg.policy.pick_rld, _SESSIONS)

    # ------------------------------------------------------------ one request

    def _serve(self, req: WorkloadRequest, rec: Rec):
        cfg = self.cfg
        md = self._pick_md(req.session) if cfg.mode in ("pd-cross", "pdd") else None
        md_cached = self.md_hit(req, md) if cfg.mode == "pdd" else 0
        decision = decide_route(
            cfg.mode, req.prompt_len, req.max_tokens, md_cached, cfg.route_kv_bytes_per_token, cfg.policy
        )
        rec.route = route = decision.route
        rec.drc_hit = md_cached / req.prompt_len if cfg.mode == "pdd" and decision.use_drc else None
        rec.md_cached = md_cached if decision.use_drc else 0
        if route == Route.COLOCATED:
            yield from self._colocated(req, rec)
        elif route in (Route.P_RLD, Route.P_RLD_SINGULAR, Route.P_RLD_ABLATION):
            yield from self._p_rld(req, rec, singular=route == Route.P_RLD_SINGULAR)
        elif route == Route.P_MD:
            yield from self._p_md(req, rec, md, fallback=decision.use_drc)
        else:
            yield from self._p_rld_md(req, rec, md)
        self._end(rec)

    def chain(self, req: WorkloadRequest) -> list[int]:
        """The names of req's prompt's whole blocks (kvroom.prompt_chain): a later turn's continue its previous
        turn's (whose own are dropped once its only next turn has them)."""
        chain = self._chains.get(req.request_id)
        if chain is not None:
            return chain
        if not req.after:
            chain = prompt_chain(req.head_tokens, self._block)
        else:  # the previous turn's, taken over where this is its only next turn (it needs it no more)
            if req.after not in self._chains and req.after in self._by_id:  # it failed before its prefill
                self.chain(self._by_id[req.after])
            only = len(self.next_turns.get(req.after, ())) == 1
            prev = (self._chains.pop if only else self._chains.get)(req.after, None)
            prev = [] if prev is None else prev if only else list(prev)  # []: its previous turn is not simulated
            chain = extend_chain(prev, req.prompt_len, self._block, self._salt[req.request_id])
        self._chains[req.request_id] = chain
        return chain

    def p_prefix_hit(self) -> dict[str, dict]:
        """Each P's prefix hit as the emulated per_worker reports it (PrefillWorker.prefix_hit)."""
        return {p.name: p.prefix_hit() for p in self.p}

    def _prefill(self, req: WorkloadRequest, rec: Rec, p: PrefillWorker | None = None):
        """P's prefill on top of what P's own prefix cache holds of the prompt (p: the P a fallback prefills on
        again, as the router's; else picked); P, or None when P refused it (the request failed)."""
        if p is None:
            how = self.cfg.policy.pick_p
            aware = how == "cache_aware" and len(self.p) > 1
            p = pick_prefill(self.p, self.chain(req), req.prompt_len) if aware else self._pick("p", how, _P_LOAD)
        rec.workers["p"] = p.name
        problem, self.p_cached[req.request_id], rec.p_started = yield from p.prefill_prompt(
            req.prompt_len, self.chain(req), self._blocks(req, 1), req.request_id
        )
        if problem:
            self._fail(rec, f"RESOURCE_EXHAUSTED: {p.name}: {problem}")
            return None
        rec.p_tokens = 1
        return p

    def _decode(self, rec: Rec, worker: DecodeWorker, role: str, session: Session):
        """A process (generator): session decodes on worker to its end (or its stop); its tokens join the record."""
        rec.live.append((worker, worker.join(session)))
        yield session.released
        if rec.error is None:  # else the failure's record took the tokens it had
            rec.live.remove((worker, session))
            rec.add(session, worker.name, role, self.back_s if role == "md" else 0.0)

    def _colocated(self, req: WorkloadRequest, rec: Rec):
        rld = self._rld()
        rec.workers["rld"] = rld.name
        if note := self._open(rec, "rld", rld, req):
            return self._fail(rec, streams_ended(req, 0, [note], "RESOURCE_EXHAUSTED"))
        ready = self._room_ready(rec, "rld")  # the local prefill waits for room until kv_wait_ms
        if not (ready if ready.__class__ is bool else (yield ready)):
            return self._fail(rec, streams_ended(req, 0, [f"rld ended: {KV_TIMEOUT}"]))
        yield rld.step_job(req.prompt_len - req.cached_tokens, req.cached_tokens)
        if rec.error:
            return
        rec.first(self.env.now, rld.name)
        yield from self._decode(rec, rld, "rld", Session(self.env, req.max_tokens - 1, req.prompt_len))
        self._free(rec, "rld")

    def _fast_path(self, p: PrefillWorker, rld: DecodeWorker, tokens: int, started: float):
        """A process's delays: P -> RLD inside cluster A, the LAN (PrefillWorker.lan_copy: streamed from P's first
        step of the prompt, started) and its one-way delay, then KV export from P's devices and the import into
        the RLD's (DecodeWorker.import_s; real compute: the export streamed during the prefill, one delay with
        the import)."""
        yield p.lan_copy(tokens * self.cfg.kv_bytes_per_token, started) - self.env.now + self.cfg.lan.one_way_s
        if isinstance(rld.model.roofline, MeasuredRoofline):
            yield kv_export_s(p.model.roofline, tokens) + kv_import_s(rld.model.roofline, tokens)
        else:
            yield kv_export_s(p.model.roofline, tokens)
            yield rld.import_s(tokens)

    def _p_rld(self, req: WorkloadRequest, rec: Rec, singular: bool, p: PrefillWorker | None = None):
        rld = self._rld()
        rec.workers["rld"] = rld.name
        if note := self._open(rec, "rld", rld, req):
            return self._fail(rec, streams_ended(req, 0, [note], "RESOURCE_EXHAUSTED"))
        p = yield from self._prefill(req, rec, p)
        if p is None or rec.error:
            return
        yield from self._fast_path(p, rld, req.prompt_len, rec.p_started)
        if rec.error:
            return
        ready = self._room_ready(rec, "rld")
        if not (ready if ready.__class__ is bool else (yield ready)) or self.env.now > rec.t0 + self.kv_wait_s:
            return self._fail(rec, streams_ended(req, 0, [f"rld ended: {KV_TIMEOUT}"]))
        rec.fast_kv = req.prompt_len * self.cfg.kv_bytes_per_token
        if singular:
            rec.kv_saved = (req.prompt_len - rec.md_cached) * self.cfg.kv_bytes_per_token
        rec.first(self.env.now, p.name)
        yield from self._decode(rec, rld, "rld", Session(self.env, req.max_tokens - 1, req.prompt_len))
        self._free(rec, "rld")

    def _peer(self, sender: str, receiver: str) -> tuple[str, str] | None:
        """Whose kept WAN connections a KV copy takes (kv.wan.persistent, as the emulated sender's pool)."""
        return (sender, receiver) if self.cfg.deployment.kv.wan.persistent else None

    def _wan_in(self, rec: Rec, p: PrefillWorker, md: DecodeWorker, tokens: int):
        """P's KV of `tokens` tokens into the MD: export, the line, room, import (a process's generator). True
        when the MD holds it; False when the line or the room took past decode.kv_wait_ms (its session's end:
        kv_timeout; the copy still crosses the line)."""
        deadline = rec.t0 + self.kv_wait_s
        if rec.drc_hit is not None and (wait := rec.t0 + self.back_s - self.env.now) >= 0:
            yield wait  # pdd: the router's open is on its way to the MD; P's copy starts at its answer (_answer)
        if rec.drc_hit is not None and (wait := rec.answer_at - self.env.now) > 0:
            yield wait
        yield kv_export_s(p.model.roofline, tokens)
        sent = self.line.transfer(
            tokens * self.cfg.kv_bytes_per_token, self.cfg.wan_connections, self._peer(p.name, md.name)
        )
        sent.callbacks.append(lambda _e: self.wan_ends.__setitem__(rec.req.request_id, self.env.now))
        self.deadlines.interrupt_unless(sent, deadline)
        try:
            yield sent
        except clock.Interrupt:  # past kv_wait_ms: the MD gives up now (the copy still crosses the line)
            return False
        if rec.after is not None and not (yield from self._after_closed(rec, md, deadline)):
            return False
        ready = self._room_ready(rec, "md")
        if not (ready if ready.__class__ is bool else (yield ready)):
            return False
        yield md.import_s(tokens)
        return True

    def _after_closed(self, rec: Rec, md: DecodeWorker, deadline: float):
        """An in-flight turn's prefix, once its own copy is in: wait (until deadline) for the earlier turn's MD
        session to end, then find its prefix in the DRC (decode.py's _open_after). True when it is; False: past the
        deadline (kv_timeout) or the earlier turn left less than promised (prefix_lost: its KV never came)."""
        closed = rec.after.md_closed
        if not closed.triggered:
            self.deadlines.interrupt_unless(closed, deadline)
            try:
                yield closed
            except clock.Interrupt:
                return False
        if (self.rooms[md.name].held(rec.req.session) or 0) < rec.md_cached:
            rec.fallbacks.append(PREFIX_LOST)
            if rec.final is not None:  # the RLD answered the client first: the record gains it, as its events would
                rec.final.fallbacks.append(PREFIX_LOST)
            return False
        return True

    def _p_md(self, req: WorkloadRequest, rec: Rec, md: DecodeWorker, fallback: bool):
        """P -> MD (pd-cross; pdd's direct route). An MD that refuses or misses kv_wait_ms: pdd falls back to
        P -> RLD (the router's p-rld-fallback), pd-cross fails (the naive baseline has no fallback)."""
        rec.workers["md"] = md.name
        if note := self._open(rec, "md", md, req):
            if fallback:
                return (yield from self._fall_back(req, rec, note))
            return self._fail(rec, streams_ended(req, 0, [note], "RESOURCE_EXHAUSTED"))
        if self._deferred(rec, "md"):
            rec.md_cached = 0
        p = yield from self._prefill(req, rec)
        if p is None or rec.error:
            return
        tokens = req.prompt_len - rec.md_cached
        rec.wan_kv = tokens * self.cfg.kv_bytes_per_token
        ok = yield from self._wan_in(rec, p, md, tokens)
        if rec.error:
            return
        if not ok:
            self._free(rec, "md")
            if fallback:
                return (yield from self._fall_back(req, rec, f"md ended: {KV_TIMEOUT}"))
            return self._fail(rec, streams_ended(req, 0, [f"md ended: {KV_TIMEOUT}"]))
        rec.first(self.env.now + self.back_s, p.name)  # P's token, sent by the MD
        yield from self._decode(rec, md, "md", Session(self.env, req.max_tokens - 1, req.prompt_len))
        if rec.error is None:
            self._free(rec, "md", self._keep(req))

    def _fall_back(self, req: WorkloadRequest, rec: Rec, reason: str):
        """pdd's P->MD failed before its first token: prefill again on the same P (its prefix cache holds the
        prompt's whole blocks if it prefilled it) and the RLD decodes the request (workers/roles/router.py's
        _fall_back)."""
        rec.route = Route.P_RLD_FALLBACK
        rec.fallbacks.append(fallback_cause({"event": "route_fallback", "reason": reason}))
        rec.md_cached, rec.drc_hit = 0, None
        p = next((w for w in self.p if w.name == rec.workers.get("p")), None)
        yield from self._p_rld(req, rec, singular=False, p=p)

    def _p_rld_md(self, req: WorkloadRequest, rec: Rec, md: DecodeWorker):
        env, cfg = self.env, self.cfg
        rld = self._rld()
        rec.workers.update(rld=rld.name, md=md.name)
        if note := self._open(rec, "rld", rld, req):
            return self._fail(rec, streams_ended(req, 0, [note], "RESOURCE_EXHAUSTED"))
        md_open = self._open(rec, "md", md, req) is None  # an MD that refuses: the RLD decodes alone
        after, inflight = self._inflight(req, md, rec.md_cached) if md_open else (None, 0)
        if after is not None:  # an earlier turn's copy brings the prefix: P ships only what lies beyond
            rec.after, rec.inflight_tokens, rec.md_cached = after, inflight - rec.md_cached, inflight
        elif not md_open or self._deferred(rec, "md"):
            rec.md_cached = 0
        if md_open:
            rec.md_closed, rec.promised = env.event(), req.prompt_len
            self._md_sessions[req.request_id] = rec
        p = yield from self._prefill(req, rec)
        if p is None or rec.error:
            return
        tokens = req.prompt_len - rec.md_cached
        wan = env.process(self._wan_in(rec, p, md, tokens)) if md_open else None
        rec.wan_kv = tokens * cfg.kv_bytes_per_token if md_open else 0
        yield from self._fast_path(p, rld, req.prompt_len, rec.p_started)
        if rec.error:
            return
        ready = self._room_ready(rec, "rld")
        if not (ready if ready.__class__ is bool else (yield ready)) or env.now > rec.t0 + self.kv_wait_s:
            return self._fail(rec, streams_ended(req, 0, [f"rld ended: {KV_TIMEOUT}"]))
        rec.fast_kv = req.prompt_len * cfg.kv_bytes_per_token
        rec.first(env.now, p.name)
        s = Session(env, req.max_tokens - 1, req.prompt_len)
        rec.live.append((rld, rld.join(s)))
        if wan is not None:
            yield wan | s.released
            if wan.triggered and not wan.value:
                self._free(rec, "md")  # kv_timeout: the MD gives up, the RLD decodes on
            elif wan.triggered and not s.released.triggered:
                rld.stop(s)  # the MD holds the prompt: hand over after the RLD's current step
        yield s.released
        if rec.error:
            return
        rec.live.remove((rld, s))
        rec.add(s, rld.name, "rld")
        self._free(rec, "rld")
        left = req.max_tokens - 1 - s.made
        if left > 0:
            return (yield from self._handoff(req, rec, md, s.made, left, rld.name))
        rec.fallbacks.append(MD_NEVER_READY)  # the RLD finished alone; the MD, if its KV lands in time, absorbs it
        rec.promised = self._keep(req)[1]  # the RLD's output goes to the MD (RelayOutput): it would keep it all
        if wan is not None and wan.triggered:
            self._absorbed(rec, req, wan.value)
        elif wan is not None:
            wan.callbacks.append(lambda _e: self._absorbed(rec, req, wan.value))

    def _absorbed(self, rec: Rec, req: WorkloadRequest, md_holds: bool) -> None:
        """The MD of a request the RLD finished: it recomputes the RLD's output and keeps it (relay_absorbed)
        once the prompt KV landed within kv_wait_ms; else its session ended (kv_timeout) keeping nothing."""
        if md_holds and rec.error is None:
            self._free(rec, "md", self._keep(req))
            rec.relay_absorbed = True
            if rec.final is not None:
                rec.final.relay_absorbed = True
        else:
            self._free(rec, "md")

    def _handoff(self, req: WorkloadRequest, rec: Rec, md: DecodeWorker, made: int, left: int, rld: str):
        """The RLD's tokens (P's first + its `made`) to the MD: their IDs and one extend step over all but the
        last (mode kv: their KV and an import), then the MD decodes the rest from the last."""
        env, cfg = self.env, self.cfg
        t, tokens = env.now, made + 1
        by_kv = cfg.handoff == "kv"
        payload = tokens * (cfg.kv_bytes_per_token if by_kv else HANDOFF_ID_BYTES)
        yield self.line.transfer(payload, *((cfg.wan_connections, self._peer(rld, md.name)) if by_kv else (1, None)))
        t_ready = env.now
        if by_kv:
            yield md.import_s(made)
        else:
            yield md.step_job(made, req.prompt_len, 1)
        if rec.error:
            return
        extend_ms = (env.now - t_ready) * 1e3
        s = Session(env, left, req.prompt_len + made)
        yield from self._decode(rec, md, "md", s)
        rec.handoff = {
            "mode": cfg.handoff if cfg.handoff in ("oneshot", "kv") else f"{cfg.handoff} (as oneshot)",
            "tokens": tokens,
            "payload_bytes": payload,
            "ready_ms": (t_ready - t) * 1e3,
            "duration_ms": ((s.times[0] if s.times else env.now) - t) * 1e3,
            "extend_ms": None if by_kv else extend_ms,
        }
        rec.wan_handoff = payload
        if rec.error is None:
            self._free(rec, "md", self._keep(req))
