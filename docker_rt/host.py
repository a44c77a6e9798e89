"""Docker hosts in the Mininet topology: each chosen host's processes run in containers.

Responsible for: the Docker runtime of one testbed (`DockerRuntime`): per
Docker host a *holder* container started with `--network none` whose network
namespace Mininet wires (the host's shell attaches to it by PID with `mnexec
-a`-style, as Containernet's Docker node does, so Mininet moves the host's veth
into it; no Open vSwitch); per process started on that host one container sharing
the holder's network namespace (`--network container:<holder>`) with the
role's CPU and memory limits; crash detection naming the role and its last log
lines; container logs collected into a directory; and teardown by the run's
label — on normal exit, errors and signals (through `topology.net.Testbed`'s
teardown) — plus `clean_orphans()` for runs that died outright.
Not responsible for: images (`docker_rt.image`), the engine
(`docker_rt.engine`), addressing, links and shaping (`topology.net`).

Like a Kubernetes pod: the holder only holds the namespace (it runs `sleep`),
so a process container can crash, and a new one start, without the host
losing its interfaces. Unlike Containernet, the host's shell joins only the
holder's *network* namespace (`nsenter --net`), not its mount namespace: so
commands the topology itself runs in a host (`Testbed.run`: ip, sysctl, ping,
ethtool, through `mnexec -a <shell pid>`) see the machine's files and tools
exactly as on a plain host (mnexec -a would otherwise chdir into a directory
the container lacks, and a container's /proc/sys is read-only). Net sysctls
are per namespace, so they still apply to the host alone.

A process container runs attached (`docker run` without -d), so the docker
client's PID stands for it: its exit code is the container's, its stdout and
stderr are the container's, and SIGTERM to it reaches the process (the client
proxies signals; `--init` makes the process not PID 1). That is why containers
are created with the CLI (the holders too, so both kinds share one set of
flags) while everything read or removed afterwards (states, exit codes, labels,
logs) goes through the docker SDK (`docker_rt.engine.client`).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import docker.errors as docker_sdk_errors

from docker_rt import LABEL_HOST, LABEL_KIND, LABEL_OWNER, LABEL_RUN, DockerError, holder_name, proc_name
from docker_rt.engine import SDK_ERRORS, client, docker, docker_bin, ensure_running, image_id, sdk
from workers import cache

log = logging.getLogger(__name__)
WEIGHTS_MOUNT = "/cache/weights"  # PDDLAB_CACHE_DIR=/cache in the image
LOG_TAIL_LINES = 20
STOP_GRACE_S = 5


class WorkerCrashed(DockerError):
    """A process container of the run exited on its own with a failure."""


@dataclass(frozen=True)
class RoleLimits:
    """cpus: CPU time, in cores (docker --cpus); memory_mb: hard memory limit, swap included (MiB); cpuset: the
    cores it may run on (docker --cpuset-cpus, e.g. "1" or "0-1"; "" = any): a pool's own hardware"""

    cpus: float
    memory_mb: int
    cpuset: str = ""


# Small model, CPU only: these leave headroom on a 2-core machine and catch a runaway role. A worker of
# the default model holds ~1.3 GiB before its first request (weights, a preallocated 800 MB KV cache,
# torch); prefilling a 2000-token prompt adds ~0.4 GiB of activations (attention scores grow with the
# square of the prompt), and P's layer copies in flight come on top: 2 GiB killed P in the default
# experiment once decoding was batched and requests came closer together.
DEFAULT_LIMITS: Mapping[str, RoleLimits] = {
    "client": RoleLimits(1.0, 1024),
    "router": RoleLimits(0.5, 1024),
    "p": RoleLimits(1.0, 3072),
    "rld": RoleLimits(1.0, 3072),
    "md": RoleLimits(1.0, 3072),
}


@dataclass(frozen=True)
class DockerOptions:
    """image: worker image ref (`docker_rt.image.ensure_image().ref`)
    roles: roles whose hosts become Docker hosts; the others stay plain namespaces
    limits: per-role CPU and memory limits (DEFAULT_LIMITS for roles not listed)
    mounts: host directories visible at the same path inside (the run dir: configs, events)
    weights_dir: host directory of model weights, mounted read-only at /cache/weights
    log_dir: where each container's log goes as <container>.log at teardown; None = not kept
    env: extra environment for process containers
    gpu_roles: roles whose process containers get the machine's GPUs (`--gpus all`: a `device: cuda` pool;
      the image is then the cuda variant, docker_rt.image)
    """

    image: str
    roles: tuple[str, ...] = ("router", "p", "rld", "md")
    limits: Mapping[str, RoleLimits] = field(default_factory=dict)
    mounts: tuple[Path, ...] = ()
    weights_dir: Path = field(default_factory=cache.weights_dir)
    log_dir: Path | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    gpu_roles: tuple[str, ...] = ()

    def limits_for(self, role: str) -> RoleLimits:
        return self.limits.get(role) or DEFAULT_LIMITS.get(role) or RoleLimits(1.0, 1024)


