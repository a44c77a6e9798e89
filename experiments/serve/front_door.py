"""The OpenAI-compatible front door of `pddlab serve`: HTTP in the client host, the router's gRPC behind it.

Responsible for: `/v1/completions` and `/v1/chat/completions` (streamed as server-sent events, or
whole), `/v1/models`, `/health` and `/metrics` (Prometheus, vLLM's metric names where one exists, the
testbed's own beside them); text <-> token IDs with the repo's tokenizer (Hugging Face `tokenizers`
format, experiments/tokenizers/<model>/), OpenAI-style error bodies for bad input, the PDD mode per
request (body field `mode`, header `X-PDD-Mode`, else the default), and one record per request in the
load generator's client.jsonl format (experiments.rundir.clientlog), so the session's directory is analysed like
a run's.
Not responsible for: serving (the router and the roles), or bringing anything up (experiments.serve.session).

aiohttp (a maintained HTTP stack with SSE-friendly streaming) and prometheus_client serve; decoding is
greedy, so sampling parameters other than their greedy values are refused, not ignored.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
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
from experiments.rundir.clientlog import ClientRecord
from workers.proto import pdd_pb2, pdd_pb2_grpc
from workers.roles.config import MODES
from workers.roles.routing import Route

log = logging.getLogger(__name__)
LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 60.0, 120.0)
# Body fields a client may send, with the only values greedy decoding honours (None = any value).
ALLOWED = {
    "model": None,
    "max_tokens": None,
    "max_completion_tokens": None,
    "stream": None,
    "stream_options": None,
    "mode": None,
    "user": None,
    "seed": None,
    "ignore_eos": None,  # there is no end-of-sequence: every request runs to max_tokens
    "temperature": (0, 0.0),
    "n": (1,),
    "best_of": (1,),
    "stop": (None, [], ""),
    "logprobs": (None, False, 0),
    "top_logprobs": (None, 0),
    "echo": (False,),
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
}


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def response(self) -> web.Response:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        body = {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}
        return web.json_response(body, status=self.status)


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


def _check_fields(body: dict) -> None:
    for key, value in body.items():
        if key in ("prompt", "messages"):
            continue
        if key not in ALLOWED:
            raise ApiError(400, f"unsupported parameter: {key!r}", key, "unsupported_parameter")
        allowed = ALLOWED[key]
        if allowed is not None and value not in allowed:
            raise ApiError(
                400, f"{key}={value!r} is not supported (greedy decoding: {allowed[0]!r})", key, "unsupported_parameter"
            )


def chat_prompt(messages) -> str:
    """The chat template: one `<|role|>` line per message, then the assistant's turn."""
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list", "messages")
    parts = []
    for i, m in enumerate(messages):
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):  # content parts: the text ones
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(content, str):
            raise ApiError(400, f"messages[{i}] needs a string role and text content", f"messages[{i}]")
        parts.append(f"<|{m['role']}|>\n{content}\n")
    return "".join(parts) + "<|assistant|>\n"


