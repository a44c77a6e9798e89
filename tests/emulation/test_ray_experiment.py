"""pdd-smoke with `runtime=ray` in the topology: a Ray node in every worker host, the roles placed by Ray.

One run of the smoke experiment (all four variants, the tiny model) with the head node in `router`
(cluster A) and a node in p1, rld1 (cluster A) and md1 (cluster B), checked from the run directory's JSON as
test_pdd_experiment checks the Docker run:

- every request of every variant completed with exactly max_tokens tokens and the colocated variant's
  tokens (near ties aside), every role exited 0 at stop;
- each worker ran on the Ray node in its own host, reached at the topology's address (the route events
  name p1, rld1, md1), and its log and events are in the run directory;
- pdd sent fewer bytes over the WAN than pd-cross, and Ray's own traffic crossed the WAN too (md1's node
  to the head's GCS port: the control plane meets the same impairments as the roles);
- nothing is left: no Ray process (none whose command line holds the run's Ray temp dir), the temp dir
  removed, and the autouse fixture's namespaces, links and state file.
"""

import json
from pathlib import Path

import pytest

from experiments.analysis import records
from experiments.run import runner
from experiments.spec.experiment import load_spec
from ray_rt.netns import GCS_PORT


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes that contain text (a check only: nothing is ended by name)."""
    out = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            line = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in line:
            out.append(f"{cmdline.parent.name}: {line[:200]}")
    return out


@pytest.fixture(scope="module")
def ray_run(tmp_path_factory):
    spec = load_spec("pdd-smoke", ["runtime=ray"])
    out = runner.run(spec, results=tmp_path_factory.mktemp("results"))
    return spec, out


def test_every_variant_completes_every_request_with_the_reference_tokens(ray_run):
    spec, out = ray_run
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["complete"] is True, meta.get("error") or meta["variants"]
    for v, w in meta["variants"].items():
        assert w["status"] == "ok" and w["exit_codes"] == {x: 0 for x in ("router", "p1", "rld1", "md1")}, (v, w)
    recs = records.read(out)
    assert {r.variant for r in recs} == set(spec.variants)
    bad = [(r.variant, r.request_id, r.error) for r in recs if not r.ok or r.output_tokens != r.max_tokens]
    assert not bad, bad
    streams = json.loads((out / "summary.json").read_text())["streams"]["variants"]
    for v, s in streams.items():
        assert s["equal"] + s["diverged"] > 0 and s["unexplained"] == 0, (v, s["divergences"][:3])


def test_each_worker_ran_on_the_node_in_its_own_host(ray_run):
    _, out = ray_run
    topo = json.loads((out / "metadata.json").read_text())["topology"]
    assert topo["runtime"] == "ray"
    nodes = {n["host"]: n["site"] for n in topo["runtime_metadata"]["nodes"]}
    assert nodes == {"router": "a", "p1": "a", "rld1": "a", "md1": "b"}
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    used = {w for e in events if e["event"] == "route" for w in (e.get("workers") or {}).values()}
    assert {"p1", "rld1", "md1"} <= used, used
    for variant in ("pd-cross", "pdd"):
        vdir = out / "variants" / variant
        driver_log = (vdir / "logs" / "ray-driver.log").read_text()
        assert all(f"{w} (" in driver_log for w in ("router", "p1", "rld1", "md1")), driver_log[-2000:]
        for worker in ("router", "p1", "rld1", "md1"):
            assert (vdir / "logs" / f"{worker}.log").stat().st_size > 0, (variant, worker)
        for worker in ("router", "p1", "md1", *(["rld1"] if variant == "pdd" else [])):  # pd-cross: no RLD
            assert (vdir / "events" / f"{worker}.jsonl").stat().st_size > 0, (variant, worker)


def test_kv_and_rays_own_traffic_cross_the_wan(ray_run):
    _, out = ray_run
    s = json.loads((out / "summary.json").read_text())["variants"]
    assert 0 < s["pdd"]["wan_bytes_total"] < s["pd-cross"]["wan_bytes_total"]
    flows = json.loads((out / "flows.json").read_text())["flows"]
    kv = [f for f in flows if f["class"] == "kv" and f["variant"] == "pd-cross"]
    assert sum(f["payload_bytes_sent"] for f in kv) > 0
    to_gcs = [f for f in flows if f["src"] == "10.2.0.61" and f["dport"] == GCS_PORT]
    assert to_gcs and sum(f["packets_delivered"] for f in to_gcs) > 0, "md1's Ray node never reached the head"


def test_no_ray_process_or_file_is_left(ray_run):
    _, out = ray_run
    temp_root = Path(json.loads((out / "metadata.json").read_text())["topology"]["runtime_metadata"]["temp_root"])
    assert temp_root.name.startswith("pddray-") and not temp_root.exists()
    assert processes_mentioning(str(temp_root)) == []
