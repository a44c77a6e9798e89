"""Decode workers computing in chunks (decode.step_budget_tokens): the MD's recompute of handed-over token IDs
and the RLD's colocated prefill, spread over several steps mixed with other sessions' decode steps, give the
colocated reference's tokens; roles as processes on loopback.

A budget of 8 tokens (4 sessions a step at most) splits a K-token handoff's recompute and a 100-token prompt
into many steps; requests run concurrently so that chunks share steps with other sessions' decode tokens.
"""

import threading

import pytest

from pdd_harness import running
from test_roles import check_reference, check_stream, events_of, fresh_prompt
from workers.roles.client import generate

BUDGET = 8
K = 24  # tokens the RLD hands over: their recompute takes at least K / (BUDGET - 1) steps


@pytest.fixture(scope="module")
def dep(tmp_path_factory):
    decode = {"step_budget_tokens": BUDGET, "max_batch": 4, "handoff_min_tokens": K}
    with running(tmp_path_factory.mktemp("decode-chunks"), decode=decode) as dep:
        yield dep


def _concurrently(dep, requests: list[tuple[str, list[int], int, str]]) -> dict:
    """Generate each (request_id, prompt, max_tokens, mode) at once; the streams by request_id."""
    out, errors = {}, []

    def one(rid, prompt, n, mode):
        try:
            out[rid] = generate(dep.channel, prompt, n, mode=mode, handoff="oneshot", request_id=rid)
        except Exception as err:  # reported below
            errors.append((rid, err))

    threads = [threading.Thread(target=one, args=r) for r in requests]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    return out


def test_the_mds_chunked_recompute_gives_the_reference_tokens(dep, reference):
    requests = [(f"chunk-md{i}", fresh_prompt(40), K + 20, "pdd") for i in range(3)]
    got = _concurrently(dep, requests)
    for rid, prompt, n, _ in requests:
        gen = got[rid]
        check_stream(gen, n)
        check_reference(reference, prompt, gen.ids, n, f"chunked recompute {rid}")
        assert gen.done.route == "p-rld-md" and "md1" in gen.workers, (gen.done, gen.workers)
        (ext,) = events_of(dep, "md1", rid, "extend")
        assert ext.fields["tokens"] == K and ext.fields["steps"] >= K // BUDGET, ext.fields
    mixed = [e for e in dep.events("md1") if e.event == "decode_step_mixed"]
    assert mixed and all(e.fields["decode_tokens"] + e.fields["chunk_tokens"] <= BUDGET for e in mixed)


def test_colocated_prefills_in_chunks_beside_decoding_sessions_give_the_reference_tokens(dep, reference):
    requests = [(f"chunk-co{i}", fresh_prompt(100 - 20 * i), 20, "colocated") for i in range(3)]
    got = _concurrently(dep, requests)
    for rid, prompt, n, _ in requests:
        gen = got[rid]
        check_stream(gen, n)
        check_reference(reference, prompt, gen.ids, n, f"chunked colocated prefill {rid}")
        assert set(gen.workers) == {"rld1"}
    carried = [e for e in dep.events("rld1") if e.event == "decode_step_mixed" and "chunk-co0" in e.fields["requests"]]
    assert len(carried) >= 100 // BUDGET, carried  # the 100-token prompt took a step per BUDGET tokens at least