@dataclass(frozen=True)
class ContainerState:
    """One container of the run as `docker inspect` sees it."""

    name: str
    host: str
    kind: str
    status: str
    exit_code: int
    oom_killed: bool


# ---------------------------------------------------------------- command builders (pure)
# Every container: no capability (the roles bind ports above 1024 and pick bbr/reno, which the kernel
# allows without one; the network is wired from outside), no privilege gained by exec, a read-only root.
HARDENING = ("--cap-drop", "ALL", "--security-opt", "no-new-privileges", "--read-only")
PROC_PIDS_LIMIT = 512  # a role's threads (gRPC pool, KV connections, torch) with room to spare


def labels(run_id: str, host: str, kind: str) -> list[str]:
    """--label arguments of a container of this run."""
    pairs = {LABEL_RUN: run_id, LABEL_OWNER: str(os.getpid()), LABEL_HOST: host, LABEL_KIND: kind}
    return [a for k, v in pairs.items() for a in ("--label", f"{k}={v}")]


def holder_run_args(opts: DockerOptions, run_id: str, host: str) -> list[str]:
    """`docker run` arguments of a host's holder: no network of Docker's, only a namespace to wire."""
    return [
        "run",
        "-d",
        "--name",
        holder_name(run_id, host),
        "--hostname",
        host,
        "--network",
        "none",
        "--init",
        *labels(run_id, host, "holder"),
        *HARDENING,
        "--pids-limit",
        "16",
        "--cpus",
        "0.1",
        "--memory",
        "64m",
        opts.image,
        "sleep",
        "infinity",
    ]


def proc_run_args(opts: DockerOptions, run_id: str, host: str, role: str, index: int, argv: list[str]) -> list[str]:
    """`docker run` arguments of a process container on a host (attached: the client stands for it)."""
    lim = opts.limits_for(role)
    args = [
        "run",
        "--name",
        proc_name(run_id, host, index),
        "--network",
        f"container:{holder_name(run_id, host)}",
        "--init",
        *labels(run_id, host, "proc"),
        "--label",
        f"pddlab.role={role}",
        *HARDENING,
        "--pids-limit",
        str(PROC_PIDS_LIMIT),
        "--tmpfs",
        "/tmp:rw,nosuid,nodev,size=256m",
        "--cpus",
        f"{lim.cpus:g}",
        "--memory",
        f"{lim.memory_mb}m",
        "--memory-swap",
        f"{lim.memory_mb}m",
        *(["--cpuset-cpus", lim.cpuset] if lim.cpuset else []),
        *(["--gpus", "all"] if role in opts.gpu_roles else []),
        "-v",
        f"{opts.weights_dir}:{WEIGHTS_MOUNT}:ro",
    ]
    for path in opts.mounts:
        args += ["-v", f"{path}:{path}"]
    for key, value in opts.env.items():
        args += ["-e", f"{key}={value}"]
    return [*args, opts.image, *container_argv(argv)]


def container_argv(argv: list[str]) -> list[str]:
    """argv as the image runs it: the host's Python interpreter means the image's."""
    if argv and (argv[0] == sys.executable or Path(argv[0]).name in ("python", "python3")):
        return ["python", *argv[1:]]
    return list(argv)


# ---------------------------------------------------------------- the Mininet node
def docker_host_class():
    """The Mininet node class (imported lazily: Mininet is only needed where a topology is built)."""
    from mininet.node import Host

    class DockerHost(Host):
        """A Mininet host whose namespaces are a holder container's.

        runtime: the testbed's DockerRuntime; role: the host's role (limits, messages)
        """

        def __init__(self, name, runtime: "DockerRuntime" = None, role: str = "", **params):
            self.runtime, self.role = runtime, role
            self.holder_pid = runtime.start_holder(name)
            super().__init__(name, **params)

        def startShell(self, mnopts=None):
            # Node.startShell, with the shell joining the holder's network namespace instead of new ones (-n).
            self.inNamespace, self._attaching = False, True
            try:
                super().startShell(mnopts="-cd")
            finally:
                self.inNamespace, self._attaching = True, False

        def _popen(self, cmd, **params):
            if getattr(self, "_attaching", False):
                cmd = ["nsenter", f"--net=/proc/{self.holder_pid}/ns/net", "--", *cmd]
            return super()._popen(cmd, **params)

    return DockerHost


