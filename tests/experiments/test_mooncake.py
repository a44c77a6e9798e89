"""Mooncake FAST'25 traces as a workload (experiments.spec.mooncake): hash ids to token blocks, scaling, the
window, the expected hit from the hash ids, bad lines refused naming the line, and the shipped slice."""

import json
import math
import tracemalloc
from pathlib import Path
from types import SimpleNamespace

import pytest

from experiments.spec import mooncake, workload
from experiments.spec.experiment import SpecError, load_spec
from experiments.spec.mooncake import MooncakeError
from experiments.spec.workload import TraceError

REPO = Path(__file__).resolve().parents[2]
SLICE = REPO / "experiments" / "traces" / "mooncake-conversation-slice.jsonl"
PUBLIC = REPO.parent / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"


def opts(**kw):
    base = dict(tokens_per_hash_block=4, time_scale=1.0, start_s=0.0, max_requests=0, max_output_tokens=0)
    return SimpleNamespace(**{**base, **kw})


def trace(tmp_path, *entries) -> Path:
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in entries))
    return path


def line(t_ms, n_in, n_out, ids):
    return {"timestamp": t_ms, "input_length": n_in, "output_length": n_out, "hash_ids": ids}


def test_equal_hash_ids_are_equal_tokens_and_the_hit_is_the_shared_prefix(tmp_path):
    path = trace(
        tmp_path,
        line(0, 1024, 512, [0, 1]),  # 2 blocks -> 8 tokens (4 per hash id), output 512 -> 4
        line(1000, 1400, 100, [0, 1, 2]),  # shares ids 0, 1: 8 tokens; 1400 -> ceil(10.9) = 11 tokens
        line(2000, 1536, 100, [0, 3, 4]),  # shares id 0 only
        line(3000, 600, 1, [5, 6]),  # shares nothing
    )
    a, b, c, d = mooncake.load(path, opts(), vocab=256, block=4, context=128, seed=7)
    assert (len(a.tokens), a.max_tokens, len(b.tokens), b.max_tokens) == (8, 4, 11, 1)
    assert b.tokens[:8] == a.tokens and c.tokens[:4] == a.tokens[:4]
    assert c.tokens[4:8] != a.tokens[4:8] and d.tokens[:4] != a.tokens[:4]
    assert [r.cached_tokens for r in (a, b, c, d)] == [0, 8, 4, 0]
    assert [r.arrival_s for r in (a, b, c, d)] == [0.0, 1.0, 2.0, 3.0]
    # the same seed gives the same tokens; another seed other tokens
    again = mooncake.load(path, opts(), vocab=256, block=4, context=128, seed=7)
    other = mooncake.load(path, opts(), vocab=256, block=4, context=128, seed=8)
    assert again[1].tokens == b.tokens and other[1].tokens != b.tokens


def test_the_hit_is_whole_drc_blocks_and_at_most_the_prompt_less_one(tmp_path):
    path = trace(tmp_path, line(0, 1536, 10, [0, 1, 2]), line(1, 1536, 10, [0, 1, 2]))
    first, same = mooncake.load(path, opts(), vocab=256, block=8, context=128, seed=0)
    assert same.tokens == first.tokens and len(same.tokens) == 12
    assert same.cached_tokens == 8  # 11 tokens may match (not the last), aligned down to 8


def test_the_window_time_scale_and_caps(tmp_path):
    path = trace(
        tmp_path,
        line(5000, 512, 512, [0]),
        line(2000, 512, 512, [0]),  # out of order in the file: replayed in timestamp order
        line(9000, 20480, 51200, list(range(40))),  # 160 + 400 tokens: over a 128-token context
        line(12000, 512, 512, [0]),
    )
    reqs = mooncake.load(path, opts(start_s=4.0, max_requests=2, time_scale=0.5), 256, 4, 128, 0)
    assert [r.arrival_s for r in reqs] == [0.5, 2.5]  # (5 - 4) x 0.5, (9 - 4) x 0.5; the 12 s one cut
    big = reqs[1]
    assert big.max_tokens == 127 and len(big.tokens) == 1  # the output capped by the context, then the prompt
    capped = mooncake.load(path, opts(start_s=9.0, max_requests=1, max_output_tokens=16), 256, 4, 128, 0)
    assert (capped[0].max_tokens, len(capped[0].tokens)) == (16, 112)


