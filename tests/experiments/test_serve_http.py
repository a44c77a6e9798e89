"""The front door's HTTP layer (experiments.serve.front_door, experiments.serve.admission): the chat template, the
parameters greedy decoding honours, OpenAI's error shape, the shipped tokenizers' sizes; then the door served on
loopback in front of a stand-in router (a real gRPC server whose Generate refuses, or never answers): malformed
bodies are 400s, the bound on requests in flight answers 429 with Retry-After, a refusal before the first token is
an HTTP status (not a 200 stream with nothing in it), a silent router is a 504, every request has its record, and a
huge prompt neither reaches the tokenizer nor stalls the event loop. (The served API for real: tests/e2e/
test_front_door.py on loopback, tests/emulation/test_serve.py in the topology.)"""

import asyncio
import json
import time

import pytest
from tokenizers import Tokenizer

import aiohttp
import grpc
from aiohttp import test_utils

from experiments.serve import admission as serve_http
from experiments.serve.admission import ApiError, chat_prompt
from experiments.serve.front_door import FrontDoor
from workers.proto import pdd_pb2, pdd_pb2_grpc
from workers.model import CONFIGS, precision_base

from experiments.serve.session import TOKENIZERS  # noqa: E402


def test_the_chat_template_and_bad_messages():
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert chat_prompt(msgs) == "<|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\n"
    for bad, where in (([], "messages"), ([{"role": "user"}], "messages[0]"), ([{"content": "x"}], "messages[0]")):
        with pytest.raises(ApiError) as info:
            chat_prompt(bad)
        assert info.value.status == 400 and info.value.param == where


@pytest.mark.parametrize(
    "body,param",
    [({"n": 2}, "n"), ({"temperature": 0.7}, "temperature"), ({"stop": ["\n"]}, "stop"), ({"tools": []}, "tools")],
)
def test_parameters_greedy_decoding_cannot_honour_are_refused(body, param):
    with pytest.raises(ApiError) as info:
        serve_http.check_fields(body)
    assert (info.value.status, info.value.param, info.value.code) == (400, param, "unsupported_parameter")


def test_greedy_values_and_harmless_fields_pass():
    serve_http.check_fields(
        {
            "model": "m",
            "prompt": "x",
            "temperature": 0,
            "n": 1,
            "stop": None,
            "stream": True,
            "stream_options": {"include_usage": True},
            "mode": "pdd",
            "ignore_eos": True,
        }
    )


