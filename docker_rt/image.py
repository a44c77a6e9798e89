"""The worker image: one image for every role, rebuilt only when its inputs change.

Responsible for: the build context in `.cache/docker/context` (the
Dockerfile, `requirements.txt`, `wheels/` and `src/`), the wheelhouse (every
Python package the image needs, downloaded on the host with the host's pip
configuration and pinned to the versions in the project venv, so both
runtimes run the same code), the inputs hash (Dockerfile, base image id,
requirements, wheels, project files) carried as the label `pddlab.inputs` and
in the tag `pddlab-worker:<hash 12>`, and `docker build` when no image of that
hash exists. Command line: `python -m docker_rt.image build`.
Not responsible for: the base image (`docker_rt.base`), the engine
(`docker_rt.engine`), running containers (`docker_rt.host`).

torch is the 2.13.0 CPU wheel of /opt/wheels (the venv's `torch==2.13.0+cpu`
pin makes pip take it, never a multi-GB CUDA build).

Variant `cuda` (`make image VARIANT=cuda`, built only when asked): the same
image with a CUDA build of torch (CUDA_TORCH, and the NVIDIA libraries it
depends on, ~3 GB more) instead of the CPU wheel; its own
context (`.cache/docker/context-cuda`) and tags (`pddlab-worker:cuda-<hash
12>`, `pddlab-worker:cuda`). A run with a `device: cuda` pool under Docker
uses it (and `--gpus all` for those workers) but never builds its wheelhouse:
that download happens only in `make image VARIANT=cuda`.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata as metadata
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from docker_rt import LABEL_INPUTS, WORKER_REPO, DockerError
from docker_rt.base import BaseImage, ensure_base
from docker_rt.engine import (
    CACHE_DIR,
    REPO_ROOT,
    SDK_ERRORS,
    check_free_space,
    client,
    docker_bin,
    engine_words,
    ensure_running,
    image_id,
    sdk,
)

log = logging.getLogger(__name__)
DOCKERFILE = Path(__file__).resolve().parent / "Dockerfile"
CONTEXT_DIR = CACHE_DIR / "context"
VARIANTS = ("cpu", "cuda")
TORCH = "torch"
# The cuda variant's torch: a CUDA 13 build of a release whose CUDA libraries this machine's package index
# holds (PyPI's torch 2.13.0 needs nvidia-cudnn-cu13==9.20.0.48, which it does not; 2.14.1's are here). The
# CPU runtimes stay on 2.13.0 (pyproject): KV moves as bytes with its dtype, and GPU numerics differ anyway.
CUDA_TORCH = "torch==2.14.1"
# The PDD roles' gRPC stack; added to pyproject's dependencies when pyproject does not list it yet.
RUNTIME_EXTRAS = ("grpcio", "grpcio-health-checking", "protobuf")
# Besides pyproject's packages: the profiles the topology modules load, and this package.
EXTRA_SOURCES = ("docker_rt", "netem_profiles", "pyproject.toml")
IMAGE_NEED_BYTES = 4 * 2**30  # the image is ~1.3 GB; layers are unpacked once more while building
WHEELS_NEED_BYTES = 1 * 2**30  # ~300 MB of wheels, torch's CPU wheel being 183 MB
BUILD_TIMEOUT_S = 1800
# A line of BuildKit's plain progress that starts a step of the Dockerfile: `#7 [3/6] RUN pip install ...`.
STEP_LINE = re.compile(r"^#\d+ \[(\d+)/(\d+)\] (.*)")
# on_step(steps done, steps in all, what runs now): how a caller shows the build's progress.
OnStep = Callable[[int, int, str], None]
# Every glibc manylinux tag the base (Debian 12, glibc 2.36) runs, newest first: with --platform pip takes only the
# tags named (no expansion to older ones), and e.g. the cuda variant's NCCL wheel is manylinux_2_18.
WHEEL_PLATFORMS = (
    *(f"manylinux_2_{minor}_x86_64" for minor in range(28, 4, -1)),
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
    "linux_x86_64",
)


@dataclass(frozen=True)
class WorkerImage:
    """ref: pddlab-worker:<hash 12>; inputs_hash: full hash; size_bytes: image size;
    built: this call ran `docker build`; build_s: its wall time (s, 0 when cached)."""

    ref: str
    image_id: str
    inputs_hash: str
    base_ref: str
    size_bytes: int
    built: bool
    build_s: float


# ---------------------------------------------------------------- requirements
def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _req_name(req: str) -> str:
    return _norm(re.split(r"[\s<>=!~;\[]", req.strip(), maxsplit=1)[0])


def requirements(pyproject: Path = REPO_ROOT / "pyproject.toml") -> list[str]:
    """pyproject's dependencies plus the gRPC extras it does not list (pure)."""
    deps = list(tomllib.loads(pyproject.read_text())["project"]["dependencies"])
    listed = {_req_name(d) for d in deps}
    return deps + [e for e in RUNTIME_EXTRAS if _norm(e) not in listed]