@pytest.mark.parametrize(
    "raw,needle",
    [
        ("{nope", "t.jsonl:2: not JSON: Expecting property name enclosed in double quotes (column 2)"),
        (json.dumps({"timestamp": 1, "input_length": 5, "output_length": 1}), "exactly the keys"),
        (json.dumps({"timestamp": 1, "input_length": 5, "output_length": 1}), "; missing ['hash_ids']"),
        (json.dumps({**line(1, 5, 1, [0]), "session": "x"}), "exactly the keys"),
        (json.dumps({**line(1, 5, 1, [0]), "session": "x"}), "; unknown ['session']"),
        ("[1, 2]", "t.jsonl:2: a Mooncake trace line is an object with the keys"),
        (json.dumps(line(-1, 5, 1, [0])), "timestamp must be a finite number >= 0"),
        (json.dumps(line(1, 0, 1, [0])), "input_length must be an int >= 1, got 0"),
        (json.dumps(line(1, 5, 1.5, [0])), "output_length must be an int >= 1, got 1.5"),
        (json.dumps(line(1, 1025, 1, [0, 1])), "2 hash_ids cannot cover input_length=1025 (one per 512-token block: 3"),
        (json.dumps(line(1, 5, 1, [0, "a"])), "hash_ids[1] must be an int >= 0, got 'a'"),
        (json.dumps(line(1, 5, 1, [0, -3])), "hash_ids[1] must be an int >= 0, got -3"),
        (json.dumps(line(1, 5, 1, 7)), "hash_ids must be a list of ints >= 0, got 7"),
        # absurd numbers and nesting: once a raw ValueError, OverflowError or RecursionError without the line
        pytest.param(
            json.dumps(line(1, "N", 1, [0])).replace('"N"', "9" * 5000),
            "t.jsonl:2: input_length must be an int >= 1, got a 5000-digit number",
            id="5000-digit",
        ),
        (
            json.dumps(line(10**399, 5, 1, [0])),
            "t.jsonl:2: timestamp must be a finite number >= 0 (ms), got a 400-digit",
        ),
        (json.dumps(line(1, 10**399, 1, [0])), "t.jsonl:2: input_length must be an int >= 1, got a 400-digit number"),
        (json.dumps(line(1, 5, 1, [10**399])), "t.jsonl:2: hash_ids[0] must be an int >= 0, got a 400-digit number"),
        pytest.param(
            json.dumps(line(1, 5, 1, "X")).replace('"X"', "[" * 10_000 + "]" * 10_000),
            "t.jsonl:2: not JSON this loader reads: nested too deep",
            id="hash_ids-nested-10000",
        ),
        pytest.param(
            "[" * 10_000 + "]" * 10_000, "t.jsonl:2: not JSON this loader reads: nested too deep", id="nested"
        ),
    ],
)
def test_a_bad_line_is_refused_naming_it(tmp_path, raw, needle):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(line(0, 512, 1, [0])) + "\n" + raw + "\n")
    with pytest.raises(MooncakeError) as info:
        mooncake.load(path, opts(), 256, 4, 128, 0)
    assert needle in str(info.value)


def test_a_huge_bad_value_is_shown_cut_and_bytes_not_utf8_name_the_line(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(line(0, 512, 1, [0])) + "\n" + json.dumps(line(1, [0] * 200_000, 1, [0])) + "\n")
    with pytest.raises(
        MooncakeError, match=r"t.jsonl:2: input_length must be an int >= 1, got \[0, 0, 0, 0, \.\.\.\]$"
    ):
        mooncake.load(path, opts(), 256, 4, 128, 0)  # the message was the 600,000-character list
    path.write_bytes(json.dumps(line(0, 512, 1, [0])).encode() + b"\n" + b'{"timestamp": \xff}\n')
    with pytest.raises(MooncakeError, match=r"t.jsonl:2: not UTF-8 \(byte 15 of the line\)"):
        mooncake.load(path, opts(), 256, 4, 128, 0)


