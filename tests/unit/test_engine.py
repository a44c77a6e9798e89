"""Engine correctness on the tiny model: cache paths agree with a plain forward pass; bad input is refused.

Greedy streams are compared with `greedy_divergence` (engine_helpers.assert_greedy_match): two numerically
different paths may pick different tokens only where the reference logits' top-2 margin is below
TIE_MARGIN (1e-4); such a near-tie is reported as a warning.
"""

import warnings

import pytest
import torch
from engine_helpers import BS, assert_greedy_match, drain, prompt, reference_greedy, req

from workers.engine import Engine
from workers.errors import (
    BadMaxTokens,
    BadRequestState,
    BadSampling,
    CapacityExceeded,
    DuplicateRequest,
    EmptyPrompt,
    KVChecksumError,
    KVHeaderError,
    KVImportError,
    KVRangeError,
    PromptTooLong,
    TokenOutOfVocab,
    UnknownRequest,
)
from workers.kvcache import BLOB_HEADER
from workers.model import TINY
from workers.sampling import TIE_MARGIN, SamplingParams, top2_margin

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def engine(make_engine):
    return make_engine()


# ---------------------------------------------------------------- correctness


def test_prefill_plus_decode_equals_full_forward(engine):
    p = prompt(1, 37)
    result = engine.generate(req("full", p, max_tokens=24, use_prefix_cache=False))
    assert result.cached_tokens == 0 and len(result.output_tokens) == 24
    assert_greedy_match(engine, p, result.output_tokens, reference_greedy(engine, p, 24), "prefill+decode")


def test_extend_logits_equal_full_forward(engine):
    p, more = prompt(2, 20), list(prompt(3, 12))
    engine.open(req("ext-logits", p, max_tokens=20, use_prefix_cache=False))
    engine.prefill("ext-logits")
    first = engine.tokens("ext-logits")[-1]
    out = engine.extend("ext-logits", more)
    full = engine.reference_logits(list(p) + [first] + more)
    assert out.start_pos == 20 and out.logits.shape == (13, TINY.vocab_size)
    torch.testing.assert_close(out.logits, full[20:], atol=1e-4, rtol=1e-4)
    engine.abort("ext-logits")


@pytest.mark.parametrize("k", [1, 7, 16, 40])
def test_extend_equals_k_decode_steps(make_engine, k):
    """The MD's handoff: KV from P, then one extend over the RLD's k tokens instead of k decode steps."""
    rld, md = make_engine(), make_engine()
    p = prompt(10 + k, 30)
    r = req("h", p, max_tokens=k + 6, use_prefix_cache=False)
    rld.open(r)
    rld.prefill("h")
    prompt_kv = rld.export_kv("h", 0, len(p))
    for _ in range(k):
        rld.decode_step(["h"])
    eager = list(rld.tokens("h")[len(p) :])  # t1..t(k+1): the RLD computed KV for t1..tk
    md.open(r)
    md.import_kv("h", prompt_kv)
    out = md.extend("h", eager[:k])
    # logits row i predicts token i+2 of the output; a different argmax is allowed only at a near-tie
    for i in range(k):
        row = out.logits[i]
        if int(row.argmax()) != eager[i + 1]:
            margin = top2_margin(row)
            assert margin < TIE_MARGIN, f"extend row {i}: argmax {int(row.argmax())} != {eager[i + 1]}, margin {margin}"
            warnings.warn(f"extend k={k} row {i}: near-tie, margin {margin:.2e}")
    assert out.next_token == eager[k] or top2_margin(out.logits[-1]) < TIE_MARGIN
    kv_rld = rld.kv.parse_blob(rld.export_kv("h", len(p), len(p) + k)).kv
    kv_md = md.kv.parse_blob(md.export_kv("h", len(p), len(p) + k)).kv
    torch.testing.assert_close(kv_md, kv_rld, atol=1e-5, rtol=1e-4)
    # and the MD continues decoding where the RLD would have
    for e in (rld, md):
        while not e.is_done("h"):
            e.decode_step(["h"])
    assert_greedy_match(md, p, md.tokens("h")[len(p) :], rld.tokens("h")[len(p) :], f"after extend k={k}")


def test_export_import_into_another_engine_continues_to_same_tokens(make_engine):
    a, b = make_engine(), make_engine(capacity_tokens=1024)
    b.open(req("filler", prompt(4, 50), max_tokens=30))  # so b uses other block ids than a
    p = prompt(5, 29)
    r = req("x", p, max_tokens=20)
    a.open(r)
    first = a.prefill("x").first_token
    b.open(r)
    imported = b.import_kv("x", a.export_kv("x"))
    assert (imported.start, imported.end, imported.written_tokens) == (0, 29, 29)
    b.append_tokens("x", [first])
    for e in (a, b):
        while not e.is_done("x"):
            e.decode_step(["x"])
    assert b.tokens("x") == a.tokens("x")
    assert_greedy_match(a, p, a.tokens("x")[29:], reference_greedy(a, p, 20), "exported engine")


