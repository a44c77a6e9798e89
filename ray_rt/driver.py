"""The Ray driver of one deployment: a small process that places the roles, then takes commands on stdin.

Responsible for: `python -m ray_rt.driver --address HEAD --config deployment.yaml --needs needs.json ...`:
connect to the cluster, wait until the nodes it expects are alive, place and start the roles (`RayRoles`),
then answer one line per command until `stop` or the end of stdin — so the experiment runner, which cannot
itself join a Ray cluster inside the topology's namespaces, drives the roles through a pipe:

    poll          -> {"ok": true, "exit": {worker: code | null}, "crashes": [message, ...]}
    kill <worker> -> {"ok": true, "pid": pid | null}
    stop          -> {"ok": true, "exit": {worker: code | null}}  (then the driver exits 0)

Every reply, and the first line (`{"ok": true, "started": {worker: pid}, "plan": ..., "place_s": s}` or
`{"ok": false, "error": "..."}`), is one JSON object on stdout after PREFIX; anything else on stdout is not
ours (Ray's) and is skipped by the reader (`read_reply`). Its own log goes to stderr.
Not responsible for: the Ray nodes (ray_rt.netns, or a cluster someone runs), readiness of the roles (the
runner's gRPC health checks), what the roles do.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import yaml

from ray_rt import RayRuntimeError
from ray_rt.placement import PoolNeeds, alive_nodes

log = logging.getLogger(__name__)
PREFIX = "pddlab-ray "
NODES_TIMEOUT_S = 60.0


def reply(data: dict) -> None:
    """One answer on stdout."""
    sys.stdout.write(PREFIX + json.dumps(data) + "\n")
    sys.stdout.flush()


def read_reply(lines) -> dict:
    """The next answer from a driver's stdout (an iterator of text lines); RayRuntimeError at its end."""
    for line in lines:
        if line.startswith(PREFIX):
            return json.loads(line[len(PREFIX) :])
    raise RayRuntimeError("the Ray driver exited without answering")


def needs_to_json(needs: list[PoolNeeds]) -> str:
    return json.dumps([{**n.__dict__, "labels": dict(n.labels)} for n in needs])


def needs_from_json(text: str) -> list[PoolNeeds]:
    return [PoolNeeds(**entry) for entry in json.loads(text)]


def wait_nodes(count: int, timeout_s: float = NODES_TIMEOUT_S) -> None:
    """Until the cluster has count alive nodes (a node that just started registers with the GCS a little later)."""
    import ray

    deadline = time.monotonic() + timeout_s
    while len(alive := alive_nodes(ray.nodes())) < count:
        if time.monotonic() > deadline:
            raise RayRuntimeError(f"{len(alive)} of the {count} Ray nodes registered within {timeout_s:.0f} s")
        time.sleep(0.2)


def serve(roles, commands) -> int:
    """Answer commands (an iterator of lines) until stop or their end; the driver's exit status."""
    for line in commands:
        verb, _, arg = line.strip().partition(" ")
        if verb == "poll":
            reply({"ok": True, "exit": roles.exit_codes(), "crashes": roles.crashes()})
        elif verb == "kill":
            reply({"ok": True, "pid": roles.kill(arg) if arg in roles.placed else None})
        elif verb == "stop":
            break
        elif verb:
            reply({"ok": False, "error": f"unknown command {verb!r}; known: poll, kill WORKER, stop"})
    reply({"ok": True, "exit": roles.stop()})
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--address", required=True, help="the head's GCS address HOST:PORT (or ray://HOST:PORT)")
    ap.add_argument("--config", type=Path, required=True, help="the roles' deployment YAML")
    ap.add_argument("--needs", required=True, help="JSON list of each role's PoolNeeds")
    ap.add_argument("--work-dir", required=True, help="the run's directory on every node")
    ap.add_argument("--log-dir", type=Path, required=True)
    ap.add_argument("--events-dir", type=Path, required=True)
    ap.add_argument("--nodes", type=int, default=0, help="wait until this many nodes are alive")
    ap.add_argument("--topology-hosts", action="store_true", help="each worker on the node in its own host")
    ap.add_argument("--cpusets", default="{}", help="JSON role -> cores")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import ray

    from ray_rt.roles import RayRoles

    try:
        t0 = time.monotonic()
        ray.init(address=args.address, log_to_driver=False)
        wait_nodes(args.nodes)
        config = yaml.safe_load(args.config.read_text())
        roles = RayRoles(
            config,
            needs_from_json(args.needs),
            args.log_dir,
            args.events_dir,
            args.work_dir,
            env={"OMP_NUM_THREADS": "1"},
            topology_hosts=args.topology_hosts,
            cpusets=json.loads(args.cpusets),
        )
        plan = roles.place()
        started = {}
        try:
            roles.start()
            started = {w: p.pid for w, p in roles.placed.items()}
        except BaseException:
            roles.stop()
            raise
    except (RayRuntimeError, ray.exceptions.RayError, OSError, ValueError) as err:
        log.error("%s", err)
        reply({"ok": False, "error": str(err)})
        return 3
    reply({"ok": True, "started": started, "plan": plan, "place_s": round(time.monotonic() - t0, 2)})
    return serve(roles, sys.stdin)


if __name__ == "__main__":
    sys.exit(main())
