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
handed-over IDs in one extend step and continues. Fallbacks: a handoff that
fails leaves the RLD decoding to the end; an MD whose prompt KV misses the
hard deadline ends its session (`kv_timeout`); an MD whose relay vanished
(unreachable at KVReady, or its process gone while the MD waits for the
handoff: probed every RELAY_PROBE_S) decodes alone.
Not responsible for: prefill for remote workers (prefill.py), routing and the
client's ordered stream (router.py), the wire (kvwire.py).

Token indices: index 0 is the first generated token (sampled by P, or here
when colocated). The MD's "pending" token is its last token without KV; a
handoff starting at index s must carry the MD's pending token first (the MD
checks it: a mismatch is a greedy divergence and refuses the handoff).
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

import grpc
import numpy as np

from workers.engine import Engine, GenerationRequest
from workers.errors import EngineError
from workers.kvcache import BLOB_HEADER, TOKEN_ID_BYTES
from workers.proto import pdd_pb2, pdd_pb2_grpc
from workers.roles.batching import StepBatcher
from workers.roles.config import DeploymentConfig, WorkerConfig
from workers.roles.events import EventLog
from workers.roles.kvwire import CONNECTIONS, Inbox, KVReceiver, KVSender, meta_for
from workers.roles.server import (Channels, RoleServer, StatsSource, build_engine, engine_stats, event_log,
                                  role_main, status_of)

log = logging.getLogger(__name__)

RELAY_TIMEOUT_S = 5.0
SESSION_WAIT_S = 4.0   # PrefixLength for a request whose session is not open yet waits this long
RELAY_RECONNECT_S = 2.0  # see _call_relay
RELAY_PROBE_S = 1.0    # MD waiting for a handoff: ask the RLD this often whether it still holds the request
H = pdd_pb2  # enum values: H.HANDOFF_ONESHOT, ...
HANDOFF_NAMES = {H.HANDOFF_NONE: "none", H.HANDOFF_ONESHOT: "oneshot", H.HANDOFF_CHUNKED: "chunked",
                 H.HANDOFF_AUTO: "auto", H.HANDOFF_KV: "kv"}


@dataclass
class Session:
    """One request on this decode worker."""
    request: pdd_pb2.DecodeRequest
    cached_tokens: int
    cond: threading.Condition = field(default_factory=threading.Condition)
    handoff_lock: threading.Lock = field(default_factory=threading.Lock)
    cancelled: bool = False
    kv_ready: bool = False        # this worker holds the prompt KV
    md_ready: bool = False        # RLD: the MD holds the prompt KV
    pending_index: int = 0        # MD: index of its token without KV
    handed_final: bool = False    # MD: the final handoff is applied
    emit_from: int = 1            # first index this worker streams
    relay_lost: bool = False      # MD: the RLD is unreachable

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def prompt_len(self) -> int:
        return len(self.request.prompt_tokens)

    def cancel(self) -> None:
        with self.cond:
            self.cancelled = True
            self.cond.notify_all()


def _call_relay(method, request):
    """An RPC to the relay. UNAVAILABLE may only mean the channel is between reconnect attempts (the RLD
    restarted): then once more, waiting up to RELAY_RECONNECT_S for the channel (longer than its
    reconnect backoff, server.grpc_options). UNAVAILABLE or DEADLINE_EXCEEDED after that: it is gone."""
    try:
        return method(request, timeout=RELAY_TIMEOUT_S)
    except grpc.RpcError as err:
        if err.code() != grpc.StatusCode.UNAVAILABLE:
            raise
    return method(request, timeout=RELAY_RECONNECT_S, wait_for_ready=True)


def token_msg(index: int, token: int, worker: str) -> pdd_pb2.DecodeEvent:
    return pdd_pb2.DecodeEvent(token=pdd_pb2.Token(index=index, token=token, worker=worker, t_ns=time.monotonic_ns()))


def end_msg(reason: str) -> pdd_pb2.DecodeEvent:
    return pdd_pb2.DecodeEvent(end=pdd_pb2.DecodeEnd(reason=reason))


