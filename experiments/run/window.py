"""What the network does during one variant's window: the schedule on the variant's clock, and cross traffic.

Responsible for: opening a variant's window at the load generator's t0 (the
profile's base parameters restored, the profile's and the spec's schedules
played from t0 when `schedule_clock` is `variant`, the cross flows' iperf3
servers up and each client started `start_s` after t0), holding the window
open until the last scheduled event when the workload finished first,
closing it (schedule stopped, flows ended and reaped by their PIDs, base
restored), and the variant's records for metadata.json (experiments.rundir.metadata.VariantRecord): its link
changes and its cross flows.
Not responsible for: the roles and the load (experiments.run.runner), the link
(topology.net / topology.shaping), iperf3's command lines and JSON
(experiments.spec.crosstraffic).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from experiments.spec import crosstraffic as ct
from experiments.rundir.metadata import CrossTrafficEntry, LinkChange, VariantRecord
from topology.proc import reap, terminate, wait_listening
from topology.profiles import DIRECTIONS, Profile, ScheduleStep, schedule_end_s
from topology.shaping import AppliedChange, merge_schedules
from topology.emulator import health_between

log = logging.getLogger(__name__)
# A client whose test is due to end gets this long to exchange its results before it is stopped (s).
CLIENT_GRACE_S = 10.0
# A one-off iperf3 server gets this long to write its report and exit after its test (s).
SERVER_GRACE_S = 2.0
# The schedule's last change, due when the hold ends, gets this long to be made (s).
SCHEDULE_GRACE_S = 5.0


class CrossTrafficFailed(RuntimeError):
    """An iperf3 flow failed on its own (not stopped by us); the message names the flow and iperf3's error."""


@dataclass(frozen=True)
class Impairment:
    """What every variant's window plays.

    steps, labels: the schedule on the variant's clock and a cause per step (empty with schedule_clock: link)
    flows: the cross flows; restore: put the profile's base back when a window opens and closes
    """

    steps: tuple[ScheduleStep, ...] = ()
    labels: tuple[str, ...] = ()
    flows: tuple[ct.CrossFlow, ...] = ()
    restore: bool = False

    @property
    def end_s(self) -> float:
        """The window's last event: a schedule change or a flow's end (s after t0)."""
        return max(schedule_end_s(self.steps), ct.last_event_s(self.flows))


def impairment(spec, profile: Profile) -> Impairment:
    """The spec's impairment of each variant's window (the profile's schedule and the spec's, merged)."""
    from experiments.spec.experiment import spec_schedule

    if spec.schedule_clock != "variant":
        return Impairment(flows=spec.cross_traffic)
    steps, labels = merge_schedules((f"profile {profile.name}", profile.schedule), ("spec", spec_schedule(spec)))
    return Impairment(steps, labels, spec.cross_traffic, restore=True)


def link_profile(spec, profile: Profile) -> Profile:
    """The profile the topology is built with: with schedule_clock link, the spec's schedule joins the profile's."""
    from experiments.spec.experiment import spec_schedule

    if spec.schedule_clock == "variant" or not spec.schedule:
        return profile
    steps, _ = merge_schedules(("profile", profile.schedule), ("spec", spec_schedule(spec)))
    return dataclasses.replace(profile, schedule=steps)


def variant_link_changes(changes: list[AppliedChange], start_ns: int, end_ns: int) -> list[LinkChange]:
    """The link changes made in [start_ns, end_ns], as metadata.json's `variants.<v>.link_changes`
    (offset_s: seconds after start_ns, the variant's schedule start)."""
    return [
        LinkChange(
            t_ns=c.t_ns,
            offset_s=round((c.t_ns - start_ns) / 1e9, 6),
            direction=c.direction,
            params=c.params,
            cause=c.cause,
        )
        for c in changes
        if start_ns <= c.t_ns <= end_ns
    ]


