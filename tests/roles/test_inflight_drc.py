"""The MD's in-flight DRC, in process with a real tiny engine: which open session a new one builds on, and
how it opens once that session has left (or failed to leave) its sequence in the DRC.

The whole path (P shipping only the suffix, the copies landing in order, the streams) is tested with the
roles as processes in tests/e2e/test_roles.py; here the cases that are hard to time there.
"""

import json
import threading
import time

import pytest

from workers.engine import Engine, GenerationRequest
from workers.kvwire import Inbox
from workers.proto import pdd_pb2
from workers.roles.config import parse_config
from workers.roles.decode import DecodeServicer, shared_blocks
from workers.roles.events import EventLog
from workers.roles.session import Session

BS = 16
SYSTEM = list(range(1, 81))  # 80 tokens: five whole blocks


def _cfg(tmp_path):
    return parse_config(
        {
            "model": "tiny",
            "block_size": BS,
            "events_dir": str(tmp_path / "events"),
            "router": {"name": "router", "grpc_port": 1},
            "p": {"name": "p1", "grpc_port": 2},
            "rld": {"name": "rld1", "grpc_port": 3, "kv_port": 4},
            "md": {"name": "md1", "grpc_port": 5, "kv_port": 6},
        }
    )


@pytest.fixture
def md(tmp_path):
    cfg = _cfg(tmp_path)
    engine = Engine("tiny", seed=0, capacity_tokens=2048, block_size=BS, device="cpu", prefix_cache=True)
    events = EventLog(tmp_path / "md1.jsonl", "md1", "md")
    servicer = DecodeServicer(cfg, cfg.md[0], "md", engine, Inbox(), events)
    yield servicer
    servicer.close()
    events.close()


def _request(rid: str, prompt: list[int], relay: bool = True) -> pdd_pb2.DecodeRequest:
    return pdd_pb2.DecodeRequest(
        request_id=rid,
        prompt_tokens=prompt,
        max_tokens=4,
        use_prefix_cache=True,
        relay_grpc="127.0.0.1:3" if relay else "",
    )


def _events(servicer, name: str) -> list[dict]:
    lines = servicer.events.path.read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == name]


def test_shared_blocks_counts_whole_common_blocks_up_to_the_cap():
    a = tuple(range(50))
    assert shared_blocks(a, a + (7,), BS, 49) == 48
    assert shared_blocks(a, a[:20] + (999,) + a[21:], BS, 100) == 16  # differs inside the second block
    assert shared_blocks(a, a, BS, 31) == 16  # the cap: at least one prompt token left to compute
    assert shared_blocks(a[:15], a, BS, 100) == 0  # no whole block in common


def test_a_relay_session_builds_on_the_open_session_that_promises_the_most(md):
    first = Session(_request("first", SYSTEM + [203, 204]), 0)
    longer = Session(_request("longer", SYSTEM + list(range(100, 140))), 0)
    longer.relay_output = (7,) * 20  # known output extends what `longer` will leave
    md._sessions.update(first=first, longer=longer)
    turn = SYSTEM + list(range(100, 140)) + [7] * 20 + [9] * 10  # `longer`'s next turn
    with md._sessions_lock:
        after, n = md._inflight_prefix(_request("next", turn), cached_now=0)
    assert after is longer and n == 128  # 80 + 40 + 20 = 140 promised -> 8 whole blocks
    with md._sessions_lock:
        assert md._inflight_prefix(_request("p-md", turn, relay=False), cached_now=0) == (None, 0)
        assert md._inflight_prefix(_request("warm", turn), cached_now=128) == (None, 0)  # the DRC has it


def test_open_after_opens_on_the_prefix_the_earlier_session_cached(md):
    earlier = Session(_request("earlier", SYSTEM + [200]), 0)
    md.engine.generate(GenerationRequest("earlier", tuple(SYSTEM + [200]), 1))  # caches SYSTEM's 5 blocks
    earlier.closed.set()
    session = Session(_request("next", SYSTEM + [201, 202]), 80, after=earlier)
    assert md._open_after(session, time.monotonic_ns() + 10**9) == ""
    assert md.engine.kv_len("next") == 80
    [ready] = _events(md, "drc_inflight_ready")
    assert ready["after"] == "earlier" and ready["cached_tokens"] == 80


def test_open_after_says_prefix_lost_when_the_earlier_session_cached_nothing(md):
    earlier = Session(_request("earlier", SYSTEM + [200]), 0)
    earlier.closed.set()  # ended without its KV (kv_timeout, cancelled): nothing cached
    session = Session(_request("next", SYSTEM + [201, 202]), 80, after=earlier)
    assert md._open_after(session, time.monotonic_ns() + 10**9) == "prefix_lost"
    assert "next" not in md.engine.open_requests  # holds nothing
    [lost] = _events(md, "prefix_lost")
    assert lost["after"] == "earlier" and "left 0 of the 80" in lost["reason"]


def test_open_after_waits_for_the_earlier_session_and_gives_up_at_the_deadline_or_on_cancel(md):
    earlier = Session(_request("earlier", SYSTEM + [200]), 0)
    session = Session(_request("next", SYSTEM + [201, 202]), 80, after=earlier)
    t0 = time.monotonic()
    assert md._open_after(session, time.monotonic_ns() + 200_000_000) == "kv_timeout"
    assert 0.2 <= time.monotonic() - t0 < 2
    threading.Timer(0.1, session.cancel).start()
    assert md._open_after(session, time.monotonic_ns() + 10 * 10**9) == "cancelled"
    assert "next" not in md.engine.open_requests