def variant_pins(pins: list[str], variant: str) -> list[str]:
    """The venv's pins as an image variant takes them (pure): cuda drops torch's (the venv's is the CPU build;
    the cuda variant's torch is CUDA_TORCH, variant_requirements)."""
    if variant not in VARIANTS:
        raise DockerError(f"image variant {variant!r} is unknown; allowed: {', '.join(VARIANTS)}")
    return [p for p in pins if variant == "cpu" or _req_name(p) != TORCH]


def variant_requirements(reqs: list[str], variant: str) -> list[str]:
    """pyproject's requirements as an image variant takes them (pure): cuda's torch is CUDA_TORCH."""
    return [CUDA_TORCH if variant == "cuda" and _req_name(r) == TORCH else r for r in reqs]


def context_dir(variant: str = "cpu") -> Path:
    """Where a variant's build context lives (the cpu one where it always was)."""
    return CONTEXT_DIR if variant == "cpu" else CACHE_DIR / f"context-{variant}"


def tag_prefix(variant: str = "cpu") -> str:
    """The tag of a variant's images before the inputs hash: "" (cpu) or "cuda-"."""
    return "" if variant == "cpu" else f"{variant}-"


def latest_tag(variant: str = "cpu") -> str:
    return f"{WORKER_REPO}:latest" if variant == "cpu" else f"{WORKER_REPO}:{variant}"


def venv_constraints() -> list[str]:
    """`name==version` of every package installed in the venv's own site-packages (not Debian's, not vendored)."""
    site = {Path(sysconfig.get_paths()[k]).resolve() for k in ("purelib", "platlib")}
    pins = []
    for dist in metadata.distributions():
        location = Path(str(getattr(dist, "_path", "/"))).resolve().parent
        name = dist.metadata["Name"]
        if name and location in site and _norm(name) != "pddlab":
            pins.append(f"{_norm(name)}=={dist.version}")
    return sorted(set(pins))


def package_sources() -> list[str]:
    """Top-level dirs/files of the project the image carries: pyproject's packages plus EXTRA_SOURCES."""
    data = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    patterns = data.get("tool", {}).get("setuptools", {}).get("packages", {}).get("find", {}).get("include", [])
    names = {p.rstrip("*").rstrip(".") for p in patterns} | set(EXTRA_SOURCES)
    return sorted(n for n in names if (REPO_ROOT / n).exists())


# ---------------------------------------------------------------- context
def pip_download_cmd(dest: Path, python_version: str, reqs: Path, constraints: Path, variant: str = "cpu") -> list[str]:
    """`pip download` of binary wheels for the image's Python (pure: unit-testable). The cuda variant does not
    look in /opt/wheels (its CPU torch is excluded by variant_pins anyway)."""
    abi = "cp" + python_version.replace(".", "")
    wheels = context_dir(variant) / "wheels"
    local = ["--find-links", "/opt/wheels"] if variant == "cpu" else []
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--disable-pip-version-check",
        "--dest",
        str(dest),
        "--only-binary=:all:",
        "--python-version",
        python_version,
        "--implementation",
        "cp",
        "--abi",
        abi,
        *local,
        "--find-links",
        str(wheels),
        "-r",
        str(reqs),
        "-c",
        str(constraints),
    ]
    for platform in WHEEL_PLATFORMS:
        cmd += ["--platform", platform]
    return cmd


def base_python_version(base: BaseImage) -> str:
    """`3.11`: the Python of the base image, asked by running it (no network)."""
    code = "import sys; print('%d.%d' % sys.version_info[:2])"
    try:
        out = client().containers.run(base.ref, ["python3", "-c", code], network_mode="none", remove=True)
    except SDK_ERRORS as err:  # ContainerError (python3 failed or is absent) carries its stderr
        said = (getattr(err, "stderr", None) or b"").decode(errors="replace").strip() or str(err)
        raise DockerError(
            f"base image {base.ref} has no working python3 ({said[-200:]}); "
            "use a base with Python 3.11+ (e.g. python:3.11-slim)"
        ) from None
    return out.decode().strip()


