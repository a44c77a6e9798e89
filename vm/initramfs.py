"""Build the VM's initramfs: busybox, kernel modules and the /init script.

Responsible for: choosing the kernel modules the VM needs (`MODULES`),
resolving their dependencies from the unpacked kernel's `modules.dep` into a
load order, decompressing them (busybox insmod reads plain .ko only), and
writing a gzip'd newc cpio with `/bin/busybox`, `/init` (`vm/init.sh`),
`/lib/pddlab/*.ko` and `/lib/pddlab/load.list`. Also writes the small
uncompressed per-run archive that carries a run's command into the VM.
Not responsible for: fetching the kernel (`vm.kernel`), or qemu and the
command's life cycle (`vm.run`).

The base archive is rebuilt only when its inputs change: its file name carries
a hash of busybox, init.sh, the kernel package and the module list. The
kernel accepts a concatenation of cpio archives, so `vm.run` appends the
per-run archive (`/pddlab/env`, `/pddlab/cmd.sh`) to a copy of the base one
instead of squeezing the command into the 2 KiB kernel command line.
"""

from __future__ import annotations

import gzip
import hashlib
import logging
import lzma
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from vm.kernel import CACHE_DIR, Kernel, cache_lock, run_cmd

log = logging.getLogger(__name__)

BUSYBOX = Path("/bin/busybox")  # Debian busybox-static: no shared libraries needed
INIT_SCRIPT = Path(__file__).with_name("init.sh")
_FORMAT_VERSION = "2"  # bump when the archive layout changes

# Loaded before the chroot, in dependency order. Anything else the guest needs
# is autoloaded: init.sh points modprobe at the unpacked kernel's modules.
MODULES = (
    "virtio_pci",  # the PCI transport of vhost-user-fs
    "virtiofs",  # host root and the share directory
    "overlay",  # writable tmpfs layer over the read-only host root
    "sch_netem",
    "sch_tbf",
    "sch_htb",
    "sch_prio",
    "sch_ingress",  # the tc backend
    "cls_u32",
    "cls_matchall",
    "cls_basic",
    "act_mirred",
    "ifb",  # ingress shaping
    "veth",
    "bridge",
    "tun",  # links, switches and the userspace backend's TUN
)


class InitramfsError(RuntimeError):
    """A module is missing or the archive could not be built."""


@dataclass(frozen=True)
class ModuleSet:
    """Modules to load, in order.

    order: module names, dependencies first
    paths: module name -> path relative to the kernel's modules dir
    """

    order: list[str]
    paths: dict[str, str]


def module_name(path: str) -> str:
    """kernel/net/sched/sch_netem.ko.xz -> sch_netem (dashes normalised to underscores)."""
    base = path.rsplit("/", 1)[-1]
    return base.split(".ko", 1)[0].replace("-", "_")


def parse_modules_dep(text: str) -> tuple[dict[str, list[str]], dict[str, str]]:
    """Parse modules.dep into (name -> dependency names, name -> path)."""
    deps: dict[str, list[str]] = {}
    paths: dict[str, str] = {}
    for line in text.splitlines():
        if ":" not in line:
            continue
        path, rest = line.split(":", 1)
        name = module_name(path)
        paths[name] = path
        deps[name] = [module_name(d) for d in rest.split()]
    return deps, paths


def load_order(wanted: list[str] | tuple[str, ...], deps: dict[str, list[str]], builtin: set[str]) -> list[str]:
    """Order `wanted` and their dependencies so each comes after what it needs."""
    order: list[str] = []

    def visit(name: str, chain: tuple[str, ...]) -> None:
        if name in order or name in builtin:
            return
        if name not in deps:
            raise InitramfsError(
                f"module {name} (needed by {' <- '.join(chain) or 'MODULES'}) is neither in modules.dep nor built in"
            )
        for dep in deps[name]:
            visit(dep, chain + (name,))
        order.append(name)

    for name in wanted:
        visit(name.replace("-", "_"), ())
    return order


def resolve_modules(kernel: Kernel, wanted=MODULES) -> ModuleSet:
    """Read the kernel's modules.dep/modules.builtin and return what to load, in order."""
    deps, paths = parse_modules_dep((kernel.modules_dir / "modules.dep").read_text())
    builtin_file = kernel.modules_dir / "modules.builtin"
    builtin = set()
    if builtin_file.exists():
        builtin = {module_name(p) for p in builtin_file.read_text().split()}
    order = load_order(wanted, deps, builtin)
    return ModuleSet(order, {name: paths[name] for name in order})