def test_import_of_a_suffix_on_top_of_a_cached_prefix(make_engine):
    """The DRC path: the MD has the prefix cached, P ships only the suffix's KV."""
    p_side, md = make_engine(prefix_cache=False), make_engine()
    shared = prompt(6, 24)
    md.generate(req("earlier", shared + prompt(7, 5), max_tokens=3))
    p = shared + prompt(8, 13)
    r = req("y", p, max_tokens=10)
    cached = md.open(r).cached_tokens
    assert cached == 24
    p_side.open(r)
    first = p_side.prefill("y").first_token
    with pytest.raises(KVRangeError, match="starts at position 30"):
        md.import_kv("y", p_side.export_kv("y", 30))  # a gap between 24 and 30
    result = md.import_kv("y", p_side.export_kv("y", cached))
    assert result.written_tokens == len(p) - 24
    md.append_tokens("y", [first])
    while not md.is_done("y"):
        md.decode_step(["y"])
    assert_greedy_match(md, p, md.tokens("y")[len(p) :], reference_greedy(md, p, 10), "suffix import")


def test_importing_incremental_kv_appends_its_tokens(make_engine):
    """The baseline handoff (ship the generated tokens' KV instead of their IDs)."""
    rld, md = make_engine(), make_engine()
    p = prompt(9, 20)
    r = req("z", p, max_tokens=12)
    rld.open(r)
    rld.prefill("z")
    for _ in range(5):
        rld.decode_step(["z"])
    md.open(r)
    md.import_kv("z", rld.export_kv("z", 0, 20))
    inc = md.import_kv("z", rld.export_kv("z", 20))  # KV of t1..t5, tokens unknown to the MD yet
    assert inc.appended_tokens == 5 and md.kv_len("z") == 25
    md.append_tokens("z", [rld.tokens("z")[-1]])
    for e in (rld, md):
        while not e.is_done("z"):
            e.decode_step(["z"])
    assert md.tokens("z") == rld.tokens("z")


def test_prefix_cache_hit_gives_same_output_as_no_cache(make_engine):
    cached, plain = make_engine(), make_engine(prefix_cache=False)
    base = prompt(11, 40)
    first = cached.generate(req("c0", base, max_tokens=12))
    assert first.cached_tokens == 0
    turns = [
        base,  # same prompt: at most len-1 tokens may hit
        base[:35] + prompt(12, 9),  # shares 35 tokens: 4 whole blocks
        base + first.output_tokens + prompt(13, 5),
    ]  # next turn: prompt + answer were cached
    hits = []
    for i, p in enumerate(turns):
        peeked = cached.cached_prefix(p)  # what open() will match, without pinning or counting it
        got = cached.generate(req(f"c{i + 1}", p, max_tokens=12))
        want = plain.generate(req(f"c{i + 1}", p, max_tokens=12))
        hits.append(got.cached_tokens)
        assert peeked == got.cached_tokens
        assert_greedy_match(plain, p, got.output_tokens, want.output_tokens, f"prefix turn {i}")
    assert hits == [32, 32, 48]  # block-granular: the first request cached 51 positions = 6 blocks
    stats = cached.prefix_stats()
    assert stats.hit_tokens == 112 and stats.total_tokens == 40 + 40 + 44 + 57
    assert plain.cached_prefix(base) == 0  # no prefix cache: nothing to hit


def test_batched_decode_equals_one_at_a_time(make_engine):
    batched, single = make_engine(), make_engine()
    reqs = [
        req(f"b{i}", prompt(20 + i, n), max_tokens=m, use_prefix_cache=False)
        for i, (n, m) in enumerate([(5, 20), (17, 12), (30, 20), (44, 8)])
    ]
    for r in reqs:
        batched.open(r)
        batched.prefill(r.request_id)
    sizes = []
    while True:
        step = batched.decode_step()
        if not step:
            break
        sizes.append(len(step))
    assert sizes[0] == 4 and sizes[-1] == 2  # lengths differ, so padding and masks are exercised
    for r in reqs:
        got = batched.finish(r.request_id).output_tokens
        want = single.generate(r).output_tokens
        assert_greedy_match(single, r.prompt_tokens, got, want, f"batched {r.request_id}")


