"""The Docker engine on this machine: installed, running, answering; and the two ways to talk to it.

Responsible for: installing Debian packages the Docker runtime needs
(`docker.io`, `debootstrap`) when they are absent; starting `dockerd` when
the engine does not answer (its own pid file `/run/pddlab/dockerd.pid`, its
own log `.cache/docker/dockerd.log`, Docker's default data root) and waiting
until it answers; checking free disk space before a build; `client()`, the
docker SDK's client through which the testbed reads and removes what the engine
holds (images, containers, labels, states, logs), and `docker()`, through which
the few docker CLI calls go (logged, raising DockerError) where the SDK lacks
what the testbed needs: an attached `docker run` whose client process stands
for the container (docker_rt.host), a BuildKit build (docker_rt.image) and an
import streamed from tar (docker_rt.base).
Not responsible for: images (`docker_rt.base`, `docker_rt.image`) or
containers (`docker_rt.host`).

A dockerd this module did not start is used as it is and never stopped; one it
started keeps running after the run (it is the machine's engine) and is stopped
by `make clean` (when no run is live) or `python -m docker_rt.engine stop`, by
the PID in its own pid file.

dockerd sets the iptables FORWARD policy to DROP, turns on ip_forward, loads
br_netfilter and makes docker0; `topology.net` answers the first two with its
own scoped ACCEPT rules for the pdd- bridges (comment `pddlab`), removed at
teardown. Before starting a dockerd this module records those four
(`/run/pddlab/dockerd.host.json`); stopping that dockerd puts back what it
changed (br_netfilter with FORWARD DROP breaks every other bridge on the host).
Docker's own iptables chains (DOCKER*, its NAT rules) are Docker's to manage
and stay.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import docker as docker_sdk
import requests

from docker_rt import DockerError

log = logging.getLogger(__name__)
REPO_ROOT = Path(__file__).resolve().parent.parent
CACHE_DIR = REPO_ROOT / ".cache" / "docker"
STATE_DIR = Path("/run/pddlab")
PID_FILE = STATE_DIR / "dockerd.pid"
HOST_STATE_FILE = STATE_DIR / "dockerd.host.json"  # the host as it was before our dockerd started
IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")
LOG_FILE = CACHE_DIR / "dockerd.log"
START_TIMEOUT_S = 60.0
LOG_TAIL_LINES = 20
# What the SDK raises: its own errors (HTTP ones as APIError) and, when nothing listens on the socket,
# the requests library's.
SDK_ERRORS = (docker_sdk.errors.DockerException, requests.RequestException)
CLIENT_TIMEOUT_S = 120  # a container removal (docker rm -f) may take its stop grace and more
_client: docker_sdk.DockerClient | None = None


@dataclass(frozen=True)
class EngineInfo:
    """server_version: dockerd's version; root_dir: its data root; started_here: this process started it;
    runtimes: the container runtimes it knows (runc; nvidia where the NVIDIA container toolkit is set up)."""

    server_version: str
    root_dir: Path
    started_here: bool
    runtimes: tuple[str, ...] = ()


def docker_bin() -> str:
    """The docker client: Debian's /usr/bin/docker (same release as its dockerd) if present, else PATH."""
    if Path("/usr/bin/docker").exists():
        return "/usr/bin/docker"
    found = shutil.which("docker")
    if not found:
        raise DockerError("no docker client: run `make setup` (installs Debian's docker.io)")
    return found


def docker(
    args: list[str], timeout_s: float = 120, check: bool = True, quiet: bool = False, **kwargs
) -> subprocess.CompletedProcess:
    """Run `docker <args>` (logged; at debug level when quiet); DockerError with its stderr on failure if check."""
    argv = [docker_bin(), *args]
    log.log(logging.DEBUG if quiet else logging.INFO, "run: %s", " ".join(argv))
    kwargs.setdefault("capture_output", True)
    kwargs.setdefault("text", True)
    try:
        proc = subprocess.run(argv, timeout=timeout_s, **kwargs)
    except subprocess.TimeoutExpired:
        raise DockerError(f"`docker {' '.join(args[:3])} ...` did not finish within {timeout_s:.0f} s") from None
    if check and proc.returncode != 0:
        err = proc.stderr if isinstance(proc.stderr, str) else (proc.stderr or b"").decode(errors="replace")
        raise DockerError(f"`docker {' '.join(args)}` failed ({proc.returncode}): {err.strip()[-2000:]}")
    return proc


