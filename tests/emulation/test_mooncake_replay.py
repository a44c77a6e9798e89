"""The shipped Mooncake slice replayed in the topology (tiny model, pdd, process runtime): the MD's measured
DRC hits agree with the hash-id expectation where the prefix is at the MD.

The expectation from the hash ids (workload.jsonl's cached_tokens) assumes every earlier request of the
window ended at the MD before this one was sent. So each request's measured hit (the MD's own, as its
session pinned it) must lie between two figures computed from the same tokens: the hit that only the
requests done at least SETTLE_S before it was sent can give (their prefix is surely at the MD: nothing is
evicted here), and the hash-id expectation. Where the two are equal the measured hit must equal them, and
there are enough such requests with a hit for that to mean something.
"""

import json

import pytest

from experiments.analysis import records
from experiments.run import runner
from experiments.spec import workload as workloadmod
from experiments.spec.experiment import load_spec
from workers.roles.routing import DRCMirror

pytestmark = [pytest.mark.emulation]

SETTLE_S = 1.0  # a request ended this long ago has its prompt in the MD's DRC (a relay drains within it)
OVERRIDES = [
    "runtime=process",
    "variants=[pdd]",
    "workload.source=mooncake",
    "workload.trace=experiments/traces/mooncake-conversation-slice.jsonl",
    # 2 tokens per hash id: prompts fit the tiny model's 128 tokens and a shared prefix spans DRC blocks of 8
    "workload.mooncake={tokens_per_hash_block: 2, time_scale: 0.1, max_output_tokens: 8}",
    "deployment.policy.singular_min_uncached_tokens=1000",  # no singular route: every request ends at the MD
]


@pytest.fixture(scope="module")
def replay(tmp_path_factory):
    spec = load_spec("pdd-smoke", OVERRIDES)
    out = runner.run(spec, results=tmp_path_factory.mktemp("mooncake"))
    return out


def test_measured_drc_hits_agree_with_the_hash_id_expectation(replay):
    out = replay
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["complete"] is True, meta.get("error") or meta["variants"]
    work = {w.request_id: w for w in workloadmod.read(out / "workload.jsonl") if w.kind != "warmup"}
    recs = sorted((r for r in records.read(out) if r.kind != "warmup"), key=lambda r: r.t_send_ns)
    assert len(recs) == len(work) == 39 and all(r.ok for r in recs), [r.error for r in recs if not r.ok]
    block = 8
    agreed = 0
    for r in recs:
        prompt, expected = work[r.request_id].head_tokens, work[r.request_id].cached_tokens
        done = DRCMirror(block, capacity_blocks=1 << 20)
        for q in recs:
            if q.t_done_ns + SETTLE_S * 1e9 < r.t_send_ns:
                done.insert(list(work[q.request_id].head_tokens))
        surely = done.match(list(prompt))
        print(
            f"{r.request_id}: prompt {len(prompt)}, at the MD surely {surely}, hash ids {expected}, "
            f"measured {r.md_cached_tokens} ({r.route})"
        )
        assert surely <= r.md_cached_tokens <= expected, r.request_id
        agreed += surely == expected > 0
    assert agreed >= 5, f"only {agreed} requests with a hit whose prefix was surely at the MD"
    s = json.loads((out / "summary.json").read_text())["variants"]["pdd"]["hit_rate"]
    assert s["expected_mean"] == pytest.approx(sum(w.expected_hit for w in work.values()) / len(work))