# ---------------------------------------------------------------- the runtime
class DockerRuntime:
    """The Docker side of one testbed (a topology.runtime.HostRuntime): holders, process containers, crash
    checks, teardown by label."""

    name = "docker"

    def __init__(self, options: DockerOptions):
        self.options = options
        self.run_id = f"{os.getpid()}-{int(time.time() * 1000)}"
        self._counts: dict[str, int] = {}
        self._roles: dict[str, str] = {}  # host -> role, of the hosts this runtime containerised
        self._host_class = None

    def start(self) -> None:
        """Engine up and the image present; DockerError saying what to do otherwise."""
        info = ensure_running()
        if self.options.gpu_roles and "nvidia" not in info.runtimes:
            raise DockerError(
                f"pools on cuda ({', '.join(self.options.gpu_roles)}) under Docker need the NVIDIA container "
                f"toolkit in the engine (its runtimes: {', '.join(info.runtimes) or 'none'}); install "
                "nvidia-container-toolkit and restart dockerd, or use runtime process"
            )
        if image_id(self.options.image) is None:
            raise DockerError(
                f"worker image {self.options.image!r} does not exist: run `make image` "
                "(python -m docker_rt.image build)"
            )
        if not self.options.weights_dir.is_dir():
            raise DockerError(
                f"weights directory {self.options.weights_dir} does not exist: generate the "
                "weights first (workers.model.get_or_create_weights) — it is mounted read-only"
            )

    def up(self, testbed) -> None:
        pass  # the containers are the hosts: nothing runs beside the roles

    def down(self) -> None:
        pass

    def metadata(self) -> dict:
        """How the containers were made, for the run's metadata.json."""
        return {
            "run_id": self.run_id,
            "image": self.options.image,
            "image_id": image_id(self.options.image) or "",
            "roles": list(self.options.roles),
            "limits": {r: vars(self.options.limits_for(r)) for r in self.options.roles},
        }

    def host_params(self, host: str, role: str) -> dict:
        """Extra `Mininet.addHost` parameters for this host of this role ({} = a plain host)."""
        if role not in self.options.roles:
            return {}
        if self._host_class is None:
            self._host_class = docker_host_class()
        self._roles[host] = role
        return {"cls": self._host_class, "runtime": self, "role": role}

    def start_holder(self, host: str) -> int:
        """Start a host's holder container; return its init's PID (whose namespaces Mininet joins)."""
        name = holder_name(self.run_id, host)
        docker(holder_run_args(self.options, self.run_id, host))
        with sdk(f"looking up the holder container of {host}"):
            pid = int(client().containers.get(name).attrs["State"]["Pid"])
        if pid <= 0:
            raise DockerError(f"holder container of {host} is not running: {self.last_lines(name)}")
        return pid

    def reap(self, host: str) -> None:
        """The docker client of a host's process was killed: the container may still run (a client's SIGKILL
        does not reach it): remove the host's process containers (its holder stays)."""
        removed = remove_labelled(f"{LABEL_RUN}={self.run_id}", f"{LABEL_HOST}={host}", f"{LABEL_KIND}=proc")
        if removed:
            log.warning("%s: removed container(s) its killed client left running: %s", host, ", ".join(removed))

    def exec_argv(self, host: str, argv: list[str]) -> list[str] | None:
        """The full argv that runs argv as a process container on host; None for a plain host."""
        role = self._roles.get(host)
        if role is None:
            return None
        index = self._counts[host] = self._counts.get(host, 0) + 1
        return [docker_bin(), *proc_run_args(self.options, self.run_id, host, role, index, argv)]

    def confine(self, argv: list[str], cpuset: str) -> list[str]:
        """Unchanged: a role's cores are its containers' --cpuset-cpus (RoleLimits.cpuset)."""
        return argv

    # ---- state and crashes
    def containers(self) -> list[ContainerState]:
        """Every container of this run, running or not."""
        return [
            ContainerState(
                c.name,
                c.labels.get(LABEL_HOST, ""),
                c.labels.get(LABEL_KIND, ""),
                c.attrs["State"]["Status"],
                int(c.attrs["State"]["ExitCode"]),
                bool(c.attrs["State"]["OOMKilled"]),
            )
            for c in labelled(f"{LABEL_RUN}={self.run_id}")
        ]

    def last_lines(self, name: str, lines: int = LOG_TAIL_LINES) -> str:
        """The last log lines of a container (stdout and stderr)."""
        return container_log(name, tail=lines).strip() or "(no output)"

    def crashes(self) -> list[str]:
        """A message per container that stopped on its own: role, host, exit code, OOM, last log lines."""
        messages = []
        for c in self.containers():
            failed = c.status in ("exited", "dead") and (c.exit_code != 0 or c.kind == "holder")
            if not failed:
                continue
            role = self._role_of(c.host)
            oom = (
                f", killed for exceeding its memory limit ({self.options.limits_for(role).memory_mb} MiB)"
                if c.oom_killed
                else ""
            )
            what = "the container holding its network namespace" if c.kind == "holder" else "container"
            messages.append(
                f"role {role} on host {c.host}: {what} {c.name} exited with code {c.exit_code}{oom}; "
                f"last log lines:\n{self.last_lines(c.name)}"
            )
        return messages

    def check(self) -> None:
        """Raise WorkerCrashed naming each crashed role and its last log lines."""
        messages = self.crashes()
        if messages:
            raise WorkerCrashed("\n".join(messages))

    def _role_of(self, host: str) -> str:
        return self._roles.get(host, host)

    # ---- teardown
    def collect_logs(self, directory: Path) -> list[Path]:
        """Write each container's log (stdout and stderr) to <directory>/<container>.log."""
        directory.mkdir(parents=True, exist_ok=True)
        written = []
        for c in self.containers():
            path = directory / f"{c.name}.log"
            path.write_text(container_log(c.name, timestamps=True))
            written.append(path)
        return written

    def stop(self) -> None:
        """Keep the logs, report crashes, then remove every container of this run (by label only)."""
        for message in self.crashes():
            log.error("%s", message)
        if self.options.log_dir:
            self.collect_logs(self.options.log_dir)
        remove_labelled(f"{LABEL_RUN}={self.run_id}")