class DecodeServicer(pdd_pb2_grpc.DecodeServicer):
    """cfg: deployment; me: this worker; role: rld | md; engine, inbox, events: this worker's"""

    def __init__(self, cfg: DeploymentConfig, me: WorkerConfig, role: str, engine: Engine, inbox: Inbox,
                 events: EventLog):
        self.cfg, self.me, self.role = cfg, me, role
        self.engine, self.inbox, self.events = engine, inbox, events
        self.lock = threading.Lock()    # the engine is single-threaded
        self.batcher = StepBatcher(engine.decode_step, self.lock, cfg.decode.max_batch)
        self._sessions: dict[str, Session] = {}
        self._sessions_lock = threading.Lock()
        self.channels = Channels(cfg)
        self._senders: set[KVSender] = set()

    # ------------------------------------------------------------ Decode

    def Decode(self, request, context):
        session = self._open(request, context)
        context.add_callback(session.cancel)
        try:
            yield pdd_pb2.DecodeEvent(accepted=pdd_pb2.Accepted(worker=self.me.name,
                                                                cached_tokens=session.cached_tokens))
            yield from self._run(session, context)
        finally:
            self._close(session)

    def _open(self, request, context) -> Session:
        rid = request.request_id
        self.events.emit("decode_arrival", rid, prompt_tokens=len(request.prompt_tokens),
                         max_tokens=request.max_tokens, handoff=HANDOFF_NAMES.get(request.handoff, "?"))
        if not rid:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "request_id is empty")
        if request.handoff != H.HANDOFF_NONE and not request.handoff_grpc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a handoff mode needs handoff_grpc (the MD's address)")
        gen = GenerationRequest(rid, tuple(request.prompt_tokens), request.max_tokens,
                                use_prefix_cache=request.use_prefix_cache)
        with self._sessions_lock:
            if len(self._sessions) >= self.cfg.decode.max_sessions:
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                              f"{self.me.name} has {len(self._sessions)} sessions (max_sessions)")
            if rid in self._sessions:
                context.abort(grpc.StatusCode.ALREADY_EXISTS, f"request {rid!r} already has a session here")
            with self.lock:
                try:
                    opened = self.engine.open(gen)
                except EngineError as err:
                    context.abort(status_of(err), str(err))
            session = self._sessions[rid] = Session(request, opened.cached_tokens)
        self.channels.warm(request.relay_grpc, request.handoff_grpc)   # KVReady / handoff: ready when needed
        for kind in ("prompt", "handoff"):
            self.inbox.expect(rid, kind)
        self.events.emit("decode_open", rid, cached_tokens=opened.cached_tokens,
                         source="local" if request.kv_source == H.KV_SOURCE_LOCAL else "peer")
        return session

    def _close(self, session: Session) -> None:
        rid = session.request_id
        self.inbox.forget(rid)
        with self.lock:
            if rid in self.engine.open_requests:
                result = self.engine.finish(rid) if session.kv_ready else self.engine.abort(rid)
                generated = len(result.output_tokens)
            else:
                generated = 0
        with self._sessions_lock:
            self._sessions.pop(rid, None)
        self.events.emit("decode_close", rid, generated_tokens=generated, cancelled=session.cancelled)

    def _run(self, session: Session, context):
        req = session.request
        if req.kv_source == H.KV_SOURCE_LOCAL:
            yield from self._prefill_locally(session)
        elif not self._import_prompt(session):
            reason = "cancelled" if session.cancelled else "kv_timeout"
            if reason == "kv_timeout":
                self.events.emit("kv_timeout", session.request_id, wait_ms=self.cfg.decode.kv_wait_ms)
            yield end_msg(reason)
            return
        else:
            # P's first token reaches the client through the decode side, once that side holds
            # the KV (as in PD serving): a WAN transfer is then part of the client's TTFT.
            session.emit_from = 0
        if self.role == "md" and req.relay_grpc:
            if not self._await_handoff(session):
                yield end_msg("cancelled" if session.cancelled else "relay_done")
                return
        yield from self._decode_loop(session)

    def _prefill_locally(self, session: Session):
        rid = session.request_id
        self.events.emit("prefill_start", rid, cached_tokens=session.cached_tokens)
        with self.lock:
            first = self.engine.prefill(rid).first_token
        session.kv_ready = True
        self.events.emit("first_token", rid, index=0)
        session.emit_from = 1
        yield token_msg(0, first, self.me.name)

    def _import_prompt(self, session: Session) -> bool:
        """Wait for the prompt KV (hard deadline), import it and P's first token; False if it never came."""
        rid = session.request_id
        t0 = time.monotonic_ns()
        got = self.inbox.wait(rid, "prompt", self.cfg.decode.kv_wait_ms / 1000, stop=lambda: session.cancelled)
        if got is None:
            return False
        try:
            with self.lock:
                self.engine.import_kv(rid, got.blob)
                self.engine.append_tokens(rid, [got.next_token])
        finally:
            got.release()
        session.kv_ready = True
        self.events.emit("kv_imported", rid, start=got.meta.start, end=got.meta.end, kv_bytes=got.meta.kv_bytes,
                         wait_ns=time.monotonic_ns() - t0)
        return True

    # ------------------------------------------------------------ MD side of the handoff

    def _await_handoff(self, session: Session) -> bool:
        """MD with a relay: tell the RLD, then wait for its final handoff. False: the relay finished alone."""
        rid = session.request_id
        stub = pdd_pb2_grpc.DecodeStub(self.channels.get(session.request.relay_grpc))
        try:
            _call_relay(stub.KVReady, pdd_pb2.KVReadyRequest(request_id=rid, worker=self.me.name))
            self.events.emit("kv_ready_sent", rid, relay=session.request.relay_grpc)
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.NOT_FOUND:
                self.events.emit("relay_done", rid, reason=err.details())
                return False
            self.events.emit("relay_lost", rid, reason=f"{err.code().name}: {err.details()}")
            session.relay_lost, session.emit_from = True, 1   # decode alone; the router drops repeats
            return True
        while True:
            with session.cond:
                if session.cond.wait_for(lambda: session.handed_final or session.cancelled, RELAY_PROBE_S):
                    return not session.cancelled
            verdict = self._probe_relay(stub, session)
            if verdict == "alive":
                continue
            with session.handoff_lock:   # a handoff being applied right now wins
                if session.handed_final or session.cancelled:
                    return not session.cancelled
                if verdict == "done":
                    self.events.emit("relay_done", rid, reason="the relay closed its session without a handoff")
                    return False
                self.events.emit("relay_lost", rid, reason=verdict, after_kv_ready=True)
                session.relay_lost, session.emit_from = True, 1   # decode alone; the router drops repeats
                return True

    def _probe_relay(self, stub, session: Session) -> str:
        """While waiting for a handoff: is the RLD still there? alive | done (no session for the request:
        it finished alone) | a reason it is gone (connection refused or reset: its process died)."""
        try:
            _call_relay(stub.PrefixLength, pdd_pb2.PrefixQuery(request_id=session.request_id))
            return "alive"
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.NOT_FOUND:
                return "done"
            if err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                return f"{err.code().name}: {err.details()}"
            return "alive"

    def Handoff(self, request, context):
        session = self._session(request.request_id, context)
        t0 = time.monotonic_ns()
        self.events.emit("handoff_recv_start", request.request_id, start_index=request.start_index,
                         tokens=len(request.token_ids), final=request.final, kv=request.kv)
        with session.handoff_lock:
            if not session.kv_ready:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"request {request.request_id!r}: the prompt KV "
                              "has not arrived here yet")
            if session.handed_final:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"request {request.request_id!r}: already handed off")
            if session.relay_lost:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"request {request.request_id!r}: this worker "
                              "declared its relay lost and decodes alone")
            if not request.token_ids:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "token_ids is empty")
            if request.kv:
                self._absorb_kv(session, request, context)
            else:
                self._absorb_ids(session, request, context)
            extend_ns = time.monotonic_ns() - t0
            with self.lock:
                toks = self.engine.tokens(request.request_id)
            next_token = toks[session.prompt_len + session.pending_index] \
                if session.prompt_len + session.pending_index < len(toks) else -1
            if request.final:
                with session.cond:
                    session.handed_final = True
                    session.emit_from = request.start_index + len(request.token_ids)
                    session.cond.notify_all()
        self.events.emit("handoff_recv_end", request.request_id, start_index=request.start_index,
                         tokens=len(request.token_ids), final=request.final, kv=request.kv, extend_ns=extend_ns,
                         payload_bytes=request.ByteSize())
        return pdd_pb2.HandoffReply(pending_index=session.pending_index, next_token=next_token, extend_ns=extend_ns)

    def _absorb_ids(self, session: Session, request, context) -> None:
        """Recompute handed-over IDs: check the overlap with what this worker has, extend the rest."""
        rid, start, ids = request.request_id, request.start_index, list(request.token_ids)
        pend = session.pending_index
        if not start <= pend < start + len(ids):
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"request {rid!r}: handoff covers indices "
                          f"[{start}, {start + len(ids)}) but this worker's next token without KV is index {pend}")
        with self.lock:
            have = self.engine.tokens(rid)[session.prompt_len:]
            overlap = ids[:pend - start + 1]
            if list(have[start:pend + 1]) != overlap:
                self.events.emit("handoff_diverged", rid, index=pend, mine=have[pend], theirs=ids[pend - start])
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"request {rid!r}: token at index {pend} is "
                              f"{have[pend]} here but {ids[pend - start]} in the handoff (greedy divergence)")
            rest = ids[pend - start + 1:]
            if rest:
                try:
                    self.engine.extend(rid, rest)
                except EngineError as err:
                    context.abort(status_of(err), str(err))
                session.pending_index = pend + len(rest) + 1
        self.events.emit("extend", rid, tokens=len(rest), start_index=pend)

    def _absorb_kv(self, session: Session, request, context) -> None:
        """KV handoff: import the generated tokens' KV from the data plane, then the one token without KV."""
        rid, start = request.request_id, request.start_index
        if start > session.pending_index:
            got = self.inbox.wait(rid, "handoff", self.cfg.decode.handoff_timeout_ms / 1000,
                                  stop=lambda: session.cancelled)
            if got is None:
                context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, f"request {rid!r}: handoff KV did not arrive")
            with self.lock:
                try:
                    self.engine.import_kv(rid, got.blob)
                except EngineError as err:
                    context.abort(status_of(err), str(err))
                finally:
                    got.release()
        with self.lock:
            have = len(self.engine.tokens(rid)) - session.prompt_len
            if have != start:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"request {rid!r}: after the KV import this "
                              f"worker has {have} tokens, the handoff continues at index {start}")
            self.engine.append_tokens(rid, [request.token_ids[0]])
        session.pending_index = start

    # ------------------------------------------------------------ decode loop (both roles)

    def _decode_loop(self, session: Session):
        rid = session.request_id
        handoff = _RelayHandoff(self, session) if self.role == "rld" and session.request.handoff != H.HANDOFF_NONE \
            else None
        with self.batcher.decoding(rid):
            yield from self._decode_steps(session, handoff)

    def _decode_steps(self, session: Session, handoff: _RelayHandoff | None):
        rid, worker = session.request_id, self.me.name
        emitted, steps, batched = session.emit_from, 0, 0
        while True:
            with self.lock:
                toks = self.engine.tokens(rid)[session.prompt_len:]
                done = self.engine.is_done(rid)
            for i in range(emitted, len(toks)):
                if i == 0 or (i == emitted and i == session.emit_from):
                    self.events.emit("first_token", rid, index=i)
                # Token 0 was sampled by P at the end of prefill: tagged with the worker that produced it.
                from_p = i == 0 and session.request.kv_source != H.KV_SOURCE_LOCAL
                yield token_msg(i, toks[i], self.cfg.p.name if from_p else worker)
            emitted = max(emitted, len(toks))
            if session.cancelled:
                yield end_msg("cancelled")
                return
            if done:
                if handoff is not None:
                    handoff.record_local_completion()
                self.events.emit("decode_done", rid, generated_tokens=len(toks), steps=steps,
                                 mean_batch=round(batched / steps, 2) if steps else 0)
                yield end_msg("length")
                return
            if handoff is not None and handoff.step(toks):
                yield end_msg("handed_off")
                return
            _, batch = self.batcher.step(rid)   # one step batched with this worker's other sessions
            steps, batched = steps + 1, batched + batch

    # ------------------------------------------------------------ small RPCs

    def PrefixLength(self, request, context):
        # P asks as soon as it starts its prefill, while the router's Decode call that opens the session
        # may still be crossing the WAN (jitter can reorder the two): wait a moment for the session
        # (an open session expects its prompt KV).
        self.inbox.is_expected(request.request_id, "prompt", SESSION_WAIT_S)
        return pdd_pb2.PrefixReply(cached_tokens=self._session(request.request_id, context).cached_tokens)

    def Lookup(self, request, context):
        prompt = list(request.prompt_tokens)
        hit = 0
        if self.engine.radix is not None and len(prompt) > 1:
            with self.lock:
                hit = self.engine.radix.match_prefix(prompt, max_match_tokens=len(prompt) - 1,
                                                     record=False).matched_tokens
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


