"""A decode worker whose KV cache is full for now queues a new session until another's end frees room.

Seen under wan-congested: every pdd request finished on the RLD (the MD never ready), the RLD's cache filled
with live sessions, and a new one was refused (RESOURCE_EXHAUSTED: "only 45 of 512 can be freed now") — a
request lost although room came back within seconds. An RLD's DecodeServicer runs in process (the role's own
code, called as gRPC would: benchmarks/bench_roles.py), model tiny, with a cache of 12 blocks.
"""

import json
import threading
import time

from benchmarks.bench_roles import _InProcess, colocated, decode_worker
from workers.engine import Engine, GenerationRequest
from workers.roles.events import EventLog

BLOCK = 16
CAPACITY = 12 * BLOCK  # one session of 100 + 20 tokens holds 8 blocks: a second one does not fit beside it
PROMPT_A = [(5 * i + 1) % 250 + 1 for i in range(100)]
PROMPT_B = [(11 * i + 7) % 250 + 1 for i in range(100)]
OUT = 20


def _ids(events) -> list[int]:
    return [e.token.token for e in events if e.WhichOneof("kind") == "token"]


def _logged(path, name: str) -> list[dict]:
    return [e for e in map(json.loads, path.read_text().splitlines()) if e["event"] == name]


def _wait_for(cond, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_session_waits_for_room_and_completes_once_another_ends(tmp_path):
    events = EventLog(tmp_path / "rld1.jsonl", "rld1", "rld")
    rld = decode_worker("tiny", 256, capacity_tokens=CAPACITY, events=events)
    reference = Engine("tiny", seed=0, capacity_tokens=4096, block_size=BLOCK, device="cpu")
    try:
        first = rld.Decode(colocated("a", PROMPT_A, OUT), _InProcess())
        assert next(first).WhichOneof("kind") == "accepted"  # "a" holds 8 of the 12 blocks from here on
        out: dict = {}
        second = threading.Thread(
            target=lambda: out.update(b=list(rld.Decode(colocated("b", PROMPT_B, OUT), _InProcess())))
        )
        second.start()
        _wait_for(lambda: _logged(events.path, "kv_room_wait"))
        assert second.is_alive() and "b" not in rld.engine.open_requests  # queued, holding no blocks
        a = _ids(first)  # "a" decodes to its end and closes: its blocks can be freed
        second.join(60)
        assert not second.is_alive()
    finally:
        rld.close()
        events.close()
    assert a == list(reference.generate(GenerationRequest("a", tuple(PROMPT_A), OUT)).output_tokens)
    assert _ids(out["b"]) == list(reference.generate(GenerationRequest("b", tuple(PROMPT_B), OUT)).output_tokens)
    [ready] = _logged(events.path, "kv_room_ready")
    assert ready["request_id"] == "b" and ready["wait_ns"] > 0


def test_a_session_larger_than_the_whole_cache_is_still_refused_at_once(tmp_path):
    rld = decode_worker("tiny", 256, capacity_tokens=4 * BLOCK)
    try:
        try:
            list(rld.Decode(colocated("big", PROMPT_A, OUT), _InProcess()))
        except RuntimeError as err:  # _InProcess.abort: what gRPC would send
            assert "RESOURCE_EXHAUSTED" in str(err) and "larger than the whole cache" in str(err), err
        else:
            raise AssertionError("a request larger than the cache was not refused")
    finally:
        rld.close()
