"""Docker runtime command builders and error messages: no root, no Docker needed."""

import subprocess
import sys
from pathlib import Path

import pytest

from docker_rt import DockerError, engine, holder_name, image
from docker_rt.base import BaseImage, debootstrap_cmd
from docker_rt.host import DockerOptions, RoleLimits, container_argv, holder_run_args, proc_run_args

OPTS = DockerOptions(
    image="pddlab-worker:abc",
    limits={"md": RoleLimits(1.5, 3000)},
    mounts=(Path("/runs/r1"),),
    weights_dir=Path("/w"),
    env={"K": "V"},
)


def _pairs(args: list[str], flag: str) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args) if a == flag]


def test_holder_has_only_a_namespace_to_wire_and_our_labels():
    args = holder_run_args(OPTS, "9-1", "md1")
    assert args[:4] == ["run", "-d", "--name", holder_name("9-1", "md1")]
    assert _pairs(args, "--network") == ["none"]
    assert {"pddlab.run=9-1", "pddlab.host=md1", "pddlab.kind=holder"} <= set(_pairs(args, "--label"))
    assert args[-3:] == ["pddlab-worker:abc", "sleep", "infinity"]


def test_process_container_shares_the_holder_namespace_with_role_limits():
    args = proc_run_args(OPTS, "9-1", "md1", "md", 2, [sys.executable, "-m", "workers.roles.decode"])
    assert "-d" not in args  # attached: the docker client stands for the process
    assert _pairs(args, "--name") == ["pddlab-9-1-md1-2"]
    assert _pairs(args, "--network") == ["container:pddlab-9-1-md1"]
    assert _pairs(args, "--cpus") == ["1.5"] and _pairs(args, "--memory") == ["3000m"]
    assert _pairs(args, "-v") == ["/w:/cache/weights:ro", "/runs/r1:/runs/r1"]
    assert _pairs(args, "-e") == ["K=V"]
    assert args[-3:] == ["python", "-m", "workers.roles.decode"]


def test_every_container_runs_without_capabilities_on_a_read_only_root():
    holder = holder_run_args(OPTS, "9-1", "md1")
    proc = proc_run_args(OPTS, "9-1", "md1", "md", 2, [sys.executable, "-m", "workers.roles.decode"])
    for args in (holder, proc):
        assert _pairs(args, "--cap-drop") == ["ALL"] and "--cap-add" not in args
        assert _pairs(args, "--security-opt") == ["no-new-privileges"]
        assert "--read-only" in args and int(_pairs(args, "--pids-limit")[0]) > 0
    assert _pairs(proc, "--tmpfs") == ["/tmp:rw,nosuid,nodev,size=256m"]


def test_a_pools_cores_reach_the_container():
    opts = DockerOptions(image="i", limits={"md": RoleLimits(1.0, 3000, "1")})
    args = proc_run_args(opts, "9-1", "md1", "md", 2, [sys.executable, "-m", "workers.roles.decode"])
    assert _pairs(args, "--cpuset-cpus") == ["1"]
    assert "--cpuset-cpus" not in proc_run_args(OPTS, "9-1", "md1", "md", 2, ["x"])


def test_default_limits_and_argv_translation():
    assert OPTS.limits_for("p") == RoleLimits(1.0, 3072)
    assert container_argv(["/usr/bin/python3", "-c", "x"]) == ["python", "-c", "x"]
    assert container_argv(["ip", "-o", "addr"]) == ["ip", "-o", "addr"]


def test_debootstrap_is_minbase_with_the_needed_packages():
    cmd = debootstrap_cmd(Path("/r"))
    assert "--variant=minbase" in cmd and cmd[-3:] == ["bookworm", "/r", "http://deb.debian.org/debian"]
    assert {"python3", "python3-venv", "iproute2", "iputils-ping", "procps"} <= set(cmd[2].split("=")[1].split(","))


def test_build_needs_no_network_for_the_local_base():
    local = image.build_cmd(BaseImage("pddlab-base:1", "sha256:x", True), "d" * 64, "pddlab-worker:d")
    other = image.build_cmd(BaseImage("python:3.11-slim", "sha256:y", False), "d" * 64, "pddlab-worker:d", True)
    assert _pairs(local, "--network") == ["none"] and "--no-cache" not in local
    assert _pairs(other, "--network") == ["default"] and "--no-cache" in other
    assert "BASE_IMAGE=python:3.11-slim" in _pairs(other, "--build-arg")
    assert f"pddlab.inputs={'d' * 64}" in _pairs(local, "--label")

    assert _pairs(local, "--progress") == ["plain"]  # a line per step: what the progress is read from


