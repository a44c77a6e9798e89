"""Both halves of the handoff by token IDs (or KV): the RLD's sender and the MD's receiver.

Responsible for: the RLD's side of one session's handoff (`RelayHandoff`: when
and how to hand over — oneshot, chunked, auto, kv — and the fallbacks it
records), and the MD's side (`MDHandoff`, mixed into the decode servicer:
telling the RLD it holds the prompt KV, waiting for the final handoff while
probing the RLD, recomputing handed-over IDs — in chunks mixed into the MD's
decode steps, or in one extend step (steps.py) — or importing their KV).
Not responsible for: decoding (decode.py) or the wire (kvwire).
"""

from __future__ import annotations

import time

import grpc

from workers.errors import EngineError
from workers.kvcache import blob_kv_view
from workers.kvwire import KVSender, meta_for, start_blob
from workers.proto import pdd_pb2, pdd_pb2_grpc
from workers.roles.server import status_of
from workers.roles.session import HANDOFF_NAMES, H, Session

RELAY_TIMEOUT_S = 5.0
RELAY_RECONNECT_S = 2.0  # see _call_relay
# An MD whose relay is lost streams from index 0, P's token that came with the KV: an RLD that died
# before it sent it would otherwise leave the client without token 0 (the request failed with every
# other token decoded); where the RLD did send it, the router drops the repeat (counted).
RELAY_LOST_EMIT_FROM = 0
RELAY_PROBE_S = 1.0  # MD waiting for a handoff: ask the RLD this often whether it still holds the request


class Diverged(Exception):
    """Tokens handed over differ from those this worker holds at the same output index (greedy divergence)."""

    def __init__(self, index: int, mine: int | None, theirs: int | None):
        super().__init__(f"token at index {index} is {mine} here but {theirs} in the handoff")
        self.index, self.mine, self.theirs = index, mine, theirs


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


