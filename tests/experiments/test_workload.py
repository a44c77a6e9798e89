"""The workload generator: the published hit skew, seeded, context-safe; trace lines checked with line numbers."""

import json

import pytest

from experiments.spec import workload as wl
from experiments.spec.experiment import load_spec
from experiments.spec.workload import TraceError, load_trace


@pytest.fixture(scope="module")
def default_requests():
    return wl.build(load_spec("pdd-vs-baselines"))


def test_default_workload_has_the_published_skew(default_requests):
    prof = wl.hit_profile(default_requests)
    # PDD.md: average ~90%, 70-80% of requests above 95%, ~3-4% singular (a few points of slack: ~45 requests)
    assert 0.87 <= prof["mean_hit"] <= 0.94, prof
    assert 0.65 <= prof["share_above_95"] <= 0.82, prof
    assert prof["singular_share"] > 0


def test_skew_holds_across_seeds():
    for seed in range(2, 8):
        s = load_spec("pdd-vs-baselines", [f"workload.seed={seed}", "workload.synthetic.sessions=20"])
        prof = wl.hit_profile(wl.build(s))
        assert 0.86 <= prof["mean_hit"] <= 0.95 and 0.6 <= prof["share_above_95"] <= 0.85, (seed, prof)


def test_seeded_and_within_the_context(default_requests):
    again = wl.build(load_spec("pdd-vs-baselines"))
    assert again == default_requests
    assert all(r.prompt_len + r.max_tokens <= 4096 for r in default_requests)
    other = wl.build(load_spec("pdd-vs-baselines", ["workload.seed=9"]))
    assert other != default_requests


def test_sessions_grow_and_chain(default_requests):
    by = {r.request_id: r for r in default_requests}
    turns = [r for r in default_requests if r.after]
    assert turns
    for r in turns:
        prev = by[r.after]
        assert r.session == prev.session and r.turn == prev.turn + 1
        assert r.prompt_len == prev.prompt_len + prev.max_tokens + len(r.head_tokens)
        assert r.cached_tokens % 16 == 0 and r.cached_tokens <= prev.prompt_len + prev.max_tokens - 1


def test_warmup_first_and_arrivals_poisson_ordered(default_requests):
    assert default_requests[0].kind == "warmup"
    starts = [r.arrival_s for r in default_requests if r.after is None and r.kind != "warmup"]
    assert starts == sorted(starts) and starts[0] > 0


def test_singular_requests_are_long_input_short_output(default_requests):
    s = [r for r in default_requests if r.kind == "singular"]
    assert s and all(r.prompt_len - r.cached_tokens >= 384 and r.max_tokens <= 6 for r in s)


@pytest.mark.parametrize(
    "hit, bucket",
    [
        (0.0, "0-90"),
        (0.8999, "0-90"),
        (0.9, "90-93"),
        (0.95, "95-97"),
        (0.985, "98-99"),
        (0.995, "99-100"),
        (1.0, "99-100"),
    ],
)
def test_buckets(hit, bucket):
    assert wl.bucket_of(hit) == bucket


def _trace(tmp_path, lines):
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return p


def test_trace_replay(tmp_path):
    p = _trace(
        tmp_path,
        [
            '{"t_s": 0.5, "session": "a", "input_tokens": 40, "output_tokens": 8}',
            "# a comment",
            '{"t_s": 0.1, "token_ids": [1, 2, 3], "output_tokens": 2}',
            '{"t_s": 2, "session": "a", "input_tokens": 60, "output_tokens": 4}',
        ],
    )
    reqs = load_trace(p, vocab=256, block=8, context=128, seed=1)
    assert [r.prompt_len for r in reqs] == [3, 40, 60]
    assert reqs[2].after == reqs[1].request_id and reqs[2].cached_tokens == 40  # (40 + 8 - 1) // 8 * 8
    assert len(reqs[2].head_tokens) == 60 - 48 and reqs[0].head_tokens == (1, 2, 3)


