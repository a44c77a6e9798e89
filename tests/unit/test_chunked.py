"""Chunked, batched prefill: the same first tokens, KV and continuations as whole prefill one by one.

Also: the budget policy (pure), decode tokens mixed with chunks equal separate steps, each request's layers
reported chunk by chunk, lone tail chunks counted, and errors that leave the engine as it was.
Near ties are treated as in test_engine (engine_helpers.assert_greedy_match).
"""

import threading
import time

import pytest
import torch
from engine_helpers import assert_greedy_match, prompt, req

from workers.chunked import ChunkScheduler, plan_step
from workers.errors import BadRequestState, UnknownRequest
from workers.model import TINY

torch.set_num_threads(1)
SHARED = prompt(200, 40)  # a prefix the prefix cache holds (whole blocks: 40 tokens)
# (prompt, max_tokens): different lengths, and cached prefixes of 0, 16, 32 and 40 tokens
PROMPTS = [
    (prompt(201, 70), 8),
    (SHARED[:20] + prompt(202, 9), 10),
    (SHARED[:35] + prompt(203, 50), 6),
    (SHARED + prompt(204, 3), 12),
    (prompt(205, 5), 9),
]


def test_plan_step_puts_decodes_first_then_oldest_prompts_under_the_budget():
    assert plan_step([("a", 30), ("b", 5), ("c", 9)], ["x", "y"], 16) == [("x", 1), ("y", 1), ("a", 14)]
    assert plan_step([("a", 3), ("b", 5), ("c", 9)], [], 16) == [("a", 3), ("b", 5), ("c", 8)]
    assert plan_step([("a", 3)], ["x", "y", "z"], 2) == [("x", 1), ("y", 1)]
    assert plan_step([], [], 8) == []
    with pytest.raises(ValueError, match="budget_tokens=0"):
        plan_step([("a", 3)], [], 0)


def warmed(make_engine):
    """An engine whose prefix cache holds SHARED."""
    e = make_engine()
    e.generate(req("warm", SHARED + prompt(206, 2), max_tokens=1))
    return e


def open_all(e, prefix=""):
    return [e.open(req(f"{prefix}{i}", p, max_tokens=m)) for i, (p, m) in enumerate(PROMPTS)]


@pytest.mark.parametrize("budget", [7, 16, 64])
def test_batched_chunks_give_the_whole_prefills_tokens_kv_and_continuations(make_engine, budget):
    whole, chunked = warmed(make_engine), warmed(make_engine)
    opened = open_all(whole)
    assert [o.cached_tokens for o in open_all(chunked)] == [o.cached_tokens for o in opened] == [0, 16, 32, 40, 0]
    firsts = [whole.prefill(o.request_id).first_token for o in opened]
    sched = ChunkScheduler(chunked, budget_tokens=budget)
    for o in opened:
        sched.submit(o.request_id)
    while sched.step() is not None:
        pass
    records = list(sched.records)
    assert all(r.tokens <= budget for r in records)
    assert any(len(r.chunks) > 1 for r in records)  # chunks of several requests shared a pass
    assert sched.lone_tail_steps == sum(r.lone_tail for r in records)
    for o, (p, _), first in zip(opened, PROMPTS, firsts):
        rid = o.request_id
        assert chunked.kv_len(rid) == len(p)
        assert_greedy_match(whole, p, chunked.tokens(rid)[len(p) :], [first], f"first token {rid}, budget {budget}")
        kv_whole = whole.kv.parse_blob(whole.export_kv(rid, o.cached_tokens)).kv
        kv_chunked = chunked.kv.parse_blob(chunked.export_kv(rid, o.cached_tokens)).kv
        torch.testing.assert_close(kv_chunked, kv_whole, atol=1e-5, rtol=1e-4)
    for e in (whole, chunked):
        while e.decode_step():
            pass
    for o, (p, _) in zip(opened, PROMPTS):
        rid = o.request_id
        assert_greedy_match(whole, p, chunked.tokens(rid)[len(p) :], whole.tokens(rid)[len(p) :], f"continued {rid}")


