"""Each worker on its own: the workers a request used, and summary.json's per-worker figures of a run of 2 P,
1 RLD and 2 MD (fake_run's pools run: P alternates, pd-cross's MD alternates, pdd's md2 serves nothing)."""

import json

import pytest

import fake_run as fr
from experiments.analysis import analyze, occupancy, runmeta
from experiments.rundir import clientlog
from experiments.spec import experiment as specmod, workload as wl
from experiments.rundir.metadata import RunMetadata, VariantRecord
from experiments.analysis.records import build_record, read as read_records
from fake_run import make_run

KV_BPT = 512  # fake_run's KV bytes per token
POOLS = {"p": 2, "md": 2}
WINDOW_MS = 5000  # fake_run.WINDOW_NS


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run = make_run(tmp_path_factory.mktemp("pools"), pools=POOLS)
    analyze.analyze(run)
    return run


@pytest.fixture(scope="module")
def workers(run):
    """variant -> worker -> its figures."""
    s = json.loads((run / "summary.json").read_text())
    return {v: x["workers"] for v, x in s["variants"].items()}


@pytest.fixture(scope="module")
def reqs():
    """The workload in send order: request i is the i-th (fake_run.picks(variant, i) names its workers)."""
    return wl.build(specmod.load_spec("pdd-smoke", []))


def _of(reqs, worker: str, variant: str) -> list:
    return [r for i, r in enumerate(reqs) if worker in fr.picks(variant, i, POOLS).values()]


def test_each_record_names_the_workers_it_used(run, reqs):
    recs = {(r.variant, r.request_id): r for r in read_records(run)}
    for i, q in enumerate(reqs):
        rec = recs[("pdd", q.request_id)]
        assert rec.workers == fr.picks("pdd", i, POOLS) == {"p": f"p{1 + i % 2}", "rld": "rld1", "md": "md1"}
        assert rec.token_workers[0] == rec.workers["p"]  # token 0: the P that prefilled it
    assert recs[("colocated", reqs[0].request_id)].workers == {"rld": "rld1"}


def test_a_worker_picked_after_the_route_is_the_one_recorded():
    """A P->MD request that fell back to cluster A: the RLD was picked then, after the route event."""
    raw = clientlog.new_record("r1", "pdd", "pdd", "s", 1, "turn", 4, list(range(8)), 0)
    evs = [
        {"t_ns": 1, "event": "route", "worker": "router", "role": "router", "workers": {"p": "p2", "md": "md1"}},
        {"t_ns": 2, "event": "prefill_arrival", "worker": "p2", "role": "p"},
        {"t_ns": 3, "event": "route_fallback", "worker": "router", "role": "router", "reason": "md1 unavailable"},
        {"t_ns": 4, "event": "session_open", "worker": "rld2", "role": "router", "cached_tokens": 0},
    ]
    assert build_record(raw, None, evs).workers == {"p": "p2", "md": "md1", "rld": "rld2"}
    old = [{"t_ns": 1, "event": "route", "worker": "router", "role": "router"}, evs[1]]  # before pools: no `workers`
    assert build_record(raw, None, old).workers == {"p": "p2"}


def test_every_worker_of_the_deployment_with_its_limits(workers):
    for v, ws in workers.items():
        assert list(ws) == ["p1", "p2", "rld1", "md1", "md2"], v
    caps = {"p": 4096, "rld": 2048, "md": 4096}  # pdd-smoke's capacity_tokens
    for name, f in workers["pdd"].items():
        assert f["limits"] == {"capacity_tokens": caps[f["role"]], "threads": 1, "cpus": None, "memory_mb": None}


def test_requests_tokens_queue_and_busy_of_each_p(workers, reqs):
    for p in ("p1", "p2"):
        f, mine = workers["pdd"][p], _of(reqs, p, "pdd")
        assert (f["requests"], f["sessions"], f["tokens"]) == (5, 5, 5)  # token 0 of each request it prefilled
        assert f["queue_ms"]["n"] == 5 and f["queue_ms"]["p50"] == pytest.approx(fr.P_QUEUE_MS[p])
        prefill_ms = 1 - fr.P_QUEUE_MS[p]  # prefill_start .. prefill_done at 2 ms
        assert f["busy_pct"] == pytest.approx(100 * 5 * prefill_ms / WINDOW_MS)
        assert f["occupancy"] is None
        hits = [q.cached_tokens / q.prompt_len for q in mine]
        assert f["prefix_hit"]["n"] == 5 and f["prefix_hit"]["mean"] == pytest.approx(sum(hits) / 5)
    total = sum(q.max_tokens for q in reqs)  # pdd's tokens: P's, then 2 from rld1, the rest from md1
    assert workers["pdd"]["rld1"]["tokens"] == sum(min(2, q.max_tokens - 1) for q in reqs)
    md1 = sum(max(0, q.max_tokens - 3) for q in reqs)
    assert workers["pdd"]["md1"]["tokens"] == md1 and workers["pdd"]["md1"]["token_share"] == pytest.approx(md1 / total)