@pytest.mark.parametrize(
    "line, needle",
    [
        ("not json", "t.jsonl:2: not JSON"),
        ('{"t_s": -1, "input_tokens": 4, "output_tokens": 1}', "t.jsonl:2: t_s must be a finite number >= 0"),
        ('{"t_s": Infinity, "input_tokens": 4, "output_tokens": 1}', "t.jsonl:2: t_s must be a finite number"),
        ('{"t_s": 1, "input_tokens": 1000000000, "output_tokens": 2}', "t.jsonl:2: prompt 1000000000 + output 2"),
        ('{"t_s": 1, "input_tokens": 4}', "t.jsonl:2: missing key 'output_tokens'"),
        ('{"input_tokens": 4, "output_tokens": 1}', "t.jsonl:2: missing key 't_s'"),
        ('{"t_s": 1, "output_tokens": 2}', "t.jsonl:2: exactly one of input_tokens or token_ids"),
        ('{"t_s": 1, "token_ids": [1, 999], "output_tokens": 2}', "t.jsonl:2: token_ids[1] must be an int in [0, 256)"),
        (
            '{"t_s": 1, "token_ids": [1, true], "output_tokens": 2}',
            "t.jsonl:2: token_ids[1] must be an int in [0, 256)",
        ),
        ("[1, 2]", "'token_ids']; got [1, 2]"),
        (
            '{"t_s": 1, "input_tokens": 4, "output_tokens": 2, "session": ["a", "b", "c", "d", "e"]}',
            "t.jsonl:2: session must be a string, got ['a', 'b', 'c', 'd', ...]",
        ),
        # absurd numbers and nesting: once a raw ValueError, OverflowError or RecursionError without the line
        pytest.param(
            '{"t_s": 1, "input_tokens": 4, "output_tokens": %s}' % ("9" * 5000),
            "t.jsonl:2: output_tokens must be an int in [1, 127], got a 5000-digit number",
            id="5000-digit",
        ),
        (
            '{"t_s": 1%s, "input_tokens": 4, "output_tokens": 2}' % ("0" * 399),
            "t.jsonl:2: t_s must be a finite number >= 0 (arrival, s), got a 400-digit number",
        ),
        (
            '{"t_s": 1, "input_tokens": 1%s, "output_tokens": 2}' % ("0" * 399),
            "t.jsonl:2: input_tokens must be an int >= 1, got a 400-digit number",
        ),
        pytest.param(
            '{"t_s": 1, "token_ids": %s, "output_tokens": 2}' % ("[" * 10_000 + "]" * 10_000),
            "t.jsonl:2: not JSON this loader reads: nested too deep",
            id="token_ids-nested-10000",
        ),
        ('{"t_s": 1, "input_tokens": 4, "output_tokens": 2, "colour": 1}', "t.jsonl:2: unknown key(s) ['colour']"),
        ('{"t_s": 1, "input_tokens": 200, "output_tokens": 2}', "t.jsonl:2: prompt 200 + output 2 tokens exceed"),
        (
            '{"t_s": 1, "session": "a", "input_tokens": 20, "output_tokens": 2}',
            "t.jsonl:2: input_tokens=20 must exceed",
        ),
    ],
)
def test_bad_trace_lines_name_the_line(tmp_path, line, needle):
    p = _trace(tmp_path, ['{"t_s": 0, "session": "a", "input_tokens": 30, "output_tokens": 4}', line])
    with pytest.raises(TraceError) as err:
        load_trace(p, vocab=256, block=8, context=128, seed=1)
    assert needle in str(err.value)