class MDHandoff:
    """The MD's side of the handoff, mixed into DecodeServicer (uses its engine, lock, steps, inbox, events,
    channels, config and sessions)."""

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
            if session.cancelled:  # the request ended meanwhile (the RLD finished it): no relay was lost
                return False
            self.events.emit("relay_lost", rid, reason=f"{err.code().name}: {err.details()}")
            session.relay_lost, session.emit_from = True, RELAY_LOST_EMIT_FROM  # decode alone
            return True
        while True:
            with session.cond:
                session.cond.wait_for(
                    lambda: session.handed_final or session.cancelled or session.relay_output is not None,
                    RELAY_PROBE_S,
                )
                if session.handed_final or session.cancelled:
                    return not session.cancelled
                if session.relay_output is not None:
                    self.events.emit("relay_done", rid, reason="the relay finished alone and sent its output")
                    return False
            verdict = self._probe_relay(stub, session)
            if verdict == "alive":
                continue
            with session.handoff_lock:  # a handoff being applied right now wins
                if session.handed_final or session.cancelled:
                    return not session.cancelled
                if verdict == "done":
                    self.events.emit("relay_done", rid, reason="the relay closed its session without a handoff")
                    return False
                self.events.emit("relay_lost", rid, reason=verdict, after_kv_ready=True)
                session.relay_lost, session.emit_from = True, RELAY_LOST_EMIT_FROM  # decode alone
                return True

    def _recompute(self, session: Session, ids: list[int], start: int, held_to: int) -> tuple[list[int], int]:
        """Without the engine lock. ids are output tokens from index start; this worker holds those before
        index held_to already, and they must be equal (else Diverged, at the first index that differs: the
        IDs alone decide it, no logits are read); the rest are appended and computed, the next token after
        them sampled (EngineError when they cannot be). (The rest, the engine steps they took.)"""
        with self.lock:
            have = self.engine.tokens(session.request_id)[session.prompt_len :]
        for i in range(start, held_to):
            mine = have[i] if i < len(have) else None
            theirs = ids[i - start] if i - start < len(ids) else None
            if mine != theirs:
                raise Diverged(i, mine, theirs)
        rest = ids[held_to - start :]
        steps = self.steps.extend(session.request_id, rest) if rest else 0
        return rest, steps

    def _end_without_handoff(self, session: Session) -> str:
        """The relay finished alone: recompute its output here when it sent it, so this worker's DRC keeps
        prompt + output (the session's next turn then ships only what is new). The session's end reason:
        cancelled, relay_absorbed, or relay_done (the prompt alone is cached)."""
        if session.cancelled:
            return "cancelled"
        if session.relay_output is None:
            return "relay_done"
        rid, ids = session.request_id, list(session.relay_output)
        t0 = time.monotonic_ns()
        with self.lock:
            held = len(self.engine.tokens(rid)) - session.prompt_len  # P's first token
        try:
            rest, steps = self._recompute(session, ids, 0, held)
        except (Diverged, EngineError) as err:
            self.events.emit("relay_absorb_failed", rid, reason=f"the relay's output: {err}")
            return "relay_done"
        self.events.emit("relay_absorbed", rid, tokens=len(rest), steps=steps, extend_ns=time.monotonic_ns() - t0)
        return "relay_absorbed"

    def RelayOutput(self, request, context):
        session = self._session(request.request_id, context)
        if not 0 < len(request.token_ids) <= session.request.max_tokens:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"request {request.request_id!r}: {len(request.token_ids)} output tokens; "
                f"allowed 1..{session.request.max_tokens}",
            )
        with session.cond:
            session.relay_output = tuple(request.token_ids)
            session.cond.notify_all()
        self.events.emit("relay_output", request.request_id, tokens=len(request.token_ids), relay=request.worker)
        return pdd_pb2.RelayOutputReply()

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
        self.events.emit(
            "handoff_recv_start",
            request.request_id,
            start_index=request.start_index,
            tokens=len(request.token_ids),
            final=request.final,
            kv=request.kv,
        )
        with session.handoff_lock:
            if not session.kv_ready:
                context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"request {request.request_id!r}: the prompt KV has not arrived here yet",
                )
            if session.handed_final:
                context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION, f"request {request.request_id!r}: already handed off"
                )
            if session.relay_lost:
                context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"request {request.request_id!r}: this worker declared its relay lost and decodes alone",
                )
            if not request.token_ids:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "token_ids is empty")
            if request.kv:
                self._absorb_kv(session, request, context)
            else:
                self._absorb_ids(session, request, context)
            extend_ns = time.monotonic_ns() - t0
            with self.lock:
                toks = self.engine.tokens(request.request_id)
            next_token = (
                toks[session.prompt_len + session.pending_index]
                if session.prompt_len + session.pending_index < len(toks)
                else -1
            )
            if request.final:
                with session.cond:
                    session.handed_final = True
                    session.emit_from = request.start_index + len(request.token_ids)
                    session.cond.notify_all()
        self.events.emit(
            "handoff_recv_end",
            request.request_id,
            start_index=request.start_index,
            tokens=len(request.token_ids),
            final=request.final,
            kv=request.kv,
            extend_ns=extend_ns,
            payload_bytes=request.ByteSize(),
        )
        return pdd_pb2.HandoffReply(pending_index=session.pending_index, next_token=next_token, extend_ns=extend_ns)

    def _absorb_ids(self, session: Session, request, context) -> None:
        """Recompute handed-over IDs: check the overlap with what this worker has, extend the rest."""
        rid, start, ids = request.request_id, request.start_index, list(request.token_ids)
        pend = session.pending_index
        if not start <= pend < start + len(ids):
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"request {rid!r}: handoff covers indices "
                f"[{start}, {start + len(ids)}) but this worker's next token without KV is index {pend}",
            )
        t0 = time.monotonic_ns()
        try:
            rest, steps = self._recompute(session, ids, start, pend + 1)  # this worker holds up to pend
        except Diverged as err:
            self.events.emit("handoff_diverged", rid, index=err.index, mine=err.mine, theirs=err.theirs)
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"request {rid!r}: {err} (greedy divergence)")
        except EngineError as err:
            context.abort(status_of(err), str(err))
        if rest:
            session.pending_index = pend + len(rest) + 1
        self.events.emit(
            "extend", rid, tokens=len(rest), start_index=pend, steps=steps, extend_ns=time.monotonic_ns() - t0
        )

    def _absorb_kv(self, session: Session, request, context) -> None:
        """KV handoff: import the generated tokens' KV from the data plane, then the one token without KV."""
        rid, start = request.request_id, request.start_index
        if start > session.pending_index:
            got = self.inbox.wait(
                rid, "handoff", self.cfg.decode.handoff_timeout_ms / 1000, stop=lambda: session.cancelled
            )
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
                context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"request {rid!r}: after the KV import this "
                    f"worker has {have} tokens, the handoff continues at index {start}",
                )
            self.engine.append_tokens(rid, [request.token_ids[0]])
        session.pending_index = start


