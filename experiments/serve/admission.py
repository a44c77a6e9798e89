"""What the serve front door lets in: bodies checked (400), requests in flight bounded (429), refusals mapped.

Responsible for: OpenAI's error shape (`ApiError`), the body's JSON and fields (every malformed body is a 400,
never a 500: deep nesting, oversized integers, wrong types), the chat template, the parameters greedy decoding
honours, the bound on requests in flight (`Gate`), the prompt size past which no tokenizing is needed to refuse
it, and the HTTP status a request the roles failed or refused gets (`status_of`).
Not responsible for: HTTP serving, tokenizing or the router's call (experiments.serve.front_door).
"""

from __future__ import annotations

import json

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
    """At most `limit` requests in flight; `enter` is False past it (the caller answers 429)."""

    def __init__(self, limit: int):
        self.limit, self.in_flight = limit, 0

    def enter(self) -> bool:
        if self.in_flight >= self.limit:
            return False
        self.in_flight += 1
        return True

    def leave(self) -> None:
        self.in_flight -= 1


def too_busy(limit: int) -> ApiError:
    return ApiError(
        429,
        f"the front door has {limit} requests in flight, its limit (--max-in-flight); retry later",
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