def lines_health(before: dict[str, dict | None] | None, after: dict[str, dict | None]) -> dict | None:
    """The userspace emulator's health over a window, every line's forwarder (pure; topology.emulator.health_between
    per line): the worst line's figures (the highest p99 lateness, then the most frames dropped), `late` where any
    line was, and with several lines `line` (the worst's name) and `lines` (each line's). None: the tc backend."""
    before = before or {}
    per = {name: health_between(before.get(name), h) for name, h in after.items() if h is not None}
    if not per:
        return None

    def badness(h: dict) -> tuple[float, int]:
        late = max((h[d]["p99_us"] or 0) for d in DIRECTIONS)
        return late, sum(h[d]["rx_drops"] + h[d]["tx_errors"] for d in DIRECTIONS)

    name, worst = max(per.items(), key=lambda kv: badness(kv[1]))
    if len(per) == 1:
        return worst
    return {**worst, "late": any(h["late"] for h in per.values()), "line": name, "lines": per}


class VariantWindow:
    """One variant's window on a running testbed.

    testbed: the topology; imp: what to play; vdir: the variant's directory; run_dir: the run's
    """

    def __init__(self, testbed, imp: Impairment, vdir: Path, run_dir: Path):
        self.tb, self.imp, self.vdir, self.run_dir = testbed, imp, vdir, run_dir
        self.start_ns: int | None = None
        self.extended_s = 0.0
        self._schedule = None
        self._cross: CrossTraffic | None = None
        self._health0: dict | None = None

    def open(self, start_ns: int) -> None:
        """The window opens at start_ns (time.monotonic_ns(), the load generator's t0)."""
        self.start_ns = start_ns
        self._health0 = {name: link.backend.health() for name, link in self.tb.links.items()}
        if self.imp.restore:
            self.tb.restore_profile("restore profile base (window opens)")
        if self.imp.steps:
            self._schedule = self.tb.play_schedule(self.imp.steps, start_ns, self.imp.labels)
        if self.imp.flows:
            self._cross = CrossTraffic(self.tb, ct.expand(self.imp.flows), self.vdir / "cross", self.run_dir, start_ns)
            self._cross.start()

    def hold(self, variant: str) -> float:
        """Keep the window open until its last event when the workload finished first; the seconds added."""
        if self.start_ns is None or not self.imp.end_s:
            return 0.0
        now_ns = time.monotonic_ns()
        remaining_s = (self.start_ns + self.imp.end_s * 1e9 - now_ns) / 1e9
        if remaining_s > 0:
            log.info(
                "variant %s: workload done %.1f s into its window; holding the window open %.1f s more, "
                "until its last scheduled event at %.1f s",
                variant,
                (now_ns - self.start_ns) / 1e9,
                remaining_s,
                self.imp.end_s,
            )
            time.sleep(remaining_s)
            self.extended_s = round(remaining_s, 3)
        if self._schedule and not self._schedule.wait(SCHEDULE_GRACE_S):  # the last change is being made
            log.warning(
                "variant %s: the schedule's last change not made %.0f s after its time", variant, SCHEDULE_GRACE_S
            )
        return self.extended_s

    def close(self, rec: VariantRecord) -> VariantRecord:
        """Stop everything the window started, restore the base; the window's part of the variant's record
        (its times, link changes, cross flows, the emulator's health) filled into rec, which is returned."""
        rec.window_extended_s = self.extended_s
        if self.start_ns is None:
            return rec
        try:
            if self._schedule:
                self._schedule.stop()
            if self._cross:
                self._cross.stop()
                rec.cross_traffic = self._cross.entries
        finally:
            if self.imp.restore:
                self.tb.restore_profile("restore profile base (window closes)")
        end_ns = time.monotonic_ns()
        rec.window_start_ns, rec.window_end_ns = self.start_ns, end_ns
        rec.link_changes = variant_link_changes(self.tb.link.changes, self.start_ns, end_ns)
        health = {name: link.backend.health() for name, link in self.tb.links.items()}
        rec.emulator = lines_health(self._health0, health)
        return rec

    def check(self) -> None:
        """Raise CrossTrafficFailed if a cross flow failed on its own."""
        if self._cross and self._cross.errors:
            raise CrossTrafficFailed("; ".join(self._cross.errors))


