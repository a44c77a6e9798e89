"""Run one command inside a stock-kernel VM that sees the host's files.

Responsible for: the `python -m vm.run` command line and `run_in_vm()`:
starting two virtiofsd daemons (the host root, served read-only to the guest
under a tmpfs overlay, and the writable share directory), booting qemu with
the Debian cloud kernel under TCG, streaming the command's output, reading
its exit status, and killing what it started (by PID) on timeout, error and
Ctrl-C.
Not responsible for: fetching the kernel (`vm.kernel`), building the
initramfs or what happens inside the guest before the command (`vm.initramfs`,
`vm/init.sh`), or what the command does.

How it fits together. The guest has no NIC (`-nic none`); everything it
needs is on the host's filesystem, which it sees at the same paths: the host
root comes in read-only through virtiofs (the cloud kernel has no 9p, so
virtiofs, not `-virtfs`), with a tmpfs overlay on top so that tools may write
anywhere (writes are lost at power-off), plus fresh /run, /dev, /proc, /sys
and cgroup2. Only the share directory is mounted writable, at its host path;
results written there come back. The command runs as root in `cwd` with the
host's PATH, stdin from /dev/null, stdout+stderr on the second serial port
(qemu's stdout here); the kernel console is the first serial port (qemu's
stderr here), where /init prints PDDLAB-START when the command starts and
PDDLAB-RC=<status> when it ends. The command travels in a small cpio
appended to the initramfs, so any argv (spaces, quotes, newlines) is safe.
"""

from __future__ import annotations

import argparse
import codecs
import ctypes
import json
import logging
import os
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from vm.initramfs import ensure_initramfs, run_archive
from vm.kernel import REPO_ROOT, Kernel, ensure_kernel

log = logging.getLogger(__name__)

QEMU = "qemu-system-x86_64"
VIRTIOFSD = "/usr/lib/qemu/virtiofsd"  # Debian's qemu-system-common ships it
DEFAULT_MEMORY_MB = 3072  # Mininet + iperf3 + the project's python fit with room to spare
DEFAULT_CPUS = 2
DEFAULT_TIMEOUT_S = 900.0
SOCKET_WAIT_S = 10.0  # virtiofsd creates its socket within milliseconds
KILL_GRACE_S = 5.0
DAEMON_EXIT_S = 2.0  # virtiofsd exits by itself once qemu has closed its socket
KERNEL_ARGS = (
    "console=ttyS0",
    "quiet",
    "panic=-1",
    "rdinit=/init",
    "mitigations=off",  # page-table isolation makes every syscall slower under TCG
)
GUEST_ENV = {
    "HOME": "/root",
    "LANG": "C.UTF-8",
    "TERM": "dumb",
    "PYTHONUNBUFFERED": "1",  # output arrives as it is printed
    "PDDLAB_IN_VM": "1",
}
START_MARK = "PDDLAB-START"
RC_MARK = "PDDLAB-RC="
ERROR_MARK = "PDDLAB-ERROR:"


class VMError(RuntimeError):
    """qemu, virtiofsd or the kernel is missing, or the VM did not report an exit status."""


class VMTimeout(VMError):
    """The command did not finish within the timeout; the VM was killed."""


@dataclass
class VMResult:
    """What a command in the VM did.

    rc: the command's exit status
    output: its stdout and stderr, interleaved as written
    boot_s: from starting qemu to the command starting (s)
    wall_s: from starting qemu to qemu exiting (s)
    console: the kernel console (ttyS0), for diagnosis
    """

    rc: int
    output: str
    boot_s: float
    wall_s: float
    console: str = field(default="", repr=False)


def guest_script(command: list[str], cwd: Path, env: dict[str, str]) -> str:
    """Return the /bin/sh script that runs `command` in `cwd` with exactly `env`."""
    lines = [f"cd -- {shlex.quote(str(cwd))} || exit 125"]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items())]
    lines.append("exec " + " ".join(shlex.quote(a) for a in command))
    return "\n".join(lines) + "\n"


def guest_env_file(share: Path, kernel: Kernel) -> str:
    """Return /pddlab/env, the variables /init sources."""
    return f"PDDLAB_SHARE={shlex.quote(str(share))}\nPDDLAB_MODULES={shlex.quote(str(kernel.modules_dir))}\n"


