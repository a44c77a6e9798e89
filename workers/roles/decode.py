"""The RLD and MD roles: decode sessions, eager output, handoff by token IDs (or KV), the DRC.

Responsible for: the `Decode` gRPC service of both decode roles. A session
opens a request (the MD matches its DRC, the decode-side radix cache, and
pins the hit), waits for the prompt KV on the data plane (or prefills it
locally: colocated), and streams tokens. The RLD decodes at once (eager
tokens) and, when the MD says it holds the prompt KV (`KVReady`), hands its
tokens over: `oneshot` (all at once, then it stops), `chunked` (chunks of
`chunk_tokens` while it keeps decoding, the last one when few remain),
`auto` (oneshot when the RLD is loaded, chunked otherwise) or `kv` (ships the
generated tokens' KV on the data plane instead of IDs). The MD recomputes
handed-over IDs and continues. A local prefill and the MD's recompute run in
chunks mixed into the sessions' decode steps (steps.py: decode.step_budget_tokens;
0: whole, between them). Fallbacks: a handoff that
fails leaves the RLD decoding to the end; an MD whose prompt KV misses the
hard deadline ends its session (`kv_timeout`); an MD whose relay vanished
(unreachable at KVReady, or its process gone while the MD waits for the
handoff: probed every RELAY_PROBE_S) decodes alone.
Not responsible for: prefill for remote workers (prefill.py), routing and the
client's ordered stream (router.py), the wire (workers/kvwire/).

Token indices: index 0 is the first generated token (sampled by P, or here
when colocated). The MD's "pending" token is its last token without KV; a
handoff starting at index s must carry the MD's pending token first (the MD
checks it: a mismatch is a greedy divergence and refuses the handoff).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

import grpc

from workers.engine import Engine, GenerationRequest
from workers.errors import CapacityExceeded, EngineError
from workers.fairlock import FairLock
from workers.kvwire import CONNECTIONS, Inbox, KVReceiver, KVSender
from workers.proto import pdd_pb2, pdd_pb2_grpc
from workers.roles.config import DeploymentConfig, WorkerConfig
from workers.roles.events import EventLog
from workers.roles.handoff import MDHandoff, RelayHandoff
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
from workers.roles.session import HANDOFF_NAMES, H, Session, end_msg, token_msg
from workers.roles.steps import DecodeSteps

log = logging.getLogger(__name__)
POLL_S = 0.05  # how often a session waiting to open (for room, or for an earlier copy) looks again

SESSION_WAIT_S = 4.0  # PrefixLength for a request whose session is not open yet waits this long


def _generation(request) -> GenerationRequest:
    return GenerationRequest(
        request.request_id,
        tuple(request.prompt_tokens),
        request.max_tokens,
        use_prefix_cache=request.use_prefix_cache,
    )


def _wait(session: Session, deadline_ns: int, ready: Callable[[], bool]) -> str:
    """Call ready() (it pauses about POLL_S when not ready) until it says so: '', or cancelled once the session
    is, or kv_timeout past deadline_ns."""
    while not ready():
        if session.cancelled:
            return "cancelled"
        if time.monotonic_ns() >= deadline_ns:
            return "kv_timeout"
    return ""


def shared_blocks(a: tuple[int, ...], b: tuple[int, ...], block_size: int, cap: int) -> int:
    """Tokens of the longest common prefix of a and b in whole blocks, at most cap (pure)."""
    n, limit = 0, min(len(a), len(b), cap)
    while n + block_size <= limit and a[n : n + block_size] == b[n : n + block_size]:
        n += block_size
    return n


class DecodeServicer(MDHandoff, pdd_pb2_grpc.DecodeServicer):
    """cfg: deployment; me: this worker; role: rld | md; engine, inbox, events: this worker's"""

    def __init__(
        self, cfg: DeploymentConfig, me: WorkerConfig, role: str, engine: Engine, inbox: Inbox, events: EventLog
    ):
        self.cfg, self.me, self.role = cfg, me, role
        self.engine, self.inbox, self.events = engine, inbox, events
        self.lock = FairLock()  # the engine is single-threaded; fair, so a step loop cannot starve other users
        self.steps = DecodeSteps(engine, self.lock, cfg.decode.step_budget_tokens, cfg.decode.max_batch, events)
        self._sessions: dict[str, Session] = {}
        self._sessions_lock = threading.Lock()
        self.channels = Channels(cfg)
        self._senders: set[KVSender] = set()

    # ------------------------------------------------------------ Decode

    def Decode(self, request, context):
        session = self._open(request, context)
        context.add_callback(session.cancel)
        try:
            yield pdd_pb2.DecodeEvent(
                accepted=pdd_pb2.Accepted(worker=self.me.name, cached_tokens=session.cached_tokens)
            )
            yield from self._run(session, context)
        finally:
            self._close(session)

    def _open(self, request, context) -> Session:
        rid = request.request_id
        self.events.emit(
            "decode_arrival",
            rid,
            prompt_tokens=len(request.prompt_tokens),
            max_tokens=request.max_tokens,
            handoff=HANDOFF_NAMES.get(request.handoff, "?"),
        )
        if not rid:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "request_id is empty")
        if request.handoff != H.HANDOFF_NONE and not request.handoff_grpc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a handoff mode needs handoff_grpc (the MD's address)")
        gen = _generation(request)
        with self._sessions_lock:
            if len(self._sessions) >= self.cfg.decode.max_sessions:
                context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"{self.me.name} has {len(self._sessions)} sessions (max_sessions)",
                )
            if rid in self._sessions:
                context.abort(grpc.StatusCode.ALREADY_EXISTS, f"request {rid!r} already has a session here")
            session = Session(request, 0)
            with self.lock:
                try:
                    cached_now = self.engine.cached_prefix(request.prompt_tokens) if request.use_prefix_cache else 0
                    after, inflight = self._inflight_prefix(request, cached_now)
                    if after is None:  # open now (validated), pinning the DRC hit
                        session.cached_tokens = self._open_or_defer(session, gen)
                        if request.kv_source == H.KV_SOURCE_LOCAL and not session.waits_for_room:
                            self.steps.submit(rid)  # still under the lock: the next step carries its first chunk
                    else:  # opened once `after` has left its sequence here; holds no KV blocks until then
                        self.engine.validate(gen)
                        session.after, session.cached_tokens = after, inflight
                except EngineError as err:
                    context.abort(status_of(err), str(err))
            self._sessions[rid] = session
        if session.waits_for_room:
            self.events.emit("kv_room_wait", rid, prompt_tokens=len(request.prompt_tokens))
        if session.after is not None:
            self.events.emit(
                "drc_inflight",
                rid,
                after=session.after.request_id,
                cached_tokens=cached_now,
                inflight_tokens=session.cached_tokens,
            )
        self.channels.warm(request.relay_grpc, request.handoff_grpc)  # KVReady / handoff: ready when needed
        for kind in ("prompt", "handoff"):
            self.inbox.expect(rid, kind)
        self.events.emit(
            "decode_open",
            rid,
            cached_tokens=session.cached_tokens,
            source="local" if request.kv_source == H.KV_SOURCE_LOCAL else "peer",
        )
        return session

    def _open_or_defer(self, session: Session, gen: GenerationRequest) -> int:
        """Open gen in the engine (the caller holds the lock): its cached tokens. A cache full for now (its
        blocks held by other sessions) defers the open to _open_when_room, like a queue in front of the
        cache: the session reports no cached prefix, so the whole prompt's KV comes and waits in host
        memory, and nothing is refused that a session's end would let in."""
        try:
            return self.engine.open(gen).cached_tokens
        except CapacityExceeded as err:
            if err.never_fits:
                raise
            session.waits_for_room = True
            self.engine.validate(gen)
            return 0

    def _open_when_room(self, session: Session, deadline_ns: int) -> str:
        """Open a deferred session once the cache has room for it: '' when open, else kv_timeout or
        cancelled."""
        t0, gen = time.monotonic_ns(), _generation(session.request)

        def opened() -> bool:
            with self.lock:
                try:
                    self.engine.open(gen)
                    return True
                except CapacityExceeded:  # one that never fits was refused at _open
                    pass
            time.sleep(POLL_S)
            return False

        if problem := _wait(session, deadline_ns, opened):
            return problem
        session.waits_for_room = False
        self.events.emit("kv_room_ready", session.request_id, wait_ns=time.monotonic_ns() - t0)
        return ""

    def _close(self, session: Session) -> None:
        rid = session.request_id
        self.inbox.forget(rid)
        self.steps.cancel(rid)  # a Handoff's extend still waiting for its chunks fails, before the abort
        try:
            with self.lock:
                if rid in self.engine.open_requests:
                    result = self.engine.finish(rid) if session.kv_ready else self.engine.abort(rid)
                    generated = len(result.output_tokens)
                else:
                    generated = 0
        finally:
            with self._sessions_lock:
                self._sessions.pop(rid, None)
            session.closed.set()  # sessions opened on top of this one's copy may open now
        self.events.emit("decode_close", rid, generated_tokens=generated, cancelled=session.cancelled)

    def _run(self, session: Session, context):
        req = session.request
        if req.kv_source == H.KV_SOURCE_LOCAL:
            yield from self._prefill_locally(session)
        elif problem := self._import_prompt(session):
            if problem == "kv_timeout":
                self.events.emit("kv_timeout", session.request_id, wait_ms=self.cfg.decode.kv_wait_ms)
            yield end_msg(problem)
            return
        else:
            # P's first token reaches the client through the decode side, once that side holds
            # the KV (as in PD serving): a WAN transfer is then part of the client's TTFT.
            session.emit_from = 0
            if not (self.role == "md" and req.relay_grpc):  # (an MD behind a relay streams from the handoff on)
                # sent now, known since the import: read back from the engine it would wait for the lock, held
                # by the decode step the import's end let begin
                self.events.emit("first_token", session.request_id, index=0)
                yield token_msg(0, session.p_token, req.prefill_worker or "p")
                session.emit_from, session.first_sent = 1, True
        if self.role == "md" and req.relay_grpc:
            if not self._await_handoff(session):
                yield end_msg(self._end_without_handoff(session))
                return
        yield from self._decode_loop(session)

    def _prefill_locally(self, session: Session):
        rid = session.request_id
        if session.waits_for_room:
            deadline = time.monotonic_ns() + int(self.cfg.decode.kv_wait_ms * 1e6)
            if problem := self._open_when_room(session, deadline):
                yield end_msg(problem)
                return
        self.events.emit("prefill_start", rid, cached_tokens=session.cached_tokens)
        first, _ = self.steps.prefill(rid)  # in chunks with the other sessions' decode steps (or whole)
        session.kv_ready = True
        self.events.emit("first_token", rid, index=0)
        session.emit_from, session.first_sent = 1, True
        yield token_msg(0, first, self.me.name)

    def _import_prompt(self, session: Session) -> str:
        """Wait for the prompt KV (hard deadline), import it and P's first token. '' when done, or the
        session's end reason: kv_timeout, cancelled, prefix_lost (see _open_after)."""
        rid = session.request_id
        t0 = time.monotonic_ns()
        wait_s = self.cfg.decode.kv_wait_ms / 1000
        got = self.inbox.wait(rid, "prompt", wait_s, stop=lambda: session.cancelled)
        if got is None:
            return "cancelled" if session.cancelled else "kv_timeout"
        try:
            if session.after is not None and (problem := self._open_after(session, t0 + int(wait_s * 1e9))):
                return problem
            if session.waits_for_room and (problem := self._open_when_room(session, t0 + int(wait_s * 1e9))):
                return problem
            with self.lock:
                self.engine.import_kv(rid, got.blob)
                self.engine.append_tokens(rid, [got.next_token])
        finally:
            got.release()
        session.kv_ready, session.p_token = True, got.next_token
        self.events.emit(
            "kv_imported",
            rid,
            start=got.meta.start,
            end=got.meta.end,
            kv_bytes=got.meta.kv_bytes,
            wait_ns=time.monotonic_ns() - t0,
        )
        return ""

    # ------------------------------------------------------------ the in-flight DRC (MD)

    def _inflight_prefix(self, request, cached_now: int) -> tuple[Session | None, int]:
        """MD, a session with a relay: the open session whose WAN copy brings more of this prompt than the
        DRC holds now (a turn's predecessor whose copy is still under way), and how many tokens of it.
        P then ships only what lies beyond, instead of the whole prompt again: on a slow line every copy
        would otherwise be whole (the DRC learns a sequence only once its copy lands), the copies crowd the
        line and none lands in time. A P->MD session (no relay) never waits on another's copy: its first
        token would. (None, 0) when no open session promises more than cached_now."""
        if self.role != "md" or not request.relay_grpc or not request.use_prefix_cache:
            return None, 0
        prompt = tuple(request.prompt_tokens)
        cap = len(prompt) - 1
        best, best_n = None, cached_now
        for other in self._sessions.values():  # the caller holds _sessions_lock
            if other.cancelled or not other.request.use_prefix_cache:
                continue
            n = shared_blocks(other.promised_tokens(), prompt, self.engine.block_size, cap)
            if n > best_n:
                best, best_n = other, n
        return (best, best_n) if best is not None else (None, 0)

    def _open_after(self, session: Session, deadline_ns: int) -> str:
        """Open a session whose prefix comes in `session.after`'s WAN copy, once that session has left its
        sequence in the DRC. '' when open with at least that prefix; else kv_timeout, cancelled or
        prefix_lost (the earlier session ended without caching it, or the blocks are gone)."""
        rid, after = session.request_id, session.after
        t0 = time.monotonic_ns()
        if problem := _wait(session, deadline_ns, lambda: after.closed.wait(POLL_S)):
            return problem
        with self.lock:
            try:
                opened = self.engine.open(_generation(session.request))
            except EngineError as err:
                reason = str(err)
            else:
                if opened.cached_tokens >= session.cached_tokens:
                    reason = ""
                else:
                    self.engine.abort(rid)
                    reason = (
                        f"{after.request_id} left {opened.cached_tokens} of the {session.cached_tokens} "
                        "prefix tokens in the DRC"
                    )
        if reason:
            self.events.emit("prefix_lost", rid, after=after.request_id, reason=reason)
            return "prefix_lost"
        self.events.emit(
            "drc_inflight_ready",
            rid,
            after=after.request_id,
            cached_tokens=opened.cached_tokens,
            wait_ns=time.monotonic_ns() - t0,
        )
        return ""

    # ------------------------------------------------------------ decode loop (both roles)

    def _decode_loop(self, session: Session):
        rid = session.request_id
        handoff = (
            RelayHandoff(self, session) if self.role == "rld" and session.request.handoff != H.HANDOFF_NONE else None
        )
        with self.steps.batcher.decoding(rid):
            yield from self._decode_steps(session, handoff)

    def _decode_steps(self, session: Session, handoff: RelayHandoff | None):
        rid, worker = session.request_id, self.me.name
        emitted, steps, batched = session.emit_from, 0, 0
        while True:
            with self.lock:
                toks = self.engine.tokens(rid)[session.prompt_len :]
                done = self.engine.is_done(rid)
            for i in range(emitted, len(toks)):
                if not session.first_sent:  # the first index this worker streams: 0, or an MD's from the handoff
                    self.events.emit("first_token", rid, index=i)
                    session.first_sent = True
                # Token 0 was sampled by P at the end of prefill: tagged with the worker that produced it.
                from_p = i == 0 and session.request.kv_source != H.KV_SOURCE_LOCAL
                yield token_msg(i, toks[i], (session.request.prefill_worker or "p") if from_p else worker)
            emitted = max(emitted, len(toks))
            if session.cancelled:
                yield end_msg("cancelled")
                return
            if done:
                if handoff is not None:
                    handoff.record_local_completion(toks)
                self.events.emit(
                    "decode_done",
                    rid,
                    generated_tokens=len(toks),
                    steps=steps,
                    mean_batch=round(batched / steps, 2) if steps else 0,
                )
                yield end_msg("length")
                return
            if handoff is not None and handoff.step(toks):
                yield end_msg("handed_off")
                return
            _, batch = self.steps.batcher.step(rid)  # one step batched with this worker's other sessions
            steps, batched = steps + 1, batched + batch

    # ------------------------------------------------------------ small RPCs

    def PrefixLength(self, request, context):
        # P asks as soon as it starts its prefill, while the router's Decode call that opens the session
        # may still be crossing the WAN (jitter can reorder the two): wait a moment for the session
        # (an open session expects its prompt KV).
        self.inbox.is_expected(request.request_id, "prompt", SESSION_WAIT_S)
        return pdd_pb2.PrefixReply(cached_tokens=self._session(request.request_id, context).cached_tokens)

    def Lookup(self, request, context):
        with self.lock:
            hit = self.engine.cached_prefix(request.prompt_tokens)
        return pdd_pb2.LookupReply(cached_tokens=hit, active_requests=self.sessions)

    def KVReady(self, request, context):
        session = self._session(request.request_id, context)
        with session.cond:
            session.md_ready = True
            session.cond.notify_all()
        self.events.emit("md_ready", request.request_id, md=request.worker)
        return pdd_pb2.KVReadyReply()

    def Cancel(self, request, context):
        with self._sessions_lock:
            session = self._sessions.get(request.request_id)
        if session is not None:
            session.cancel()
        return pdd_pb2.CancelReply(cancelled=int(session is not None))

    def _session(self, rid: str, context) -> Session:
        with self._sessions_lock:
            session = self._sessions.get(rid)
        if session is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no decode session for request {rid!r} on {self.me.name}")
        return session

    @property
    def sessions(self) -> int:
        with self._sessions_lock:
            return len(self._sessions)

    def close(self) -> None:
        with self._sessions_lock:
            sessions = list(self._sessions.values())
        for s in sessions:
            s.cancel()
        self.channels.close()


