"""Fetch and unpack the stock Debian cloud kernel that the VM boots.

Responsible for: resolving which `linux-image-*-cloud-amd64` package the
metapackage `linux-image-cloud-amd64` currently depends on, downloading it
with `apt-get download` (never installing it on the host), unpacking it with
`dpkg-deb -x` under `.cache/vm/kernel/<package>_<version>/`, and generating
its `modules.dep` with `depmod -b` (the .deb ships none; the host's postinst
would normally make it). Also the one helper that logs and runs external
commands for the `vm` package.
Not responsible for: choosing modules or building the initramfs
(`vm.initramfs`), or booting anything (`vm.run`).

Idempotent: a finished unpack is marked by a `.complete` stamp and reused;
the directory name carries the package name and version, so a kernel update
in the archive unpacks next to the old one. Without network, the newest kernel
already unpacked is used (with a warning).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parent.parent
CACHE_DIR = REPO_ROOT / ".cache" / "vm"  # gitignored
META_PACKAGE = "linux-image-cloud-amd64"  # has sch_netem (as a module)
_STAMP = ".complete"


class KernelError(RuntimeError):
    """The kernel could not be resolved, downloaded or unpacked."""


@dataclass(frozen=True)
class Kernel:
    """An unpacked kernel package.

    package: Debian package name, e.g. linux-image-6.1.0-57-cloud-amd64
    version: Debian package version, e.g. 6.1.192-3
    release: `uname -r` of that kernel, e.g. 6.1.0-57-cloud-amd64
    root: directory the .deb was unpacked into
    """

    package: str
    version: str
    release: str
    root: Path

    @property
    def vmlinuz(self) -> Path:
        return self.root / "boot" / f"vmlinuz-{self.release}"

    @property
    def modules_dir(self) -> Path:
        return self.root / "lib" / "modules" / self.release


def run_cmd(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    """Log argv, run it, and raise `CalledProcessError` (with its stderr) on failure."""
    log.info("run: %s", " ".join(argv))
    kwargs.setdefault("capture_output", True)
    kwargs.setdefault("text", True)
    return subprocess.run(argv, check=True, **kwargs)


@contextlib.contextmanager
def cache_lock(cache_dir: Path = CACHE_DIR):
    """Hold an exclusive lock on the cache, so concurrent runs build it once."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def parse_depends(apt_cache_output: str) -> str:
    """Return the `linux-image-*` package named on a `Depends:` line of `apt-cache depends`."""
    for match in re.finditer(r"^\s*Depends:\s*(linux-image-\S+)", apt_cache_output, re.M):
        return match.group(1)
    raise KernelError(f"no linux-image-* dependency of {META_PACKAGE} in: {apt_cache_output!r}")


def parse_version(apt_cache_show: str) -> str:
    """Return the `Version:` field of `apt-cache show` output."""
    match = re.search(r"^Version:\s*(\S+)", apt_cache_show, re.M)
    if not match:
        raise KernelError(f"no Version field in: {apt_cache_show!r}")
    return match.group(1)


def release_of(package: str) -> str:
    """Map linux-image-6.1.0-57-cloud-amd64 to its `uname -r`, 6.1.0-57-cloud-amd64."""
    if not package.startswith("linux-image-"):
        raise KernelError(f"not a kernel image package: {package}")
    return package.removeprefix("linux-image-")


def resolve_package() -> tuple[str, str]:
    """Return (package, version) of the kernel the metapackage depends on now."""
    try:
        package = parse_depends(run_cmd(["apt-cache", "depends", META_PACKAGE]).stdout)
        show = run_cmd(["apt-cache", "show", "--no-all-versions", package]).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise KernelError(f"apt-cache cannot resolve {META_PACKAGE}: {exc}") from exc
    return package, parse_version(show)


def _unpack(package: str, version: str, dest: Path, cache_dir: Path) -> None:
    debs = cache_dir / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    deb = debs / f"{package}_{version.replace(':', '%3a')}_amd64.deb"
    if not deb.exists():
        run_cmd(["apt-get", "download", f"{package}={version}"], cwd=debs)
    if dest.exists():
        shutil.rmtree(dest)  # a half-finished unpack from an interrupted run
    dest.parent.mkdir(parents=True, exist_ok=True)
    run_cmd(["dpkg-deb", "-x", str(deb), str(dest)])
    run_cmd(["depmod", "-b", str(dest), release_of(package)])
    (dest / _STAMP).write_text(f"{package} {version}\n")


def _newest_unpacked(cache_dir: Path) -> Kernel | None:
    stamps = sorted((cache_dir / "kernel").glob(f"*/{_STAMP}"), key=lambda p: p.stat().st_mtime)
    if not stamps:
        return None
    package, version = stamps[-1].read_text().split()
    return Kernel(package, version, release_of(package), stamps[-1].parent)


def ensure_kernel(cache_dir: Path = CACHE_DIR) -> Kernel:
    """Return the current cloud kernel, downloading and unpacking it only if needed."""
    try:
        package, version = resolve_package()
    except KernelError:
        cached = _newest_unpacked(cache_dir)
        if cached is None:
            raise
        log.warning("apt-cache failed; using the kernel already unpacked: %s", cached.root)
        return cached
    dest = cache_dir / "kernel" / f"{package}_{version}"
    kernel = Kernel(package, version, release_of(package), dest)
    if (dest / _STAMP).exists():
        log.debug("kernel %s %s already unpacked in %s", package, version, dest)
        return kernel
    try:
        with cache_lock(cache_dir):
            if not (dest / _STAMP).exists():  # another run may have unpacked it meanwhile
                _unpack(package, version, dest, cache_dir)
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", "") or exc
        raise KernelError(f"cannot fetch/unpack {package}={version}: {detail}") from exc
    return kernel