def test_a_huge_bad_value_is_shown_cut_and_bytes_not_utf8_name_the_line(tmp_path):
    p = _trace(tmp_path, ['{"t_s": 0, "input_tokens": 30, "output_tokens": 4}', json.dumps({"t_s": [0] * 200_000})])
    with pytest.raises(TraceError, match=r"t.jsonl:2: t_s must be .*, got \[0, 0, 0, 0, \.\.\.\]$"):
        load_trace(p, vocab=256, block=8, context=128, seed=1)  # the message was the 600,000-character list
    p.write_bytes(b'{"t_s": 0, "input_tokens": 30, "output_tokens": 4}\n{"t_s": 1, "session": "\xe9"}\n')
    with pytest.raises(TraceError, match=r"t.jsonl:2: not UTF-8 \(byte 24 of the line\)"):
        load_trace(p, vocab=256, block=8, context=128, seed=1)


def test_trace_spec_fails_before_the_topology(tmp_path):
    from experiments.run import runner

    p = _trace(tmp_path, ['{"t_s": 0, "input_tokens": 30, "output_tokens": 4}', '{"t_s": "soon"}'])
    s = load_spec("pdd-smoke", ["workload.source=trace", f"workload.trace={p}"])
    with pytest.raises(TraceError, match=r"t.jsonl:2: t_s must be"):
        runner.prepare(s)


def test_workload_file_round_trips(tmp_path, default_requests):
    wl.write(default_requests, tmp_path / "w.jsonl")
    assert wl.read(tmp_path / "w.jsonl") == default_requests
    json.loads((tmp_path / "w.jsonl").read_text().splitlines()[0])


def test_rate_steps_raise_the_arrival_rate_from_their_start():
    import random

    from experiments.spec.workload import next_arrival

    rng, t, arrivals = random.Random(7), 0.0, []
    while t < 300:
        t = next_arrival(t, 0.5, ((100, 2.0), (200, 5.0)), rng)
        arrivals.append(t)
    per_segment = [sum(1 for a in arrivals if lo <= a < lo + 100) / 100 for lo in (0, 100, 200)]
    # Poisson counts: 50, 200 and 500 expected; 4 sigma is 28, 57 and 89
    assert abs(per_segment[0] - 0.5) < 0.28 and abs(per_segment[1] - 2.0) < 0.57 and abs(per_segment[2] - 5.0) < 0.89
    # without steps the draws are the plain exponential ones (workloads without rate_steps are unchanged)
    a, b = random.Random(3), random.Random(3)
    assert next_arrival(1.0, 0.3, (), a) == 1.0 + b.expovariate(0.3)


def test_rate_steps_must_increase():
    from experiments.spec.experiment import SpecError, load_spec

    with pytest.raises(SpecError, match=r"rate_steps: from_s must increase, got \[20.0, 10.0\]"):
        load_spec("pdd-smoke", ["workload.synthetic.rate_steps=[[20, 1], [10, 2]]"])


def test_fixed_hit_gives_every_request_the_same_hit():
    s = load_spec(
        "pdd-smoke", ["workload.source=fixed_hit", "workload.fixed_hit.prompt_tokens=96", "workload.fixed_hit.hit=0.4"]
    )
    reqs = wl.build(s)
    warm, rest = reqs[0], reqs[1:]
    assert warm.kind == "warmup" and len(rest) == 40 and {r.prompt_len for r in rest} == {96}
    # 0.4 x 96 = 38.4 -> 32 tokens in whole blocks of 8; the warm-up is that prefix and one block
    assert {r.cached_tokens for r in rest} == {32} and {r.head_tokens[:32] for r in rest} == {warm.head_tokens[:32]}
    assert len({r.head_tokens[32:] for r in rest}) == 40  # the rest is new in each
    assert [r.arrival_s for r in rest] == sorted(r.arrival_s for r in rest)
    with pytest.raises(Exception, match=r"workload.fixed_hit.prompt_tokens=200 out of range \[2, 127\]"):
        load_spec("pdd-smoke", ["workload.source=fixed_hit", "workload.fixed_hit.prompt_tokens=200"])