def test_build_steps_are_read_from_buildkit_plain_lines():
    assert image.build_step("#7 [3/6] RUN --mount=type=bind,source=wheels,target=/wheels  pip install") == (
        3,
        6,
        "RUN --mount=type=bind,source=wheels,target=/wheels  pip inst",
    )
    assert image.build_step("#4 [1/6] FROM docker.io/library/pddlab-base:2ba0c6b42846\n")[:2] == (1, 6)
    for other in ("#7 2.948 Looking in links: /wheels", "#3 [internal] load metadata for x", "#7 DONE 12.0s", ""):
        assert image.build_step(other) is None


BUILD_OUTPUT = "#1 [internal] load build\n#4 [1/3] FROM base\n#5 [2/3] RUN x\n#5 0.1 out\n#6 [3/3] COPY src\n"


def test_a_build_reports_its_steps_and_keeps_its_log(tmp_path, monkeypatch):
    fake = tmp_path / "docker"  # prints what BuildKit's plain progress prints (the real build: make image)
    fake.write_text(f"#!/bin/sh\nprintf '{BUILD_OUTPUT}'\n")
    fake.chmod(0o755)
    monkeypatch.setattr(image, "docker_bin", lambda: str(fake))
    monkeypatch.setattr(image, "image_id", lambda ref: "sha256:x")
    steps = []
    image._run_build(["build", "-t", "r:1", "."], tmp_path / "build.log", lambda *step: steps.append(step))
    assert steps == [(0, 3, "FROM base"), (1, 3, "RUN x"), (2, 3, "COPY src"), (3, 3, "done")]
    assert (tmp_path / "build.log").read_text() == BUILD_OUTPUT
    monkeypatch.setattr(image, "image_id", lambda ref: None)  # the build made no image: it failed
    with pytest.raises(DockerError, match=r"(?s)docker build failed; last lines of .*#6 \[3/3\] COPY src"):
        image._run_build(["build", "-t", "r:1", "."], tmp_path / "build.log")


def test_wheels_are_binary_for_the_image_python():
    cmd = image.pip_download_cmd(Path("/d"), "3.11", Path("/r.txt"), Path("/c.txt"))
    assert "--only-binary=:all:" in cmd and _pairs(cmd, "--abi") == ["cp311"]
    assert "/opt/wheels" in _pairs(cmd, "--find-links")


def test_requirements_add_grpc_only_when_pyproject_lacks_it(tmp_path):
    py = tmp_path / "pyproject.toml"
    py.write_text('[project]\nname = "x"\ndependencies = ["torch==2.13.0", "grpcio==1.0"]\n')
    reqs = image.requirements(py)
    assert reqs[:2] == ["torch==2.13.0", "grpcio==1.0"]
    assert "grpcio" not in reqs[2:] and "protobuf" in reqs


def test_inputs_hash_follows_the_context(tmp_path, monkeypatch):
    monkeypatch.setattr(image, "CONTEXT_DIR", tmp_path)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("x = 1\n")
    base = BaseImage("b", "sha256:1", True)
    first = image.inputs_hash(base)
    assert image.inputs_hash(base) == first
    (tmp_path / "src" / "a.py").write_text("x = 2\n")
    assert image.inputs_hash(base) != first
    assert image.inputs_hash(BaseImage("b", "sha256:2", True)) != image.inputs_hash(base)


def test_not_enough_disk_says_how_much(tmp_path):
    with pytest.raises(DockerError, match=r"not enough disk for the test: .* GiB free .* GiB needed"):
        engine.check_free_space(tmp_path, 1 << 60, "the test")