def fill_wheelhouse(python_version: str, variant: str = "cpu", download: bool = True) -> None:
    """Download the wheels unless the wheelhouse was made from the same requirements and pins; with
    download=False, DockerError instead of a download (a run never fetches the cuda variant's ~3 GB)."""
    context = context_dir(variant)
    wheels = context / "wheels"
    context.mkdir(parents=True, exist_ok=True)
    reqs, constraints = context / "requirements.txt", CACHE_DIR / f"constraints-{variant}.txt"
    reqs.write_text("\n".join(variant_requirements(requirements(), variant)) + "\n")
    constraints.write_text("\n".join(variant_pins(venv_constraints(), variant)) + "\n")
    stamp_text = f"{python_version}\n{reqs.read_text()}{constraints.read_text()}"
    stamp = wheels / ".stamp"
    if stamp.exists() and stamp.read_text() == stamp_text:
        return
    if not download:
        raise DockerError(
            f"the {variant} worker image's packages are not downloaded (or are out of date): run "
            f"`make image VARIANT={variant}` first"
        )
    need = WHEELS_NEED_BYTES * (1 if variant == "cpu" else 5)
    check_free_space(CACHE_DIR, need, f"the {variant} image's wheels")
    fresh = context / "wheels.new"
    shutil.rmtree(fresh, ignore_errors=True)
    wheels.mkdir(exist_ok=True)  # old wheels are found with --find-links: nothing is fetched twice
    cmd = pip_download_cmd(fresh, python_version, reqs, constraints, variant)
    log.info("run: %s", " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise DockerError(
            f"downloading the image's Python packages failed:\n{proc.stderr.strip()[-1500:]}\n"
            "The host's pip configuration must reach PyPI or hold these wheels (/opt/wheels)."
        )
    shutil.rmtree(wheels)
    fresh.rename(wheels)
    stamp.write_text(stamp_text)


def copy_sources(variant: str = "cpu") -> None:
    """Refresh context/src from the working tree (no caches, no bytecode)."""
    context = context_dir(variant)
    src = context / "src"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
    for name in package_sources():
        path = REPO_ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=ignore)
        else:
            shutil.copy2(path, src / name)
    shutil.copy2(DOCKERFILE, context / "Dockerfile")


def inputs_hash(base: BaseImage, variant: str = "cpu") -> str:
    """Hash of everything the image is made of: base id, and every file of the context."""
    context = context_dir(variant)
    h = hashlib.sha256(base.image_id.encode())
    for path in sorted(p for p in context.rglob("*") if p.is_file()):
        rel = path.relative_to(context).as_posix()
        if rel == "wheels/.stamp":
            continue
        # Wheels are immutable files named by version: name and size identify them without reading 300 MB.
        body = str(path.stat().st_size).encode() if rel.startswith("wheels/") else path.read_bytes()
        h.update(rel.encode() + b"\0" + hashlib.sha256(body).digest())
    return h.hexdigest()


# ---------------------------------------------------------------- build
def build_cmd(base: BaseImage, digest: str, ref: str, no_cache: bool = False, variant: str = "cpu") -> list[str]:
    """The `docker build` arguments (pure: unit-testable). The local base needs no network at all."""
    network = "none" if base.local else "default"
    context = context_dir(variant)
    return [
        "build",
        "--progress",
        "plain",  # a line per step, parsed for the progress shown (build_step)
        *(["--no-cache"] if no_cache else []),
        "--network",
        network,
        "--build-arg",
        f"BASE_IMAGE={base.ref}",
        "--label",
        f"{LABEL_INPUTS}={digest}",
        "--label",
        f"pddlab.base={base.ref}",
        "--label",
        f"pddlab.variant={variant}",
        "-t",
        ref,
        "-t",
        latest_tag(variant),
        "-f",
        str(context / "Dockerfile"),
        str(context),
    ]


def image_size_bytes(ref: str) -> int:
    with sdk(f"looking up image {ref}"):
        return int(client().images.get(ref).attrs["Size"])


def build_step(line: str) -> tuple[int, int, str] | None:
    """(k, n, what) of a line of BuildKit's plain progress that starts step k of n; None for any other line."""
    m = STEP_LINE.match(line)
    return (int(m[1]), int(m[2]), m[3].strip()[:60]) if m else None


