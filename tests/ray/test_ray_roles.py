"""The PDD roles under Ray on a loopback cluster of two labelled nodes: placed by site, one pdd request answered
with the reference tokens, crashes reported like the Docker runtime's, bad placements refused before anything
starts, and nothing left once the cluster stops.

The module's tests share one cluster (conftest) and run in file order; the last one stops it.
"""

import logging
import subprocess
import time

import pytest
import ray
import torch
from pdd_harness import deployment_yaml, free_port
from test_roles import check_reference

from ray_rt.placement import CLUSTER_LABEL, PlacementError, PoolNeeds, pool_needs
from ray_rt.roles import RayRoles, WorkerCrashed, process_rss_kb
from workers.engine import Engine, GenerationRequest
from workers.roles.client import generate, wait_healthy
from workers.roles.events import read_events

pytestmark = pytest.mark.slow
log = logging.getLogger(__name__)
READY_S = 120.0


@pytest.fixture(scope="module")
def reference():
    engine = Engine("tiny", seed=0, capacity_tokens=4096, block_size=16, device="cpu", prefix_cache=False)

    def ref(prompt: list[int], max_tokens: int) -> list[int]:
        return list(engine.generate(GenerationRequest("ref", tuple(prompt), max_tokens)).output_tokens)

    ref.engine = engine
    return ref


def needs(**by_role: PoolNeeds) -> list[PoolNeeds]:
    """Each role's default needs (one worker in its own site), with by_role's replacements."""
    return [by_role.get(role) or pool_needs(role) for role in ("router", "p", "rld", "md")]


def roles_for(tmp_path, pools: list[PoolNeeds] | None = None, md_device: str = "cpu") -> RayRoles:
    config = deployment_yaml(tmp_path, [free_port()])  # the WAN proxy's port goes unused: Ray sets the addresses
    config["md"][0]["device"] = md_device
    return RayRoles(config, pools or needs(), tmp_path / "logs", tmp_path / "events", str(tmp_path / "work"))


def site_of(node_id: str) -> str:
    return next(n["Labels"].get(CLUSTER_LABEL) for n in ray.nodes() if n["NodeID"] == node_id)


def wait_exit(roles: RayRoles, worker: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while ray.get(roles.placed[worker].actor.poll.remote()) is None:
        assert time.monotonic() < deadline, f"{worker} did not exit within {timeout_s} s"
        time.sleep(0.2)


def test_ray_listens_on_loopback_only(cluster):
    pids = cluster.ray_pids()
    lines = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True, check=True).stdout.splitlines()
    ours = [line for line in lines if any(f"pid={pid}," in line for pid in pids)]
    assert ours, "no listening socket of the Ray processes found"
    local = [line.split()[3] for line in ours]
    assert all(a.startswith(("127.0.0.1:", "[::ffff:127.0.0.1]:")) for a in local), local
    rss_mb = sum(process_rss_kb(pid) for pid in pids) >> 10
    log.info(
        "Ray cluster of 2 nodes up in %.1f s; %d processes (%d MiB resident), %d listening sockets, all on 127.0.0.1",
        cluster.start_s,
        len(pids),
        rss_mb,
        len(ours),
    )


def test_a_pdd_request_through_ray_gives_the_reference_tokens(cluster, tmp_path, reference):
    roles = roles_for(tmp_path)
    t0 = time.monotonic()
    plan = roles.place()
    assert {role: {site_of(n) for n in nodes} for role, nodes in plan.items()} == {
        "router": {"a"},
        "p": {"a"},
        "rld": {"a"},
        "md": {"b"},
    }
    try:
        cfg = roles.start()
        for role in ("router", "p", "rld", "md"):
            for w in [cfg[role]] if role == "router" else cfg[role]:
                assert w["host"] == "127.0.0.1"
                wait_healthy(f"{w['host']}:{w['grpc_port']}", timeout_s=READY_S)
        ready_s = time.monotonic() - t0
        prompt = list(range(3, 43))
        with grpc_channel(cfg) as ch:
            gen = generate(ch, prompt, 12, mode="pdd", request_id="ray-1")
        assert [t.index for t in gen.tokens] == list(range(12))
        check_reference(reference, prompt, gen.ids, 12, "pdd under Ray")
        assert "md1" in gen.workers, gen.workers  # the MD in site b finished it
        memory = roles.memory_kb()
        roles.check()
    finally:
        codes = roles.stop()
    assert codes == {w: 0 for w in codes} and len(codes) == 4, codes
    for worker in ("router", "p1", "rld1", "md1"):
        assert (tmp_path / "logs" / f"{worker}.log").stat().st_size > 0
    md_events = read_events(tmp_path / "events" / "md1.jsonl")
    assert any(e.request_id == "ray-1" for e in md_events)
    # the role process the actor started (not the actor) recorded its CPU time at its stop, brought back by stop()
    assert md_events[-1].event == "role_cpu" and md_events[-1].fields["cpu_s"] > 0, md_events[-1]
    log.info(
        "roles placed, started and SERVING in %.1f s; resident memory (MiB) role/actor: %s",
        ready_s,
        {w: (m.get("role", 0) >> 10, m["actor"] >> 10) for w, m in memory.items()},
    )


def grpc_channel(cfg: dict):
    import grpc

    return grpc.insecure_channel(f"{cfg['router']['host']}:{cfg['router']['grpc_port']}")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU to crash an MD")
def test_a_crashed_role_is_reported_with_its_role_node_exit_and_last_lines(cluster, tmp_path):
    # the MD's config asks for cuda but its pool reserves no GPU: its process exits at start, naming itself
    roles = roles_for(tmp_path, md_device="cuda")
    roles.place()
    try:
        roles.start()
        wait_exit(roles, "md1")
        with pytest.raises(
            WorkerCrashed,
            match=r"role md worker md1 on node 127\.0\.0\.1/\w+: exited with code 1; "
            r"last log lines:\n(.|\n)*DeviceUnavailable: worker md1: device cuda",
        ):
            roles.check()
    finally:
        codes = roles.stop()
    assert codes["md1"] == 1 and (tmp_path / "logs" / "md1.log").read_text().count("DeviceUnavailable")


def test_a_pool_that_cannot_be_placed_fails_before_any_actor_starts(cluster, tmp_path):
    before = set(ray.util.list_named_actors())
    gpu_md = PoolNeeds("md", 1, "b", 1.0, num_gpus=1.0, device="cuda")
    with pytest.raises(PlacementError, match=r"pool md asks for 1 GPU per worker \(device cuda\), but no node"):
        roles_for(tmp_path, needs(md=gpu_md)).place()
    zoned_p = PoolNeeds("p", 1, "a", 1.0, labels={"zone": "z1"})
    with pytest.raises(PlacementError, match=r"pool p: no node has label zone=z1"):
        roles_for(tmp_path, needs(p=zoned_p)).place()
    too_big = PoolNeeds("rld", 1, "a", 8.0)
    with pytest.raises(
        PlacementError,
        match=r"pool rld: one worker needs CPU 8; the largest node with "
        r"pddlab/cluster=a has 3",
    ):
        roles_for(tmp_path, needs(rld=too_big)).place()
    assert set(ray.util.list_named_actors()) == before


def test_nothing_of_ray_is_left_once_the_cluster_stops(cluster):
    pids = cluster.ray_pids()
    temp_dir = cluster.temp_dir
    assert pids and temp_dir.exists()
    left = cluster.stop()
    assert not left, f"still alive: {left}"
    assert not temp_dir.exists() and not ray.is_initialized()
    log.info("stopped %d Ray processes, none left", len(pids))