def read_module(path: Path) -> bytes:
    """Return a module's plain ELF bytes, decompressing .ko.xz / .ko.zst / .ko.gz."""
    if path.suffix == ".xz":
        return lzma.decompress(path.read_bytes())
    if path.suffix == ".gz":
        return gzip.decompress(path.read_bytes())
    if path.suffix == ".zst":
        return run_cmd(["zstd", "-dc", str(path)], text=False).stdout
    return path.read_bytes()


class CpioWriter:
    """Writes a newc ("070701") cpio archive into memory; entries are owned by root."""

    def __init__(self) -> None:
        self._chunks: list[bytes] = []
        self._ino = 1

    def _entry(self, name: str, mode: int, data: bytes = b"", rdev: tuple[int, int] = (0, 0)) -> None:
        fields = [self._ino, mode, 0, 0, 1, 0, len(data), 0, 0, rdev[0], rdev[1], len(name) + 1, 0]
        header = b"070701" + b"".join(b"%08x" % f for f in fields)
        self._ino += 1
        self._chunks += [header, name.encode() + b"\0", _pad(len(header) + len(name) + 1), data, _pad(len(data))]

    def add_dir(self, name: str) -> None:
        self._entry(name, stat.S_IFDIR | 0o755)

    def add_file(self, name: str, data: bytes, mode: int = 0o644) -> None:
        self._entry(name, stat.S_IFREG | mode, data)

    def add_chardev(self, name: str, major: int, minor: int) -> None:
        self._entry(name, stat.S_IFCHR | 0o600, rdev=(major, minor))

    def finish(self) -> bytes:
        """Append the trailer and return the archive."""
        self._entry("TRAILER!!!", 0)
        return b"".join(self._chunks)


def _pad(length: int) -> bytes:
    return b"\0" * (-length % 4)


def _input_hash(kernel: Kernel, modules: ModuleSet) -> str:
    h = hashlib.sha256(_FORMAT_VERSION.encode())
    for blob in (
        BUSYBOX.read_bytes(),
        INIT_SCRIPT.read_bytes(),
        f"{kernel.package} {kernel.version}".encode(),
        " ".join(modules.order).encode(),
    ):
        h.update(hashlib.sha256(blob).digest())
    return h.hexdigest()[:16]


def build_archive(kernel: Kernel, modules: ModuleSet) -> bytes:
    """Return the base initramfs (uncompressed cpio bytes)."""
    cpio = CpioWriter()
    for d in ("bin", "sbin", "dev", "proc", "sys", "lib", "lib/pddlab", "mnt", "newroot", "pddlab"):
        cpio.add_dir(d)
    cpio.add_chardev("dev/console", 5, 1)  # the kernel opens it for /init's stdio
    cpio.add_file("bin/busybox", BUSYBOX.read_bytes(), 0o755)
    cpio.add_file("init", INIT_SCRIPT.read_bytes(), 0o755)
    for name in modules.order:
        ko = read_module(kernel.modules_dir / modules.paths[name])
        cpio.add_file(f"lib/pddlab/{name}.ko", ko)
    cpio.add_file("lib/pddlab/load.list", ("\n".join(modules.order) + "\n").encode())
    cpio.add_file("lib/pddlab/release", (kernel.release + "\n").encode())
    return cpio.finish()


def ensure_initramfs(kernel: Kernel, cache_dir: Path = CACHE_DIR) -> Path:
    """Return the path of the base initramfs for `kernel`, building it if its inputs changed."""
    if not BUSYBOX.exists():
        raise InitramfsError(f"{BUSYBOX} missing: apt-get install busybox-static")
    modules = resolve_modules(kernel)
    out = cache_dir / f"initramfs-{kernel.release}-{_input_hash(kernel, modules)}.cpio.gz"
    if out.exists():
        log.debug("initramfs up to date: %s", out)
        return out
    with cache_lock(cache_dir):
        if not out.exists():
            _build(kernel, modules, out)
    return out


def _build(kernel: Kernel, modules: ModuleSet, out: Path) -> None:
    log.info("building %s with modules: %s", out.name, " ".join(modules.order))
    data = gzip.compress(build_archive(kernel, modules), compresslevel=6)
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, out)  # atomic: an interrupted build never leaves half a file


def run_archive(files: dict[str, str]) -> bytes:
    """Return an uncompressed cpio holding `files` (name under /pddlab -> text) for one run."""
    cpio = CpioWriter()
    cpio.add_dir("pddlab")
    for name, text in files.items():
        cpio.add_file(f"pddlab/{name}", text.encode(), 0o755)
    return cpio.finish()