def test_a_tail_chunk_batches_with_the_next_prompt_and_a_lone_one_is_counted(make_engine):
    e = make_engine(prefix_cache=False)
    sched = ChunkScheduler(e, budget_tokens=16)
    for rid, n in (("a", 20), ("b", 30)):
        e.open(req(rid, prompt(210 + n, n), max_tokens=2))
        sched.submit(rid)
    steps = []
    while (record := sched.step()) is not None:
        steps.append([(c.request_id, c.start, c.n_tokens, c.last) for c in record.chunks])
    # a's tail (4 tokens) shares its step with b's first 12; b's tail (6) runs alone: a lone tail chunk
    assert steps == [
        [("a", 0, 16, False)],
        [("a", 16, 4, True), ("b", 0, 12, False)],
        [("b", 12, 16, False)],
        [("b", 28, 2, True)],
    ]
    assert [r.lone_tail for r in sched.records] == [False, False, False, True] and sched.lone_tail_steps == 1


def test_decode_tokens_mixed_with_chunks_equal_separate_steps(make_engine):
    separate, mixed = make_engine(prefix_cache=False), make_engine(prefix_cache=False)
    sessions = [req(f"s{i}", prompt(220 + i, 10 + 7 * i), max_tokens=12, use_prefix_cache=False) for i in range(3)]
    long = req("long", prompt(230, 90), max_tokens=4, use_prefix_cache=False)
    for e in (separate, mixed):
        for r in sessions:
            e.open(r)
            e.prefill(r.request_id)
        e.decode_step()
        e.open(long)
    separate.prefill("long")  # the stall: the whole prompt between two decode steps
    sched = ChunkScheduler(mixed, budget_tokens=24)
    sched.submit("long")
    ids = [r.request_id for r in sessions]
    while "long" in sched.waiting:
        record = sched.step(decode=ids)
        assert record.tokens <= 24 and set(record.decoded) == set(ids)
    for e in (separate, mixed):
        while e.decode_step():
            pass
    for r in sessions + [long]:
        p = r.prompt_tokens
        got, want = mixed.tokens(r.request_id)[len(p) :], separate.tokens(r.request_id)[len(p) :]
        assert_greedy_match(separate, p, got, want, f"mixed {r.request_id}")


def test_each_layer_of_each_chunk_is_reported_once_its_kv_is_stored(make_engine):
    e = make_engine(prefix_cache=False)
    sched = ChunkScheduler(e, budget_tokens=16)
    seen = {}

    def on_layer(w):
        kv = e.kv.read_layer(w.layer, w.slots)  # (2, n, nkv, hs) as it is when reported
        seen.setdefault(w.request_id, []).append((w.layer, w.start, kv))

    for rid, n in (("a", 21), ("b", 12)):
        e.open(req(rid, prompt(240 + n, n), max_tokens=2))
        sched.submit(rid, on_layer)
    while sched.step() is not None:
        pass
    for rid, n in (("a", 21), ("b", 12)):
        final = e.kv.parse_blob(e.export_kv(rid, 0, n)).kv  # (nl, 2, n, nkv, hs)
        for layer in range(TINY.n_layer):
            chunks = [(start, kv) for lay, start, kv in seen[rid] if lay == layer]
            assert [s for s, _ in chunks] == sorted(s for s, _ in chunks)  # position order
            assert sum(kv.shape[1] for _, kv in chunks) == n
            torch.testing.assert_close(torch.cat([kv for _, kv in chunks], dim=1), final[layer], rtol=0, atol=0)


