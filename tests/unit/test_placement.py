"""Placement under Ray, pure: a spec's pools -> resource requests and label selectors, checked against fake nodes."""

import socket

import pytest

from experiments.spec.experiment import build, ExperimentSpec, load_spec
from ray_rt import RayRuntimeError
from ray_rt.cluster import check_reachable, split_address
from ray_rt.placement import (
    CLUSTER_LABEL,
    NodeInfo,
    PlacementError,
    alive_nodes,
    check_placement,
    deployment_needs,
    selector_matches,
    selector_problem,
)

GiB = 1 << 30


def node(node_id: str, site: str | None, cpus: float = 4, gpus: float = 0, mem_gib: float = 16, **labels) -> dict:
    """One `ray.nodes()` entry."""
    resources = {"CPU": float(cpus), "memory": mem_gib * GiB, f"node:10.0.0.{len(node_id)}": 1.0}
    if gpus:
        resources["GPU"] = float(gpus)
    if site:
        labels[CLUSTER_LABEL] = site
    labels["ray.io/node-id"] = node_id
    return {
        "NodeID": node_id,
        "Alive": True,
        "NodeManagerAddress": "10.0.0.1",
        "Resources": resources,
        "Labels": labels,
    }


def spec_with(pools: dict, runtime: str = "process", address: str = "") -> ExperimentSpec:
    return build(ExperimentSpec, {"name": "x", "runtime": runtime, "cluster": {"address": address}, "pools": pools})


def needs_of(pools: dict, **kw) -> dict:
    return {n.role: n for n in deployment_needs(spec_with(pools, **kw).pools)}


# ---------------------------------------------------------------- requests


def test_pools_in_clusters_a_and_b_become_label_selectors_and_resources():
    needs = needs_of(
        {
            "p": {"workers": 2, "num_cpus": 2, "memory_mb": 3072},
            "rld": {"cpus": 1.5},
            "md": {"workers": 3, "device": "cuda", "accelerator_type": "H100", "labels": {"zone": "in(z1, z2)"}},
        }
    )
    assert needs["router"].actor_options() == {"num_cpus": 0.5, "num_gpus": 0.0, "label_selector": {CLUSTER_LABEL: "a"}}
    assert needs["p"].actor_options() == {
        "num_cpus": 2.0,
        "num_gpus": 0.0,
        "memory": 3072 << 20,
        "label_selector": {CLUSTER_LABEL: "a"},
    }
    assert needs["rld"].num_cpus == 1.5  # the Docker cpus stand in when num_cpus is not given
    md = needs["md"]
    assert (md.workers, md.num_gpus) == (3, 1.0)  # a cuda worker holds a GPU of its own
    assert md.actor_options()["label_selector"] == {
        CLUSTER_LABEL: "b",
        "ray.io/accelerator-type": "H100",
        "zone": "in(z1, z2)",
    }
    assert md.resources() == {"CPU": 1.0, "GPU": 1.0}


def test_a_pool_may_move_to_the_other_site_only_on_a_ray_cluster():
    assert needs_of({"rld": {"cluster": "b"}}, runtime="docker", address="")["rld"].cluster == "b"  # built, not run
    with pytest.raises(Exception, match=r"pools\.rld\.cluster='b': in the emulated topology rld workers live in"):
        load_spec("pdd-smoke", ["pools.rld.cluster=b"])


def test_a_variant_with_fewer_workers_asks_for_fewer():
    needs = {n.role: n for n in deployment_needs(spec_with({"md": {"workers": 4}}).pools, {"md": 2})}
    assert needs["md"].workers == 2


# ---------------------------------------------------------------- the check against nodes

TWO_SITES = [node("a1", "a", cpus=4), node("b1", "b", cpus=4, gpus=2, **{"ray.io/accelerator-type": "H100"})]


def test_p_and_rld_land_in_cluster_a_and_md_in_cluster_b():
    plan = check_placement(
        deployment_needs(spec_with({"md": {"workers": 2, "device": "cuda"}}).pools), alive_nodes(TWO_SITES)
    )
    assert plan == {"router": ["a1"], "p": ["a1"], "rld": ["a1"], "md": ["b1", "b1"]}


def test_gpus_where_no_node_has_any_fail_naming_the_pool():
    nodes = alive_nodes([node("a1", "a"), node("b1", "b")])
    with pytest.raises(
        PlacementError,
        match=r"pool md asks for 1 GPU per worker \(device cuda\), but no node with "
        r"pddlab/cluster=b has a GPU \(no node of the cluster has one\)",
    ):
        check_placement(deployment_needs(spec_with({"md": {"device": "cuda"}}).pools), nodes)


def test_gpus_only_in_the_other_site_are_no_use():
    nodes = alive_nodes([node("a1", "a", gpus=1), node("b1", "b")])
    with pytest.raises(
        PlacementError, match=r"pool md asks for 1 GPU per worker.*no node with pddlab/cluster=b has a GPU$"
    ):
        check_placement(deployment_needs(spec_with({"md": {"num_gpus": 1}}).pools), nodes)


