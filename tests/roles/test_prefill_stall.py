"""A decode worker's long local prefill no longer stalls its other sessions: its chunks ride in their decode steps.

An RLD's DecodeServicer runs in process (the role's code, called as gRPC would: benchmarks/bench_roles.py's
prefill_stall, the measurement `make bench` prints), model `small`: two colocated sessions decode, then a
2048-token prompt arrives there, prefilled whole between two of their steps (decode.step_budget_tokens 0) or
in chunks of the default budget mixed into them. The MD's chunked recompute of handed-over IDs:
tests/e2e/test_decode_chunks.py.
"""

import json

import pytest

from benchmarks.bench_roles import decode_worker, prefill_stall
from workers.roles.config import ConfigError, DecodeConfig, parse_config
from workers.roles.events import EventLog

MODEL = "small"  # 2048 tokens prefill in ~0.8 s on one thread, a decode step of two sessions takes ~10 ms
PROMPT_TOKENS = 2048
SESSIONS = 2
BUDGET = DecodeConfig.step_budget_tokens  # the default: 256
# Whole, the prompt holds each session for its whole prefill: one gap of ~0.8 s. In chunks, a session waits
# for one step of 256 tokens at a time (~0.1 s): 8x shorter on an idle host. Asserted: half, so that a loaded
# two-core host (both runs slow down alike) cannot fail it.
WORST_GAP_RATIO_MAX = 0.5
MIN_TOKENS_DURING = 3  # each session's tokens while the prompt is prefilled in chunks (~8 steps of chunks)
BASE = {
    "router": {"name": "router", "grpc_port": 1},
    "p": {"name": "p1", "grpc_port": 2},
    "rld": {"name": "rld1", "grpc_port": 3, "kv_port": 4},
    "md": {"name": "md1", "grpc_port": 5, "kv_port": 6},
}


@pytest.mark.slow
def test_a_long_colocated_prefill_does_not_stall_the_other_sessions(tmp_path):
    events = EventLog(tmp_path / "rld1.jsonl", "rld1", "rld")
    whole = decode_worker(MODEL, 0)
    chunked = decode_worker(MODEL, BUDGET, engine=whole.engine, events=events)
    prompt = [(7 * i + 3) % whole.engine.config.vocab_size for i in range(PROMPT_TOKENS)]
    try:
        stalled = prefill_stall(whole, prompt, SESSIONS, "whole")
        mixed = prefill_stall(chunked, prompt, SESSIONS, "chunked", seed=1)
    finally:
        whole.close()
        chunked.close()
        events.close()
    # whole: the gap that spans the prefill is as long as the prefill itself
    assert stalled.worst_s >= 0.8 * stalled.ttft_s, stalled
    assert mixed.worst_s < WORST_GAP_RATIO_MAX * stalled.worst_s, (mixed, stalled)
    assert len(mixed.gaps_s) >= SESSIONS * MIN_TOKENS_DURING, mixed
    steps = [e for e in map(json.loads, events.path.read_text().splitlines()) if e["event"] == "decode_step_mixed"]
    carried = [e for e in steps if "chunked-long" in e["requests"]]
    assert carried and all(e["decode_tokens"] + e["chunk_tokens"] <= BUDGET for e in carried)
    assert sum(e["decode_tokens"] > 0 for e in carried) > len(carried) // 2, "the sessions' steps did not carry it"
    assert [e["completed"] for e in carried][-1] == ["chunked-long"]


def test_a_budget_without_room_beside_a_full_batch_is_refused():
    with pytest.raises(ConfigError, match=r"decode.step_budget_tokens=32 must exceed decode.max_batch \(32\)"):
        parse_config({**BASE, "decode": {"step_budget_tokens": 32}})
    assert parse_config({**BASE, "decode": {"step_budget_tokens": 0}}).decode.step_budget_tokens == 0  # whole