def test_the_decode_workers_queue_occupancy_and_drc_hit(workers, reqs):
    md = workers["pdd"]["md1"]
    assert (md["requests"], md["sessions"]) == (10, 10)
    assert md["queue_ms"]["p90"] == pytest.approx(fr.DECODE_QUEUE_MS["md1"])
    open_ms = fr.DECODE_SESSION_MS - fr.DECODE_QUEUE_MS["md1"]
    occ = md["occupancy"]
    assert (occ["sessions_max"], occ["sessions_mean"]) == (1, pytest.approx(10 * open_ms / WINDOW_MS))
    reserved = [q.prompt_len + q.max_tokens for q in reqs]
    assert occ["reserved_tokens_max"] == max(reserved)
    assert occ["reserved_tokens_mean"] == pytest.approx(sum(reserved) * open_ms / WINDOW_MS)
    assert occ["reserved_pct_mean"] == pytest.approx(100 * occ["reserved_tokens_mean"] / 4096)
    hit = md["prefix_hit"]
    assert hit["mean"] == pytest.approx(sum(q.cached_tokens / q.prompt_len for q in reqs) / len(reqs))
    assert hit["token_weighted"] == pytest.approx(sum(q.cached_tokens for q in reqs) / sum(q.prompt_len for q in reqs))
    assert workers["pd-cross"]["md2"]["prefix_hit"]["mean"] == 0.0  # no DRC on pd-cross's route
    assert workers["pd-cross"]["md2"]["queue_ms"]["p50"] == pytest.approx(fr.DECODE_QUEUE_MS["md2"])
    rld = workers["pdd"]["rld1"]
    assert rld["prefix_hit"]["n"] == 0  # its sessions took P's KV: its cache was not asked
    assert workers["colocated"]["rld1"]["prefix_hit"]["n"] == 10  # colocated prefills locally


def test_a_worker_that_served_nothing(workers, run):
    idle = workers["pdd"]["md2"]
    assert (idle["requests"], idle["sessions"], idle["tokens"], idle["token_share"]) == (0, 0, 0, 0.0)
    assert idle["queue_ms"] == {"n": 0, "p50": None, "p90": None, "max": None}
    assert idle["occupancy"] == {
        "sessions_mean": 0.0,
        "sessions_max": 0,
        "reserved_tokens_mean": 0.0,
        "reserved_tokens_max": 0,
        "reserved_pct_mean": 0.0,
    }
    assert idle["prefix_hit"]["n"] == 0 and idle["kv_received"] == {} and idle["handoffs"]["received"] == 0
    md = (run / "summary.md").read_text()
    assert "## Per worker" in md
    rows = {tuple(line.split(" | ")[:2]) for line in md.splitlines() if line.startswith("| ")}
    assert ("| pdd", "md2") in rows  # idle in a pool its variant used: shown
    assert ("| colocated", "p1") not in rows and ("| colocated", "rld1") in rows  # colocated uses no P


def test_kv_sent_per_path_and_receiver_and_received(workers, reqs):
    for i, (p, md) in enumerate((("p1", "md1"), ("p2", "md2"))):
        mine = [q for j, q in enumerate(reqs) if j % 2 == i]
        wan = workers["pd-cross"][p]["kv_sent"]["wan"]
        sent = sum(q.prompt_len * KV_BPT for q in mine)
        assert (wan["transfers"], wan["ok"], wan["kv_bytes"]) == (5, 5, sent)
        assert wan["to"] == {md: {"transfers": 5, "kv_bytes": sent}}
        assert workers["pd-cross"][md]["kv_received"] == {
            "prompt": {"transfers": 5, "kv_bytes": sent, "wire_bytes": sent}
        }
    p1 = workers["pdd"]["p1"]["kv_sent"]
    assert set(p1["fast"]["to"]) == {"rld1"} and set(p1["wan"]["to"]) == {"md1"}
    drc_copy = sum((q.prompt_len - q.cached_tokens) * KV_BPT for q in reqs)
    assert workers["pdd"]["md1"]["kv_received"]["prompt"]["kv_bytes"] == drc_copy
    assert workers["pdd"]["rld1"]["handoffs"] == {"sent": 10, "payload_bytes_sent": 400, "received": 0}
    assert workers["pdd"]["md1"]["handoffs"]["received"] == 10


def test_a_docker_runs_limits_reach_each_worker(run):
    deps = runmeta.deployments(run)
    meta = RunMetadata(
        experiment="x",
        complete=True,
        provenance=fr.PROVENANCE,
        topology=fr.topology_record() | {"runtime_metadata": {"limits": {"md": {"cpus": 2.0, "memory_mb": 3072}}}},
    )
    setups = {w.name: w for w in runmeta.worker_setups(deps["pdd"], meta)}
    assert (setups["md2"].cpus, setups["md2"].memory_mb, setups["md2"].kv_address) == (2.0, 3072, "10.2.0.62:50063")
    assert (setups["p1"].cpus, setups["p1"].kv_address) == (None, "")
    assert runmeta.kv_ports(deps) == {50062, 50063}


def test_one_workers_occupancy_reserves_prompt_and_output_tokens():
    ev = [
        {
            "t_ns": 0,
            "event": "decode_arrival",
            "worker": "md2",
            "request_id": "a",
            "prompt_tokens": 30,
            "max_tokens": 10,
        },
        {"t_ns": 0, "event": "decode_open", "worker": "md2", "request_id": "a"},
        {"t_ns": 10, "event": "decode_open", "worker": "md1", "request_id": "b"},
        {"t_ns": 50, "event": "decode_close", "worker": "md2", "request_id": "a"},
        {"t_ns": 60, "event": "session_open", "worker": "md2", "role": "router", "request_id": "c"},
    ]
    occ = occupancy.worker_occupancy(ev, "md2", VariantRecord(status="ok", t_ready_ns=0, t_end_ns=100))
    assert occ == {"sessions_mean": 0.5, "sessions_max": 1, "reserved_tokens_mean": 20.0, "reserved_tokens_max": 40}
