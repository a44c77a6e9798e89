"""Where a spec's workers run: each pool's device, checked before anything starts."""

import pytest
import torch

from experiments.spec import experiment as spec
from experiments.spec.deployment import deployment_dict
from experiments.spec.experiment import SpecError, load_spec


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where torch sees no GPU; here is one")
def test_cuda_on_a_machine_without_a_gpu_fails_at_load_naming_the_pool():
    with pytest.raises(SpecError, match=r"pools\.md\.device=cuda: runtime process runs every worker on this machine"):
        load_spec("pdd-smoke", ["runtime=process", "pools.md.device=cuda"])


def test_cuda_under_docker_needs_an_nvidia_gpu_on_this_machine():
    s = spec.build(spec.ExperimentSpec, {"name": "x", "runtime": "docker", "pools": {"p": {"device": "cuda"}}})
    with pytest.raises(SpecError, match=r"pools\.p\.device=cuda: runtime docker runs it in the cuda worker image"):
        spec._validate_devices(s, gpus_here=0)
    spec._validate_devices(s, gpus_here=1)  # the cuda image and --gpus all then (docker_rt)


def test_a_cuda_pool_passes_where_a_gpu_is_and_reaches_its_workers():
    s = spec.build(spec.ExperimentSpec, {"name": "x", "runtime": "process", "pools": {"md": {"device": "cuda"}}})
    spec._validate_devices(s, cuda_here=True)
    data = deployment_dict(s, "/nonexistent")
    assert [w["device"] for w in data["md"]] == ["cuda"] and data["p"][0]["device"] == "cpu"


def test_runtime_ray_in_the_topology_puts_a_node_in_every_worker_host():
    from experiments.spec.deployment import ray_nodes

    s = load_spec("pdd-smoke", ["runtime=ray", "pools.p.workers=2", "pools.md.workers=2", "pools.md.num_cpus=2"])
    nodes = {n.host: (n.ip, n.site, n.num_cpus) for n in ray_nodes(s)}
    assert nodes == {
        "router": ("10.1.0.11", "a", 0.5),
        "p1": ("10.1.0.21", "a", 1.0),
        "p2": ("10.1.0.22", "a", 1.0),
        "rld1": ("10.1.0.41", "a", 1.0),
        "md1": ("10.2.0.61", "b", 2.0),
        "md2": ("10.2.0.62", "b", 2.0),
    }


def test_an_existing_ray_cluster_takes_the_spec_and_its_wan_ends():
    s = load_spec(
        "pdd-smoke",
        ["runtime=ray", "cluster.address=ray://head:10001", "cluster.shape=[{site: a, interface: eth1}]"],
    )
    assert s.cluster.address == "ray://head:10001" and s.cluster.shape[0].interface == "eth1"
    assert s.cluster.shape[0].site == "a" and s.cluster.capture == ()


ON_A_CLUSTER = ["runtime=ray", "cluster.address=10.0.0.5:6379"]


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["schedule=[{at_s: 1, set: {loss_pct: 1}}]"], r"schedule: not on an existing Ray cluster"),
        (["profile=wan-flaky"], r"schedule: not on an existing Ray cluster"),  # the profile's own schedule
        (["faults=[{at_s: 1, kill: md}]"], r"faults: not on an existing Ray cluster"),
        (["cluster.shape=[{site: a, interface: e0}, {site: a, interface: e1}]"], r"cluster.shape: one entry per site"),
        (["cluster.capture=[{site: b, interface: 'eth 1'}]"], r"cluster.capture\[0\].interface"),
        (["cluster.shape=[{site: c, interface: e0}]"], r"cluster.shape\[0\].site='c'; allowed: \['a', 'b'\]"),
        (["cluster.shape=[{site: b, interface: e0, labels: {'bad key': x}}]"], r"cluster.shape\[0\].labels"),
    ],
)
def test_what_a_cluster_cannot_do_fails_at_load_with_the_field(overrides, needle):
    with pytest.raises(SpecError, match=needle):
        load_spec("pdd-smoke", ON_A_CLUSTER + overrides)


def test_wan_ends_without_a_cluster_are_refused():
    with pytest.raises(SpecError, match=r"cluster.shape, cluster.capture: only with cluster.address"):
        load_spec("pdd-smoke", ["cluster.capture=[{site: a, interface: eth1}]"])


@pytest.mark.parametrize(
    "override, needle",
    [
        ("cluster.address=http://x", r"cluster.address='http://x': \"\" \(this machine\) or ray://HOST:PORT"),
        ("cluster.address=ray://head:10001", r"a Ray cluster needs runtime: ray"),
        ("pools.md.cluster=c", r"pools.md.cluster='c'; allowed: \['', 'a', 'b'\]"),
        ("pools.p.num_gpus=-1", r"pools.p.num_gpus=-1 out of range"),
    ],
)
def test_bad_placement_fields_fail_at_load_with_the_field(override, needle):
    with pytest.raises(SpecError, match=needle):
        load_spec("pdd-smoke", [override])


def test_under_ray_in_the_topology_a_label_no_host_node_has_fails_at_load_naming_the_pool():
    with pytest.raises(SpecError, match=r"pool p: no node has label zone=z9; the nodes' labels: 10.1.0.11/router"):
        load_spec("pdd-smoke", ["runtime=ray", "pools.p.labels={zone: z9}"])
    load_spec("pdd-smoke", ["runtime=ray", "pools.md.labels={pddlab/host: 'in(md1, md2)'}"])  # labels nodes carry
