"""Worker pools in the topology: pdd-smoke with 2 P, 1 RLD and 2 MD, every variant, the tiny model.

Each worker runs in a host of its own (p1, p2 in cluster A; md1, md2 in cluster B); checked from the run
directory's JSON: every request of every variant completed with the colocated variant's tokens (near
ties aside, as in test_pdd_experiment), the router used both Ps and both MDs, and summary.json has each
worker's own figures.
"""

import json

import pytest

from experiments.analysis import records
from experiments.run import runner
from experiments.spec.experiment import load_spec

# in turn, so both workers of each pool serve whatever the timing (cache-aware picks: tests/e2e/test_pools.py)
POOLS = [
    "pools.p.workers=2",
    "pools.md.workers=2",
    "runtime=process",
    "deployment.policy.pick_p=round_robin",
    "deployment.policy.pick_md=round_robin",
]


@pytest.fixture(scope="module")
def pool_run(tmp_path_factory):
    spec = load_spec("pdd-smoke", POOLS)
    return spec, runner.run(spec, results=tmp_path_factory.mktemp("results"))


def test_every_request_completes_with_the_reference_tokens(pool_run):
    spec, out = pool_run
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["complete"] is True, meta.get("error") or meta["variants"]
    recs = records.read(out)
    bad = [(r.variant, r.request_id, r.error) for r in recs if not r.ok or r.output_tokens != r.max_tokens]
    assert not bad, bad
    streams = json.loads((out / "summary.json").read_text())["streams"]["variants"]
    for v, s in streams.items():
        assert s["unexplained"] == 0 and s["prompt_differs"] == 0, (v, s["divergences"][:3])


def test_both_ps_and_both_mds_served_and_each_has_its_figures(pool_run):
    spec, out = pool_run
    routes = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    used = {w for e in routes if e["event"] == "route" for w in (e.get("workers") or {}).values()}
    assert {"p1", "p2", "rld1", "md1", "md2"} <= used, used
    hosts = {h["name"] for h in json.loads((out / "metadata.json").read_text())["topology"]["hosts"]}
    assert {"p1", "p2", "md1", "md2"} <= hosts
    workers = json.loads((out / "summary.json").read_text())["variants"]["pd-cross"]["workers"]
    assert {"p1", "p2", "md1", "md2"} <= set(workers)
    pd_cross = [r for r in records.read(out) if r.variant == "pd-cross"]
    assert sum(workers[w]["sessions"] for w in ("md1", "md2")) >= len(pd_cross)
