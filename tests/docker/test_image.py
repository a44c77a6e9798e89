"""The worker image: builds with no registry, is cached while its inputs do not change, refuses a bad BASE_IMAGE."""

import time

import pytest

from docker_rt import LABEL_INPUTS, DockerError
from docker_rt.engine import docker
from docker_rt.image import ensure_image

CACHED_BUILD_MAX_S = 30  # a cached "build" only hashes the context (~250 MB of wheels by name and size)


def test_image_builds_then_is_cached(worker_image):
    start = time.monotonic()
    again = ensure_image()
    assert not again.built, "second build with the same inputs ran docker build"
    assert time.monotonic() - start < CACHED_BUILD_MAX_S
    assert again.ref == worker_image.ref and again.image_id == worker_image.image_id
    label = docker(
        ["image", "inspect", "--format", f'{{{{index .Config.Labels "{LABEL_INPUTS}"}}}}', again.ref]
    ).stdout.strip()
    assert label == again.inputs_hash


def test_image_has_the_pinned_cpu_torch_and_the_project(worker_image):
    code = "import torch, grpc, yaml, workers.engine, docker_rt; print(torch.__version__)"
    out = docker(["run", "--rm", "--network", "none", worker_image.ref, "python", "-c", code]).stdout
    assert out.strip() == "2.13.0+cpu"


def test_missing_base_image_is_a_clear_error(worker_image):
    # A registry on a closed loopback port: the pull fails at once, and nothing leaves the machine.
    with pytest.raises(DockerError, match=r"BASE_IMAGE 'localhost:1/pddlab-no-such-image:0' does not exist"):
        ensure_image(base_image="localhost:1/pddlab-no-such-image:0")