class _RelayHandoff:
    """The RLD's side of one session's handoff: decides when and how to hand over; records fallbacks."""

    def __init__(self, servicer: DecodeServicer, session: Session):
        self.s, self.session = servicer, session
        self.mode = session.request.handoff
        self.md_pending = 0            # the MD's token without KV: P's first token at first
        self.inflight: grpc.Future | None = None
        self.inflight_t0 = 0
        self.failed_reason = ""
        self.stub = pdd_pb2_grpc.DecodeStub(servicer.channels.get(session.request.handoff_grpc))

    def step(self, toks: tuple[int, ...]) -> bool:
        """Called between decode steps; True when the final handoff is done (stop decoding)."""
        if self.mode == H.HANDOFF_NONE or not self.session.md_ready:
            return False
        if self.inflight is not None:
            if not self.inflight.done():
                return False
            self._chunk_done()
            if self.mode == H.HANDOFF_NONE:
                return False
        mode = self._effective_mode()
        chunk = self.session.request.chunk_tokens or self.s.cfg.policy.chunk_tokens
        if mode == H.HANDOFF_CHUNKED and len(toks) - self.md_pending > chunk + 1:
            self._send_chunk(list(toks[self.md_pending:self.md_pending + chunk + 1]))
            return False
        return self._final(mode, toks)

    def _effective_mode(self) -> int:
        if self.mode != H.HANDOFF_AUTO:
            return self.mode
        loaded = self.s.sessions >= self.s.cfg.decode.auto_oneshot_load
        return H.HANDOFF_ONESHOT if loaded else H.HANDOFF_CHUNKED

    def _request(self, start: int, ids: list[int], final: bool, kv: bool = False) -> pdd_pb2.HandoffRequest:
        return pdd_pb2.HandoffRequest(request_id=self.session.request_id, start_index=start, token_ids=ids,
                                      final=final, kv=kv, worker=self.s.me.name)

    def _send_chunk(self, ids: list[int]) -> None:
        req = self._request(self.md_pending, ids, final=False)
        self.s.events.emit("handoff_start", self.session.request_id, mode="chunked", final=False,
                           start_index=self.md_pending, tokens=len(ids), payload_bytes=req.ByteSize())
        self.inflight_t0 = time.monotonic_ns()
        self.inflight = self.stub.Handoff.future(req, timeout=self.s.cfg.decode.handoff_timeout_ms / 1000)

    def _chunk_done(self) -> None:
        fut, self.inflight = self.inflight, None
        try:
            reply = fut.result()
        except grpc.RpcError as err:
            self._fail(f"chunk: {err.code().name}: {err.details()}")
            return
        self.s.events.emit("handoff_end", self.session.request_id, mode="chunked", final=False,
                           duration_ns=time.monotonic_ns() - self.inflight_t0, extend_ns=reply.extend_ns,
                           md_pending_index=reply.pending_index)
        self.md_pending = reply.pending_index

    def _final(self, mode: int, toks: tuple[int, ...]) -> bool:
        rid, t0 = self.session.request_id, time.monotonic_ns()
        name = HANDOFF_NAMES[mode] if self.mode != H.HANDOFF_AUTO else f"auto:{HANDOFF_NAMES[mode]}"
        try:
            if mode == H.HANDOFF_KV:
                req, kv_bytes = self._ship_kv(toks)
            else:
                req, kv_bytes = self._request(self.md_pending, list(toks[self.md_pending:]), final=True), 0
            self.s.events.emit("handoff_start", rid, mode=name, final=True, start_index=req.start_index,
                               tokens=len(toks) - self.md_pending, payload_bytes=req.ByteSize() + kv_bytes)
            reply = self.stub.Handoff(req, timeout=self.s.cfg.decode.handoff_timeout_ms / 1000)
        except grpc.RpcError as err:
            self._fail(f"{name}: {err.code().name}: {err.details()}")
            return False
        except _KVShipFailed as err:
            self._fail(f"{name}: {err}")
            return False
        self.s.events.emit("handoff_end", rid, mode=name, final=True, duration_ns=time.monotonic_ns() - t0,
                           extend_ns=reply.extend_ns, tokens=len(toks) - self.md_pending,
                           payload_bytes=req.ByteSize() + kv_bytes)
        return True

    def _ship_kv(self, toks: tuple[int, ...]) -> tuple[pdd_pb2.HandoffRequest, int]:
        """Send the KV of generated tokens 0..n-2 to the MD's data plane; the last token travels as an ID."""
        rid, n, L = self.session.request_id, len(toks), self.session.prompt_len
        kv_bytes = 0
        if n > 1:
            with self.s.lock:
                blob = self.s.engine.export_kv(rid, L, L + n - 1)
            meta = meta_for(self.s.engine, rid, "handoff", L, L + n - 1, toks[:n - 1])
            body = np.frombuffer(blob, np.uint8, offset=BLOB_HEADER.size + (n - 1) * TOKEN_ID_BYTES)
            layers = body.reshape(meta.n_layer, 2, n - 1, meta.row_bytes)  # (nl, 2, n-1, row)
            sender = KVSender(self.session.request.handoff_kv, meta, self.s.cfg.kv.wan, "handoff", self.s.events)
            sender.start()
            for layer in range(meta.n_layer):
                sender.put_layer(layer, layers[layer])
            sender.finish(None)
            result = sender.wait()
            if not result.ok:
                raise _KVShipFailed(result.reason)
            kv_bytes = result.wire_bytes
        return self._request(n - 1, [toks[n - 1]], final=True, kv=True), kv_bytes

    def _fail(self, reason: str) -> None:
        """A handoff failed: keep decoding here to the end; tell the MD (best effort) to drop its copy."""
        self.failed_reason = reason
        self.mode = H.HANDOFF_NONE
        self.s.events.emit("handoff_failed", self.session.request_id, reason=reason)
        try:
            self.stub.Cancel(pdd_pb2.CancelRequest(request_id=self.session.request_id), timeout=1.0)
        except grpc.RpcError:
            pass

    def record_local_completion(self) -> None:
        """The RLD generated every token itself: record why (fallback) when a handoff was planned."""
        if self.inflight is not None:
            self.inflight.cancel()
        reason = self.failed_reason or ("md_never_ready" if not self.session.md_ready else "finished_first")
        self.s.events.emit("completed_on_rld", self.session.request_id, reason=reason)