def test_errors_leave_the_engine_as_it_was(make_engine):
    e = make_engine(prefix_cache=False)
    e.open(req("a", prompt(250, 20), max_tokens=3))
    e.open(req("b", prompt(251, 9), max_tokens=3))
    before = (e.tokens("a"), e.kv_len("a"), e.tokens("b"), e.kv_len("b"))
    for parts, error in (
        ([("a", 5), ("b", 10)], BadRequestState),  # b has only 9 tokens without KV
        ([("a", 5), ("zz", 1)], UnknownRequest),
        ([("a", 5), ("a", 1)], ValueError),
        ([("a", 0)], BadRequestState),
    ):
        with pytest.raises(error):
            e.step(parts)
        assert (e.tokens("a"), e.kv_len("a"), e.tokens("b"), e.kv_len("b")) == before
    sched = ChunkScheduler(e, budget_tokens=8)
    with pytest.raises(UnknownRequest):
        sched.submit("zz")
    sched.submit("a")
    with pytest.raises(BadRequestState, match="already submitted"):
        sched.submit("a")
    sched.submit("b")
    e.abort("b")  # its owner aborts it without cancel(): b fails alone, a completes
    while sched.step() is not None:
        pass
    assert e.kv_len("a") == 20 and sched.take("a").next_token == e.tokens("a")[-1]
    with pytest.raises(UnknownRequest):
        sched.take("b")
    assert sched.take("b") is None and sched.waiting == []


def test_concurrent_prefill_callers_share_steps(make_engine):
    whole, chunked = warmed(make_engine), warmed(make_engine)
    opened = open_all(whole)
    open_all(chunked)
    firsts = {o.request_id: whole.prefill(o.request_id).first_token for o in opened}
    engine_lock = threading.Lock()
    sched = ChunkScheduler(chunked, budget_tokens=16, lock=engine_lock)
    results, errors = {}, []

    def caller(rid):
        try:
            results[rid] = sched.prefill(rid)
        except Exception as err:  # reported below
            errors.append(err)

    threads = [threading.Thread(target=caller, args=(o.request_id,)) for o in opened]
    with engine_lock:  # the first caller to lead waits here until every caller has submitted
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while len(sched.waiting) < len(opened) and time.monotonic() < deadline:
            time.sleep(0.001)
    for t in threads:
        t.join(60)
    assert not errors and set(results) == set(firsts)
    for o, (p, _) in zip(opened, PROMPTS):
        r = results[o.request_id]
        assert (r.start, r.computed_tokens) == (o.cached_tokens, len(p) - o.cached_tokens)
        assert_greedy_match(whole, p, [r.next_token], [firsts[o.request_id]], f"concurrent {o.request_id}")
    assert any(len(rec.chunks) > 1 for rec in sched.records)  # tails shared steps with the next callers' chunks


def test_a_failing_layer_callback_fails_its_request_alone_and_cancel_forgets(make_engine):
    e = make_engine(prefix_cache=False)
    sched = ChunkScheduler(e, budget_tokens=64)

    def broken(w):
        if w.layer == 1:
            raise ConnectionError("sender gone")

    for rid, cb in (("a", broken), ("b", None), ("c", None)):
        e.open(req(rid, prompt(260 + len(rid) + ord(rid), 12), max_tokens=2))
        sched.submit(rid, cb)
    assert sched.cancel("c") and not sched.cancel("c") and not sched.cancel("zz")
    assert sched.step().chunks[-1].request_id == "b" and sched.step() is None  # one step ran a and b; c is gone
    with pytest.raises(ConnectionError, match="sender gone"):
        sched.take("a")
    assert sched.take("b").next_token == e.tokens("b")[-1] and sched.take("c") is None
    assert e.kv_len("c") == 0  # cancelled before any step: nothing computed


def test_decode_requests_are_checked_as_decode_step_checks_them(make_engine):
    e = make_engine(prefix_cache=False)
    e.open(req("s", prompt(270, 10), max_tokens=1))
    e.open(req("fresh", prompt(271, 10), max_tokens=4))  # its prompt has no KV: not decodable
    e.prefill("s")  # its one token generated: done
    sched = ChunkScheduler(e, budget_tokens=8)
    before = (e.tokens("s"), e.kv_len("s"), e.kv_len("fresh"))
    for rid, needle in (("s", "max_tokens=1"), ("fresh", "needs exactly 1 token without KV")):
        with pytest.raises(BadRequestState, match=needle):
            sched.step(decode=[rid])
    with pytest.raises(ValueError, match="exceed the step budget"):
        ChunkScheduler(e, budget_tokens=2).step(decode=["a", "b", "c"])
    assert (e.tokens("s"), e.kv_len("s"), e.kv_len("fresh")) == before and sched.steps == 0