class FrontDoor:
    """One served model: the tokenizer, the router's channel, the metrics, the request log."""

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
    ):
        self.tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
        self.model, self.context, self.default_mode, self.variant = model, context, default_mode, variant
        self.router = router
        self.channel = grpc.aio.insecure_channel(router)
        self.stub = pdd_pb2_grpc.RouterStub(self.channel)
        self.metrics = Metrics(model)
        self.workers = workers
        self._log = open(log_path, "a", buffering=1)
        self._log_lock = threading.Lock()
        self.t0_ns = time.monotonic_ns()
        self.n = 0

    # ---------------------------------------------------------------- parsing

    def _request(self, body: dict, chat: bool, header_mode: str | None) -> tuple[list[int], int, str, bool, bool]:
        _check_fields(body)
        if body.get("model", self.model) != self.model:
            raise ApiError(
                404,
                f"The model {body.get('model')!r} does not exist; served: {self.model!r}",
                "model",
                "model_not_found",
            )
        if chat:
            text = chat_prompt(body.get("messages"))
            ids = self.tok.encode(text).ids
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
                prompt = prompt[0]
            if isinstance(prompt, str):
                ids = self.tok.encode(prompt).ids
            elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
                ids = list(prompt)
                if any(not 0 <= t < self.tok.get_vocab_size() for t in ids):
                    raise ApiError(400, f"a token id outside [0, {self.tok.get_vocab_size()})", "prompt")
            else:
                raise ApiError(400, "prompt must be a string, one string in a list, or a list of token ids", "prompt")
        if not ids:
            raise ApiError(400, "the prompt is empty", "prompt")
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens", 16))
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise ApiError(400, f"max_tokens must be an integer >= 1, got {max_tokens!r}", "max_tokens")
        if len(ids) >= self.context:
            raise ApiError(
                400,
                f"This model's maximum context length is {self.context} tokens; the prompt has {len(ids)}",
                "prompt",
                "context_length_exceeded",
            )
        if len(ids) + max_tokens > self.context:
            raise ApiError(
                400,
                f"This model's maximum context length is {self.context} tokens: {len(ids)} in the "
                f"prompt + max_tokens={max_tokens} exceed it",
                "max_tokens",
                "context_length_exceeded",
            )
        mode = body.get("mode") or header_mode or self.default_mode
        if mode not in MODES:
            raise ApiError(400, f"mode {mode!r} not in {list(MODES)}", "mode")
        stream = body.get("stream", False)
        opts = body.get("stream_options") or {}
        usage_chunk = bool(stream and isinstance(opts, dict) and opts.get("include_usage"))
        return ids, max_tokens, mode, bool(stream), usage_chunk

    # ---------------------------------------------------------------- serving

    async def handle(self, request: web.Request, chat: bool) -> web.StreamResponse:
        try:
            try:
                body = await request.json()
            except (json.JSONDecodeError, UnicodeDecodeError) as err:
                raise ApiError(400, f"the body is not valid JSON: {err}") from None
            if not isinstance(body, dict):
                raise ApiError(400, "the body must be a JSON object")
            ids, max_tokens, mode, stream, usage_chunk = self._request(body, chat, request.headers.get("X-PDD-Mode"))
        except ApiError as err:
            return err.response()
        self.n += 1
        rid = f"serve.{self.n:05d}-{uuid.uuid4().hex[:6]}"
        kind = "chat.completion" if chat else "text_completion"
        head = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{rid}", "created": int(time.time()), "model": self.model}
        rec = self._record(rid, ids, max_tokens, mode)
        self.metrics.running.labels(self.model).inc()
        try:
            if stream:
                return await self._stream(request, rec, head, kind, usage_chunk)
            return await self._whole(rec, head, kind)
        finally:
            self.metrics.running.labels(self.model).dec()

    def _record(self, rid: str, ids: list[int], max_tokens: int, mode: str) -> ClientRecord:
        return clientlog.new_record(
            rid.removeprefix("serve."), self.variant, mode, rid, 1, "trace", max_tokens, ids, self.t0_ns, router_id=rid
        )

    async def _tokens(self, rec: ClientRecord):
        """The router's tokens as they come (index order), recorded; the done message lands in rec."""
        call = self.stub.Generate(
            pdd_pb2.GenerateRequest(
                request_id=rec.router_id, prompt_tokens=rec.prompt, max_tokens=rec.max_tokens, mode=rec.mode
            )
        )
        try:
            async for ev in call:
                clientlog.add_event(rec, ev)
                if ev.WhichOneof("kind") == "token":
                    yield ev.token.token
        except grpc.aio.AioRpcError as err:
            rec.error = f"{err.code().name}: {err.details()}"
        except (asyncio.CancelledError, GeneratorExit):  # the client went away: so does the router's call
            rec.error = rec.error or "CANCELLED: the client closed the connection"
            call.cancel()
            raise
        finally:
            self._finish(rec)

    def _finish(self, rec: ClientRecord) -> None:
        rec.t_done_ns = time.monotonic_ns()
        with self._log_lock:
            self._log.write(clientlog.line(rec))
        m, lab = self.metrics, self.model
        if rec.error is not None:
            m.failed.labels(rec.error.split(":")[0]).inc()
            return
        ts = [t.t_recv_ns for t in rec.tokens]
        n = len(ts)
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

    def _usage(self, rec: ClientRecord) -> dict:
        n = len(rec.tokens)
        return {"prompt_tokens": rec.prompt_tokens, "completion_tokens": n, "total_tokens": rec.prompt_tokens + n}

    def _text(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=False)

    async def _whole(self, rec: ClientRecord, head: dict, kind: str) -> web.Response:
        ids = [t async for t in self._tokens(rec)]
        if rec.error is not None:
            return ApiError(503, f"the request failed in the testbed: {rec.error}", code="serving_failed").response()
        text = self._text(ids)
        choice = {"index": 0, "finish_reason": "length", "logprobs": None}
        choice.update(
            {"message": {"role": "assistant", "content": text}} if kind == "chat.completion" else {"text": text}
        )
        return web.json_response({**head, "object": kind, "choices": [choice], "usage": self._usage(rec)})

    async def _stream(self, request, rec: ClientRecord, head: dict, kind: str, usage_chunk: bool) -> web.StreamResponse:
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
        tokens = self._tokens(rec)
        try:
            async for tok in tokens:
                ids.append(tok)
                text = self._text(ids)
                if text.endswith("\ufffd"):  # half a UTF-8 character: wait for the rest
                    continue
                await send(chunk(text[len(shown) :]))
                shown = text
        except ConnectionError:  # the client closed the stream: end the router's call, record it failed
            await tokens.aclose()
            raise
        if rec.error is not None:
            await send(
                {
                    "error": {
                        "message": f"the request failed in the testbed: {rec.error}",
                        "type": "server_error",
                        "param": None,
                        "code": "serving_failed",
                    }
                }
            )
        else:
            rest = self._text(ids)[len(shown) :]
            await send(chunk(rest or (None if chat else ""), finish="length"))
            if usage_chunk:
                await send({**head, "object": obj, "choices": [], "usage": self._usage(rec)})
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

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
        a = web.Application()
        a.router.add_post("/v1/completions", lambda r: self.handle(r, chat=False))
        a.router.add_post("/v1/chat/completions", lambda r: self.handle(r, chat=True))
        a.router.add_get("/v1/models", self.models)
        a.router.add_get("/health", self.health)
        a.router.add_get("/metrics", self.metrics_page)
        return a


async def _serve(door: FrontDoor, listen: list[str], unix: str | None) -> None:
    runner = web.AppRunner(door.app(), access_log=None)
    await runner.setup()
    for addr in listen:
        host, port = addr.rsplit(":", 1)
        await web.TCPSite(runner, host, int(port)).start()
    if unix:
        await web.UnixSite(runner, unix).start()
    print("front door ready", flush=True)  # the parent waits for this line
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
        await door.channel.close()


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
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    workers = dict(w.split("=", 1) for w in args.worker)

    async def go() -> None:
        door = FrontDoor(
            args.router, args.tokenizer, args.model, args.context, args.mode, args.log, workers, args.variant
        )
        await _serve(door, args.listen, args.unix)

    try:
        asyncio.run(go())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