def test_a_label_no_node_has_fails_naming_the_pool_and_the_label():
    with pytest.raises(PlacementError, match=r"pool md: no node has label pddlab/cluster=b; the nodes' labels: .*a1"):
        check_placement(deployment_needs(spec_with({}).pools), alive_nodes([node("a1", "a")]))
    with pytest.raises(PlacementError, match=r"pool p: no node has label zone=z9"):
        check_placement(deployment_needs(spec_with({"p": {"labels": {"zone": "z9"}}}).pools), alive_nodes(TWO_SITES))
    with pytest.raises(PlacementError, match=r"pool md: no node has label ray.io/accelerator-type=A100"):
        check_placement(deployment_needs(spec_with({"md": {"accelerator_type": "A100"}}).pools), alive_nodes(TWO_SITES))


def test_labels_each_present_but_never_together_are_named_together():
    nodes = alive_nodes([node("a1", "a", zone="z1"), node("a2", "a", disk="ssd"), node("b1", "b")])
    with pytest.raises(PlacementError, match=r"pool p: no node has all of pddlab/cluster=a, zone=z1, disk=ssd"):
        check_placement(deployment_needs(spec_with({"p": {"labels": {"zone": "z1", "disk": "ssd"}}}).pools), nodes)


def test_pools_that_do_not_fit_their_sites_nodes_together_fail_naming_the_pool():
    nodes = alive_nodes([node("a1", "a", cpus=2), node("b1", "b", cpus=8)])
    # router 0.5 + rld 1 + 2 P x 1 = 3.5 CPUs on a 2-CPU site
    with pytest.raises(
        PlacementError,
        match=r"pool rld cannot be placed: 1 x \(CPU 1\) on the nodes with pddlab/cluster=a; worker 1 finds no room "
        r"\(10.0.0.1/a1: CPU 0 left after p x2\)",
    ):
        check_placement(deployment_needs(spec_with({"p": {"workers": 2}}).pools), nodes)


def test_one_worker_larger_than_any_node_of_its_site_is_named():
    with pytest.raises(
        PlacementError,
        match=r"pool md: one worker needs memory 40960 MiB; the largest node with "
        r"pddlab/cluster=b has 16384 MiB",
    ):
        check_placement(deployment_needs(spec_with({"md": {"memory_mb": 40960}}).pools), alive_nodes(TWO_SITES))


def test_an_empty_or_dead_cluster_is_refused():
    dead = {**node("a1", "a"), "Alive": False}
    with pytest.raises(PlacementError, match="no alive node"):
        check_placement(deployment_needs(spec_with({}).pools), alive_nodes([dead]))


# ---------------------------------------------------------------- Ray's label selector syntax


@pytest.mark.parametrize(
    "selector, labels, want",
    [
        ({"site": "a"}, {"site": "a"}, True),
        ({"site": "a"}, {"site": "b"}, False),
        ({"site": "a"}, {}, False),
        ({"site": "!a"}, {"site": "b"}, True),
        ({"site": "!a"}, {}, True),  # not-equal matches an absent label (Kubernetes' and Ray's meaning)
        ({"gpu": "in(H100, A100)"}, {"gpu": "A100"}, True),
        ({"gpu": "in(H100,A100)"}, {"gpu": "L4"}, False),
        ({"gpu": "!in(H100, A100)"}, {"gpu": "L4"}, True),
        ({"site": "a", "gpu": "H100"}, {"site": "a"}, False),
    ],
)
def test_selector_matches_as_ray_does(selector, labels, want):
    assert selector_matches(selector, labels) is want


@pytest.mark.parametrize("key, value", [("zone", "in()"), ("zone", "-x"), ("bad key", "x"), ("zone", "a b")])
def test_a_bad_selector_is_named(key, value):
    assert selector_problem(key, value)


def test_a_bad_label_in_a_spec_fails_at_load():
    with pytest.raises(Exception, match=r"pools\.md\.labels: label selector zone='in\(\)'"):
        load_spec("pdd-smoke", ["pools.md.labels={zone: 'in()'}"])


def test_node_info_reads_a_ray_nodes_entry():
    n = NodeInfo.from_ray(node("b1", "b", gpus=1))
    assert n.resources["GPU"] == 1.0 and n.labels[CLUSTER_LABEL] == "b" and n.node_id == "b1"


def test_an_unreachable_cluster_address_is_one_clear_error_before_anything_starts():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    with pytest.raises(RayRuntimeError, match=rf"cannot reach the Ray cluster at ray://127.0.0.1:{port}: .*refused"):
        check_reachable(f"ray://127.0.0.1:{port}", timeout_s=2)
    with pytest.raises(RayRuntimeError, match=r"expected HOST:PORT or ray://HOST:PORT"):
        split_address("ray://head")
