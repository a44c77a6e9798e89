"""`pddlab run SPEC --cluster ADDRESS`: an experiment on an existing Ray cluster, no emulated topology.

The cluster is the tier's two-node loopback Ray (conftest: site a, the head, and site b); pddlab runs as a
separate process, as a user would start it, connecting to the head's address with the cluster's token (the
environment the fixture set). Checked from the run directory's JSON:

- pdd-smoke's pd-cross and pdd complete every request with the same tokens, the router, P and RLD placed on
  site a's node and the MD on site b's, every worker's log and events brought back into the run directory,
  and the captures named by cluster.capture in pcap/;
- one clear error, before any role starts and with nothing left, for an address nothing answers at (before a
  run directory exists), a label no node has, and a shaping command that fails on its node.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import ray

from experiments.run.deploy import REPO

pytestmark = pytest.mark.slow
RUN_S = 420


def pddlab(tmp_path, *args: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "experiments.cli", "run", "pdd-smoke", "--results", str(tmp_path), *args]
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=RUN_S)


def run_dir(tmp_path):
    found = sorted(tmp_path.glob("*pdd-smoke*"))
    return found[-1] if found else None


def test_an_address_nothing_answers_at_is_one_error_before_anything(tmp_path):
    proc = pddlab(tmp_path, "--cluster", "127.0.0.1:1")
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "cannot reach the Ray cluster at 127.0.0.1:1: Connection refused" in proc.stderr
    assert "nothing was started" in proc.stderr and run_dir(tmp_path) is None


def test_pdd_smoke_runs_on_the_cluster_with_the_roles_placed_by_site(cluster, tmp_path):
    work_dirs_before = set(Path("/tmp").glob("pddlab-cluster-*"))
    proc = pddlab(
        tmp_path,
        "--cluster",
        cluster.address,
        "--set",
        "variants=[colocated, pd-cross, pdd]",
        "--set",
        "cluster.capture=[{site: a, interface: lo}]",
        "--set",
        "cluster.capture_filter=tcp",
    )
    out = run_dir(tmp_path)
    assert proc.returncode == 0 and out is not None, proc.stderr[-3000:]
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["complete"] is True, meta.get("error") or meta["variants"]
    assert meta["topology"]["runtime"] == "ray-cluster" and meta["topology"]["hosts"] == []
    recs = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert {r["variant"] for r in recs} == {"colocated", "pd-cross", "pdd"}
    assert all(r["ok"] and r["output_tokens"] == r["max_tokens"] for r in recs), [r for r in recs if not r["ok"]]
    streams = json.loads((out / "summary.json").read_text())["streams"]["variants"]
    for v, s in streams.items():
        assert s["equal"] + s["diverged"] > 0 and s["unexplained"] == 0, (v, s["divergences"][:3])
    sites = {n["id"]: n["labels"]["pddlab/cluster"] for n in meta["topology"]["runtime_metadata"]["nodes"]}
    for variant in ("pd-cross", "pdd"):
        vdir = out / "variants" / variant
        cfg = (vdir / "deployment.yaml").read_text()
        assert "127.0.0.1" in cfg  # the addresses Ray gave the workers, written back
        for worker in ("router", "p1", "rld1", "md1"):
            assert (vdir / "logs" / f"{worker}.log").stat().st_size > 0, (variant, worker)
        assert (vdir / "events" / "md1.jsonl").stat().st_size > 0
    assert set(sites.values()) == {"a", "b"}
    assert (out / "pcap" / "wan-a.pcap").stat().st_size > 24  # more than a pcap header
    assert set(Path("/tmp").glob("pddlab-cluster-*")) == work_dirs_before  # the nodes' work directory removed


def test_a_label_no_node_has_is_refused_naming_the_pool_and_nothing_starts(cluster, tmp_path):
    before = set(ray.util.list_named_actors(all_namespaces=True))
    proc = pddlab(tmp_path, "--cluster", cluster.address, "--set", "pools.p.labels={zone: z9}")
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "pool p: no node has label zone=z9" in proc.stderr
    meta = json.loads((run_dir(tmp_path) / "metadata.json").read_text())
    assert meta["complete"] is False and meta["variants"] == {}
    assert set(ray.util.list_named_actors(all_namespaces=True)) == before


def test_a_shaping_that_fails_on_its_node_is_one_error_and_nothing_starts(cluster, tmp_path):
    proc = pddlab(tmp_path, "--cluster", cluster.address, "--set", "cluster.shape=[{site: b, interface: pddnone0}]")
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "shaping b_to_a (wan-cross-country) on node 127.0.0.1/" in proc.stderr
    assert "`tc qdisc replace dev pddnone0 root netem" in proc.stderr
    meta = json.loads((run_dir(tmp_path) / "metadata.json").read_text())
    assert meta["complete"] is False and meta["variants"] == {}
