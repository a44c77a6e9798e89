"""Docker runtime costs: image build cold and warm, image size, `docker run` to a healthy gRPC service per role.

    python benchmarks/bench_docker.py [--skip-build] [--runtimes docker,process]

Build: "cold" is `docker build --no-cache` with the base image and the
wheelhouse already on the machine (a fresh machine adds the debootstrap of the
base, logged in .cache/docker/debootstrap.log, and the wheel download);
"warm" is the next `make image` with unchanged inputs (the inputs hash
matches: no docker build at all). Ready: every role started on its host of
the topology (wan-regional) at once; the time from starting it (`docker run`,
or the plain process for comparison) until its gRPC health service answers
SERVING, polled from the client host. Needs root.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # docker_rt is not an installed package yet

from docker_rt.engine import docker  # noqa: E402
from docker_rt.host import DockerOptions, runtime_for  # noqa: E402
from docker_rt.image import ensure_image  # noqa: E402
from experiments.run import deploy  # noqa: E402
from topology.net import Testbed, TopologyConfig  # noqa: E402
from topology.profiles import load_profile  # noqa: E402
from workers.model import get_config, get_or_create_weights  # noqa: E402

# Polls every role's health service concurrently; prints CLOCK_MONOTONIC (shared by every namespace) of SERVING.
POLL_CODE = """
import json, sys, threading, time
from workers.roles.client import wait_healthy
ready = {}
def poll(addr):
    wait_healthy(addr, timeout_s=300)
    ready[addr] = time.monotonic()
threads = [threading.Thread(target=poll, args=(a,)) for a in sys.argv[1].split(",")]
[t.start() for t in threads]
[t.join() for t in threads]
print(json.dumps(ready))
"""


def bench_build() -> list[str]:
    """Cold (--no-cache) and warm (unchanged inputs) builds, and the image size."""
    ensure_image()  # base and wheelhouse present, so "cold" measures the docker build itself
    start = time.monotonic()
    cold = ensure_image(no_cache=True)
    cold_s = time.monotonic() - start
    start = time.monotonic()
    warm = ensure_image()
    warm_s = time.monotonic() - start
    start = time.monotonic()
    docker(["run", "--rm", "--network", "none", warm.ref, "true"])
    run_s = time.monotonic() - start
    return [
        f"| image build, cold (docker build --no-cache) | {cold_s:.1f} s |",
        f"| image build, warm (inputs unchanged) | {warm_s:.1f} s |",
        f"| image size ({warm.ref}) | {cold.size_bytes / 1e6:.0f} MB |",
        f"| `docker run --rm image true` | {run_s:.2f} s |",
    ]


def bench_ready(runtime: str, image: str) -> list[str]:
    """Start every role at once; seconds from its start to SERVING, per role."""
    run_dir = Path(tempfile.mkdtemp(prefix="pddlab-bench-docker-"))
    cfg = deploy.roles_config(str(run_dir / "events"))
    cfg_path = run_dir / "deployment.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    topo = TopologyConfig(
        wan_profile=load_profile("wan-regional"),
        runtime=runtime_for(runtime, DockerOptions(image=image, mounts=(run_dir,))),
    )
    with Testbed(topo) as tb:
        started = {}
        for role, host in ((role, names[0]) for role, names in deploy.worker_names().items()):
            started[role] = time.monotonic()
            tb.popen(
                host,
                [sys.executable, "-m", deploy.ROLE_MODULES[role], "--config", str(cfg_path), "--worker", host],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        addrs = {role: deploy.grpc_address(role) for role in started}
        out = subprocess.run(
            tb.ns_prefix("client") + [sys.executable, "-c", POLL_CODE, ",".join(addrs.values())],
            capture_output=True,
            text=True,
            timeout=400,
            check=True,
        ).stdout
        ready = json.loads(out)
    return [
        f"| start to gRPC SERVING, {role} ({runtime}) | {ready[addrs[role]] - started[role]:.2f} s |" for role in addrs
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-build", action="store_true", help="only the readiness measurement")
    ap.add_argument("--runtimes", default="docker,process")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    get_or_create_weights(get_config("tiny"), 0)
    print("| docker runtime | value |\n|---|---|", flush=True)
    if not args.skip_build:
        print("\n".join(bench_build()), flush=True)
    image = ensure_image().ref
    for runtime in args.runtimes.split(","):
        print("\n".join(bench_ready(runtime, image)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