def test_seeded_sampling_is_reproducible_and_independent_of_batching(make_engine):
    e = make_engine()
    p = prompt(30, 16)

    def sampled(rid, seed):
        return req(rid, p, max_tokens=16, sampling=SamplingParams(temperature=1.0, seed=seed), use_prefix_cache=False)

    alone = e.generate(sampled("s1", 7)).output_tokens
    assert e.generate(sampled("s2", 7)).output_tokens == alone
    assert e.generate(sampled("s3", 8)).output_tokens != alone
    assert alone != tuple(reference_greedy(e, p, 16))
    e.open(sampled("s4", 7))
    e.open(req("other", prompt(31, 9), max_tokens=16))
    for rid in ("s4", "other"):
        e.prefill(rid)
    while e.decode_step():
        pass
    assert e.finish("s4").output_tokens == alone


# ---------------------------------------------------------------- bad input


BAD_REQUESTS = [
    (req("bad", []), EmptyPrompt, "empty"),
    (req("bad", [1] * TINY.max_seq_len), PromptTooLong, "at most 127"),
    (req("bad", [1, TINY.vocab_size]), TokenOutOfVocab, "token 256 at index 1"),
    (req("bad", [-1, 3]), TokenOutOfVocab, "token -1 at index 0"),
    (req("bad", [1, 2], max_tokens=0), BadMaxTokens, "max_tokens=0"),
    (req("bad", [1, 2], max_tokens=-3), BadMaxTokens, r"\[1, 126\]"),
    (req("bad", [1] * 100, max_tokens=50), BadMaxTokens, r"\[1, 28\]"),
    (req("bad", [1, 2], sampling=SamplingParams(temperature=-1.0)), BadSampling, "temperature"),
    (req("bad", [1, 2], sampling=SamplingParams(top_k=-2)), BadSampling, "top_k"),
]


@pytest.fixture(scope="module")
def good_reference(engine):
    p = prompt(40, 21)
    return p, reference_greedy(engine, p, 14)


@pytest.mark.parametrize("bad, error, message", BAD_REQUESTS)
def test_bad_request_is_refused_and_engine_keeps_serving(make_engine, good_reference, bad, error, message):
    e = make_engine()
    p, want = good_reference
    e.open(req("good", p, max_tokens=14))
    e.prefill("good")
    e.decode_step(["good"])
    free = e.kv.free_blocks
    with pytest.raises(error, match=message):
        e.open(bad)
    assert e.open_requests == ["good"] and e.kv.free_blocks == free
    while not e.is_done("good"):
        e.decode_step()
    assert_greedy_match(e, p, e.finish("good").output_tokens, want, f"after {error.__name__}")


def test_bad_extend_leaves_the_request_intact(make_engine, good_reference):
    e = make_engine()
    p, want = good_reference
    e.open(req("good", p, max_tokens=14))
    e.prefill("good")
    before = (e.tokens("good"), e.kv_len("good"))
    with pytest.raises(TokenOutOfVocab, match="index 23"):
        e.extend("good", [want[1], 999])
    with pytest.raises(BadRequestState, match="exceed max_tokens"):
        e.extend("good", want[1:14] + [0, 0])
    with pytest.raises(BadRequestState, match="no token IDs"):
        e.extend("good", [])
    assert (e.tokens("good"), e.kv_len("good")) == before
    e.extend("good", want[1:4])
    while not e.is_done("good"):
        e.decode_step()
    assert_greedy_match(e, p, e.tokens("good")[len(p) :], want, "after bad extend")


def test_bad_kv_imports_are_refused_and_a_good_one_still_works(make_engine):
    src, other_weights, dst = make_engine(), make_engine(seed=1), make_engine()
    p = prompt(50, 26)
    r = req("k", p, max_tokens=6)
    for e in (src, other_weights, dst):
        e.open(r)
    first = src.prefill("k").first_token
    other_weights.prefill("k")
    good = src.export_kv("k")
    corrupt = bytearray(good)
    corrupt[BLOB_HEADER.size + 26 * 4 + 5] ^= 0xFF
    src.open(req("k2", prompt(51, 26), max_tokens=6))
    src.prefill("k2")
    cases = [
        (other_weights.export_kv("k"), KVHeaderError, "fingerprint"),
        (bytes(corrupt), KVChecksumError, "checksum"),
        (src.export_kv("k2"), KVRangeError, "token IDs"),
        (good[:-8], KVHeaderError, "length"),
        (b"", KVHeaderError, "length"),
    ]
    for blob, error, message in cases:
        with pytest.raises(error, match=message) as err:
            dst.import_kv("k", blob)
        assert isinstance(err.value, KVImportError)
        assert dst.kv_len("k") == 0 and dst.tokens("k") == p
    dst.import_kv("k", good)
    dst.append_tokens("k", [first])
    while not dst.is_done("k"):
        dst.decode_step(["k"])
    assert_greedy_match(dst, p, dst.tokens("k")[len(p) :], reference_greedy(dst, p, 6), "after bad imports")