def client() -> docker_sdk.DockerClient:
    """The docker SDK's client of the engine the CLI talks to (DOCKER_HOST honoured, else the local socket),
    made once per process, each call answering within CLIENT_TIMEOUT_S; DockerError when no engine answers."""
    global _client
    if _client is None:
        try:
            _client = docker_sdk.from_env(timeout=CLIENT_TIMEOUT_S)
        except SDK_ERRORS as err:
            raise DockerError(f"no Docker engine answers ({err}); `make setup` starts one") from None
    return _client


def engine_words(err: Exception) -> str:
    """What the engine said of a failed SDK call (its explanation), else the error itself."""
    return getattr(err, "explanation", None) or str(err)


@contextmanager
def sdk(what: str):
    """Around SDK calls: an SDK error becomes a DockerError saying what failed and the engine's words."""
    try:
        yield
    except SDK_ERRORS as err:
        raise DockerError(f"{what} failed: {engine_words(err)}") from None


def image_id(ref: str) -> str | None:
    """The local image id of ref, or None when no such image is here."""
    with sdk(f"looking up image {ref}"):
        try:
            return client().images.get(ref).id
        except docker_sdk.errors.ImageNotFound:
            return None


# ---------------------------------------------------------------- packages
def missing_debs(packages: list[str]) -> list[str]:
    """The Debian packages of the list that are not installed."""
    missing = []
    for pkg in packages:
        out = subprocess.run(["dpkg-query", "-W", "-f=${Status}", pkg], capture_output=True, text=True)
        if "install ok installed" not in out.stdout:
            missing.append(pkg)
    return missing


def ensure_debs(packages: list[str]) -> None:
    """Install the missing ones with apt-get; DockerError saying what to do when that is impossible."""
    missing = missing_debs(packages)
    if not missing:
        return
    if os.geteuid() != 0:
        raise DockerError(
            f"Debian packages {missing} are missing and installing them needs root: run `make setup` as root"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing],
    ):
        log.info("run: %s", " ".join(argv))
        proc = subprocess.run(argv, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-LOG_TAIL_LINES:])
            raise DockerError(
                f"could not install {missing} (`{' '.join(argv)}` failed):\n{tail}\n"
                "Fix apt (sources, network to the Debian mirror) or install Docker yourself "
                "(Debian's docker.io or Docker CE), then rerun `make setup`."
            )


def ensure_installed() -> None:
    """dockerd and a docker client are present (Debian's docker.io otherwise)."""
    if shutil.which("dockerd") and (Path("/usr/bin/docker").exists() or shutil.which("docker")):
        return
    ensure_debs(["docker.io"])
    if not shutil.which("dockerd"):
        raise DockerError("docker.io is installed but `dockerd` is not on PATH: check the installation")


# ---------------------------------------------------------------- daemon
def engine_info() -> EngineInfo | None:
    """What the engine says of itself (`docker info`), or None when no daemon answers (polled while dockerd
    starts)."""
    try:
        info = client().info()
    except (DockerError, *SDK_ERRORS):
        return None
    return EngineInfo(
        info["ServerVersion"],
        Path(info["DockerRootDir"]),
        started_here=_our_dockerd_pid() is not None,
        runtimes=tuple(sorted(info.get("Runtimes") or {})),
    )