def _run_build(args: list[str], log_path: Path, on_step: OnStep | None = None) -> None:
    """`docker build`, its output into log_path line by line, each step's start to on_step (else logged).

    The CLI, not the SDK: the SDK speaks the classic builder's API only, and the Dockerfile needs BuildKit
    (`RUN --mount`: the wheels never land in a layer)."""
    argv = [docker_bin(), *args]
    env = {**os.environ, "DOCKER_BUILDKIT": "1"}
    log.info("building the worker image (log %s)", log_path)
    log.debug("run: %s", " ".join(argv))
    done, total = 0, 0
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
        watchdog = threading.Timer(BUILD_TIMEOUT_S, proc.kill)  # a build that hangs, silent or not
        watchdog.start()
        try:
            for raw in proc.stdout:
                out.write(raw)
                step = build_step(raw.decode(errors="replace"))
                if step is None:
                    continue
                (k, total, what), done = step, max(done, step[0] - 1)
                if on_step:
                    on_step(done, total, what)
                else:
                    log.info("build step %d/%d: %s", k, total, what)
        finally:
            proc.wait()
            watchdog.cancel()
    if proc.returncode == -signal.SIGKILL:
        raise DockerError(f"docker build did not finish within {BUILD_TIMEOUT_S} s; see {log_path}")
    if image_id(args[args.index("-t") + 1]) is None:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-25:])
        raise DockerError(f"docker build failed; last lines of {log_path}:\n{tail}")
    if on_step and total:
        on_step(total, total, "done")


def stale_tags(tags: list[str], current: str, variant: str = "cpu") -> list[str]:
    """The variant's worker image tags of earlier inputs (pure): `<repo>:<prefix><12 hex>` other than current;
    the latest tags and the other variant's images are not the variant's stale ones."""
    own = re.compile(rf"^{re.escape(WORKER_REPO)}:{re.escape(tag_prefix(variant))}[0-9a-f]{{12}}$")
    return [t for t in tags if own.match(t) and t != current]


def _remove_older(current: str, variant: str = "cpu") -> None:
    """Untag the variant's worker images of earlier inputs (ones a container still uses stay)."""
    with sdk("listing worker images"):
        tags = [t for img in client().images.list(name=WORKER_REPO) for t in img.tags]
    for tag in stale_tags(tags, current, variant):
        try:
            client().images.remove(tag)
        except SDK_ERRORS as err:  # in use by a container: stays, as `docker rmi` would leave it
            log.info("worker image %s stays: %s", tag, engine_words(err))


def ensure_image(
    base_image: str | None = None,
    no_cache: bool = False,
    on_step: OnStep | None = None,
    variant: str = "cpu",
    download: bool = True,
) -> WorkerImage:
    """The worker image (of a variant: cpu | cuda) for the current inputs: built if absent (always, without
    layer cache, with no_cache), else the existing one; a build's steps go to on_step as they start. With
    download=False a wheelhouse that is missing or out of date is an error, not a download."""
    variant_pins([], variant)  # an unknown variant fails here, before the engine is asked anything
    info = ensure_running()
    base = ensure_base(base_image)
    fill_wheelhouse(base_python_version(base), variant, download)
    copy_sources(variant)
    digest = inputs_hash(base, variant)
    ref = f"{WORKER_REPO}:{tag_prefix(variant)}{digest[:12]}"
    found = image_id(ref)
    built, build_s = False, 0.0
    if found is None or no_cache:
        need = IMAGE_NEED_BYTES * (1 if variant == "cpu" else 3)
        check_free_space(info.root_dir, need, f"building the {variant} worker image")
        start = time.monotonic()
        _run_build(build_cmd(base, digest, ref, no_cache, variant), CACHE_DIR / f"build-{variant}.log", on_step)
        built, build_s, found = True, time.monotonic() - start, image_id(ref)
        _remove_older(ref, variant)
    else:
        log.info("worker image %s is up to date", ref)
        repo, tag = latest_tag(variant).split(":")
        with sdk(f"tagging {ref} as {latest_tag(variant)}"):
            client().images.get(ref).tag(repo, tag)
    return WorkerImage(ref, found, digest, base.ref, image_size_bytes(ref), built, build_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m docker_rt.image", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["build"])
    parser.add_argument(
        "--base-image",
        default=None,
        help="build FROM this image (default: $BASE_IMAGE, else the local debootstrapped Debian base)",
    )
    parser.add_argument("--variant", choices=VARIANTS, default="cpu", help="cuda: a CUDA build of torch (~3 GB more)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        image = ensure_image(args.base_image, variant=args.variant)
    except DockerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(asdict(image)))
    else:
        state = f"built in {image.build_s:.1f} s" if image.built else "up to date"
        print(f"{image.ref} ({image.size_bytes / 1e6:.0f} MB, FROM {image.base_ref}): {state}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