class CrossTraffic:
    """The cross flows of one window: iperf3 servers up at start(), each client started at its start_s.

    testbed: the topology; runs: the directed runs; out_dir: where their JSON goes; run_dir: the run's
    directory (metadata paths are relative to it); start_ns: the window's t0
    """

    def __init__(self, testbed, runs: list[ct.FlowRun], out_dir: Path, run_dir: Path, start_ns: int):
        self.tb, self.runs, self.out_dir, self.run_dir, self.start_ns = testbed, runs, out_dir, run_dir, start_ns
        self.entries: list[CrossTrafficEntry] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._servers: list[subprocess.Popen] = []
        self._clients: dict[str, subprocess.Popen] = {}
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        """Every server listening (a real check), then one timer thread per run."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        for run in self.runs:
            with open(self.out_dir / f"{run.name}-{run.direction}.server.log", "ab") as out:
                server = self.tb.popen(run.receiver.name, ct.server_cmd(run), stdout=out, stderr=subprocess.STDOUT)
            self._servers.append(server)
            try:
                wait_listening(
                    lambda argv, h=run.receiver.name: self.tb.run(h, argv),
                    run.port,
                    f"iperf3 server {run.name}-{run.direction} on {run.receiver.name}",
                    alive=lambda s=server: s.poll() is None,
                )
            except RuntimeError as err:
                raise CrossTrafficFailed(str(err)) from err
        for run in self.runs:
            t = threading.Thread(
                target=self._play,
                args=(run, self._congestion(run)),
                daemon=True,
                name=f"cross-{run.name}-{run.direction}",
            )
            t.start()
            self._threads.append(t)

    def _congestion(self, run: ct.FlowRun) -> str | None:
        if run.flow.kind != "tcp":
            return None
        if run.flow.congestion:
            return run.flow.congestion
        return self.tb.run(run.sender.name, ["sysctl", "-n", "net.ipv4.tcp_congestion_control"]).strip()

    def _play(self, run: ct.FlowRun, congestion: str | None) -> None:
        due_s = (self.start_ns + run.flow.start_s * 1e9 - time.monotonic_ns()) / 1e9
        if self._stop.wait(max(0.0, due_s)):
            log.warning("cross flow %s-%s never started: the window closed first", run.name, run.direction)
            return
        path = self.out_dir / run.file_name
        with self._lock:
            if self._stop.is_set():
                return
            with open(self.out_dir / f"{run.name}-{run.direction}.log", "ab") as err:
                proc = self.tb.popen(run.sender.name, ct.client_cmd(run, path), stdout=subprocess.DEVNULL, stderr=err)
            self._clients[run.file_name] = proc
        started_ns = time.monotonic_ns()
        code = proc.wait()
        entry = ct.metadata_entry(run, started_ns, time.monotonic_ns(), str(path.relative_to(self.run_dir)), congestion)
        with self._lock:
            self.entries.append(entry)
            if code != 0 and not self._stop.is_set():
                self.errors.append(f"cross flow {run.name}-{run.direction}: iperf3 exited {code}: {_error(path)}")

    def stop(self) -> None:
        """End every client (those due to finish get CLIENT_GRACE_S first) and server, by PID; join the timers."""
        with self._lock:
            clients = dict(self._clients)
        now_ns = time.monotonic_ns()
        for run in self.runs:
            proc = clients.get(run.file_name)
            due_ns = self.start_ns + run.flow.end_s * 1e9
            if proc is not None and due_ns <= now_ns:
                try:
                    proc.wait(CLIENT_GRACE_S)
                except subprocess.TimeoutExpired:
                    log.warning(
                        "cross flow %s-%s still running %.0f s after its end", run.name, run.direction, CLIENT_GRACE_S
                    )
        with self._lock:
            self._stop.set()
            clients = dict(self._clients)
        for proc in clients.values():
            terminate(proc)
        for t in self._threads:
            t.join(10)
        for server in self._servers:  # a one-off server exits once its test is done; the others are ended
            reap(server, SERVER_GRACE_S)
        self.entries.sort(key=lambda e: (e.start_ns, e.name, e.direction))


def _error(path: Path) -> str:
    try:
        return json.loads(path.read_text()).get("error") or "no error in its JSON"
    except (OSError, json.JSONDecodeError) as exc:
        return f"no JSON ({exc})"
