"""The P role: prefill a prompt and stream its KV on one or two paths at once.

Responsible for: the `Prefill` gRPC service; asking a decode worker's DRC
(`Decode.PrefixLength`) where its WAN copy must start, while the prefill
already runs (layers wait until the answer comes); queueing a prompt while
the cache is full for now, first come first served, bounded in length and
time (roomqueue.py; prefill.max_waiting, room_wait_ms); computing the prompt
(on top of P's own prefix cache) while every layer's KV leaves on each target
path as soon as it is written (`layerhook`); the first token; cancelling a
request's transfers still in flight (`Cancel`).
Not responsible for: decoding, routing, or the wire format (kvwire).

Prefill returns once the first token is sampled; the transfers finish in the
background and are recorded in the event log (kv_send_start/progress/end).
Every reply carries what P's WAN KV connections have measured of the line
so far (TCP_INFO: delivery rate, RTT, retransmissions; wanestimate.py), for
the router's `policy.wan_estimate: measured`; where the MDs sit behind named
lines (`md[i].line`), one estimate per line, each fed only by the transfers to
the MDs behind it (`PrefillReply.lines`, for `policy.pick_md: line_measured`).
"""

from __future__ import annotations

import logging
import threading
import time

import grpc
import numpy as np

from workers.chunked import ChunkScheduler
from workers.engine import Engine, GenerationRequest, LayerWrite
from workers.errors import CapacityExceeded, EngineError
from workers.fairlock import FairLock
from workers.kvwire import CONNECTIONS, KVSender, SendResult, meta_for
from workers.proto import pdd_pb2, pdd_pb2_grpc
from workers.roles.config import DeploymentConfig, PathConfig, WorkerConfig
from workers.roles.events import EventLog
from workers.roles.layerhook import layer_tap, read_layer
from workers.roles.roomqueue import RoomQueue
from workers.roles.server import (
    Channels,
    RoleServer,
    StatsSource,
    build_engine,
    engine_stats,
    event_log,
    role_main,
    status_of,
)
from workers.roles.wanestimate import WanEstimate, WanEstimator

log = logging.getLogger(__name__)

DRC_QUERY_TIMEOUT_S = 5.0
CANCEL_MEMORY_S = 60.0  # a cancelled request is remembered this long (a DRC answer later than that: no copy)


class _Target:
    """One KV target of a prefill. start: first position to send, given (start_tokens) or None until the
    target's DRC answers; layers computed before that wait in `stash` (the whole prompt's rows)."""

    def __init__(self, target, start: int | None, request_id: str, prompt: tuple[int, ...]):
        self.target, self.start = target, start
        self.request_id, self.prompt = request_id, prompt
        self.failed = ""
        self.answered = threading.Event()
        if start is not None:
            self.answered.set()
        self.sender: KVSender | None = None
        self.stash: list[tuple[int, int, np.ndarray]] = []  # (layer, first position, rows) until start is known


def _put(plan: _Target, layer: int, start: int, rows: np.ndarray) -> None:
    """The part of rows (positions start..) at or past the target's start, to its sender."""
    lo = max(start, plan.start)
    if lo < start + rows.shape[1]:
        plan.sender.put_rows(layer, lo - plan.start, rows[:, lo - start :])


def _wire(e: WanEstimate) -> pdd_pb2.WanEstimate:
    return pdd_pb2.WanEstimate(
        rate_mbit=e.rate_mbit, rtt_ms=e.rtt_ms, min_rtt_ms=e.min_rtt_ms, retrans_pct=e.retrans_pct, samples=e.samples
    )


