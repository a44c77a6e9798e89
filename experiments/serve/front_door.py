"""The OpenAI-compatible front door of `pddlab serve`: HTTP in the client host, the router's gRPC behind it.

Responsible for: `/v1/completions` and `/v1/chat/completions` (streamed as server-sent events, or
whole), `/v1/models`, `/health` and `/metrics` (Prometheus, vLLM's metric names where one exists, the
testbed's own beside them); text <-> token IDs with the repo's tokenizer (Hugging Face `tokenizers`
format, experiments/tokenizers/<model>/, off the event loop), the PDD mode per request (body field `mode`,
header `X-PDD-Mode`, else the default), a deadline on the router's silence, the headers of a stream held until
its first token (a refusal before it is an HTTP status), a drain at SIGTERM, and one record per request, whatever
became of it, in the load generator's client.jsonl format (experiments.rundir.clientlog), so the session's
directory is analysed like a run's.
Not responsible for: what is let in (experiments.serve.admission: body checks, the bound on requests in flight,
error statuses), serving (the router and the roles), or bringing anything up (experiments.serve.session).

aiohttp (a maintained HTTP stack with SSE-friendly streaming) and prometheus_client serve; decoding is
greedy, so sampling parameters other than their greedy values are refused, not ignored.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import threading
import time
import uuid
from pathlib import Path

import grpc
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from tokenizers import Tokenizer

from experiments.rundir import clientlog
from experiments.serve import admission
from experiments.serve.admission import ApiError, chat_prompt, check_fields
from experiments.rundir.clientlog import ClientRecord
from workers.proto import pdd_pb2, pdd_pb2_grpc
from workers.roles.config import MODES
from workers.roles.routing import Route

log = logging.getLogger(__name__)
LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 60.0, 120.0)
MAX_IN_FLIGHT = 64  # below the router's bound on calls (its grpc_threads, 80 by default): the door refuses first
ROUTER_IDLE_S = 60.0  # longer than the roles' own waits (kv_wait_ms 30 s): a router this silent is not coming back
DRAIN_S = 5.0  # at SIGTERM, requests in flight get this long to end before they are cancelled (and recorded)
CLIENT_GONE = "CANCELLED: the client closed the connection"
DOOR_STOPPED = "CANCELLED: the front door stopped"


class Metrics:
    """The front door's Prometheus registry: vLLM's names, plus pddlab's route, handoff and fallback counts."""

    def __init__(self, model: str):
        r = self.registry = CollectorRegistry()
        lab = ["model_name"]
        self.model = model
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds", "TTFT at the front door", lab, registry=r, buckets=LATENCY_BUCKETS
        )
        self.tpot = Histogram(
            "vllm:time_per_output_token_seconds",
            "mean time per output token after the first",
            lab,
            registry=r,
            buckets=LATENCY_BUCKETS,
        )
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "end to end", lab, registry=r, buckets=LATENCY_BUCKETS)
        self.running = Gauge("vllm:num_requests_running", "requests in flight at the front door", lab, registry=r)
        self.limit = Gauge("pddlab:admission_limit", "requests the front door admits at once now", registry=r)
        self.limit_cuts = Counter("pddlab:admission_limit_cuts", "times the roles' TTFT cut the limit", registry=r)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "prompt tokens of completed requests", lab, registry=r)
        self.gen_tokens = Counter("vllm:generation_tokens", "generated tokens of completed requests", lab, registry=r)
        self.success = Counter("vllm:request_success", "completed requests", [*lab, "finished_reason"], registry=r)
        self.kv_usage = Gauge(
            "vllm:kv_cache_usage_perc", "share of a worker's KV blocks in use (0-1)", ["worker"], registry=r
        )
        self.worker_sessions = Gauge(
            "pddlab:worker_sessions", "decode sessions open at a worker", ["worker"], registry=r
        )
        self.routes = Counter("pddlab:requests_by_route", "completed requests by route", ["route"], registry=r)
        self.handoffs = Counter("pddlab:handoffs", "requests whose tokens moved from the RLD to the MD", registry=r)
        self.fallbacks = Counter(
            "pddlab:fallbacks", "requests the router re-routed or resumed (done notes)", registry=r
        )
        self.failed = Counter("pddlab:requests_failed", "requests that ended with an error", ["code"], registry=r)