def virtiofsd_command(source: Path, socket: Path, cache: str) -> list[str]:
    """Return the argv of a virtiofsd serving `source` on `socket`."""
    return [
        VIRTIOFSD,
        f"--socket-path={socket}",
        "-o",
        f"source={source}",
        "-o",
        f"cache={cache}",
        "-o",
        "log_level=warn",
        # pivot_root (the default sandbox) fails with EBUSY when source is /
        "-o",
        "sandbox=chroot",
    ]


def qemu_command(kernel: Kernel, initrd: Path, sockets: dict[str, Path], memory_mb: int, cpus: int) -> list[str]:
    """Return the qemu argv; `sockets` maps a virtiofs tag to its virtiofsd socket."""
    argv = [
        QEMU,
        "-accel",
        "tcg",
        "-machine",
        "pc,memory-backend=mem",
        "-cpu",
        "max",
        "-smp",
        str(cpus),
        "-m",
        f"{memory_mb}M",
        # vhost-user needs guest RAM that virtiofsd can map
        "-object",
        f"memory-backend-memfd,id=mem,size={memory_mb}M,share=on",
        "-kernel",
        str(kernel.vmlinuz),
        "-initrd",
        str(initrd),
        "-append",
        " ".join(KERNEL_ARGS),
        "-nodefaults",
        "-nic",
        "none",
        "-display",
        "none",
        "-no-reboot",
        "-chardev",
        "file,id=console,path=/dev/stderr",
        "-serial",
        "chardev:console",
        "-chardev",
        "stdio,id=output,signal=off",
        "-serial",
        "chardev:output",
    ]
    for i, (tag, socket) in enumerate(sockets.items()):
        argv += ["-chardev", f"socket,id=fs{i},path={socket}", "-device", f"vhost-user-fs-pci,chardev=fs{i},tag={tag}"]
    return argv


def _check_tools() -> None:
    missing = [t for t in (QEMU, VIRTIOFSD) if not shutil.which(t)]
    if missing:
        raise VMError(f"missing {', '.join(missing)}: apt-get install qemu-system-x86")
    if os.geteuid() != 0:
        raise VMError("virtiofsd must run as root to serve the host's files")


def _write_initrd(base: Path, dest: Path, files: dict[str, str]) -> None:
    data = base.read_bytes()
    dest.write_bytes(data + b"\0" * (-len(data) % 4) + run_archive(files))


# Linux ABI constants for the read-only view of the host root.
_CLONE_NEWNS, _MS_REC, _MS_BIND, _MS_PRIVATE = 0x20000, 0x4000, 0x1000, 0x40000
_SYS_MOUNT_SETATTR, _AT_FDCWD, _AT_RECURSIVE, _MOUNT_ATTR_RDONLY = 442, -100, 0x8000, 0x1
_MNT_DETACH = 2
HIDDEN_MOUNTS = ("proc", "sys", "dev")  # the host's own; the guest mounts fresh ones there


def _libc_check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _readonly_view(target: Path) -> Callable[[], None]:
    """Return a preexec_fn that gives the child a private mount namespace in
    which `target` is a recursive, read-only bind of the host's /, without the
    host's /proc, /sys and /dev.

    virtiofsd 7.2 has no read-only option; this makes the host root read-only
    on the host side, whatever the guest does (mount_setattr, Linux >= 5.12).
    """
    libc = ctypes.CDLL(None, use_errno=True)  # loaded before fork: the child only makes syscalls
    dest = os.fsencode(target)
    hidden = [os.path.join(dest, name.encode()) for name in HIDDEN_MOUNTS]
    attr = struct.pack("QQQQ", _MOUNT_ATTR_RDONLY, 0, 0, 0)  # struct mount_attr

    def enter() -> None:
        _libc_check(libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
        _libc_check(libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None), "make / private")
        _libc_check(libc.mount(b"/", dest, None, _MS_BIND | _MS_REC, None), "bind / to the view")
        for path in hidden:
            libc.umount2(path, _MNT_DETACH)  # fails harmlessly where it is not a mount
        _libc_check(
            libc.syscall(_SYS_MOUNT_SETATTR, _AT_FDCWD, dest, _AT_RECURSIVE, attr, len(attr)),
            "mount_setattr(MOUNT_ATTR_RDONLY)",
        )

    return enter


