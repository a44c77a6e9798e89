"""Continuous batching: same tokens as one-at-a-time, admission by capacity, backpressure, thread loop."""
import pytest
import torch

from workers.engine import Engine, GenerationRequest
from workers.errors import CapacityExceeded, DuplicateRequest, EmptyPrompt, QueueFull, TokenOutOfVocab
from workers.model import TINY
from workers.scheduler import Scheduler
from workers.sampling import greedy_divergence

torch.set_num_threads(1)
BS = 8


@pytest.fixture(scope="module")
def weights_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("weights")


@pytest.fixture(scope="module")
def make_engine(weights_dir):
    def make(capacity_tokens=2048, prefix_cache=True):
        return Engine("tiny", capacity_tokens=capacity_tokens, block_size=BS, device="cpu",
                      prefix_cache=prefix_cache, weights_dir=weights_dir)
    return make


def prompt(seed: int, n: int) -> tuple[int, ...]:
    return tuple(torch.randint(0, TINY.vocab_size, (n,), generator=torch.Generator().manual_seed(seed)).tolist())


def workload(n: int = 6) -> list[GenerationRequest]:
    shapes = [(12, 10), (30, 4), (7, 16), (25, 9), (40, 6), (18, 12), (9, 5), (33, 3)]
    return [GenerationRequest(f"r{i}", prompt(100 + i, p), m, use_prefix_cache=False)
            for i, (p, m) in enumerate(shapes[:n])]


@pytest.fixture(scope="module")
def expected(make_engine):
    """Each request run alone on its own engine call: the reference for batched runs."""
    e = make_engine(prefix_cache=False)
    return {r.request_id: e.generate(r).output_tokens for r in workload(8)}, e


def assert_same(expected, results) -> None:
    want, engine = expected
    for res in results:
        w = want[res.request_id]
        d = greedy_divergence(res.output_tokens, w, lambda i: engine.reference_logits(
            list(res.prompt_tokens) + list(w[:i]))[-1])
        assert d is None or d.is_tie, f"{res.request_id}: {d}"


def test_batched_run_gives_one_at_a_time_tokens(make_engine, expected):
    s = Scheduler(make_engine(), max_batch=3)
    futures = [s.submit(r) for r in workload()]
    reports = s.run_until_idle()
    assert max(r.batch_size for r in reports) == 3
    assert sum(len(r.admitted) for r in reports) == 6
    assert all(f.done() for f in futures)
    assert_same(expected, [f.result() for f in futures])
    assert s.engine.open_requests == []


def test_admission_waits_for_kv_capacity(make_engine, expected):
    e = make_engine(capacity_tokens=96, prefix_cache=False)  # 12 blocks: about two requests at a time
    s = Scheduler(e, max_batch=8)
    futures = [s.submit(r) for r in workload()]
    active, held = [], []
    while not s.idle:
        s.step()
        active.append(s.active)
        held.append(e.kv.num_blocks - e.kv.free_blocks)
    assert max(active) < 6 and max(held) <= 12  # capacity, not max_batch, bounded the batch
    assert_same(expected, [f.result() for f in futures])
    assert e.kv.free_blocks == e.kv.num_blocks


def test_fifo_head_of_line_waits_rather_than_being_overtaken(make_engine):
    e = make_engine(capacity_tokens=96, prefix_cache=False)
    s = Scheduler(e, max_batch=8, max_prefills_per_step=8)
    big = GenerationRequest("big", prompt(1, 60), 20)        # 10 blocks
    small = GenerationRequest("small", prompt(2, 10), 6)     # 2 blocks
    first = GenerationRequest("first", prompt(3, 20), 4)     # 3 blocks
    for r in (first, big, small):
        s.submit(r)
    report = s.step()
    assert report.admitted == ("first",)  # big does not fit yet; small must not jump the queue
    s.run_until_idle()
    assert s.idle


def test_queue_bound_rejects_clearly_and_keeps_the_queue(make_engine):
    s = Scheduler(make_engine(), max_waiting=2)
    reqs = workload(3)
    s.submit(reqs[0])
    s.submit(reqs[1])
    with pytest.raises(QueueFull, match="waiting queue is full \\(2 requests\\)"):
        s.submit(reqs[2])
    assert s.waiting == 2
    s.step()  # admits one, freeing a place
    s.submit(reqs[2])
    s.run_until_idle()
    assert s.idle


def test_bad_and_impossible_requests_are_refused_at_submit(make_engine, expected):
    s = Scheduler(make_engine(capacity_tokens=96))
    good = s.submit(workload(1)[0])
    with pytest.raises(EmptyPrompt):
        s.submit(GenerationRequest("e", (), 4))
    with pytest.raises(TokenOutOfVocab):
        s.submit(GenerationRequest("v", (1, 999), 4))
    with pytest.raises(CapacityExceeded, match="ever"):
        s.submit(GenerationRequest("huge", prompt(5, 90), 20))
    with pytest.raises(DuplicateRequest):
        s.submit(workload(1)[0])
    assert s.waiting == 1
    s.run_until_idle()
    assert_same(expected, [good.result()])


def test_a_request_done_after_prefill_finishes_without_decoding(make_engine):
    s = Scheduler(make_engine())
    one = s.submit(GenerationRequest("one", prompt(6, 10), 1))
    report = s.step()
    assert report.batch_size == 0 and [r.request_id for r in report.finished] == ["one"]
    assert len(one.result().output_tokens) == 1 and s.idle


def test_tokens_stream_to_callbacks_in_order(make_engine):
    s = Scheduler(make_engine(), max_batch=4)
    seen: dict[str, list[int]] = {}
    futures = [s.submit(r, on_token=lambda rid, t: seen.setdefault(rid, []).append(t)) for r in workload(4)]
    events = [ev for rep in s.run_until_idle() for ev in rep.tokens]
    for f in futures:
        res = f.result()
        assert tuple(seen[res.request_id]) == res.output_tokens
        indices = [ev.index for ev in events if ev.request_id == res.request_id]
        assert indices == list(range(len(res.output_tokens)))


def test_a_failing_callback_does_not_stop_the_batch(make_engine, expected):
    s = Scheduler(make_engine())
    def explode(rid, token):
        raise RuntimeError("client went away")
    futures = [s.submit(r, on_token=explode) for r in workload(2)]
    s.run_until_idle()
    assert_same(expected, [f.result() for f in futures])


def test_thread_loop_serves_submitted_requests(make_engine, expected):
    with Scheduler(make_engine(), max_batch=4) as s:
        futures = [s.submit(r) for r in workload(8)]
        results = [f.result(timeout=60) for f in futures]
    assert_same(expected, results)
    assert s.idle