class FrontDoor:
    """One served model: the tokenizer, the router's channel, the metrics, the request log.

    max_in_flight: requests served at once (past it: 429), the ceiling when ttft_target_s is given: then the
    limit follows the roles' TTFT from start_in_flight (admission.Gate) and a request past it waits up to
    ttft_target_s for a place; router_idle_s: the longest wait for the router's next message (s) before the
    request fails DEADLINE_EXCEEDED."""

    def __init__(
        self,
        router: str,
        tokenizer_dir: Path,
        model: str,
        context: int,
        default_mode: str,
        log_path: Path,
        workers: dict[str, str],
        variant: str,
        max_in_flight: int = MAX_IN_FLIGHT,
        router_idle_s: float = ROUTER_IDLE_S,
        ttft_target_s: float | None = None,
        start_in_flight: int | None = None,
    ):
        self.tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
        longest = max(len(t) for t in self.tok.get_vocab(with_added_tokens=True))
        self.max_prompt_chars = admission.max_prompt_chars(longest, context)
        self.model, self.context, self.default_mode, self.variant = model, context, default_mode, variant
        self.gate = admission.Gate(max_in_flight, start_in_flight, ttft_target_s, wait_s=ttft_target_s or 0.0)
        self.router_idle_s = router_idle_s
        self.router = router
        self.channel = grpc.aio.insecure_channel(router)
        self.stub = pdd_pb2_grpc.RouterStub(self.channel)
        self.metrics = Metrics(model)
        self.metrics.limit.set(self.gate.admits)
        self.workers = workers
        self._log = open(log_path, "a", buffering=1)
        self._log_lock = threading.Lock()
        self.t0_ns = time.monotonic_ns()
        self.n = 0

    # ---------------------------------------------------------------- parsing

    async def _encode(self, text: str) -> list[int]:
        """text's token ids, tokenized off the event loop (encode_batch lets go of the GIL; encode does not);
        text that cannot fit the context is refused before."""
        if len(text) > self.max_prompt_chars:
            raise admission.context_exceeded(self.context, f"; a prompt of {len(text)} characters is far over it")
        (enc,) = await asyncio.to_thread(self.tok.encode_batch, [text])
        return enc.ids

    async def _prompt_ids(self, body: dict, chat: bool) -> list[int]:
        if chat:
            return await self._encode(chat_prompt(body.get("messages")))
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            return await self._encode(prompt)
        if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
            if len(prompt) >= self.context:
                raise admission.context_exceeded(self.context, f"; the prompt has {len(prompt)}")
            if any(not 0 <= t < self.tok.get_vocab_size() for t in prompt):
                raise ApiError(400, f"a token id outside [0, {self.tok.get_vocab_size()})", "prompt")
            return list(prompt)
        raise ApiError(400, "prompt must be a string, one string in a list, or a list of token ids", "prompt")

    async def _request(self, body: dict, chat: bool, header_mode: str | None) -> tuple[list[int], int, str, bool, bool]:
        check_fields(body)
        if body.get("model", self.model) != self.model:
            raise ApiError(
                404,
                f"The model {body.get('model')!r} does not exist; served: {self.model!r}",
                "model",
                "model_not_found",
            )
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens", 16))
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise ApiError(400, f"max_tokens must be an integer >= 1, got {str(max_tokens)[:40]}", "max_tokens")
        mode = body.get("mode") or header_mode or self.default_mode
        if mode not in MODES:
            raise ApiError(400, f"mode {mode!r} not in {list(MODES)}", "mode")
        ids = await self._prompt_ids(body, chat)
        if not ids:
            raise ApiError(400, "the prompt is empty", "prompt")
        if len(ids) >= self.context:
            raise admission.context_exceeded(self.context, f"; the prompt has {len(ids)}")
        if len(ids) + max_tokens > self.context:
            raise admission.context_exceeded(
                self.context, f": {len(ids)} in the prompt + max_tokens={max_tokens} exceed it", "max_tokens"
            )
        stream = body.get("stream", False)
        opts = body.get("stream_options") or {}
        return ids, max_tokens, mode, stream, bool(stream and opts.get("include_usage"))

    # ---------------------------------------------------------------- serving

    async def handle(self, request: web.Request, chat: bool) -> web.StreamResponse:
        """One request, whatever becomes of it; each one admitted or refused is recorded once, at its end."""
        self.n += 1
        rid = f"serve.{self.n:05d}-{uuid.uuid4().hex[:6]}"
        t_arrive_ns = time.monotonic_ns()  # a record's t_send: the client's TTFT counts its wait for a place
        if not await self.gate.enter():
            rec = self._record(rid, [], 0, request.headers.get("X-PDD-Mode") or self.default_mode, t_arrive_ns)
            rec.issued, rec.error = False, f"REFUSED: {self.gate.admits} requests in flight at the front door"
            self._finish(rec, t_arrive_ns)
            return admission.too_busy(self.gate).response()
        rec, t_admit_ns = None, time.monotonic_ns()
        self.metrics.running.labels(self.model).inc()
        try:
            try:
                body = admission.parse_body(await request.read())
                ids, max_tokens, mode, stream, usage_chunk = await self._request(
                    body, chat, request.headers.get("X-PDD-Mode")
                )
            except ApiError as err:
                return err.response()
            kind = "chat.completion" if chat else "text_completion"
            head = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{rid}", "created": int(time.time()), "model": self.model}
            rec = self._record(rid, ids, max_tokens, mode, t_arrive_ns)
            if stream:
                return await self._stream(request, rec, head, kind, usage_chunk)
            return await self._whole(rec, head, kind)
        except ConnectionError:  # the client went away before its answer was written
            if rec is not None:
                rec.error = rec.error or CLIENT_GONE
            return web.Response(status=499)  # nobody reads it
        except asyncio.CancelledError:  # the door stops (SIGTERM) past its drain time
            if rec is not None:
                rec.error = rec.error or DOOR_STOPPED
            raise
        except Exception as err:
            log.exception("request %s", rid)
            if rec is not None:
                rec.error = f"INTERNAL: {err!r}"
            return ApiError(500, f"the front door failed: {err!r}", code="internal_error").response()
        finally:
            self.gate.leave()
            self.metrics.running.labels(self.model).dec()
            if rec is not None:
                self._finish(rec, t_admit_ns)

    def _record(self, rid: str, ids: list[int], max_tokens: int, mode: str, t_arrive_ns: int) -> ClientRecord:
        """The request's record, sent when it arrived (its wait for a place counts in the client's TTFT)."""
        rec = clientlog.new_record(
            rid.removeprefix("serve."), self.variant, mode, rid, 1, "trace", max_tokens, ids, self.t0_ns, router_id=rid
        )
        rec.t_send_ns = t_arrive_ns
        return rec

    async def _tokens(self, rec: ClientRecord):
        """The router's tokens as they come (index order), recorded in rec with its done message; a failed call
        leaves its `CODE: details` in rec.error. Closing the generator early ends the router's call."""
        call = self.stub.Generate(
            pdd_pb2.GenerateRequest(
                request_id=rec.router_id, prompt_tokens=rec.prompt, max_tokens=rec.max_tokens, mode=rec.mode
            )
        )
        try:
            while (ev := await asyncio.wait_for(call.read(), self.router_idle_s)) is not grpc.aio.EOF:
                clientlog.add_event(rec, ev)
                if ev.WhichOneof("kind") == "token":
                    yield ev.token.token
            if rec.done is None:
                rec.error = "UNKNOWN: the router's stream ended without its done message"
        except TimeoutError:
            rec.error = f"DEADLINE_EXCEEDED: the router sent nothing for {self.router_idle_s:g} s"
        except grpc.aio.AioRpcError as err:
            rec.error = f"{err.code().name}: {err.details()}"
        finally:
            call.cancel()  # no-op once it ended; else the router's call ends with ours

    def _finish(self, rec: ClientRecord, t_admit_ns: int) -> None:
        rec.t_done_ns = time.monotonic_ns()
        with self._log_lock:
            self._log.write(clientlog.line(rec))
        m, lab = self.metrics, self.model
        self._follow(rec, t_admit_ns)
        if rec.error is not None:
            m.failed.labels(rec.error.split(":")[0]).inc()
            return
        ts = [t.t_recv_ns for t in rec.tokens]
        n = len(ts)
        if n:
            m.ttft.labels(lab).observe((ts[0] - rec.t_send_ns) / 1e9)
        if n > 1:
            m.tpot.labels(lab).observe((ts[-1] - ts[0]) / 1e9 / (n - 1))
        m.e2e.labels(lab).observe((rec.t_done_ns - rec.t_send_ns) / 1e9)
        m.prompt_tokens.labels(lab).inc(rec.prompt_tokens)
        m.gen_tokens.labels(lab).inc(n)
        m.success.labels(lab, "length").inc()
        route = rec.done.route if rec.done else None
        m.routes.labels(route or "none").inc()
        workers = [t.worker for t in rec.tokens]
        if any(a.startswith("rld") and b.startswith("md") for a, b in zip(workers, workers[1:])):
            m.handoffs.inc()
        if (rec.done and rec.done.notes) or route == Route.P_RLD_FALLBACK:
            m.fallbacks.inc()

    def _follow(self, rec: ClientRecord, t_admit_ns: int) -> None:
        """The admission limit learns from an admitted request: its TTFT (admission to first token), or a failure
        for want of capacity (the roles refused it, or it timed out)."""
        if not rec.issued:
            return
        now_s, cuts = rec.t_done_ns / 1e9, self.gate.cuts
        if rec.tokens:
            self.gate.served((rec.tokens[0].t_recv_ns - t_admit_ns) / 1e9, now_s)
        elif rec.error and rec.error.split(":", 1)[0] in ("RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED"):
            self.gate.overloaded(now_s)
        self.metrics.limit.set(self.gate.admits)
        self.metrics.limit_cuts.inc(self.gate.cuts - cuts)

    def _usage(self, rec: ClientRecord) -> dict:
        n = len(rec.tokens)
        return {"prompt_tokens": rec.prompt_tokens, "completion_tokens": n, "total_tokens": rec.prompt_tokens + n}

    def _text(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=False)

    async def _whole(self, rec: ClientRecord, head: dict, kind: str) -> web.Response:
        tokens = self._tokens(rec)
        try:
            ids = [t async for t in tokens]
        finally:
            await tokens.aclose()
        if rec.error is not None:
            return admission.status_of(rec.error).response()
        text = self._text(ids)
        choice = {"index": 0, "finish_reason": "length", "logprobs": None}
        choice.update(
            {"message": {"role": "assistant", "content": text}} if kind == "chat.completion" else {"text": text}
        )
        return web.json_response({**head, "object": kind, "choices": [choice], "usage": self._usage(rec)})

    async def _stream(self, request, rec: ClientRecord, head: dict, kind: str, usage_chunk: bool) -> web.StreamResponse:
        """Server-sent events; the headers wait for the first token, so a request the roles refuse or fail before
        it gets its HTTP status (429, 503, 504), not a 200 stream with no content."""
        tokens = self._tokens(rec)
        try:
            first = await anext(tokens, None)
            if first is None:
                return admission.status_of(rec.error or "UNKNOWN: no token").response()
            return await self._events(request, rec, head, kind, usage_chunk, first, tokens)
        finally:
            await tokens.aclose()  # a client gone mid-stream: the router's call ends here

    async def _events(self, request, rec, head: dict, kind: str, usage_chunk: bool, first: int, tokens):
        chat = kind == "chat.completion"
        obj = "chat.completion.chunk" if chat else "text_completion"
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)

        async def send(payload: dict) -> None:
            await resp.write(f"data: {json.dumps(payload)}\n\n".encode())

        def chunk(delta: str | None = None, finish: str | None = None, role: bool = False) -> dict:
            if chat:
                d = {"role": "assistant", "content": ""} if role else ({} if delta is None else {"content": delta})
                c = {"index": 0, "delta": d, "finish_reason": finish, "logprobs": None}
            else:
                c = {"index": 0, "text": delta or "", "finish_reason": finish, "logprobs": None}
            return {**head, "object": obj, "choices": [c], **({"usage": None} if usage_chunk else {})}

        if chat:
            await send(chunk(role=True))
        ids, shown = [], ""

        async def emit(tok: int) -> None:
            nonlocal shown
            ids.append(tok)
            text = self._text(ids)
            if not text.endswith("\ufffd"):  # else half a UTF-8 character: wait for the rest
                await send(chunk(text[len(shown) :]))
                shown = text

        await emit(first)
        async for tok in tokens:
            await emit(tok)
        if rec.error is not None:  # failed mid-stream: the status is sent, the error goes in the stream
            err = admission.status_of(rec.error)
            await send({"error": {"message": err.message, "type": "server_error", "param": None, "code": err.code}})
        else:
            tail = self._text(ids)[len(shown) :]
            await send(chunk(tail or (None if chat else ""), finish="length"))
            if usage_chunk:
                await send({**head, "object": obj, "choices": [], "usage": self._usage(rec)})
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    def close(self) -> None:
        with self._log_lock:
            self._log.close()

    # ---------------------------------------------------------------- models, health, metrics

    async def models(self, _request) -> web.Response:
        card = {
            "id": self.model,
            "object": "model",
            "created": int(self.t0_ns // 10**9),
            "owned_by": "pddlab",
            "root": self.model,
            "max_model_len": self.context,
        }
        return web.json_response({"object": "list", "data": [card]})

    async def health(self, _request) -> web.Response:
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        try:
            reply = await health_pb2_grpc.HealthStub(self.channel).Check(health_pb2.HealthCheckRequest(), timeout=2)
        except grpc.aio.AioRpcError as err:
            return web.json_response({"status": "unavailable", "router": err.code().name}, status=503)
        ok = reply.status == health_pb2.HealthCheckResponse.SERVING
        return web.json_response({"status": "ok" if ok else "not serving"}, status=200 if ok else 503)

    async def metrics_page(self, _request) -> web.Response:
        for name, address in self.workers.items():
            try:
                async with grpc.aio.insecure_channel(address) as ch:
                    s = await pdd_pb2_grpc.WorkerStub(ch).Stats(pdd_pb2.StatsRequest(), timeout=2)
            except grpc.aio.AioRpcError:
                continue  # a worker that does not answer keeps its last figures
            used = 1 - s.free_blocks / s.total_blocks if s.total_blocks else 0.0
            self.metrics.kv_usage.labels(name).set(used)
            self.metrics.worker_sessions.labels(name).set(s.sessions)
        return web.Response(body=generate_latest(self.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    def app(self) -> web.Application:
        async def completions(request):
            return await self.handle(request, chat=False)

        async def chat_completions(request):
            return await self.handle(request, chat=True)

        a = web.Application()
        a.router.add_post("/v1/completions", completions)
        a.router.add_post("/v1/chat/completions", chat_completions)
        a.router.add_get("/v1/models", self.models)
        a.router.add_get("/health", self.health)
        a.router.add_get("/metrics", self.metrics_page)
        return a


async def _serve(door: FrontDoor, listen: list[str], unix: str | None, drain_s: float) -> None:
    """Serve until SIGTERM or SIGINT; then stop listening, give the requests in flight drain_s to end, cancel
    the rest (each is recorded) and return."""
    runner = web.AppRunner(door.app(), access_log=None, shutdown_timeout=drain_s)
    await runner.setup()
    for addr in listen:
        host, port = addr.rsplit(":", 1)
        await web.TCPSite(runner, host, int(port)).start()
    if unix:
        await web.UnixSite(runner, unix).start()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    print("front door ready", flush=True)  # the parent waits for this line
    try:
        await stop.wait()
        log.info("stopping: %d requests in flight get %g s", door.gate.in_flight, drain_s)
    finally:
        await runner.cleanup()
        await door.channel.close()
        door.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="pddlab serve's front door (run in the client host)")
    ap.add_argument("--router", required=True)
    ap.add_argument("--tokenizer", required=True, type=Path)
    ap.add_argument("--model", required=True, help="the served model's name")
    ap.add_argument("--context", required=True, type=int)
    ap.add_argument("--mode", default="pdd")
    ap.add_argument("--variant", default="serve")
    ap.add_argument("--log", required=True, type=Path, help="client.jsonl to append every request to")
    ap.add_argument("--listen", action="append", default=[], help="HOST:PORT (repeatable)")
    ap.add_argument("--unix", default=None, help="also listen on this UNIX socket")
    ap.add_argument("--worker", action="append", default=[], metavar="NAME=ADDR", help="a worker for /metrics")
    ap.add_argument(
        "--max-in-flight", type=_positive(int), default=MAX_IN_FLIGHT, help="requests at once; past it: 429"
    )
    ap.add_argument(
        "--ttft-target-ms",
        type=_positive(float),
        default=None,
        help="the TTFT the roles should keep (ms): the limit follows it (AIMD) up to --max-in-flight, and a "
        "request past the limit waits as long for a place (default: a fixed limit, --max-in-flight, no wait)",
    )
    ap.add_argument(
        "--start-in-flight", type=_positive(int), default=None, help="with --ttft-target-ms, the first limit"
    )
    ap.add_argument(
        "--router-idle-s",
        type=_positive(float),
        default=ROUTER_IDLE_S,
        help="longest wait for the router's next message (s); past it the request fails with 504",
    )
    ap.add_argument(
        "--drain-s", type=_positive(float), default=DRAIN_S, help="at SIGTERM, time for requests in flight (s)"
    )
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    workers = dict(w.split("=", 1) for w in args.worker)

    async def go() -> None:
        door = FrontDoor(
            args.router,
            args.tokenizer,
            args.model,
            args.context,
            args.mode,
            args.log,
            workers,
            args.variant,
            max_in_flight=args.max_in_flight,
            router_idle_s=args.router_idle_s,
            ttft_target_s=args.ttft_target_ms / 1000 if args.ttft_target_ms else None,
            start_in_flight=args.start_in_flight,
        )
        await _serve(door, args.listen, args.unix, args.drain_s)

    asyncio.run(go())


def _positive(kind):
    def parse(text: str):
        value = kind(text)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value

    return parse


if __name__ == "__main__":
    main()