def _start_virtiofsd(
    source: Path, socket: Path, cache: str, logfile: Path, preexec: Callable[[], None] | None = None
) -> subprocess.Popen:
    argv = virtiofsd_command(source, socket, cache)
    where = " (in a mount namespace where source is a read-only bind of /)" if preexec else ""
    log.info("run: %s%s", " ".join(argv), where)
    with open(logfile, "wb") as out:
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, preexec_fn=preexec)
        except subprocess.SubprocessError as exc:
            raise VMError(f"cannot prepare the read-only host root for virtiofsd: {exc}") from exc
    deadline = time.monotonic() + SOCKET_WAIT_S
    while not socket.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise VMError(f"virtiofsd for {source} did not come up: {logfile.read_text()[-2000:]}")
        time.sleep(0.02)
    return proc


def _stop(proc: subprocess.Popen, name: str, grace_s: float = 0.0) -> None:
    """Stop a process we started, by its PID: wait `grace_s`, then SIGTERM, then SIGKILL."""
    try:
        proc.wait(grace_s)
        return
    except subprocess.TimeoutExpired:
        pass
    log.info("stopping %s (pid %d)", name, proc.pid)
    proc.terminate()
    try:
        proc.wait(KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class _Streams:
    """Reader threads for qemu's stdout (command output) and stderr (console)."""

    def __init__(self, proc: subprocess.Popen, t0: float, echo: Callable[[str], None] | None):
        self.output: list[str] = []
        self.console: list[str] = []
        self.start_s: float | None = None
        self._t0, self._echo = t0, echo
        self._threads = [
            threading.Thread(target=self._read_output, args=(proc.stdout,), daemon=True),
            threading.Thread(target=self._read_console, args=(proc.stderr,), daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _read_output(self, pipe) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        while chunk := os.read(pipe.fileno(), 65536):
            text = decoder.decode(chunk)
            self.output.append(text)
            if self._echo and text:
                self._echo(text)

    def _read_console(self, pipe) -> None:
        for raw in pipe:
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            if START_MARK in line and self.start_s is None:
                self.start_s = time.monotonic() - self._t0
            self.console.append(line)
            log.debug("console: %s", line)

    def join(self) -> None:
        for t in self._threads:
            t.join(KILL_GRACE_S)


def parse_rc(console: list[str]) -> int:
    """Return the status from the PDDLAB-RC line; raise VMError with the console tail if absent."""
    for line in reversed(console):
        if RC_MARK in line:
            return int(line.split(RC_MARK, 1)[1].split()[0])
    errors = [line for line in console if ERROR_MARK in line]
    tail = "\n".join(console[-30:])
    raise VMError(f"the VM reported no exit status. {' '.join(errors)}\nconsole tail:\n{tail}")


def _echo_stdout(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def run_in_vm(
    command: list[str],
    cwd: Path,
    share: Path,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    memory_mb: int = DEFAULT_MEMORY_MB,
    *,
    cpus: int = DEFAULT_CPUS,
    env: dict[str, str] | None = None,
    echo: Callable[[str], None] | None = None,
) -> VMResult:
    """Boot the VM, run `command` in `cwd` as root, and return its status and output.

    share: host directory mounted writable at the same path inside (must exist)
    timeout_s: whole-VM limit, boot included (s); VMTimeout when exceeded
    env: extra environment for the command (default: the host's PATH and GUEST_ENV)
    echo: called with each piece of output as it arrives (e.g. to stream it)
    """
    if not command:
        raise ValueError("empty command")
    _check_tools()
    cwd, share = Path(cwd).resolve(), Path(share).resolve()
    for what, path in (("share", share), ("working", cwd)):
        if not path.is_dir():
            raise VMError(f"{what} directory {path} does not exist")
    kernel = ensure_kernel()
    if not kernel.vmlinuz.exists():
        raise VMError(f"kernel image {kernel.vmlinuz} missing; delete {kernel.root} to refetch it")
    base = ensure_initramfs(kernel)
    guest_env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), **GUEST_ENV, **(env or {})}
    with tempfile.TemporaryDirectory(prefix="pddlab-vm-") as tmp:
        run_dir = Path(tmp)
        initrd = run_dir / "initrd.cpio"
        _write_initrd(
            base, initrd, {"env": guest_env_file(share, kernel), "cmd.sh": guest_script(command, cwd, guest_env)}
        )
        return _boot(kernel, initrd, run_dir, share, timeout_s, memory_mb, cpus, echo)


def _boot(
    kernel: Kernel, initrd: Path, run_dir: Path, share: Path, timeout_s: float, memory_mb: int, cpus: int, echo
) -> VMResult:
    daemons: list[tuple[str, subprocess.Popen]] = []
    qemu = None
    state = _RunRecord(run_dir)  # `make clean` ends them (by PID) if this process is SIGKILLed
    try:
        sockets = {"hostroot": run_dir / "root.sock", "share": run_dir / "share.sock"}
        root_view = run_dir / "hostroot"
        root_view.mkdir()
        daemons.append(
            (
                "virtiofsd /",
                _start_virtiofsd(
                    root_view, sockets["hostroot"], "always", run_dir / "virtiofsd-root.log", _readonly_view(root_view)
                ),
            )
        )
        state.add(daemons[-1][1].pid, daemons[-1][0])
        daemons.append(
            (f"virtiofsd {share}", _start_virtiofsd(share, sockets["share"], "auto", run_dir / "virtiofsd-share.log"))
        )
        state.add(daemons[-1][1].pid, daemons[-1][0])
        argv = qemu_command(kernel, initrd, sockets, memory_mb, cpus)
        log.info("run: %s", shlex.join(argv))
        t0 = time.monotonic()
        qemu = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        state.add(qemu.pid, "qemu")
        streams = _Streams(qemu, t0, echo)
        try:
            qemu.wait(timeout_s)
        except subprocess.TimeoutExpired:
            _stop(qemu, "qemu")
            streams.join()
            raise VMTimeout(
                f"command did not finish within {timeout_s:g} s; VM killed. "
                f"Output so far:\n{''.join(streams.output)[-2000:]}"
            ) from None
        wall_s = time.monotonic() - t0
        streams.join()
        rc = parse_rc(streams.console)
        return VMResult(
            rc, "".join(streams.output), streams.start_s or float("nan"), wall_s, "\n".join(streams.console)
        )
    finally:
        if qemu is not None:
            _stop(qemu, "qemu")
        for name, proc in daemons:
            _stop(proc, name, grace_s=DAEMON_EXIT_S)
        state.remove()


# `make clean` (topology.cleanup, RUN_KINDS "vm") reads this file. vm imports nothing of the project (the
# layers: tests/unit/test_shape.py), so it writes topology.cleanup.StateFile's format itself: the owner and
# its start time, each process with its start time (/proc/PID/stat field 22: survives exec, so a reused
# PID is never mistaken for ours), and the work directory.
STATE_DIR = Path("/run/pddlab")


def _start_time(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except OSError:
        return None


class _RunRecord:
    """This VM run's processes and work directory, on disk until its teardown finishes."""

    def __init__(self, workdir: Path):
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        self.path = STATE_DIR / f"vm-{os.getpid()}.json"
        owner = os.getpid()
        self.state = {"owner": owner, "owner_started": _start_time(owner), "procs": [], "workdir": str(workdir)}
        self._write()

    def add(self, pid: int, what: str) -> None:
        self.state["procs"].append({"pid": pid, "what": what, "started": _start_time(pid)})
        self._write()

    def _write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state))
        tmp.replace(self.path)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def _default_share() -> Path:
    share = REPO_ROOT / "results" / "vm" / time.strftime("%Y%m%d-%H%M%S")
    share.mkdir(parents=True, exist_ok=True)
    return share


def main(argv: list[str] | None = None) -> int:
    """CLI: python -m vm.run [--timeout S] [--memory MB] [--share DIR] -- COMMAND..."""
    parser = argparse.ArgumentParser(prog="python -m vm.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds, boot included")
    parser.add_argument("--memory", type=int, default=DEFAULT_MEMORY_MB, help="guest RAM in MB")
    parser.add_argument("--cpus", type=int, default=DEFAULT_CPUS)
    parser.add_argument(
        "--share", type=Path, help="writable host dir at the same path inside (default: a fresh results/vm/<time>)"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log the kernel console too")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (put it after --)")
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="vm: %(message)s", stream=sys.stderr
    )
    share = args.share or _default_share()
    # SIGTERM unwinds like Ctrl-C, so the finally blocks stop qemu and virtiofsd
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        result = run_in_vm(command, Path.cwd(), share, args.timeout, args.memory, cpus=args.cpus, echo=_echo_stdout)
    except VMTimeout as exc:
        log.error("%s", exc)
        return 124
    except KeyboardInterrupt:
        log.error("interrupted; VM stopped")
        return 130
    except (VMError, RuntimeError) as exc:
        log.error("%s", exc)
        return 125
    log.info("rc=%d boot=%.1fs wall=%.1fs share=%s", result.rc, result.boot_s, result.wall_s, share)
    return result.rc


if __name__ == "__main__":
    sys.exit(main())
