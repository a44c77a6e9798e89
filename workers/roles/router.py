"""The router: the client-facing `Generate` stream, the route decision, one ordered stream per request.

Responsible for: validating requests at the edge; choosing the mode
(colocated, pd-intra, pd-cross, pdd; per request or the config default) and,
in pdd, the route: P->MD when the MD's DRC hit (as the router's mirror of
the DRC expects it, or asked of the MD: policy.drc_estimate) makes the WAN transfer short
(estimated transfer time <= policy.direct_max_transfer_ms), P->RLD for
singular requests (long uncached input, short output; the WAN transfer is
blocked and the bytes saved recorded) or, behind the ablation flag, for any
request, and P->RLD->MD otherwise; starting the decode sessions before P's
prefill so the KV has somewhere to land; merging the workers' token streams
into one stream where every index appears exactly once and in order (a
repeated index is dropped and counted); cancelling what is left when done.
Not responsible for: prefill, decode or KV (the other roles).

Routes: see routing.py (the decision itself is pure and lives there). A pdd
P->MD request whose WAN target fails before its first token (P cannot reach
the MD's DRC, the MD's stream ends without a token) is re-routed here to the
RLD (p-rld-fallback): PDD keeps serving while the WAN struggles; pd-cross, the
naive baseline, has no such fallback. A pdd request whose MD stream fails after
tokens were streamed (the MD died after it took over, or mid P->MD decode)
resumes on the RLD: the RLD recomputes the prompt and the tokens so far from
their IDs, as a handoff does, and decodes the rest (event resumed_on_rld).
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field, replace

import grpc

from workers.model import get_config
from workers.proto import pdd_pb2, pdd_pb2_grpc
from workers.roles.config import HANDOFFS, MODES, DeploymentConfig, WorkerConfig, context_tokens, kv_bytes_per_token
from workers.roles.events import EventLog
from workers.roles.pools import Choice, Pools
from workers.roles.server import Channels, RoleServer, StatsSource, event_log, role_main
from workers.roles.routing import ENDS_AT_MD, Route, RouteDecision, decide_route
from workers.roles.wanestimate import WanEstimate

log = logging.getLogger(__name__)

SETUP_TIMEOUT_S = 10.0  # a worker must accept a session this fast
REQUEST_TIMEOUT_S = 300.0  # longest a request may take end to end
HANDOFF_ENUM = {
    "oneshot": pdd_pb2.HANDOFF_ONESHOT,
    "chunked": pdd_pb2.HANDOFF_CHUNKED,
    "auto": pdd_pb2.HANDOFF_AUTO,
    "kv": pdd_pb2.HANDOFF_KV,
}


@dataclass
class _Merge:
    """Tokens from every source, released in index order."""

    max_tokens: int
    next_index: int = 0
    buffered: dict[int, pdd_pb2.Token] = field(default_factory=dict)
    seen: dict[int, int] = field(default_factory=dict)
    duplicates: int = 0
    notes: list[str] = field(default_factory=list)

    def add(self, tok: pdd_pb2.Token) -> list[pdd_pb2.Token]:
        """Accept one token; return the tokens now releasable in order."""
        if tok.index in self.seen or tok.index >= self.max_tokens or tok.index < 0:
            self.duplicates += 1
            if self.seen.get(tok.index, tok.token) != tok.token:
                self.notes.append(
                    f"divergence at index {tok.index}: kept {self.seen[tok.index]}, {tok.worker} said {tok.token}"
                )
            return []
        self.seen[tok.index] = tok.token
        self.buffered[tok.index] = tok
        out = []
        while self.next_index in self.buffered:
            out.append(self.buffered.pop(self.next_index))
            self.next_index += 1
        return out

    @property
    def complete(self) -> bool:
        return self.next_index >= self.max_tokens


class RouterServicer(pdd_pb2_grpc.RouterServicer):
    def __init__(self, cfg: DeploymentConfig, events: EventLog):
        self.cfg = cfg
        self.events = events
        self.model = get_config(cfg.model)
        # the architecture's where compute is modelled (its tokens stay in the small model's vocabulary)
        self.kv_bytes_per_token, self.context_tokens = kv_bytes_per_token(cfg), context_tokens(cfg)
        self.channels = Channels(cfg)  # not warmed at start: peers may still be starting (refused, backoff)
        self._lock = threading.Lock()
        self._rids: set[str] = set()  # request ids in flight (their count: Stats' sessions)
        # each pool's load, failures, each MD's DRC mirror, and each line's latest measurement (pools.lines:
        # P's PrefillReply.wan for the one WAN, .lines per named line)
        self.pools = Pools(cfg)

    def _stub(self, cls, worker: WorkerConfig):
        return cls(self.channels.get(worker.grpc_address))

    def close(self) -> None:
        self.channels.close()

    # ------------------------------------------------------------ Generate

    def Generate(self, request, context):
        rid = request.request_id or uuid.uuid4().hex[:16]
        prompt, max_tokens = list(request.prompt_tokens), request.max_tokens
        self.events.emit(
            "arrival", rid, prompt_tokens=len(prompt), max_tokens=max_tokens, mode=request.mode, handoff=request.handoff
        )
        mode, handoff = self._validate(request, context)
        with self._lock:
            duplicate = rid in self._rids
            if not duplicate:
                self._rids.add(rid)
        if duplicate:  # its sessions, KV and cancels would be the running request's
            self.events.emit("rejected", rid, reason="request_id already in flight")
            context.abort(grpc.StatusCode.ALREADY_EXISTS, f"request {rid!r} is already in flight")
        try:
            yield from self._serve(rid, prompt, max_tokens, mode, handoff, context)
        finally:
            with self._lock:
                self._rids.discard(rid)

    def _serve(self, rid: str, prompt: list[int], max_tokens: int, mode: str, handoff: str, context):
        """Route one claimed request and stream it to its end."""
        decision, chosen, line, figures = self._decide(mode, prompt, max_tokens)
        wan = self.pools.lines.estimate(line)  # the estimate of the line the decision rested on
        self.events.emit(
            "route",
            rid,
            route=decision.route,
            workers={role: c.worker.name for role, c in chosen.items()},
            picks={role: c.record() for role, c in chosen.items() if len(c.loads) > 1},
            mode=mode,
            handoff=handoff,
            md_cached_tokens=decision.md_cached_tokens,
            wan_estimate_ms=None if math.isinf(decision.wan_estimate_ms) else decision.wan_estimate_ms,
            wan_source=decision.wan_source,
            wan_congested=bool(wan and wan.congested),
            wan_rate_mbit=wan.rate_mbit if wan else None,
            wan_rtt_ms=wan.rtt_ms if wan else None,
            drc_estimate=self.cfg.policy.drc_estimate if mode == "pdd" else None,
            # the line the request's KV crosses (its MD's; None: none crosses, or one WAN), and every line's
            # figures as the pick saw them
            line=line if figures and "md" in chosen else None,
            lines=figures,
        )
        if decision.singular:
            saved = (len(prompt) - decision.md_cached_tokens) * self.kv_bytes_per_token
            self.events.emit("wan_blocked", rid, kv_bytes_saved=saved, reason="singular")
        run = _RequestRun(self, rid, prompt, max_tokens, decision, handoff, context, chosen)
        try:
            yield from run.stream()
        finally:
            run.cleanup()

    def _validate(self, request, context) -> tuple[str, str]:
        mode = request.mode or self.cfg.policy.mode
        handoff = request.handoff or self.cfg.policy.handoff
        ctx = self.context_tokens
        limit = self.cfg.policy.max_prompt_tokens or ctx - 1
        n = len(request.prompt_tokens)
        problems = []
        if mode not in MODES:
            problems.append(f"mode {mode!r} not in {list(MODES)}")
        if handoff not in HANDOFFS:
            problems.append(f"handoff {handoff!r} not in {list(HANDOFFS)}")
        if n == 0:
            problems.append("prompt is empty")
        if n > limit:
            problems.append(f"prompt has {n} tokens, at most {limit} allowed")
        bad = next((t for t in request.prompt_tokens if not 0 <= t < self.model.vocab_size), None)
        if bad is not None:
            problems.append(f"token {bad} outside the vocabulary [0, {self.model.vocab_size})")
        if not 1 <= request.max_tokens <= ctx - n:
            problems.append(f"max_tokens={request.max_tokens} not in [1, {max(1, ctx - n)}] (context {ctx})")
        if problems:
            self.events.emit("rejected", request.request_id or None, reason="; ".join(problems))
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "; ".join(problems))
        return mode, handoff

    def _decide(
        self, mode: str, prompt: list[int], max_tokens: int
    ) -> tuple[RouteDecision, dict[str, Choice], str, dict | None]:
        """The route, the worker of each pool it uses, the line the decision rested on (the chosen MD's; "": the
        one WAN) and the named lines' figures before the pick (None: one WAN): the MD first (pdd routes on the
        chosen MD's DRC hit, and on its line's estimate), then the RLD and P the route needs."""
        chosen: dict[str, Choice] = {}
        hit, line = 0, ""
        figures = self.pools.lines.record() if self.pools.lines.names else None
        if mode in ("pd-cross", "pdd"):
            hits = self._md_hits(prompt) if mode == "pdd" else {}
            kv = {md.name: (len(prompt) - hits.get(md.name, 0)) * self.kv_bytes_per_token for md in self.cfg.md}
            chosen["md"] = self.pools.choose("md", hits, kv, len(prompt) + max_tokens)
            hit, line = hits.get(chosen["md"].worker.name, 0), chosen["md"].worker.line
        lines = self.pools.lines
        decision = decide_route(
            mode,
            len(prompt),
            max_tokens,
            hit,
            self.kv_bytes_per_token,
            self.cfg.policy,
            lines.estimate(line),
            lines.view(line) if line in self.cfg.policy.lines else None,
        )
        if decision.route not in ENDS_AT_MD and "md" in chosen:
            self.pools.release(chosen.pop("md"))
        if decision.route != Route.P_MD:
            chosen["rld"] = self.pools.choose("rld", tokens=len(prompt) + max_tokens)  # as _open_stream takes
        if decision.route != Route.COLOCATED:
            chosen["p"] = self.pools.choose("p", self.pools.p_hits(prompt), tokens=len(prompt))  # as _prefill holds
        return decision, chosen, line, figures

    def _md_hits(self, prompt: list[int]) -> dict[str, int]:
        """MD name -> its expected DRC hit for prompt: the router's mirrors, or (drc_estimate: lookup) each MD
        asked (one WAN round trip; an MD that cannot answer counts as a miss)."""
        if self.cfg.policy.drc_estimate == "mirror":
            return self.pools.hits(prompt)
        hits = {}
        for md in self.cfg.md:
            try:
                hits[md.name] = (
                    self._stub(pdd_pb2_grpc.DecodeStub, md)
                    .Lookup(pdd_pb2.LookupRequest(prompt_tokens=prompt), timeout=SETUP_TIMEOUT_S)
                    .cached_tokens
                )
            except grpc.RpcError as err:
                self.events.emit(
                    "drc_lookup_failed", None, worker=md.name, reason=f"{err.code().name}: {err.details()}"
                )
        return hits


# Past the MD's own KV deadline, how long a drained request may still take to end.
DRAIN_MARGIN_S = 5.0


class _RequestRun:
    """One request in flight at the router: sessions, prefill, merged stream, cleanup."""

    def __init__(
        self,
        servicer: RouterServicer,
        rid: str,
        prompt: list[int],
        max_tokens: int,
        decision: RouteDecision,
        handoff: str,
        context,
        chosen: dict[str, Choice],
    ):
        self.s, self.cfg, self.rid = servicer, servicer.cfg, rid
        self.workers = {role: c.worker for role, c in chosen.items()}  # the P, RLD, MD this request uses
        self.prompt, self.max_tokens, self.decision, self.handoff = prompt, max_tokens, decision, handoff
        self.context = context
        self.queue: queue.Queue = queue.Queue()
        self.calls: list = []
        self.threads: list[threading.Thread] = []
        self.live = 0
        self.p_used = False
        self.merge = _Merge(max_tokens)
        self.first_error: grpc.StatusCode | None = None
        self.md_cached_tokens: int | None = None  # the MD's DRC hit as its session pinned it (Accepted)
        self.fell_back = False
        self.resumed = False  # the RLD took the request back from a failed MD (_resume_on_rld)
        self.final_source: str | None = None  # the stream that delivered the last token first
        self.md_end: str | None = None  # how the MD's stream ended (its end reason, or the RPC's code)

    def stream(self):
        self._start()
        deadline = time.monotonic() + REQUEST_TIMEOUT_S
        while not self.merge.complete:
            if self.live == 0 and self._can_fall_back():
                self._fall_back("; ".join(self.merge.notes) or "every worker stream ended")
            elif self.live == 0 and self._can_resume():
                self._resume_on_rld()
            if self.live == 0:
                self._fail(
                    self.first_error or grpc.StatusCode.UNAVAILABLE,
                    f"request {self.rid}: every worker "
                    "stream ended after "
                    f"{self.merge.next_index} of {self.max_tokens} tokens ({'; '.join(self.merge.notes)})",
                )
            try:
                item = self.queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self._fail(
                    grpc.StatusCode.DEADLINE_EXCEEDED, f"request {self.rid}: no completion in {REQUEST_TIMEOUT_S} s"
                )
            for tok in self._take(item):
                if tok.index == 0:
                    self.s.events.emit("first_token", self.rid, worker=tok.worker)
                yield pdd_pb2.GenerateEvent(token=tok)
        self.s.events.emit(
            "complete", self.rid, route=self.decision.route, duplicates=self.merge.duplicates, notes=self.merge.notes
        )
        if self.decision.use_drc and self.decision.route in ENDS_AT_MD and self.final_source == "md":
            out = [self.merge.seen[i] for i in range(self.max_tokens)]
            self._learn(self.prompt + out[:-1], "md_decoded")  # the MD's cache keeps every token with KV
        yield pdd_pb2.GenerateEvent(
            done=pdd_pb2.GenerateDone(
                request_id=self.rid,
                route=self.decision.route,
                finish_reason="length",
                duplicates=self.merge.duplicates,
                md_cached_tokens=self.decision.md_cached_tokens
                if self.md_cached_tokens is None
                else self.md_cached_tokens,
                notes=self.merge.notes,
            )
        )

    def _take(self, item) -> list[pdd_pb2.Token]:
        source, kind, payload = item
        if kind == "token":
            if payload.index == self.max_tokens - 1 and payload.index not in self.merge.seen:
                self.final_source = source
            return self.merge.add(payload)
        self.live -= 1
        if kind == "error":
            code, reason = payload
            self.first_error = self.first_error or code
            self.merge.notes.append(f"{source}: {reason}")
            self.s.events.emit("source_failed", self.rid, source=source, reason=reason)
        elif payload not in ("length", "handed_off"):
            self.merge.notes.append(f"{source} ended: {payload}")
        return []

    def _fail(self, code: grpc.StatusCode, message: str) -> None:
        self.s.events.emit("failed", self.rid, code=code.name, reason=message)
        self.context.abort(code, message)

    # ------------------------------------------------------------ setup per route

    def _decode_request(self, **kw) -> pdd_pb2.DecodeRequest:
        return pdd_pb2.DecodeRequest(request_id=self.rid, prompt_tokens=self.prompt, max_tokens=self.max_tokens, **kw)

    def _w(self, role: str) -> WorkerConfig:
        """The worker of a pool this request uses (picked now where the route did not need one: a fallback
        to the RLD of a P->MD request)."""
        if role not in self.workers:
            self.workers[role] = self.s.pools.choose(role).worker
        return self.workers[role]

    def _start(self) -> None:
        route = self.decision.route
        if route == Route.COLOCATED:
            # the RLD's own prefix cache spares the prefill what it computed before (a fair colocated baseline)
            local = self._decode_request(kv_source=pdd_pb2.KV_SOURCE_LOCAL, use_prefix_cache=True)
            self._open_stream("rld", self._w("rld"), local)
            return
        targets, p_name = [], self._w("p").name
        if route in ENDS_AT_MD:
            md = self._w("md")
            relay = self._w("rld").grpc_address if route == Route.P_RLD_MD else ""
            drc = self.decision.use_drc
            req = self._decode_request(use_prefix_cache=drc, relay_grpc=relay, prefill_worker=p_name)
            self._open_stream("md", md, req)
            targets.append(
                pdd_pb2.KVTarget(path="wan", kv_address=md.kv_address, drc_address=md.grpc_address if drc else "")
            )
        if route != Route.P_MD:
            rld, to_md = self._w("rld"), route == Route.P_RLD_MD
            self._open_stream(
                "rld",
                rld,
                self._decode_request(
                    handoff=HANDOFF_ENUM[self.handoff] if to_md else pdd_pb2.HANDOFF_NONE,
                    handoff_grpc=self._w("md").grpc_address if to_md else "",
                    handoff_kv=self._w("md").kv_address if to_md else "",
                    chunk_tokens=self.cfg.policy.chunk_tokens,
                    prefill_worker=p_name,
                ),
            )
            targets.insert(0, pdd_pb2.KVTarget(path="fast", kv_address=rld.kv_address, start_tokens=0))
        self._prefill(targets)

    def _open_stream(self, source: str, worker: WorkerConfig, req: pdd_pb2.DecodeRequest, offset: int = 0) -> None:
        """Start a Decode stream without waiting for its Accepted: waiting would put a round trip to the
        MD (a WAN one) before the prefill. KV or a DRC query that overtakes the call waits for the session
        at the worker (kvwire.EXPECT_WAIT_S, decode.SESSION_WAIT_S). offset: added to the stream's token
        indices (a resumed stream's prompt holds the request's first `offset` output tokens)."""
        call = self.s._stub(pdd_pb2_grpc.DecodeStub, worker).Decode(req, timeout=REQUEST_TIMEOUT_S)
        self.calls.append(call)
        self.live += 1
        tokens = len(req.prompt_tokens) + req.max_tokens  # the KV slots the session reserves there
        self.s.pools.take(worker, tokens)
        t = threading.Thread(
            target=self._pump,
            args=(source, worker, call, offset, tokens),
            name=f"pump-{source}-{self.rid}",
            daemon=True,
        )
        self.threads.append(t)
        t.start()

    def _pump(self, source: str, worker: WorkerConfig, call, offset: int, tokens: int) -> None:
        try:
            for ev in call:
                kind = ev.WhichOneof("kind")
                if kind == "token":
                    ev.token.index += offset
                    self.queue.put((source, "token", ev.token))
                elif kind == "accepted":
                    if source == "md":
                        self.md_cached_tokens = ev.accepted.cached_tokens
                    self.s.events.emit(
                        "session_open", self.rid, worker=worker.name, cached_tokens=ev.accepted.cached_tokens
                    )
                elif kind == "end":
                    self._ended(source, ev.end.reason)
                    self.queue.put((source, "end", ev.end.reason))
                    return
            self._ended(source, "closed")
            self.queue.put((source, "end", "closed"))
        except grpc.RpcError as err:
            self._ended(source, err.code().name.lower())
            if err.code() == grpc.StatusCode.CANCELLED:
                self.queue.put((source, "end", "cancelled"))
            else:
                if err.code() == grpc.StatusCode.UNAVAILABLE:
                    self.s.pools.failed(worker)
                self.queue.put((source, "error", (err.code(), f"{worker.name}: {err.code().name}: {err.details()}")))
        finally:
            self.s.pools.give_back(worker, tokens)

    def _ended(self, source: str, reason: str) -> None:
        if source == "md":
            self.md_end = reason

    def _prefill(self, targets: list) -> None:
        self.p_used, p = True, self._w("p")
        stub = self.s._stub(pdd_pb2_grpc.PrefillStub, p)
        try:
            with self.s.pools.holding(p, len(self.prompt)):
                reply = stub.Prefill(
                    pdd_pb2.PrefillRequest(
                        request_id=self.rid, prompt_tokens=self.prompt, targets=targets, use_prefix_cache=True
                    ),
                    timeout=REQUEST_TIMEOUT_S,
                )
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.UNAVAILABLE:
                self.s.pools.failed(p)
            if self._can_fall_back():
                self._fall_back(f"{p.name}: {err.code().name}: {err.details()}")
                return
            self._fail(err.code(), f"{p.name}: {err.details()}")
        # Token 0 (reply.first_token) reaches the client from the decode side once it holds the KV.
        self.s.events.emit("prefill_reply", self.rid, first_token=reply.first_token, t_ns_p=reply.t_ns)
        self.s.pools.prefilled(p, self.prompt)
        for line, w in [("", reply.wan), *reply.lines.items()]:
            if w.samples:
                self.s.pools.lines.report(
                    p.name, line, WanEstimate(w.rate_mbit, w.rtt_ms, w.min_rtt_ms, w.retrans_pct, w.samples)
                )

    def _can_fall_back(self) -> bool:
        """A pdd P->MD request with no token yet may still be served from cluster A."""
        return (
            self.decision.route == Route.P_MD
            and self.decision.use_drc
            and not self.fell_back
            and self.merge.next_index == 0
        )

    def _can_resume(self) -> bool:
        """A pdd request that ended at the MD, whose streams all ended after some tokens but before the last."""
        return (
            self.decision.use_drc
            and self.decision.route in ENDS_AT_MD
            and not self.resumed
            and 0 < self.merge.next_index < self.max_tokens
        )

    def _resume_on_rld(self) -> None:
        """The MD failed after it took over: the RLD recomputes the prompt and the n tokens the client has
        (by their IDs, as a token-ID handoff does, in one local prefill) and decodes the rest; its tokens
        keep their request indices (offset n). Nothing reaches the MD again, so its DRC learns nothing."""
        self.resumed = True
        n = self.merge.next_index
        done = [self.merge.seen[i] for i in range(n)]
        self.s.events.emit(
            "resumed_on_rld", self.rid, from_index=n, reason="; ".join(self.merge.notes) or "the MD's stream ended"
        )
        req = pdd_pb2.DecodeRequest(
            request_id=self.rid,
            prompt_tokens=self.prompt + done,
            max_tokens=self.max_tokens - n,
            kv_source=pdd_pb2.KV_SOURCE_LOCAL,
            use_prefix_cache=True,
        )
        self._open_stream("rld", self._w("rld"), req, offset=n)

    def _fall_back(self, reason: str) -> None:
        """The WAN target failed: drop the MD's session, prefill again (P's prefix cache holds the prompt)
        and let the RLD decode the request to the end."""
        self.fell_back = True
        self.s.events.emit(
            "route_fallback", self.rid, from_route=self.decision.route, to_route=Route.P_RLD_FALLBACK, reason=reason
        )
        self.decision = replace(self.decision, route=Route.P_RLD_FALLBACK)
        for call in self.calls:
            call.cancel()
        rld = self._w("rld")
        self._open_stream(
            "rld", rld, self._decode_request(handoff=pdd_pb2.HANDOFF_NONE, prefill_worker=self._w("p").name)
        )
        self._prefill([pdd_pb2.KVTarget(path="fast", kv_address=rld.kv_address, start_tokens=0)])

    def cleanup(self) -> None:
        """Cancel every stream still open and P's transfers still in flight; join the pumps.

        Exception: a P->RLD->MD request the RLD finished alone still ends at the MD
        (PDD.md: every pipeline ends at the MD, so its DRC stays aligned with P's):
        the WAN copy and the MD's session run to their own end, drained in the background
        (the RLD gives the MD its output to recompute: RelayOutput), and the mirror learns the
        sequence only once the MD's session ends having cached it.
        """
        if self.merge.complete and self.decision.route == Route.P_RLD_MD:
            threading.Thread(target=self._drain_to_md, name=f"drain-{self.rid}", daemon=True).start()
            return
        self._cancel_all()

    def _drain_to_md(self) -> None:
        deadline = time.monotonic() + self.cfg.decode.kv_wait_ms / 1000 + DRAIN_MARGIN_S
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        if self.decision.use_drc and self.md_end == "relay_absorbed":
            # The MD imported the prompt KV and recomputed the output the RLD sent it (RelayOutput): it
            # caches prompt + output, every token with KV.
            self._learn(self.prompt + [self.merge.seen[i] for i in range(self.max_tokens)], "md_absorbed_relay")
        elif self.decision.use_drc and self.md_end == "relay_done":
            # The MD imported the prompt KV, then learnt the relay had finished without its output: it
            # caches the prompt's whole blocks, and nothing the RLD generated.
            self._learn(self.prompt, "md_holds_prompt")
        self._cancel_all()  # whatever is still open past the MD's own deadline

    def _learn(self, tokens: list[int], cause: str) -> None:
        """Tell the DRC mirror what the MD's cache now holds (only what it really does, when it does)."""
        self.s.pools.mirrors[self._w("md").name].insert(tokens)
        self.s.events.emit("drc_learned", self.rid, tokens=len(tokens), cause=cause)

    def _cancel_all(self) -> None:
        for call in self.calls:
            call.cancel()
        if self.p_used:
            try:
                self.s._stub(pdd_pb2_grpc.PrefillStub, self._w("p")).Cancel(
                    pdd_pb2.CancelRequest(request_id=self.rid), timeout=2.0
                )
            except grpc.RpcError as err:
                self.s.events.emit("cancel_failed", self.rid, worker=self._w("p").name, reason=err.code().name)
        for t in self.threads:
            t.join(5)


def build(cfg: DeploymentConfig, worker: WorkerConfig) -> RoleServer:
    """The router's server, ready to start."""
    events = event_log(cfg, worker, "router")
    servicer = RouterServicer(cfg, events)

    def on_stop() -> None:
        servicer.close()
        events.close()

    return RoleServer(
        cfg,
        worker,
        "router",
        lambda s: pdd_pb2_grpc.add_RouterServicer_to_server(servicer, s),
        StatsSource(sessions=lambda: len(servicer._rids)),
        on_stop,
    )


def main(argv: list[str] | None = None) -> int:
    return role_main("router", build, "router", argv)


if __name__ == "__main__":
    raise SystemExit(main())
