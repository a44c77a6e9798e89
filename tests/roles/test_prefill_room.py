"""P queues a prompt while its KV cache is full for now, instead of refusing it (issue 28).

Seen with aiperf against `pddlab serve`: 192 streamed requests of 616 prompt tokens at concurrency 48, and 162
failed with RESOURCE_EXHAUSTED ("needs 39 KV blocks (624 tokens), only 10 of 1024 can be freed now"): every
one would have fitted once earlier prompts drained. P's PrefillServicer serves real gRPC on loopback here,
model tiny, with a cache of 8 blocks (one 100-token prompt takes 7). A "hog" request the test opens in P's
engine holds the cache full, as prompts in flight would, until the test aborts it.
"""

import json
import time
from concurrent import futures

import grpc
import pytest

from workers.engine import Engine, GenerationRequest
from workers.proto import pdd_pb2, pdd_pb2_grpc
from workers.roles.config import parse_config
from workers.roles.events import EventLog
from workers.roles.prefill import PrefillServicer

BLOCK = 16
CAPACITY = 8 * BLOCK  # a 100-token prompt (+1) takes 7 blocks: one at a time fits
HOG = 2 * BLOCK  # the hog's 2 blocks leave 6 free: no prompt fits beside it
BASE = {
    "router": {"name": "router", "grpc_port": 1},
    "p": {"name": "p1", "grpc_port": 2},
    "rld": {"name": "rld1", "grpc_port": 3, "kv_port": 4},
    "md": {"name": "md1", "grpc_port": 5, "kv_port": 6},
}


def _prompt(i: int, n: int = 100) -> list[int]:
    return [(7 * j + 13 * i + 1) % 250 + 1 for j in range(n)]