def test_the_error_body_is_openais_shape():
    resp = ApiError(404, "no such model", "model", "model_not_found").response()
    assert resp.status == 404
    assert json.loads(resp.body) == {
        "error": {
            "message": "no such model",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
    }


@pytest.mark.parametrize("model", sorted(CONFIGS))
def test_each_model_has_a_tokenizer_of_its_vocab_size_that_round_trips_text(model):
    tok = Tokenizer.from_file(str(TOKENIZERS / precision_base(model) / "tokenizer.json"))
    assert tok.get_vocab_size() == CONFIGS[model].vocab_size
    text = "PDD: Prefill -> Relay Decode -> Main Decode, über das WAN."
    assert tok.decode(tok.encode(text).ids) == text
    assert tok.decode([CONFIGS[model].vocab_size - 1])  # every id the model may sample decodes to something
    config = json.loads((TOKENIZERS / precision_base(model) / "tokenizer_config.json").read_text())
    assert (
        config["vocab_size"] == CONFIGS[model].vocab_size and config["model_max_length"] == CONFIGS[model].max_seq_len
    )


# ---------------------------------------------------------------- the door on loopback, a stand-in router behind it


class _Router(pdd_pb2_grpc.RouterServicer):
    """Generate as told: `silent` never answers, a status code refuses at once, "ok" sends max_tokens tokens."""

    def __init__(self, behaviour):
        self.behaviour, self.calls = behaviour, 0

    async def Generate(self, request, context):
        self.calls += 1
        if self.behaviour == "silent":
            await asyncio.sleep(3600)
        if isinstance(self.behaviour, grpc.StatusCode):
            await context.abort(self.behaviour, "the stand-in router refuses")
        for i in range(request.max_tokens):
            yield pdd_pb2.GenerateEvent(token=pdd_pb2.Token(index=i, token=65 + i % 26, worker="p1", t_ns=1))
        yield pdd_pb2.GenerateEvent(done=pdd_pb2.GenerateDone(route="colocated", finish_reason="length"))


async def _door(tmp_path, behaviour, **kw):
    """(the router servicer, its server, the door, an aiohttp test server running it)."""
    router = _Router(behaviour)
    server = grpc.aio.server()
    pdd_pb2_grpc.add_RouterServicer_to_server(router, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    tok = TOKENIZERS / "tiny"
    door = FrontDoor(f"127.0.0.1:{port}", tok, "pddlab-tiny", 128, "pdd", tmp_path / "client.jsonl", {}, "pdd", **kw)
    http = test_utils.TestServer(door.app())
    await http.start_server()
    return router, server, door, http


def _served(tmp_path, behaviour, scenario, **kw):
    """Run scenario(base_url, router) against a door in front of a stand-in router; the records it wrote."""

    async def go():
        router, server, door, http = await _door(tmp_path, behaviour, **kw)
        try:
            await scenario(str(http.make_url("")), router)
        finally:
            await http.close()
            await door.channel.close()
            door.close()
            await server.stop(0)

    asyncio.run(go())
    path = tmp_path / "client.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def _post(session, url, body, path="/v1/completions"):
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    async with session.post(url + path, data=data, headers={"Content-Type": "application/json"}) as r:
        return r.status, dict(r.headers), await r.read()


MALFORMED = [
    "[" * 100_000 + "]" * 100_000,  # deeper than json's recursion limit
    '{"prompt": "x", "max_tokens": ' + "9" * 5000 + "}",  # past int()'s digit limit
    {"prompt": "x", "stream": "no"},
    {"prompt": "x", "stream": 1},
    {"prompt": "x", "mode": ["pdd"]},
    {"prompt": "x", "model": {"name": "pddlab-tiny"}},
    {"prompt": "x", "stream": True, "stream_options": "include_usage"},
    {"prompt": [1, 2, True]},
    {"prompt": [1, 2.5]},
]
MALFORMED_CHAT = [
    {"messages": [{"role": "user", "content": [{"type": "text", "text": 42}]}]},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": None}]}]},
    {"messages": [{"role": "user", "content": None}]},
]


def test_every_malformed_body_is_a_400_in_openais_shape_and_reaches_no_router(tmp_path):
    answers = []

    async def scenario(url, router):
        async with aiohttp.ClientSession() as s:
            for body in MALFORMED:
                answers.append(await _post(s, url, body))
            for body in MALFORMED_CHAT:
                answers.append(await _post(s, url, body, "/v1/chat/completions"))
        assert router.calls == 0

    records = _served(tmp_path, "ok", scenario)
    for body, (status, _, raw) in zip(MALFORMED + MALFORMED_CHAT, answers):
        assert status == 400, (str(body)[:80], status, raw[:300])
        assert json.loads(raw)["error"]["type"] == "invalid_request_error"
    assert records == []  # refused as malformed: never admitted, nothing sent


def test_past_its_bound_on_requests_in_flight_the_door_answers_429_with_retry_after_and_records_it(tmp_path):
    async def scenario(url, router):
        async with aiohttp.ClientSession() as s:
            body = {"prompt": "hold on", "max_tokens": 4}
            held = [asyncio.create_task(_post(s, url, body)) for _ in range(2)]
            while router.calls < 2:  # both are at the (silent) router
                await asyncio.sleep(0.02)
            status, headers, raw = await _post(s, url, {**body, "stream": True})
            assert status == 429 and int(headers["Retry-After"]) >= 1, (status, raw)
            assert json.loads(raw)["error"]["code"] == "rate_limit_exceeded"
            assert router.calls == 2  # the refused one never reached it
            for t in held:
                assert (await t)[0] == 504  # the silent router: past router_idle_s

    records = _served(tmp_path, "silent", scenario, max_in_flight=2, router_idle_s=2)
    refused = [r for r in records if not r["issued"]]
    assert len(records) == 3 and len(refused) == 1 and refused[0]["error"].startswith("REFUSED"), records
    assert all(r["error"].startswith("DEADLINE_EXCEEDED") for r in records if r["issued"]), records


@pytest.mark.parametrize("stream", [True, False])
def test_a_router_that_never_answers_is_a_504_past_the_deadline_and_recorded(tmp_path, stream):
    got = []

    async def scenario(url, router):
        async with aiohttp.ClientSession() as s:
            t0 = time.monotonic()
            got.append(await _post(s, url, {"prompt": "anyone?", "max_tokens": 4, "stream": stream}))
            got.append(time.monotonic() - t0)

    (rec,) = _served(tmp_path, "silent", scenario, router_idle_s=1)
    (status, _, raw), waited_s = got
    assert status == 504 and 1 <= waited_s < 10, (status, raw, waited_s)
    assert rec["error"].startswith("DEADLINE_EXCEEDED") and rec["issued"], rec


@pytest.mark.parametrize("code,status", [(grpc.StatusCode.RESOURCE_EXHAUSTED, 429), (grpc.StatusCode.UNAVAILABLE, 503)])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_a_refusal_before_the_first_token_is_an_http_status_not_an_empty_200_stream(tmp_path, code, status, path):
    got = []

    async def scenario(url, router):
        async with aiohttp.ClientSession() as s:
            body = {"max_tokens": 4, "stream": True}
            body.update({"messages": [{"role": "user", "content": "hi"}]} if "chat" in path else {"prompt": "hi"})
            got.append(await _post(s, url, body, path))

    (rec,) = _served(tmp_path, code, scenario)
    ((got_status, headers, raw),) = got
    assert got_status == status and int(headers["Retry-After"]) >= 1, (got_status, raw)
    assert "stand-in router refuses" in json.loads(raw)["error"]["message"]
    assert rec["error"].startswith(code.name) and rec["tokens"] == [], rec


def test_a_huge_prompt_is_refused_before_tokenizing_and_does_not_stall_other_requests(tmp_path):
    got = {}

    async def scenario(url, router):
        async with aiohttp.ClientSession() as s:
            big = {"prompt": "x" * 1_000_000, "max_tokens": 4}  # just under aiohttp's 1 MiB body limit
            t0 = time.monotonic()
            bigs = [asyncio.create_task(_post(s, url, big)) for _ in range(4)]
            await asyncio.sleep(0)
            async with s.get(url + "/v1/models") as r:
                await r.read()
            got["models_s"] = time.monotonic() - t0
            got["bigs"] = await asyncio.gather(*bigs)
            got["bigs_s"] = time.monotonic() - t0

    _served(tmp_path, "ok", scenario)
    for status, _, raw in got["bigs"]:
        assert status == 400 and json.loads(raw)["error"]["code"] == "context_length_exceeded", (status, raw)
    # tokenizing 1 MB takes ~0.3-0.7 s of CPU (each, on the event loop it was): refused unread, far quicker
    assert got["bigs_s"] < 0.5 and got["models_s"] < 0.5, got