class _KVShipFailed(Exception):
    pass


def build(cfg: DeploymentConfig, worker: WorkerConfig) -> RoleServer:
    """An RLD or MD server (the role follows from which config entry the worker is), ready to start."""
    role = "md" if worker is cfg.md else "rld"
    engine = build_engine(cfg, worker, prefix_cache=(role == "md"))
    events = event_log(cfg, worker, role)
    inbox = Inbox()
    receiver = KVReceiver(worker.host, worker.kv_port, engine.fingerprint.hex(), inbox, events,
                          cfg.kv.max_transfer_bytes, cfg.kv.max_frame_bytes).start()
    servicer = DecodeServicer(cfg, worker, role, engine, inbox, events)
    open_requests, blocks = engine_stats(engine, servicer.lock)
    stats = StatsSource(open_requests, blocks, lambda: receiver.active_transfers + inbox.pending,
                        lambda: servicer.sessions)

    def on_stop() -> None:
        servicer.close()
        CONNECTIONS.close()
        receiver.stop()
        events.close()
    return RoleServer(cfg, worker, role, lambda s: pdd_pb2_grpc.add_DecodeServicer_to_server(servicer, s), stats,
                      on_stop)


def main(argv: list[str] | None = None) -> int:
    return role_main("decode", build, "md", argv)


if __name__ == "__main__":
    raise SystemExit(main())