def test_dockerd_that_fails_to_start_shows_its_log(tmp_path, monkeypatch):
    fake = tmp_path / "dockerd"
    fake.write_text("#!/bin/sh\necho 'failed to start daemon: simulated: no space left' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(engine.shutil, "which", lambda name: str(fake))
    monkeypatch.setattr(engine, "engine_info", lambda: None)
    monkeypatch.setattr(engine, "STATE_DIR", tmp_path)
    monkeypatch.setattr(engine, "PID_FILE", tmp_path / "dockerd.pid")
    monkeypatch.setattr(engine, "LOG_FILE", tmp_path / "dockerd.log")
    with pytest.raises(DockerError, match=r"(?s)dockerd exited with code 1.*simulated: no space left"):
        engine.start_dockerd(timeout_s=10)


def test_docker_not_installable_says_what_to_do(monkeypatch):
    monkeypatch.setattr(engine, "missing_debs", lambda pkgs: list(pkgs))
    monkeypatch.setattr(engine.os, "geteuid", lambda: 0)
    monkeypatch.setattr(
        engine.subprocess,
        "run",
        lambda argv, **kw: subprocess.CompletedProcess(argv, 100, "", "E: Unable to locate package docker.io"),
    )
    with pytest.raises(DockerError, match=r"(?s)could not install \['docker.io'\].*Unable to locate.*make setup"):
        engine.ensure_debs(["docker.io"])


def test_what_dockerd_changed_is_put_back_and_nothing_else():
    from docker_rt.engine import restore_actions

    before = {"forward_policy": "ACCEPT", "ip_forward": "0", "br_netfilter": False, "docker0": False}
    now = {"forward_policy": "DROP", "ip_forward": "1", "br_netfilter": True, "docker0": True}
    assert restore_actions(before, now) == [
        ("iptables FORWARD policy ACCEPT", ["iptables", "-P", "FORWARD", "ACCEPT"]),
        ("net.ipv4.ip_forward=0", None),
        ("link docker0 removed", ["ip", "link", "del", "docker0"]),
        ("br_netfilter unloaded", ["modprobe", "-r", "br_netfilter"]),
    ]
    assert restore_actions(now, now) == []  # the host had them before dockerd: left as they are
    assert restore_actions({}, now) == []  # nothing recorded: nothing to put back


# ---------------------------------------------------------------- the cuda image variant (make image VARIANT=cuda)
def test_the_cuda_variant_takes_a_cuda_torch_and_not_the_local_cpu_wheel():
    pins = ["grpcio==1.85.1", "torch==2.13.0+cpu", "numpy==2.2.0"]
    assert image.variant_pins(pins, "cpu") == pins
    assert image.variant_pins(pins, "cuda") == ["grpcio==1.85.1", "numpy==2.2.0"]
    reqs = ["torch==2.13.0", "grpcio==1.85.1"]
    assert image.variant_requirements(reqs, "cpu") == reqs
    assert image.variant_requirements(reqs, "cuda") == [image.CUDA_TORCH, "grpcio==1.85.1"]
    cmd = image.pip_download_cmd(Path("/d"), "3.11", Path("/r.txt"), Path("/c.txt"), "cuda")
    assert "/opt/wheels" not in cmd and _pairs(cmd, "--find-links") == [str(image.CACHE_DIR / "context-cuda/wheels")]
    with pytest.raises(DockerError, match=r"image variant 'rocm' is unknown; allowed: cpu, cuda"):
        image.variant_pins(pins, "rocm")


def test_the_cuda_variant_has_its_own_context_tags_and_stale_images():
    base = BaseImage("pddlab-base:1", "sha256:x", True)
    cmd = image.build_cmd(base, "d" * 64, "pddlab-worker:cuda-dddddddddddd", variant="cuda")
    assert _pairs(cmd, "-t") == ["pddlab-worker:cuda-dddddddddddd", "pddlab-worker:cuda"]
    assert "pddlab.variant=cuda" in _pairs(cmd, "--label") and cmd[-1] == str(image.CACHE_DIR / "context-cuda")
    tags = ["pddlab-worker:latest", "pddlab-worker:cuda", "pddlab-worker:aaaaaaaaaaaa", "pddlab-worker:bbbbbbbbbbbb"]
    tags += ["pddlab-worker:cuda-aaaaaaaaaaaa", "pddlab-worker:cuda-cccccccccccc"]
    assert image.stale_tags(tags, "pddlab-worker:aaaaaaaaaaaa") == ["pddlab-worker:bbbbbbbbbbbb"]
    assert image.stale_tags(tags, "pddlab-worker:cuda-cccccccccccc", "cuda") == ["pddlab-worker:cuda-aaaaaaaaaaaa"]


def test_a_run_never_downloads_the_cuda_wheels(tmp_path, monkeypatch):
    monkeypatch.setattr(image, "CACHE_DIR", tmp_path)
    monkeypatch.setattr(image, "venv_constraints", lambda: ["torch==2.13.0+cpu"])
    with pytest.raises(
        DockerError, match=r"cuda worker image.s packages are not downloaded .*`make image VARIANT=cuda`"
    ):
        image.fill_wheelhouse("3.11", "cuda", download=False)
    assert not (tmp_path / "context-cuda" / "wheels").exists()


def test_only_the_cuda_pools_containers_get_the_gpus():
    opts = DockerOptions(image="pddlab-worker:cuda-abc", weights_dir=Path("/w"), gpu_roles=("md",))
    argv = [sys.executable, "-m", "workers.roles.decode"]
    assert _pairs(proc_run_args(opts, "9-1", "md1", "md", 0, argv), "--gpus") == ["all"]
    assert "--gpus" not in proc_run_args(opts, "9-1", "rld1", "rld", 0, argv)