def build(cfg: DeploymentConfig, worker: WorkerConfig) -> RoleServer:
    """An RLD or MD server (the role follows from which config entry the worker is), ready to start."""
    role = cfg.role_of(worker.name)
    # Both decode roles keep a prefix cache: the MD's is the DRC; the RLD's spares a colocated prefill (and a
    # relay's local one) the prefix it already computed, as P's does (a fair colocated baseline).
    engine = build_engine(cfg, worker, prefix_cache=True)
    events = event_log(cfg, worker, role)
    inbox = Inbox()
    receiver = KVReceiver(
        worker.host,
        worker.kv_port,
        engine.fingerprint.hex(),
        inbox,
        events,
        cfg.kv.max_transfer_bytes,
        cfg.kv.max_frame_bytes,
    ).start()
    servicer = DecodeServicer(cfg, worker, role, engine, inbox, events)
    open_requests, blocks = engine_stats(engine, servicer.lock)
    stats = StatsSource(
        open_requests, blocks, lambda: receiver.active_transfers + inbox.pending, lambda: servicer.sessions
    )

    def on_stop() -> None:
        servicer.close()
        CONNECTIONS.close()
        receiver.stop()
        events.close()

    return RoleServer(
        cfg, worker, role, lambda s: pdd_pb2_grpc.add_DecodeServicer_to_server(servicer, s), stats, on_stop, engine
    )


def main(argv: list[str] | None = None) -> int:
    return role_main("decode", build, "md", argv)


if __name__ == "__main__":
    raise SystemExit(main())
