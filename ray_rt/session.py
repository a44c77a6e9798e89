"""The roles of one variant under Ray, as the experiment runner holds them: a driver process and its pipe.

Responsible for: `RayDeployment`, the Ray runtime's counterpart of `experiments.run.deploy.Runtime` (same
methods: `workers`, `start`, `dead`, `kill`, `stop`). `start` runs the driver (`python -m ray_rt.driver`) in
the head's host through `Testbed.popen` — a Ray driver must run on a node of its cluster, and the runner's
own namespace has no route into the topology — and waits for its first answer: every worker placed and its
role process started, or one error (a pool that cannot be placed: nothing runs). Then each call is one
command on the driver's stdin and one answer on its stdout (ray_rt.driver). Crashes are logged as the
driver reports them: role, worker, node, exit code, last log lines.
Not responsible for: the Ray nodes (ray_rt.netns.RayHostRuntime, the testbed's runtime), the roles' config
(experiments.spec.deployment), readiness (the runner's gRPC health checks).
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
from pathlib import Path
from typing import Sequence

from ray_rt import RayRuntimeError
from ray_rt.driver import needs_to_json, read_reply
from ray_rt.netns import HEAD_HOST
from ray_rt.placement import PoolNeeds

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parent.parent
STOP_WAIT_S = 60.0


class RayDeployment:
    """One variant's roles, placed and supervised by Ray on the nodes of the testbed's hosts.

    testbed: the running topology, its runtime a ray_rt.netns.RayHostRuntime
    config: the deployment YAML; log_dir: <worker>.log per worker (and ray-driver.log)
    workers: every worker's name, in start order; needs: each role's PoolNeeds (ray_rt.placement)
    cpusets: role -> the cores its workers run on ("" or absent = any)
    """

    def __init__(
        self,
        testbed,
        config: Path,
        log_dir: Path,
        workers: Sequence[str],
        needs: Sequence[PoolNeeds],
        cpusets: dict[str, str] | None = None,
    ):
        self.testbed, self.config, self.log_dir = testbed, config, log_dir
        self.workers = list(workers)
        self.needs, self.cpusets = list(needs), cpusets or {}
        self.proc: subprocess.Popen | None = None
        self.pids: dict[str, int] = {}
        self.exit_codes: dict[str, int | None] = {}
        self._lock = threading.Lock()  # one command at a time (the fault player kills from its thread)
        self._reported: set[str] = set()

    def address(self, worker: str) -> str:
        """host:port of a worker's gRPC, as the deployment config says (its topology host's address)."""
        import yaml

        cfg = yaml.safe_load(self.config.read_text())
        for role in ("router", "p", "rld", "md"):
            for w in [cfg[role]] if isinstance(cfg[role], dict) else cfg[role]:
                if w["name"] == worker:
                    return f"{w['host']}:{w['grpc_port']}"
        raise KeyError(f"no worker {worker!r} in {self.config}")

    def _argv(self) -> list[str]:
        nodes = self.testbed.runtime
        vdir = self.config.parent
        return [
            sys.executable,
            "-m",
            "ray_rt.driver",
            "--address",
            nodes.address,
            "--config",
            str(self.config),
            "--needs",
            needs_to_json(self.needs),
            "--work-dir",
            str(vdir),
            "--log-dir",
            str(self.log_dir),
            "--events-dir",
            str(vdir / "events"),
            "--nodes",
            str(len(nodes.nodes)),
            "--topology-hosts",
            "--cpusets",
            json.dumps(self.cpusets),
        ]

    def start(self) -> None:
        """Start the driver and wait until every role process runs; RayRuntimeError (nothing left) otherwise."""
        import os

        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.testbed.runtime.env(), "PYTHONPATH": str(REPO)}
        with open(self.log_dir / "ray-driver.log", "ab") as err:
            self.proc = self.testbed.popen(
                HEAD_HOST,
                self._argv(),
                cwd=REPO,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                bufsize=1,
            )
        first = self._answer()
        if not first.get("ok"):
            self._end_driver()
            raise RayRuntimeError(f"the roles could not be placed under Ray: {first.get('error')}")
        self.pids = first["started"]
        log.info("Ray placed and started %d workers in %.1f s", len(self.pids), first["place_s"])

    def _answer(self) -> dict:
        try:
            return read_reply(self.proc.stdout)
        except RayRuntimeError:
            code = self.proc.wait()
            raise RayRuntimeError(
                f"the Ray driver exited ({code}) without answering; see {self.log_dir / 'ray-driver.log'}"
            ) from None

    def _command(self, line: str) -> dict:
        with self._lock:
            if self.proc is None or self.proc.poll() is not None:
                raise RayRuntimeError("the Ray driver is not running")
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
            return self._answer()

    def dead(self) -> dict[str, int]:
        """Workers whose role process exited: worker -> exit status (every worker when the driver is gone)."""
        try:
            answer = self._command("poll")
        except (RayRuntimeError, OSError):
            code = self.proc.poll() if self.proc else None
            return {w: -1 if code is None else code for w in self.workers}
        for message in answer["crashes"]:
            worker = message.split(" worker ", 1)[-1].split(" ", 1)[0]
            if worker not in self._reported:
                self._reported.add(worker)
                log.error("%s", message)
        return {w: c for w, c in answer["exit"].items() if c is not None}

    def kill(self, target: str) -> int | None:
        """SIGKILL one worker's role process (a worker's name, or a role for its first worker); its PID."""
        name = next((w for w in self.workers if w == target or w.rstrip("0123456789") == target), target)
        return self._command(f"kill {name}").get("pid")

    def stop(self) -> dict[str, int]:
        """Every role stopped (SIGTERM, then SIGKILL), actors and placement group removed; worker -> exit."""
        if self.proc is None:
            return {}
        try:
            answer = self._command("stop")
            self.exit_codes = answer.get("exit", {})
        except (RayRuntimeError, OSError) as err:
            log.error("stopping the roles under Ray: %s", err)
        self._end_driver()
        return {w: (-1 if c is None else c) for w, c in self.exit_codes.items()}

    def _end_driver(self) -> None:
        from topology.proc import terminate

        if self.proc is None:
            return
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            log.warning("the Ray driver did not exit in %.0f s: SIGTERM", STOP_WAIT_S)
            terminate(self.proc)
        self.proc = None


class ClusterDeployment:
    """One variant's roles on an existing Ray cluster, this process its driver (ray_rt.cluster.connect done).

    config: the deployment YAML (its addresses are replaced by where Ray placed each worker); log_dir: where
    each worker's log comes back at stop (events: beside it in events/); workers, needs, cpusets: as
    RayDeployment's; work_dir: the run's directory on every node
    """

    def __init__(
        self,
        config: Path,
        log_dir: Path,
        workers: Sequence[str],
        needs: Sequence[PoolNeeds],
        work_dir: str,
        cpusets: dict[str, str] | None = None,
    ):
        import yaml

        from ray_rt.roles import RayRoles

        self.config, self.log_dir, self.workers = config, log_dir, list(workers)
        data = yaml.safe_load(config.read_text())
        self.roles = RayRoles(data, list(needs), log_dir, config.parent / "events", work_dir, cpusets=cpusets)
        self.final: dict = {}

    def start(self) -> None:
        """Place every worker (PlacementError: nothing runs), start the roles, write the addresses Ray gave
        them into the deployment YAML (what a reader of the run directory then finds)."""
        import yaml

        self.roles.place()
        try:
            self.final = self.roles.start()
        except BaseException:
            self.roles.stop()
            raise
        self.config.write_text(yaml.safe_dump(self.final, sort_keys=False))

    def address(self, worker: str) -> str:
        for role in ("router", "p", "rld", "md"):
            section = self.final[role]
            for w in [section] if isinstance(section, dict) else section:
                if w["name"] == worker:
                    return f"{w['host']}:{w['grpc_port']}"
        raise KeyError(worker)

    def dead(self) -> dict[str, int]:
        for message in self.roles.crashes():
            log.error("%s", message)
        return {w: c for w, c in self.roles.exit_codes().items() if c is not None}

    def kill(self, target: str) -> int | None:
        name = next((w for w in self.workers if w == target or w.rstrip("0123456789") == target), target)
        return self.roles.kill(name) if name in self.roles.placed else None

    def stop(self) -> dict[str, int]:
        codes = self.roles.stop()
        return {w: (-1 if c is None else c) for w, c in codes.items()}