class RelayHandoff:
    """The RLD's side of one session's handoff: decides when and how to hand over; records fallbacks."""

    def __init__(self, servicer, session: Session):
        """servicer: the RLD's DecodeServicer (its engine, lock, config, events, channels)"""
        self.s, self.session = servicer, session
        self.mode = session.request.handoff
        self.md_pending = 0  # the MD's token without KV: P's first token at first
        self.inflight: grpc.Future | None = None
        self.inflight_t0 = 0
        self.failed_reason = ""
        self.stub = pdd_pb2_grpc.DecodeStub(servicer.channels.get(session.request.handoff_grpc))

    def step(self, toks: tuple[int, ...]) -> bool:
        """Called between decode steps; True when the final handoff is done (stop decoding)."""
        if self.mode == H.HANDOFF_NONE or not self.session.md_ready:
            return False
        if len(toks) <= self.s.cfg.decode.handoff_min_tokens:  # toks[0] is P's: K more before handing over
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
            self._send_chunk(list(toks[self.md_pending : self.md_pending + chunk + 1]))
            return False
        return self._final(mode, toks)

    def _effective_mode(self) -> int:
        if self.mode != H.HANDOFF_AUTO:
            return self.mode
        loaded = self.s.sessions >= self.s.cfg.decode.auto_oneshot_load
        return H.HANDOFF_ONESHOT if loaded else H.HANDOFF_CHUNKED

    def _request(self, start: int, ids: list[int], final: bool, kv: bool = False) -> pdd_pb2.HandoffRequest:
        return pdd_pb2.HandoffRequest(
            request_id=self.session.request_id,
            start_index=start,
            token_ids=ids,
            final=final,
            kv=kv,
            worker=self.s.me.name,
        )

    def _send_chunk(self, ids: list[int]) -> None:
        req = self._request(self.md_pending, ids, final=False)
        self.s.events.emit(
            "handoff_start",
            self.session.request_id,
            mode="chunked",
            final=False,
            start_index=self.md_pending,
            tokens=len(ids),
            payload_bytes=req.ByteSize(),
        )
        self.inflight_t0 = time.monotonic_ns()
        self.inflight = self.stub.Handoff.future(req, timeout=self.s.cfg.decode.handoff_timeout_ms / 1000)

    def _chunk_done(self) -> None:
        fut, self.inflight = self.inflight, None
        try:
            reply = fut.result()
        except grpc.RpcError as err:
            self._fail(f"chunk: {err.code().name}: {err.details()}")
            return
        self.s.events.emit(
            "handoff_end",
            self.session.request_id,
            mode="chunked",
            final=False,
            duration_ns=time.monotonic_ns() - self.inflight_t0,
            extend_ns=reply.extend_ns,
            md_pending_index=reply.pending_index,
        )
        self.md_pending = reply.pending_index

    def _final(self, mode: int, toks: tuple[int, ...]) -> bool:
        rid, t0 = self.session.request_id, time.monotonic_ns()
        name = HANDOFF_NAMES[mode] if self.mode != H.HANDOFF_AUTO else f"auto:{HANDOFF_NAMES[mode]}"
        try:
            if mode == H.HANDOFF_KV:
                req, sender = self._ship_kv(toks)
            else:
                req, sender = self._request(self.md_pending, list(toks[self.md_pending :]), final=True), None
            self.s.events.emit(
                "handoff_start",
                rid,
                mode=name,
                final=True,
                start_index=req.start_index,
                tokens=len(toks) - self.md_pending,
                payload_bytes=req.ByteSize(),
            )
            # The KV (if any) is on its way: the request goes at once, and the MD imports the KV as it lands
            # (it waits for it in its inbox), so a KV handoff pays no extra round trip for the data plane's ack.
            call = self.stub.Handoff.future(req, timeout=self.s.cfg.decode.handoff_timeout_ms / 1000)
            kv_bytes = self._shipped(sender, call)
            reply = call.result()
        except grpc.RpcError as err:
            self._fail(f"{name}: {err.code().name}: {err.details()}")
            return False
        except _KVShipFailed as err:
            self._fail(f"{name}: {err}")
            return False
        self.s.events.emit(
            "handoff_end",
            rid,
            mode=name,
            final=True,
            duration_ns=time.monotonic_ns() - t0,
            extend_ns=reply.extend_ns,
            tokens=len(toks) - self.md_pending,
            payload_bytes=req.ByteSize() + kv_bytes,
        )
        return True

    def _ship_kv(self, toks: tuple[int, ...]) -> tuple[pdd_pb2.HandoffRequest, KVSender | None]:
        """Start sending the KV of generated tokens 0..n-2 to the MD's data plane (the sender runs on; None
        with nothing to send); the last token travels as an ID in the request."""
        rid, n, L = self.session.request_id, len(toks), self.session.prompt_len
        sender = None
        if n > 1:
            with self.s.lock:
                blob = self.s.engine.export_kv(rid, L, L + n - 1)
            meta = meta_for(self.s.engine, rid, "handoff", L, L + n - 1, toks[: n - 1])
            layers = blob_kv_view(blob, meta.n_layer, n - 1, meta.row_bytes)  # (nl, 2, n-1, row)
            sender = start_blob(
                self.session.request.handoff_kv,
                meta,
                layers,
                self.s.cfg.kv.wan.send_settings(),
                "handoff",
                self.s.events,
            )
        return self._request(n - 1, [toks[n - 1]], final=True, kv=True), sender

    @staticmethod
    def _shipped(sender: KVSender | None, call) -> int:
        """The KV's wire bytes once its transfer ended (0 without one); a failed transfer cancels the request
        already sent (the MD would wait for KV that never comes) and raises _KVShipFailed."""
        if sender is None:
            return 0
        result = sender.wait()
        if not result.ok:
            call.cancel()
            raise _KVShipFailed(result.reason)
        return result.wire_bytes

    def _fail(self, reason: str) -> None:
        """A handoff failed: keep decoding here to the end; tell the MD (best effort) to drop its copy."""
        self.failed_reason = reason
        self.mode = H.HANDOFF_NONE
        self.s.events.emit("handoff_failed", self.session.request_id, reason=reason)
        try:
            self.stub.Cancel(pdd_pb2.CancelRequest(request_id=self.session.request_id), timeout=1.0)
        except grpc.RpcError:
            pass

    def record_local_completion(self, toks: tuple[int, ...]) -> None:
        """The RLD generated every token itself: record why (fallback) when a handoff was planned, and give
        the MD the output (its session still waits for the prompt KV or for a handoff) unless the handoff
        failed (the MD was told to drop its copy)."""
        if self.inflight is not None:
            self.inflight.cancel()
        reason = self.failed_reason or ("md_never_ready" if not self.session.md_ready else "finished_first")
        self.s.events.emit("completed_on_rld", self.session.request_id, reason=reason)
        if not self.failed_reason:
            self._send_output(toks)

    def _send_output(self, toks: tuple[int, ...]) -> None:
        """RelayOutput: PDD ends every pipeline at the MD, so that its DRC follows P's. Sent before this
        session closes: an MD that then finds the session gone already holds the output."""
        rid = self.session.request_id
        req = pdd_pb2.RelayOutputRequest(request_id=rid, token_ids=list(toks), worker=self.s.me.name)
        try:
            self.stub.RelayOutput(req, timeout=RELAY_TIMEOUT_S)
        except grpc.RpcError as err:
            self.s.events.emit("relay_output_failed", rid, reason=f"{err.code().name}: {err.details()}")
        else:
            self.s.events.emit("relay_output_sent", rid, tokens=len(toks))


class _KVShipFailed(Exception):
    pass