def huge_line(tmp_path, n_ids: int) -> Path:
    """One request listing n_ids distinct hash ids (a line of about 8 bytes per id), all of them needed."""
    return trace(tmp_path, line(0, 512 * n_ids, 1, list(range(10**6, 10**6 + n_ids))))


def test_only_the_hash_ids_the_cut_prompt_needs_are_expanded(tmp_path):
    path = huge_line(tmp_path, 250_000)
    assert path.stat().st_size > 2 * 2**20
    ((_, d),) = mooncake.read(path)
    blocks = mooncake.Blocks(seed=0, vocab=32000, size=8)
    prompt = blocks.prompt(d["hash_ids"], 4095)
    assert len(prompt) == 4095 and len(blocks) == math.ceil(4095 / 8)  # 512 of the 250,000 ids
    assert prompt[:8] == blocks[10**6] and prompt[-7:] == blocks[10**6 + 511][:7]


def test_a_2_mib_line_loads_in_memory_of_its_json_not_of_its_hash_ids_expanded(tmp_path):
    path = huge_line(tmp_path, 250_000)
    tracemalloc.start()
    try:
        (entry,) = mooncake.load(path, opts(tokens_per_hash_block=8), vocab=32000, block=16, context=4096, seed=0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert (len(entry.tokens), entry.max_tokens) == (4095, 1)
    # the parsed line is ~10 MiB of ints; expanding every id to its 8 tokens first took 112 MiB
    assert peak < 32 * 2**20, f"peak {peak / 2**20:.0f} MiB"


def test_an_empty_window_and_a_missing_file_are_clear_errors(tmp_path):
    path = trace(tmp_path, line(0, 512, 1, [0]))
    with pytest.raises(MooncakeError, match="no request at or after start_s=5.0 s"):
        mooncake.load(path, opts(start_s=5.0), 256, 4, 128, 0)
    with pytest.raises(MooncakeError, match="cannot read the trace"):
        mooncake.load(tmp_path / "absent.jsonl", opts(), 256, 4, 128, 0)


def test_the_spec_takes_a_mooncake_source_and_checks_its_options():
    spec = load_spec("pdd-mooncake")
    reqs = workload.build(spec)
    assert spec.workload.source == "mooncake" and len(reqs) == 39
    assert {r.kind for r in reqs} == {"trace"} and all(r.after is None and r.turn == 1 for r in reqs)
    assert all(r.prompt_len == len(r.head_tokens) for r in reqs)
    assert sum(r.cached_tokens > 0 for r in reqs) >= 20  # the slice keeps conversations that reuse a prefix
    with pytest.raises(SpecError, match=r"workload.mooncake.tokens_per_hash_block=0 out of range \[1, 512\]"):
        load_spec("pdd-mooncake", ["workload.mooncake.tokens_per_hash_block=0"])
    with pytest.raises(SpecError, match="workload.trace: required when workload.source is 'mooncake'"):
        load_spec("pdd-smoke", ["workload.source=mooncake"])
    with pytest.raises(TraceError, match="no request at or after start_s=9000.0 s"):  # the workload's error
        workload.build(load_spec("pdd-mooncake", ["workload.mooncake.start_s=9000"]))


def test_the_slice_is_lines_of_the_public_trace_unchanged():
    if not PUBLIC.exists():
        pytest.skip(f"the public trace is not at {PUBLIC}")
    public = set(PUBLIC.read_text().splitlines())
    lines = SLICE.read_text().splitlines()
    assert len(lines) == 39 and all(x in public for x in lines)