def test_state_errors_are_typed(engine):
    with pytest.raises(UnknownRequest):
        engine.prefill("nope")
    engine.open(req("st", prompt(60, 10), max_tokens=3, use_prefix_cache=False))
    with pytest.raises(DuplicateRequest):
        engine.open(req("st", prompt(60, 10)))
    with pytest.raises(BadRequestState, match="exactly 1 token"):
        engine.decode_step(["st"])
    with pytest.raises(BadRequestState, match="prompt KV incomplete"):
        engine.extend("st", [1])
    with pytest.raises(BadRequestState, match="range"):
        engine.export_kv("st", 0, 1)
    engine.prefill("st")
    with pytest.raises(BadRequestState, match="already present"):
        engine.prefill("st")
    engine.decode_step(["st"])
    engine.decode_step(["st"])
    with pytest.raises(BadRequestState, match="max_tokens"):
        engine.decode_step(["st"])
    assert len(engine.finish("st").output_tokens) == 3


# ---------------------------------------------------------------- capacity


def test_capacity_rejection_frees_everything_it_held(make_engine):
    e = make_engine(capacity_tokens=96)  # 12 blocks of 8
    shared = prompt(70, 24)
    e.generate(req("c", shared, max_tokens=4))  # caches 3 blocks of prefix (27 tokens with KV)
    assert e.radix.cached_blocks == 3 and e.kv.free_blocks == 9
    e.open(req("a", prompt(71, 40), max_tokens=20))  # 60 tokens: 8 blocks
    assert e.kv.free_blocks == 1
    b = req("b", shared + prompt(72, 10), max_tokens=20)  # 54 tokens: 7 blocks, 3 of them cached
    with pytest.raises(CapacityExceeded, match="needs 7 KV blocks") as err:
        e.open(b)
    assert not err.value.never_fits
    assert e.kv.free_blocks == 1 and e.radix.stats().pinned_blocks == 0 and e.radix.cached_blocks == 3
    assert e.open_requests == ["a"]
    e.finish("a")
    assert e.open(b).cached_tokens == 24


def test_cached_prefixes_are_evicted_to_admit_a_request(make_engine):
    e = make_engine(capacity_tokens=96)
    for i in range(3):
        e.generate(req(f"p{i}", prompt(80 + i, 24), max_tokens=1))  # 3 cached blocks each
    assert e.radix.cached_blocks == 9 and e.kv.free_blocks == 3
    e.open(req("big", prompt(90, 56), max_tokens=16))  # 9 blocks: 3 free + the two oldest prefixes
    assert e.radix.cached_blocks == 3 and e.kv.free_blocks == 0
    assert e.radix.match_prefix(prompt(82, 24), record=False).matched_tokens == 24  # the newest survived


def test_a_request_larger_than_the_cache_never_fits(make_engine):
    e = make_engine(capacity_tokens=96)
    with pytest.raises(CapacityExceeded, match="ever") as err:
        e.open(req("huge", prompt(91, 100), max_tokens=27))
    assert err.value.never_fits and e.kv.free_blocks == 12


def test_no_blocks_leak(make_engine):
    e = make_engine(capacity_tokens=512)
    base = prompt(95, 30)
    for i in range(4):
        e.generate(req(f"l{i}", base[: 20 + i] + prompt(96 + i, 7), max_tokens=5 + i))
    e.open(req("ab", base, max_tokens=4))
    e.prefill("ab")
    e.abort("ab")
    assert e.open_requests == []
    drain(e)
    assert e.kv.free_blocks == e.kv.num_blocks and e.radix.cached_blocks == 0


# ---------------------------------------------------------------- device


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_engine_matches_cpu_and_its_kv_moves_to_cpu(make_engine, weights_dir):
    gpu = Engine("tiny", capacity_tokens=2048, block_size=BS, device="cuda", weights_dir=weights_dir)
    cpu = make_engine()
    assert gpu.device.type == "cuda" and gpu.fingerprint == cpu.fingerprint
    p = prompt(120, 33)
    want = cpu.generate(req("g", p, max_tokens=12, use_prefix_cache=False)).output_tokens
    got = gpu.generate(req("g", p, max_tokens=12, use_prefix_cache=False)).output_tokens
    assert_greedy_match(cpu, p, got, want, "cuda vs cpu")
    r = req("h", p, max_tokens=12)
    gpu.open(r)
    first = gpu.prefill("h").first_token
    cpu.open(r)
    cpu.import_kv("h", gpu.export_kv("h"))
    cpu.append_tokens("h", [first])
    while not cpu.is_done("h"):
        cpu.decode_step(["h"])
    assert_greedy_match(cpu, p, cpu.tokens("h")[len(p) :], want, "cuda KV continued on cpu")
