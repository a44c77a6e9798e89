"""StepBatcher: concurrent sessions' decode steps share engine steps; errors stay with their request.

The pure-logic tests drive it with a recording fake of engine.decode_step; the last test decodes real
requests of the tiny model from threads and compares them with decoding each alone.
"""

import threading
import time

import pytest

from workers.engine import Engine, GenerationRequest
from workers.errors import UnknownRequest
from workers.roles.batching import StepBatcher


class FakeEngine:
    """decode_step that records its batches and takes step_s (a step that takes no time leaves nothing
    to batch); token = how many steps this request had so far."""

    def __init__(self, refuse=(), crash=False, step_s=0.002):
        self.step_s = step_s
        self.batches: list[list[str]] = []
        self.count: dict[str, int] = {}
        self.refuse, self.crash = set(refuse), crash
        self.lock = threading.Lock()

    def step(self, rids):
        assert self.lock.locked(), "stepped without the engine lock"
        if len(set(rids)) != len(rids):
            raise AssertionError(f"a request twice in one batch: {rids}")
        if self.crash:
            raise RuntimeError("boom")
        bad = [r for r in rids if r in self.refuse]
        if bad:
            raise UnknownRequest(bad[0])
        time.sleep(self.step_s)
        self.batches.append(list(rids))
        for r in rids:
            self.count[r] = self.count.get(r, 0) + 1
        return {r: self.count[r] for r in rids}


def _run_sessions(batcher, rids, steps, register=True):
    out, errors = {r: [] for r in rids}, []
    start = threading.Barrier(len(rids))

    def session(rid):
        try:
            start.wait()
            if register:
                with batcher.decoding(rid):
                    for _ in range(steps):
                        out[rid].append(batcher.step(rid)[0])
            else:
                for _ in range(steps):
                    out[rid].append(batcher.step(rid)[0])
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append((rid, err))

    threads = [threading.Thread(target=session, args=(r,)) for r in rids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "a session hangs"
    return out, errors


def test_concurrent_sessions_share_steps_and_each_gets_every_token_once():
    eng = FakeEngine()
    batcher = StepBatcher(eng.step, eng.lock, max_batch=32)
    rids = [f"r{i}" for i in range(6)]
    out, errors = _run_sessions(batcher, rids, steps=40)
    assert not errors
    assert all(out[r] == list(range(1, 41)) for r in rids)
    assert sum(len(b) for b in eng.batches) == 6 * 40
    assert batcher.stepped / batcher.steps > 2, f"mean batch {batcher.stepped / batcher.steps}"
    assert len(eng.batches) < 6 * 40 / 2


def test_max_batch_bounds_every_step():
    eng = FakeEngine()
    batcher = StepBatcher(eng.step, eng.lock, max_batch=2)
    out, errors = _run_sessions(batcher, [f"r{i}" for i in range(5)], steps=20)
    assert not errors
    assert max(len(b) for b in eng.batches) == 2
    assert all(v == list(range(1, 21)) for v in out.values())


def test_a_refused_request_gets_its_error_alone():
    eng = FakeEngine(refuse={"bad"})
    batcher = StepBatcher(eng.step, eng.lock)
    out, errors = _run_sessions(batcher, ["a", "b", "bad", "c"], steps=10)
    assert [r for r, _ in errors] == ["bad"] and isinstance(errors[0][1], UnknownRequest)
    assert all(out[r] == list(range(1, 11)) for r in "abc")


def test_an_unexpected_error_reaches_every_request_of_its_batch_and_nobody_hangs():
    eng = FakeEngine(crash=True)
    batcher = StepBatcher(eng.step, eng.lock)
    _, errors = _run_sessions(batcher, ["a", "b", "c"], steps=3)
    assert sorted(r for r, _ in errors) == ["a", "b", "c"]
    assert all(isinstance(e, RuntimeError) for _, e in errors)


def test_a_request_cannot_wait_twice_and_max_batch_must_be_positive():
    eng = FakeEngine()
    with pytest.raises(ValueError):
        StepBatcher(eng.step, eng.lock, max_batch=0)
    batcher = StepBatcher(eng.step, eng.lock)
    batcher._waiting.append("a")  # as if another thread of the same request waited
    with pytest.raises(ValueError, match="already waiting"):
        batcher.step("a")


def test_batched_real_decoding_equals_decoding_each_alone():
    prompts = {f"q{i}": tuple(range(3 + i, 3 + i + n)) for i, n in enumerate((5, 17, 33, 9))}
    n_steps = 12

    def fresh():
        eng = Engine("tiny", seed=0, capacity_tokens=1024, block_size=8, prefix_cache=False)
        for rid, p in prompts.items():
            eng.open(GenerationRequest(rid, p, n_steps + 1))
            eng.prefill(rid)
        return eng

    alone = fresh()
    for rid in prompts:
        for _ in range(n_steps):
            alone.decode_step([rid])
    eng, lock = fresh(), threading.Lock()
    batcher = StepBatcher(eng.decode_step, lock)
    _, errors = _run_sessions(batcher, list(prompts), n_steps)
    assert not errors
    assert batcher.stepped / batcher.steps > 1
    for rid in prompts:
        assert eng.tokens(rid) == alone.tokens(rid)
