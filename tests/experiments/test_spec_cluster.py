"""Where a spec's workers run: each pool's device, checked before anything starts."""

import pytest
import torch

from experiments import spec
from experiments.deployment import deployment_dict
from experiments.spec import SpecError, load_spec


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where torch sees no GPU; here is one")
def test_cuda_on_a_machine_without_a_gpu_fails_at_load_naming_the_pool():
    with pytest.raises(SpecError, match=r"pools\.md\.device=cuda: runtime process runs every worker on this machine"):
        load_spec("pdd-smoke", ["runtime=process", "pools.md.device=cuda"])


def test_cuda_under_docker_is_refused_the_image_is_cpu_only():
    with pytest.raises(SpecError, match=r"pools\.p\.device=cuda: the worker image holds CPU torch only"):
        load_spec("pdd-smoke", ["runtime=docker", "pools.p.device=cuda"])


def test_a_cuda_pool_passes_where_a_gpu_is_and_reaches_its_workers():
    s = spec.build(spec.ExperimentSpec, {"name": "x", "runtime": "process", "pools": {"md": {"device": "cuda"}}})
    spec._validate_devices(s, cuda_here=True)
    data = deployment_dict(s, "/nonexistent")
    assert [w["device"] for w in data["md"]] == ["cuda"] and data["p"][0]["device"] == "cpu"


def test_runtime_ray_is_refused_until_pddlab_run_starts_it():
    with pytest.raises(SpecError, match=r"runtime=ray: the roles run under Ray through ray_rt.roles.RayRoles"):
        load_spec("pdd-smoke", ["runtime=ray"])


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