def runtime_for(name: str, options: DockerOptions | None = None):
    """The topology.runtime.HostRuntime called name: process (plain processes) or docker (needs options)."""
    from topology.runtime import ProcessRuntime

    if name == "process":
        return ProcessRuntime()
    if name == "docker":
        if options is None:
            raise DockerError("the docker runtime needs DockerOptions (the worker image at least)")
        return DockerRuntime(options)
    raise DockerError(f"runtime {name!r} is unknown; allowed: process, docker")


def labelled(*labels: str) -> list:
    """Every container (running or not) carrying every one of labels (k=v), as the SDK's Container objects
    (inspected; one removed meanwhile is left out)."""
    with sdk(f"listing containers labelled {', '.join(labels)}"):
        return client().containers.list(all=True, filters={"label": list(labels)}, ignore_removed=True)


def container_log(name: str, tail: int | None = None, timestamps: bool = False) -> str:
    """A container's log, stdout and stderr interleaved as they came; "" when the container is gone."""
    try:
        raw = client().containers.get(name).logs(tail="all" if tail is None else tail, timestamps=timestamps)
    except docker_sdk_errors.NotFound:
        return ""
    except SDK_ERRORS as err:
        return f"(its log could not be read: {err})"
    return raw.decode(errors="replace")


def remove_labelled(*labels: str) -> list[str]:
    """Remove (forced, with anonymous volumes: `docker rm -f -v`) every container carrying every one of
    labels (k=v); return their names."""
    removed = []
    for c in labelled(*labels):
        with sdk(f"removing container {c.name}"):
            try:
                c.remove(force=True, v=True)
            except docker_sdk_errors.NotFound:
                pass  # gone on its own meanwhile
        removed.append(c.name)
    return removed


def clean_orphans() -> list[str]:
    """Remove containers of runs whose testbed process is gone (for `make clean`); return their names."""
    try:
        runs = {(c.labels[LABEL_RUN], c.labels.get(LABEL_OWNER, "")) for c in labelled(LABEL_RUN)}
    except DockerError:
        return []  # no engine: nothing of ours can be running
    removed = []
    for run_id, owner in sorted(runs):
        if owner.isdigit() and int(owner) != os.getpid() and Path(f"/proc/{owner}").exists():
            continue  # its testbed is alive and will tear it down
        removed += [f"container {n}" for n in remove_labelled(f"{LABEL_RUN}={run_id}")]
    return removed


def main(argv: list[str] | None = None) -> int:
    """`python -m docker_rt.host clean`: remove containers of dead runs (what `make clean` calls)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m docker_rt.host", description=main.__doc__)
    parser.add_argument("action", choices=["clean"])
    parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    for line in clean_orphans():
        print(f"removed {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
