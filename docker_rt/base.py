"""The base image the worker image is built FROM, made without any registry.

Responsible for: the default base `pddlab-base:<hash>` — Debian bookworm
debootstrapped (`--variant=minbase`) from the mirror apt uses into
`.cache/docker/rootfs`, with only what the workers and the testbed need inside
a host, then `docker import`ed; skipped when that image exists. Or, with
`BASE_IMAGE` set (e.g. `python:3.11-slim` for users with a registry), that
image, pulled if absent, with a clear message when it does not exist.
Not responsible for: Python packages or the project (`docker_rt.image`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from docker_rt import BASE_REPO, DockerError
from docker_rt.engine import (
    CACHE_DIR,
    SDK_ERRORS,
    check_free_space,
    client,
    docker,
    engine_words,
    ensure_debs,
    image_id,
)

log = logging.getLogger(__name__)
SUITE = "bookworm"
MIRROR = os.environ.get("DEBIAN_MIRROR", "http://deb.debian.org/debian")
# The workers need python3 + venv; the rest is for looking at a host's network from inside
# its containers (the tests run `ip` and `ping` there).
PACKAGES = ("python3", "python3-venv", "iproute2", "iputils-ping", "procps", "net-tools", "ethtool")
ROOTFS_DIR = CACHE_DIR / "rootfs"
DONE_MARK = ".pddlab-rootfs-done"
ROOTFS_NEED_BYTES = 1 * 2**30  # debootstrap needs ~400 MB while it unpacks; the import doubles it
RECIPE_VERSION = "1"  # bump when the recipe below changes in a way its inputs do not show


@dataclass(frozen=True)
class BaseImage:
    """ref: what the Dockerfile's FROM names; image_id: its content id; local: debootstrapped here."""

    ref: str
    image_id: str
    local: bool


def recipe_hash() -> str:
    """Hash of every input of the debootstrapped base: suite, mirror, packages, recipe version."""
    text = "|".join([RECIPE_VERSION, SUITE, "minbase", MIRROR, ",".join(sorted(PACKAGES))])
    return hashlib.sha256(text.encode()).hexdigest()


def debootstrap_cmd(rootfs: Path) -> list[str]:
    """The debootstrap command line (pure: unit-testable)."""
    return [
        "debootstrap",
        "--variant=minbase",
        f"--include={','.join(PACKAGES)}",
        "--components=main",
        SUITE,
        str(rootfs),
        MIRROR,
    ]


def _run_logged(argv: list[str], log_path: Path) -> None:
    log.info("run: %s (log %s)", " ".join(argv), log_path)
    with open(log_path, "wb") as out:
        code = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT).returncode
    if code != 0:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-15:])
        raise DockerError(f"`{argv[0]}` failed ({code}); last lines of {log_path}:\n{tail}")


def build_rootfs(digest: str) -> Path:
    """Debootstrap into ROOTFS_DIR unless a finished rootfs of this recipe is there."""
    mark = ROOTFS_DIR / DONE_MARK
    if mark.exists() and mark.read_text() == digest:
        return ROOTFS_DIR
    ensure_debs(["debootstrap"])
    check_free_space(CACHE_DIR, ROOTFS_NEED_BYTES, "the Debian base rootfs")
    shutil.rmtree(ROOTFS_DIR, ignore_errors=True)  # a half-made rootfs from an interrupted run
    ROOTFS_DIR.mkdir(parents=True)
    _run_logged(debootstrap_cmd(ROOTFS_DIR), CACHE_DIR / "debootstrap.log")
    for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):  # nothing the image needs
        for entry in (ROOTFS_DIR / junk).glob("*"):
            if entry.is_file():
                entry.unlink()
    mark.write_text(digest)
    return ROOTFS_DIR


def import_rootfs(rootfs: Path, ref: str) -> None:
    """`tar | docker import` the rootfs as ref (the done-mark left out)."""
    tar = ["tar", "-C", str(rootfs), "--exclude", f"./{DONE_MARK}", "-c", "."]
    imp = [
        "import",
        "--change",
        "ENV LANG=C.UTF-8",
        "--change",
        'CMD ["/bin/bash"]',
        "--message",
        f"pddlab base: debootstrap {SUITE} minbase from {MIRROR}",
        "-",
        ref,
    ]
    # The CLI, not the SDK: tar's output streams into it; the SDK's import_image takes a file or the bytes.
    log.info("run: %s | docker %s", " ".join(tar), " ".join(imp))
    producer = subprocess.Popen(tar, stdout=subprocess.PIPE)
    try:
        docker(imp, timeout_s=600, stdin=producer.stdout, text=False)
    finally:
        producer.stdout.close()
        producer.wait()
    if producer.returncode != 0:
        raise DockerError(f"tar of {rootfs} failed ({producer.returncode})")


def local_base() -> BaseImage:
    """pddlab-base:<hash>, debootstrapped and imported only when it is not here yet."""
    digest = recipe_hash()
    ref = f"{BASE_REPO}:{digest[:12]}"
    found = image_id(ref)
    if found:
        log.info("base image %s is up to date", ref)
        return BaseImage(ref, found, local=True)
    import_rootfs(build_rootfs(digest), ref)
    return BaseImage(ref, image_id(ref), local=True)


def user_base(ref: str) -> BaseImage:
    """A BASE_IMAGE of the user's: local, or pulled; DockerError saying what to do otherwise."""
    found = image_id(ref)
    if found is None:
        try:
            found = client().images.pull(ref).id
        except SDK_ERRORS as err:
            raise DockerError(
                f"BASE_IMAGE {ref!r} does not exist here and could not be pulled "
                f"({engine_words(err)}). Name an image that `docker images` lists "
                "or that your registry serves, or unset BASE_IMAGE to build the Debian base "
                "locally with debootstrap."
            )
    return BaseImage(ref, found, local=False)


def ensure_base(base_image: str | None = None) -> BaseImage:
    """The base to build FROM: BASE_IMAGE when given (argument, else environment), else the local one."""
    ref = base_image if base_image is not None else os.environ.get("BASE_IMAGE") or None
    return user_base(ref) if ref else local_base()