class _P:
    """P's servicer behind a gRPC server on 127.0.0.1, and a stub to it."""

    def __init__(self, tmp_path, capacity_tokens: int = CAPACITY, **prefill):
        cfg = parse_config({**BASE, "prefill": prefill})
        self.events = EventLog(tmp_path / "p1.jsonl", "p1", "p")
        engine = Engine("tiny", seed=0, capacity_tokens=capacity_tokens, block_size=BLOCK, device="cpu")
        self.servicer = PrefillServicer(cfg, engine, self.events)
        self.server = grpc.server(futures.ThreadPoolExecutor(16))
        pdd_pb2_grpc.add_PrefillServicer_to_server(self.servicer, self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.stub = pdd_pb2_grpc.PrefillStub(self.channel)

    def hog(self) -> None:
        """Hold the cache full: a request of HOG tokens open in P's engine."""
        with self.servicer.lock:
            self.servicer.engine.open(GenerationRequest("hog", tuple(_prompt(99, HOG - 1)), 1))

    def release_hog(self) -> None:
        with self.servicer.lock:
            self.servicer.engine.abort("hog")
        self.servicer.room.freed()

    def prefill(self, rid: str, prompt: list[int]):
        request = pdd_pb2.PrefillRequest(request_id=rid, prompt_tokens=prompt, use_prefix_cache=True)
        return self.stub.Prefill.future(request, timeout=60)

    def logged(self, name: str) -> list[dict]:
        lines = self.events.path.read_text().splitlines()
        return [e for e in map(json.loads, lines) if e["event"] == name]

    def close(self) -> None:
        self.channel.close()
        self.server.stop(None)
        self.servicer.close()
        self.events.close()


@pytest.fixture
def make_p(tmp_path):
    made: list[_P] = []

    def make(**kw) -> _P:
        made.append(_P(tmp_path, **kw))
        return made[-1]

    yield make
    for p in made:
        p.close()


def _wait_for(cond, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _first_token(prompt: list[int]) -> int:
    reference = Engine("tiny", seed=0, capacity_tokens=4096, block_size=BLOCK, device="cpu")
    return reference.generate(GenerationRequest("ref", tuple(prompt), 1)).output_tokens[0]


def _queued(p: _P, n: int) -> None:
    _wait_for(lambda: len(p.logged("kv_room_wait")) == n)


def _refused(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call.result()
    return caught.value


def test_a_burst_larger_than_the_cache_waits_and_completes_in_order(make_p):
    p = make_p()
    p.hog()
    rids = ["a", "b", "c"]  # 3 x 7 blocks against 8: they fit one after another, not at once
    calls = []
    for i, rid in enumerate(rids):
        calls.append(p.prefill(rid, _prompt(i)))
        _queued(p, i + 1)  # each queued before the next is sent: their order is known
    time.sleep(0.2)
    assert not any(c.done() for c in calls)  # still waiting, not refused
    p.release_hog()
    replies = [c.result() for c in calls]
    assert [r.first_token for r in replies] == [_first_token(_prompt(i)) for i in range(len(rids))]
    assert [e["request_id"] for e in p.logged("prefill_start")] == rids  # first come, first served
    ready = p.logged("kv_room_ready")
    assert [e["request_id"] for e in ready] == rids and all(e["wait_ns"] > 0.2e9 for e in ready)
    assert [e["ahead"] for e in p.logged("kv_room_wait")] == [0, 1, 2]


@pytest.mark.parametrize("budget", [256, 0])  # chunks of every prompt share steps; whole prompts one at a time
def test_a_concurrent_burst_larger_than_the_cache_all_completes(make_p, budget):
    p = make_p(step_budget_tokens=budget)  # the aiperf case: prompts arrive together, nothing else holds the cache
    prompts = [_prompt(i) for i in range(8)]  # 8 x 7 blocks against 8
    calls = [p.prefill(f"r{i}", prompt) for i, prompt in enumerate(prompts)]
    assert [c.result().first_token for c in calls] == [_first_token(prompt) for prompt in prompts]


def test_past_the_queue_bound_a_prompt_is_refused_at_once(make_p):
    p = make_p(max_waiting=2)
    p.hog()
    calls = [p.prefill("a", _prompt(0)), p.prefill("b", _prompt(1))]
    _queued(p, 2)
    t0 = time.monotonic()
    err = _refused(p.prefill("c", _prompt(2)))
    assert time.monotonic() - t0 < 2.0
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "prefill.max_waiting" in err.details(), err
    p.release_hog()
    assert [c.result().first_token for c in calls] == [_first_token(_prompt(i)) for i in range(2)]


def test_a_prompt_that_waits_past_its_deadline_is_refused(make_p):
    p = make_p(room_wait_ms=300)
    p.hog()
    t0 = time.monotonic()
    err = _refused(p.prefill("a", _prompt(0)))
    waited_s = time.monotonic() - t0
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "prefill.room_wait_ms" in err.details(), err
    assert 0.3 <= waited_s < 5.0, waited_s
    assert len(p.servicer.room) == 0  # it left the queue
    p.release_hog()
    assert p.prefill("b", _prompt(1)).result().first_token == _first_token(_prompt(1))  # P serves on


@pytest.mark.parametrize("queued", [False, True])
def test_a_prompt_larger_than_the_whole_cache_is_refused_at_once(make_p, queued):
    p = make_p(capacity_tokens=4 * BLOCK)  # 4 blocks: the 100-token prompt needs 7
    waiting = None
    if queued:  # others wait for room: the too-big prompt is still refused, not queued behind them
        p.hog()
        waiting = p.prefill("small", _prompt(1, 40))  # 3 blocks beside the hog's 2 of 4
        _queued(p, 1)
    t0 = time.monotonic()
    err = _refused(p.prefill("big", _prompt(0)))
    assert time.monotonic() - t0 < 2.0
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than the whole cache" in err.details(), err
    if waiting is not None:
        p.release_hog()
        assert waiting.result().first_token == _first_token(_prompt(1, 40))