class PrefillServicer(pdd_pb2_grpc.PrefillServicer):
    """engine: P's engine (with its prefix cache); paths: PathConfig by path name; events: P's log"""

    def __init__(self, cfg: DeploymentConfig, engine: Engine, events: EventLog):
        self.cfg = cfg
        self.engine = engine
        self.events = events
        self.lock = FairLock()  # the engine is single-threaded; fair, so a step loop cannot starve other users
        budget = cfg.prefill.step_budget_tokens
        # chunks of every prompt in flight share engine steps (None: whole prompts, one at a time)
        self.sched = ChunkScheduler(engine, budget, self.lock) if budget else None
        self._steps_logged = 0  # scheduler steps already in the event log
        self._steps_lock = threading.Lock()
        self._senders: dict[str, list[KVSender]] = {}
        self._cancelled: dict[str, float] = {}  # request -> when it was cancelled (CANCEL_MEMORY_S)
        self._senders_lock = threading.Lock()
        self.channels = Channels(cfg)
        # one estimate per line ("": the one WAN), fed by the WAN transfers to the MDs behind it
        self.lines = {"": WanEstimator(), **{md.line: WanEstimator() for md in cfg.md if md.line}}
        self._line_of = {md.kv_address: md.line for md in cfg.md}  # an MD's KV address -> its line
        # prompts that find the cache full for now wait here, in order, for earlier ones' blocks
        self.room = RoomQueue(cfg.prefill.max_waiting, cfg.prefill.room_wait_ms / 1000, "prefill")

    # ------------------------------------------------------------ RPCs

    def Prefill(self, request, context):
        rid, prompt = request.request_id, tuple(request.prompt_tokens)
        arrival = self.events.emit("prefill_arrival", rid, prompt_tokens=len(prompt), targets=len(request.targets))
        if not rid:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "request_id is empty")
        gen = GenerationRequest(rid, prompt, 1, use_prefix_cache=request.use_prefix_cache)
        try:
            self.engine.validate(gen)
        except EngineError as err:
            context.abort(status_of(err), str(err))
        for t in request.targets:
            if t.path not in ("fast", "wan"):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"target path {t.path!r}; allowed: fast, wan")
            if not t.drc_address and not 0 <= t.start_tokens < len(prompt):
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"target {t.path}: start {t.start_tokens} outside [0, {len(prompt)})",
                )
        plans = [_Target(t, None if t.drc_address else t.start_tokens, rid, prompt) for t in request.targets]
        for plan in plans:
            if plan.start is None:
                threading.Thread(
                    target=self._ask_drc, args=(rid, plan, len(prompt)), name=f"drc-{rid}", daemon=True
                ).start()
        first, t_first, opened = self._prefill(gen, plans, context)
        sent = [p for p in plans if p.sender is not None]
        if plans and not sent:
            context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"request {rid!r}: no KV target is reachable ({'; '.join(p.failed for p in plans if p.failed)})",
            )
        self.events.emit(
            "prefill_done",
            rid,
            duration_ns=t_first - arrival,
            cached_tokens=opened[0],
            computed_tokens=opened[1],
            first_token=first,
        )
        return pdd_pb2.PrefillReply(
            first_token=first,
            t_ns=t_first,
            cached_tokens=opened[0],
            computed_tokens=opened[1],
            sent_from_tokens=[p.start for p in sent],
            wan=_wire(self.lines[""].estimate()),
            lines={name: _wire(e) for name, est in self.lines.items() if name and (e := est.estimate()).samples},
        )

    def Cancel(self, request, context):
        now = time.monotonic()
        with self._senders_lock:
            senders = list(self._senders.get(request.request_id, []))
            self._cancelled[request.request_id] = now  # a sender still waiting for its DRC must not start
            for rid in [r for r, t in self._cancelled.items() if now - t > CANCEL_MEMORY_S]:
                del self._cancelled[rid]
        live = [s for s in senders if not s.done]
        for s in live:
            s.cancel("request cancelled")
        return pdd_pb2.CancelReply(cancelled=len(live))

    # ------------------------------------------------------------ steps

    def _ask_drc(self, rid: str, plan: _Target, prompt_len: int) -> None:
        """Where the target's copy must start: its decode worker's DRC hit. Asked while the prefill runs
        (the WAN round trip overlaps the compute); a worker that cannot answer drops the target."""
        target = plan.target
        stub = pdd_pb2_grpc.DecodeStub(self.channels.get(target.drc_address))
        try:
            start = stub.PrefixLength(pdd_pb2.PrefixQuery(request_id=rid), timeout=DRC_QUERY_TIMEOUT_S).cached_tokens
            if not 0 <= start < prompt_len:
                raise ValueError(f"start {start} outside [0, {prompt_len})")
        except (grpc.RpcError, ValueError) as err:
            reason = f"{err.code().name}: {err.details()}" if isinstance(err, grpc.RpcError) else str(err)
            plan.failed = f"{target.path}: {reason}"
            self.events.emit("drc_query_failed", rid, drc=target.drc_address, path=target.path, reason=reason)
        else:
            plan.start = start
            self.events.emit("drc_query", rid, drc=target.drc_address, cached_tokens=start)
        finally:
            plan.answered.set()

    def _prefill(self, gen: GenerationRequest, plans: list[_Target], context) -> tuple[int, int, tuple[int, int]]:
        rid = gen.request_id
        opened = self._open(gen, context)
        self.events.emit("prefill_start", rid, cached_tokens=opened.cached_tokens)
        try:
            first, computed = self._compute(gen, plans, opened.cached_tokens)
            t_first = time.monotonic_ns()
            with self.lock:
                self.engine.finish(rid)
        except BaseException:
            for plan in plans:
                if plan.sender is not None:
                    plan.sender.cancel("prefill failed")
            if self.sched is not None:
                self.sched.cancel(rid)
            with self.lock:
                self.engine.abort(rid)
            raise
        finally:
            self.room.freed()  # its blocks are free (or cached, evictable): a prompt waiting for room tries
            self._log_steps()
        ready = [p for p in plans if p.sender is not None]
        for plan in ready:
            plan.sender.finish(first)
        late = [p for p in plans if p.sender is None and not p.failed]  # a DRC still to answer: layers stashed
        for plan in late:
            if ready:  # the first token has its way to the client: a late WAN copy must not hold it back
                threading.Thread(
                    target=self._finish_late, args=(gen, plan, first), daemon=True, name=f"late-{rid}"
                ).start()
            else:  # P->MD: the first token travels with this copy
                self._finish_late(gen, plan, first)
        return first, t_first, (opened.cached_tokens, computed)

    def _open(self, gen: GenerationRequest, context):
        """Open gen in the engine, reserving its blocks. A cache full for now queues it (FIFO, bounded in length
        and time: prefill.max_waiting, room_wait_ms) until earlier prompts free blocks; past the bound, or
        never fitting, it is refused (RESOURCE_EXHAUSTED)."""
        rid = gen.request_id

        def try_open():
            with self.lock:
                return self.engine.open(gen)

        def on_queue(ahead: int) -> None:
            self.events.emit("kv_room_wait", rid, prompt_tokens=len(gen.prompt_tokens), ahead=ahead)

        def too_big() -> None:  # the engine's own test (CapacityExceeded.never_fits), without opening
            kv = self.engine.kv
            needed = kv.blocks_for(len(gen.prompt_tokens) + gen.max_tokens)
            if needed > kv.num_blocks:
                with self.lock:
                    available = self.engine.available_blocks()
                raise CapacityExceeded(rid, needed, available, kv.num_blocks, kv.block_size)

        try:
            opened, wait_ns = self.room.admit(rid, try_open, lambda: not context.is_active(), on_queue, too_big)
        except EngineError as err:
            context.abort(status_of(err), str(err))
        if wait_ns:
            self.events.emit("kv_room_ready", rid, wait_ns=wait_ns)
        return opened

    def _compute(self, gen: GenerationRequest, plans: list[_Target], cached: int) -> tuple[int, int]:
        """The prompt's KV beyond the cached prefix, each layer shipped as it is written; (first token, tokens
        computed). Chunked: this prompt's chunks share engine steps with every other prompt in flight (the
        first chunk of a layer also carries the cached prefix's rows, which a target may lack); whole: one
        pass under the engine lock."""
        rid, n = gen.request_id, len(gen.prompt_tokens)
        if self.sched is None:
            with self.lock:
                with layer_tap(
                    self.engine.kv, lambda layer, slots: self._ship(plans, layer, 0, self._rows(layer, slots[:n]))
                ):
                    result = self.engine.prefill(rid)
            return result.first_token, result.computed_tokens

        def on_layer(write: LayerWrite) -> None:
            end = write.start + write.slots.numel()
            slots = self.engine.slots(rid, 0, end) if write.start == cached else write.slots
            self._ship(plans, write.layer, 0 if write.start == cached else write.start, self._rows(write.layer, slots))

        result = self.sched.prefill(rid, on_layer)
        return result.next_token, result.computed_tokens

    def _rows(self, layer: int, slots) -> np.ndarray:
        return read_layer(self.engine.kv, layer, slots)

    def _log_steps(self) -> None:
        """The scheduler's steps since the last call, as prefill_step events (which prompts' chunks shared each
        step; lone_tail: a prompt's last, short chunk ran alone — the bathtub's valleys, PDD.md)."""
        if self.sched is None:
            return
        with self._steps_lock:
            new = self.sched.steps - self._steps_logged
            records = list(self.sched.records)[-new:] if new > 0 else []
            self._steps_logged = self.sched.steps
            for r in records:
                self.events.emit(
                    "prefill_step",
                    None,
                    chunks=[[c.request_id, c.start, c.n_tokens, c.last] for c in r.chunks],
                    tokens=r.tokens,
                    budget_tokens=r.budget_tokens,
                    lone_tail=r.lone_tail,
                    t_start_ns=int(r.t_start * 1e9),
                    duration_ns=int(r.duration_s * 1e9),
                )

    def _finish_late(self, gen: GenerationRequest, plan: _Target, first_token: int) -> None:
        """A target whose DRC had not answered by the end of the prefill: wait for the answer, then send the
        stashed layers. On a congested WAN the answer queues behind KV (seconds): with a fast target, P's reply
        (and so the first token) does not wait for it."""
        rid = gen.request_id
        if not plan.answered.wait(DRC_QUERY_TIMEOUT_S + 1):
            plan.failed = f"{plan.target.path}: no DRC answer"
        if plan.failed or self._was_cancelled(rid):
            plan.stash = []
            return
        self._open_sender(plan)
        plan.sender.finish(first_token)

    def _was_cancelled(self, rid: str) -> bool:
        with self._senders_lock:
            return rid in self._cancelled

    def _ship(self, plans: list[_Target], layer: int, start: int, rows: np.ndarray) -> None:
        """Rows of positions start.. of one layer are in the cache: each target gets those at or past its own
        start (a target whose DRC has not answered yet: stashed)."""
        for plan in plans:
            if plan.sender is None and plan.answered.is_set() and not plan.failed:
                self._open_sender(plan)
            if plan.sender is not None:
                _put(plan, layer, start, rows)
            elif not plan.failed:
                plan.stash.append((layer, start, rows))

    def _open_sender(self, plan: _Target) -> None:
        """The target's start is known: its sender starts with the rows computed so far."""
        plan.sender = self._sender(plan.request_id, plan.target, plan.start, plan.prompt)
        for layer, start, rows in plan.stash:
            _put(plan, layer, start, rows)
        plan.stash = []

    def _sender(self, rid: str, target, start: int, prompt: tuple[int, ...]) -> KVSender:
        path_cfg: PathConfig = getattr(self.cfg.kv, target.path)
        meta = meta_for(self.engine, rid, "prompt", start, len(prompt), prompt[start:])
        wan = self.lines[self._line_of.get(target.kv_address, "")] if target.path == "wan" else None
        sender = KVSender(
            target.kv_address,
            meta,
            path_cfg.send_settings(),
            target.path,
            self.events,
            on_done=lambda result, rid=rid: self._forget(rid, result, wan),
            observe=wan.observe if wan else None,
        )
        with self._senders_lock:
            self._senders.setdefault(rid, []).append(sender)
        return sender.start()

    def _forget(self, rid: str, result: SendResult, wan: WanEstimator | None) -> None:
        if wan is not None and result.ok:
            wan.observe_transfer(result.segs_out, result.retrans_segs)
        with self._senders_lock:
            live = [s for s in self._senders.get(rid, []) if not s.done]
            if live:
                self._senders[rid] = live
            else:
                self._senders.pop(rid, None)

    @property
    def active_transfers(self) -> int:
        with self._senders_lock:
            return sum(1 for ss in self._senders.values() for s in ss if not s.done)

    def close(self) -> None:
        with self._senders_lock:
            senders = [s for ss in self._senders.values() for s in ss]
        for s in senders:
            s.cancel("worker stopping")
        for s in senders:
            s.wait(5)
        self.channels.close()


def build(cfg: DeploymentConfig, worker: WorkerConfig) -> RoleServer:
    """P's server, ready to start."""
    engine = build_engine(cfg, worker, prefix_cache=True)
    events = event_log(cfg, worker, "p")
    servicer = PrefillServicer(cfg, engine, events)
    open_requests, blocks = engine_stats(engine, servicer.lock)
    stats = StatsSource(open_requests, blocks, lambda: servicer.active_transfers)

    def on_stop() -> None:
        servicer.close()
        CONNECTIONS.close()
        events.close()

    return RoleServer(
        cfg, worker, "p", lambda s: pdd_pb2_grpc.add_PrefillServicer_to_server(servicer, s), stats, on_stop, engine
    )


def main(argv: list[str] | None = None) -> int:
    return role_main("p", build, "p", argv)


if __name__ == "__main__":
    raise SystemExit(main())