def test_a_prefill_caller_leaves_its_chunks_to_the_decode_steps_while_they_run(make_engine):
    """decode_grace_s: while sessions step (as a decode role's StepBatcher does), their steps carry a waiting
    prompt's chunks; the caller leads chunk-only steps of its own once they stop."""
    e = make_engine(prefix_cache=False)
    lock, seen = threading.Lock(), []
    sched = ChunkScheduler(e, budget_tokens=12, lock=lock, decode_grace_s=0.5, on_step=seen.append)
    e.open(req("s", prompt(272, 8), max_tokens=100))
    e.prefill("s")
    e.open(req("long", prompt(273, 100), max_tokens=2))
    stop, decoding = threading.Event(), threading.Event()

    def session():
        for _ in range(4):  # alone for a few steps, then with the prompt's chunks
            sched.step(decode=["s"])
        decoding.set()
        while not stop.is_set():
            sched.step(decode=["s"])
            time.sleep(0.002)  # the session streams its token between steps

    t = threading.Thread(target=session)
    t.start()
    decoding.wait(30)
    result = sched.prefill("long")
    stop.set()
    t.join(30)
    mixed = [r for r in seen if r.chunks]
    assert result.computed_tokens == 100 and result.steps == len(mixed) >= 9  # 11 tokens a step beside "s"
    assert all(r.decoded for r in mixed), "the caller ran a chunk-only step while the session decoded"
    assert list(sched.records) == seen  # on_step saw every step, in order
    e.open(req("alone", prompt(274, 30), max_tokens=2))
    t0 = time.monotonic()
    assert sched.prefill("alone").steps == 3  # nobody decodes now: it leads its own steps
    assert time.monotonic() - t0 < 5 and not any(r.decoded for r in seen[-3:])


def test_a_request_submitted_before_a_step_rides_it_and_wait_takes_the_result(make_engine):
    """A decode role submits a prompt it opens while holding the engine lock: the session step that takes the lock
    next carries its first chunk (prefill() after the lock's release would miss that step), and wait() then only
    takes what the steps computed, or leads the rest itself."""
    e = make_engine(prefix_cache=False)
    sched = ChunkScheduler(e, budget_tokens=16, decode_grace_s=0.5)
    e.open(req("s", prompt(280, 8), max_tokens=50))
    e.prefill("s")
    for rid, n in (("short", 10), ("long", 40)):
        e.open(req(rid, prompt(281 + n, n), max_tokens=2))
        sched.submit(rid)
    assert sched.queued("short") and sched.queued("long") and not sched.queued("s")
    first = sched.step(decode=["s"])  # the sessions' next step: 15 tokens of room beside "s"
    assert [(c.request_id, c.n_tokens, c.last) for c in first.chunks] == [("short", 10, True), ("long", 5, False)]
    done = sched.wait("short")  # computed already: nothing more runs
    assert (done.computed_tokens, done.steps, sched.steps) == (10, 1, 1) and not sched.queued("short")
    t0 = time.monotonic()
    rest = sched.wait("long")  # the session stepped within decode_grace_s: the waiter leads only after it
    assert rest.computed_tokens == 40 and rest.steps == 4 and time.monotonic() - t0 >= 0.4
    with pytest.raises(BadRequestState, match="not submitted"):
        sched.wait("long")  # taken
    e.open(req("gone", prompt(290, 6), max_tokens=2))
    sched.submit("gone")
    assert sched.cancel("gone")
    with pytest.raises(BadRequestState, match="not submitted"):
        sched.wait("gone")