def _our_dockerd_pid() -> int | None:
    """The dockerd we started, if its pid file names a live dockerd."""
    try:
        pid = int(PID_FILE.read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    except (OSError, ValueError):
        return None
    return pid if cmdline.endswith(b"dockerd") else None


def _log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def start_dockerd(timeout_s: float = START_TIMEOUT_S) -> int:
    """Start dockerd in its own session, logging to LOG_FILE; return its PID once the engine answers."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    LOG_FILE.parent.mkdir(parents=True, exist_ok=True)
    HOST_STATE_FILE.write_text(json.dumps(host_state()))
    argv = [shutil.which("dockerd") or "dockerd", "--pidfile", str(PID_FILE)]
    log.info("run: %s (log %s)", " ".join(argv), LOG_FILE)
    with open(LOG_FILE, "ab") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )  # the engine outlives this run
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise DockerError(
                f"dockerd exited with code {proc.returncode} while starting; "
                f"last lines of {LOG_FILE}:\n{_log_tail(LOG_FILE)}"
            )
        if engine_info() is not None:
            # Whoever stops it later (`make clean`, another process), this process reaps it: no zombie.
            threading.Thread(target=proc.wait, name="reap-dockerd", daemon=True).start()
            return proc.pid
        time.sleep(0.5)  # polling a real check (`docker info`), not waiting blind
    raise DockerError(
        f"dockerd (pid {proc.pid}) did not answer within {timeout_s:.0f} s; "
        f"last lines of {LOG_FILE}:\n{_log_tail(LOG_FILE)}"
    )


def ensure_running() -> EngineInfo:
    """Install if needed, start dockerd if nothing answers, and return what the engine says of itself."""
    ensure_installed()
    info = engine_info()
    if info is not None:
        return info
    if os.geteuid() != 0:
        raise DockerError("no Docker daemon answers and starting one needs root: run as root, or start Docker yourself")
    start_dockerd()
    info = engine_info()
    if info is None:
        raise DockerError(f"dockerd started but does not answer; see {LOG_FILE}")
    log.info("docker engine %s ready (data root %s)", info.server_version, info.root_dir)
    return info


def stop_dockerd(grace_s: float = 20) -> list[str] | None:
    """Stop the dockerd this module started (by the PID in its pid file) and put back what it changed on
    the host (restore_host); a line per thing done, None if no such dockerd runs."""
    pid = _our_dockerd_pid()
    if pid is None:
        return None
    log.info("stopping dockerd (pid %d)", pid)
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        time.sleep(0.2)
    return [f"dockerd (pid {pid}) stopped", *restore_host()]


# ---------------------------------------------------------------- what dockerd changes on the host
def host_state() -> dict:
    """What dockerd changes that can be put back: FORWARD's policy, ip_forward, br_netfilter, docker0."""
    policy = subprocess.run(["iptables", "-S", "FORWARD"], capture_output=True, text=True).stdout.splitlines()
    return {
        "forward_policy": policy[0].split()[-1] if policy and policy[0].startswith("-P FORWARD") else None,
        "ip_forward": IP_FORWARD.read_text().strip() if IP_FORWARD.exists() else None,
        "br_netfilter": Path("/sys/module/br_netfilter").exists(),
        "docker0": Path("/sys/class/net/docker0").exists(),
    }


def restore_actions(before: dict, now: dict) -> list[tuple[str, list[str] | None]]:
    """What to do to put the host back as `before` recorded it (pure): (description, argv or None for
    the ip_forward write)."""
    actions: list[tuple[str, list[str] | None]] = []
    if before.get("forward_policy") and before["forward_policy"] != now.get("forward_policy"):
        actions.append(
            (
                f"iptables FORWARD policy {before['forward_policy']}",
                ["iptables", "-P", "FORWARD", before["forward_policy"]],
            )
        )
    if before.get("ip_forward") is not None and before["ip_forward"] != now.get("ip_forward"):
        actions.append((f"net.ipv4.ip_forward={before['ip_forward']}", None))
    if before.get("docker0") is False and now.get("docker0"):
        actions.append(("link docker0 removed", ["ip", "link", "del", "docker0"]))
    if before.get("br_netfilter") is False and now.get("br_netfilter"):
        actions.append(("br_netfilter unloaded", ["modprobe", "-r", "br_netfilter"]))
    return actions


def restore_host() -> list[str]:
    """Put back what our dockerd changed (from HOST_STATE_FILE, then forgotten); a line per change made
    (or that failed, with why)."""
    try:
        before = json.loads(HOST_STATE_FILE.read_text())
    except (OSError, ValueError):
        return []
    done = []
    for what, argv in restore_actions(before, host_state()):
        if argv is None:
            IP_FORWARD.write_text(before["ip_forward"] + "\n")
            done.append(what)
            continue
        res = subprocess.run(argv, capture_output=True, text=True)
        done.append(what if res.returncode == 0 else f"{what}: failed ({res.stderr.strip()})")
    HOST_STATE_FILE.unlink(missing_ok=True)
    return done


# ---------------------------------------------------------------- disk
def check_free_space(path: Path, need_bytes: int, what: str) -> None:
    """DockerError naming the shortfall when path's filesystem has less than need_bytes free."""
    probe = path
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < need_bytes:
        raise DockerError(
            f"not enough disk for {what}: {free / 2**30:.1f} GiB free on the filesystem of "
            f"{path}, {need_bytes / 2**30:.1f} GiB needed. Free some space (e.g. "
            "`docker image prune`, or remove .cache/docker) and retry."
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m docker_rt.engine", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["ensure", "stop", "info"])
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.action == "ensure":
            info = ensure_running()
            print(f"docker engine {info.server_version} ready (data root {info.root_dir})")
        elif args.action == "stop":
            lines = stop_dockerd()
            print("no dockerd started by pddlab is running" if lines is None else "\n".join(lines))
        else:
            print(engine_info() or "no Docker daemon answers")
    except DockerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
