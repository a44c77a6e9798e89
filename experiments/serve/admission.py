"""What the serve front door lets in: bodies checked (400), requests in flight bounded (429), refusals mapped.

Responsible for: OpenAI's error shape (`ApiError`), the body's JSON and fields (every malformed body is a 400,
never a 500: deep nesting, oversized integers, wrong types), the chat template, the parameters greedy decoding
honours, the bound on requests in flight (`Gate`), the prompt size past which no tokenizing is needed to refuse
it, and the HTTP status a request the roles failed or refused gets (`status_of`).
Not responsible for: HTTP serving, tokenizing or the router's call (experiments.serve.front_door).
"""

from __future__ import annotations

import asyncio
import json
import math
from collections import deque

from aiohttp import web

RETRY_AFTER_S = 1  # a refused client may try again this soon: requests end within seconds on the testbed
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
    """An HTTP error in OpenAI's shape. retry_after_s: sent as Retry-After (429, 503)."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str = "invalid_request_error",
        retry_after_s: int | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.retry_after_s = retry_after_s

    def response(self) -> web.Response:
        kind = "requests" if self.status == 429 else "invalid_request_error" if self.status < 500 else "server_error"
        body = {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}
        headers = {"Retry-After": str(self.retry_after_s)} if self.retry_after_s is not None else None
        return web.json_response(body, status=self.status, headers=headers)


class Gate:
    """Requests in flight bounded by a limit that follows the roles' capacity; `enter` is False past it (the
    caller answers 429).

    Static (target_s None): at most `ceiling` at once, no queue. Adaptive (target_s: the TTFT the roles should
    keep, from the spec's SLO): the limit starts at `start` and moves by AIMD on what the roles do: each
    request served with TTFT (admission to first token) within target_s adds 1/limit while the gate was full
    (one per limit's worth of requests); one past it, or failed for want of capacity (`overloaded`), cuts the
    limit by BACKOFF, at most once per target_s (one episode of overload, one cut); never below 1 nor above
    `ceiling`. Past the limit a request waits in a FIFO of at most `limit` places for up to wait_s (so a
    waiting request still meets its TTFT), else it is refused. Concurrency limits of this kind (TCP's AIMD,
    Netflix's concurrency-limits) are the standard answer; no maintained Python package offers one for
    asyncio, so it is the few lines below."""

    BACKOFF = 0.7

    def __init__(self, ceiling: int, start: int | None = None, target_s: float | None = None, wait_s: float = 0.0):
        self.ceiling, self.target_s, self.wait_s = ceiling, target_s, wait_s
        self.limit = float(ceiling if target_s is None else max(1, min(start or ceiling, ceiling)))
        self.in_flight, self.cuts = 0, 0
        self._waiters: deque[asyncio.Future] = deque()
        self._last_cut = -math.inf
        self._full = False  # the gate was full since the last increase: the limit, not the load, held requests

    @property
    def admits(self) -> int:
        return max(1, int(self.limit))

    async def enter(self) -> bool:
        if self.in_flight < self.admits and not self._waiters:
            self._take()
            return True
        self._full = True
        if self.target_s is None or self.wait_s <= 0 or len(self._waiters) >= self.admits:
            return False
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        granted = False
        try:
            await asyncio.wait({fut}, timeout=self.wait_s)
            granted = fut.done()
        finally:
            if not fut.done():
                self._waiters.remove(fut)
                fut.cancel()
            elif not granted:  # a slot came, but this request was cancelled before it took it
                self.leave()
        return granted

    def _take(self) -> None:
        self.in_flight += 1
        if self.in_flight >= self.admits:
            self._full = True

    def leave(self) -> None:
        self.in_flight -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self.in_flight < self.admits:
            fut = self._waiters.popleft()
            if not fut.done():
                self._take()
                fut.set_result(True)

    def served(self, ttft_s: float, now_s: float) -> None:
        """A request's first token came ttft_s after its admission."""
        if self.target_s is None:
            return
        if ttft_s > self.target_s:
            self.overloaded(now_s)
        elif self._full:
            self.limit = min(float(self.ceiling), self.limit + 1 / self.limit)
            self._full = self.in_flight >= self.admits
            self._wake()

    def overloaded(self, now_s: float) -> None:
        """The roles showed too much load: a TTFT past target, or a request they refused or let time out."""
        if self.target_s is None or now_s - self._last_cut < self.target_s:
            return
        self.limit, self._last_cut, self.cuts = max(1.0, self.limit * self.BACKOFF), now_s, self.cuts + 1


def too_busy(gate: Gate) -> ApiError:
    why = "(--max-in-flight)"
    if gate.target_s is not None:
        why = f"(it follows the roles' TTFT; at most --max-in-flight {gate.ceiling})"
    return ApiError(
        429,
        f"the front door has {gate.in_flight} requests in flight, its limit {gate.admits} {why}; retry later",
        code="rate_limit_exceeded",
        retry_after_s=RETRY_AFTER_S,
    )


def status_of(error: str) -> ApiError:
    """The HTTP answer to a request the testbed did not serve; error: the record's `CODE: details`."""
    code = error.split(":", 1)[0]
    message = f"the request failed in the testbed: {error}"
    if code == "RESOURCE_EXHAUSTED":  # the roles refused it (full queues, too many calls): a client may retry
        return ApiError(429, message, code="overloaded", retry_after_s=RETRY_AFTER_S)
    if code == "UNAVAILABLE":
        return ApiError(503, message, code="unavailable", retry_after_s=RETRY_AFTER_S)
    if code == "DEADLINE_EXCEEDED":
        return ApiError(504, message, code="timeout")
    return ApiError(503, message, code="serving_failed")


def parse_body(raw: bytes) -> dict:
    """The body as a JSON object; ApiError 400 for anything else (json's own limits included: nesting past the
    recursion limit, integers of more than 4,300 digits)."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as err:  # JSONDecodeError is a ValueError
        raise ApiError(400, f"the body is not valid JSON: {str(err)[:200]}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object")
    return body


def check_fields(body: dict) -> None:
    """Every field known, of its type, and at a value greedy decoding honours; ApiError 400 naming it."""
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
    for key in ("model", "mode"):
        if key in body and not isinstance(body[key], str):
            raise ApiError(400, f"{key} must be a string", key)
    if not isinstance(body.get("stream", False), bool):
        raise ApiError(400, f"stream must be true or false, got {body['stream']!r}", "stream")
    if not isinstance(body.get("stream_options") or {}, dict):
        raise ApiError(400, "stream_options must be an object", "stream_options")


def chat_prompt(messages) -> str:
    """The chat template: one `<|role|>` line per message, then the assistant's turn."""
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list", "messages")
    parts = []
    for i, m in enumerate(messages):
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):  # content parts: the text ones
            texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
            content = "".join(texts) if all(isinstance(t, str) for t in texts) else None
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(content, str):
            raise ApiError(400, f"messages[{i}] needs a string role and text content", f"messages[{i}]")
        parts.append(f"<|{m['role']}|>\n{content}\n")
    return "".join(parts) + "<|assistant|>\n"


def max_prompt_chars(longest_token_chars: int, context: int) -> int:
    """Text longer than this cannot fit the context, whatever it says: no token spans more than the vocabulary's
    longest (a character is at least one byte); twice that, for the tokenizer's normalization."""
    return 2 * longest_token_chars * context


def context_exceeded(context: int, detail: str, param: str = "prompt") -> ApiError:
    return ApiError(
        400, f"This model's maximum context length is {context} tokens{detail}", param, "context_length_exceeded"
    )
