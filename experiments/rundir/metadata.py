"""metadata.json, typed: how a run was made and what happened in it — its one layout, writer and reader.

Responsible for: `RunMetadata` and its sections, one layout for serving runs (experiments.run.runner, a
sweep's points), serve sessions (experiments.serve.session) and the link calibration (experiments.run.calibration);
`write` (atomic: the runner rewrites the file after every step, so an interrupted run leaves an honest
record) and `read` (validated: a missing section or field, or a wrong type, is an error naming the file
and the field — never a silent default).
Not responsible for: what the writers put in (topology.net.Testbed.metadata, experiments.run.window,
experiments.spec.faults), or what the analysis makes of it (experiments.analysis.runmeta, experiments.analysis.analyze).

Layout (times: `wall_*` in Unix s, the pcap's clock; `*_ns` in time.monotonic_ns(), the roles' log clock):

    experiment, complete, provenance      every run (complete: false until its last step)
    spec, seeds, runtime, workload        a serving run (a serve session: spec, seeds and runtime)
    line_scaling                          a run whose compute.kv_scale s > 1: s, the published and applied rates
    serve                                 true for a serve session
    calibration, all_checks_ok            the link calibration (its CalibrationConfig, the verdict)
    topology                              once the topology is up (Testbed.metadata())
    shared_topology                       a sweep's point run on a topology shared with other points
    variants.<v>                          each variant's VariantRecord (a serve session: its one mode)
    interrupted, error, finished_at       how the run ended
    speed_at_end                          a run that ended: the machine's reference speed after its last step
                                          (provenance.machine.speed: before its first; workers.speed)

Older run directories: a section added later reads as None or empty (`runtime_metadata`, a fault's
record); a calibration's provenance, once written at the top level, is read into `provenance`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, PrivateAttr, model_serializer, model_validator

from experiments.rundir import files as rundir

FILE = "metadata.json"
Direction = Literal["a_to_b", "b_to_a"]
# A variant's course: running -> ok | failed_requests | timeout | failed | interrupted (a run's variant);
# starting -> serving -> stopped (a serve session's mode).
Status = Literal[
    "running", "ok", "failed_requests", "timeout", "failed", "interrupted", "starting", "serving", "stopped"
]


class MetadataError(rundir.RecordError):
    """metadata.json is missing, not JSON, or lacks what its reader needs; the message names file and field."""


class Record(BaseModel):
    """A section of metadata.json: assignments are validated, so a writer's wrong type fails where it is made;
    keys a newer reader no longer knows are ignored on read."""

    model_config = ConfigDict(validate_assignment=True, extra="ignore")


class Whole(Record):
    """A section written whole by its owner (the spec, a profile): typed where it is read, every key kept."""

    model_config = ConfigDict(extra="allow")


# ---- how the run was made ------------------------------------------------------
class GitState(Record):
    commit: str | None  # None outside a git checkout
    dirty: bool | None


class SpeedRecord(Record):
    """rundir.machine_speed(): workers.speed's fixed forward passes timed (medians of `rounds`), and the load."""

    work: str  # what was timed: the model, its threads, the passes
    rounds: int
    prefill_wall_ms: float
    prefill_cpu_ms: float  # this thread's CPU time: longer than another run's = a slower core
    decode_wall_ms: float  # memory-bound: every weight streamed once
    decode_cpu_ms: float
    load_average: list[float]  # 1, 5 and 15 minute load averages when it was measured

    def ratio(self, later: SpeedRecord) -> float:
        """later's reference prefill over this one's (CPU time): > 1, the machine was slower then."""
        return later.prefill_cpu_ms / self.prefill_cpu_ms

    def differs(self, later: SpeedRecord) -> bool:
        """The two are further apart than SPEED_TOLERANCE: the machine itself changed between them."""
        return abs(self.ratio(later) - 1) > SPEED_TOLERANCE


SPEED_TOLERANCE = 0.10  # reference passes further apart than this: the machine, not only what was run, differed


class MachineRecord(Record):
    """rundir.machine(): the CPU the run measured on, and how busy the machine was when it started."""

    cpu_model: str | None
    cores: int | None
    load_average: list[float]  # 1, 5 and 15 minute load averages at the run's start
    speed: SpeedRecord | None = None  # at the start; None: not measured (older runs, sweeps' state, calibrations)


class Provenance(Record):
    """rundir.provenance(): where and from what the run was made."""

    git: GitState
    kernel: str
    python: str
    hostname: str
    argv: list[str]
    tools: dict[str, str | None]  # tool -> its version line (None: not installed)
    # Python package -> version (None: not installed); absent in runs made before it was recorded
    packages: dict[str, str | None] | None = None
    machine: MachineRecord | None = None  # absent in runs made before it was recorded
    started_at: str  # ISO 8601, local time with offset


class Seeds(Record):
    workload: int | None = None  # the synthetic workload's (a serve session and the calibration have none)
    weights: int | None = None  # every worker's seeded weights (the calibration runs no worker)
    topology: int  # the userspace emulator's random seed


class SpecRecord(Whole):
    """The resolved spec (experiments.spec.experiment.to_dict), every key kept; typed: what the analysis reads."""

    variants: list[str]
    model: str
    weights_seed: int
    profile: str
    slo: dict[str, Any]  # experiments.spec.experiment.SLO's fields
    variant_defs: dict[str, Any] = {}  # name -> {mode, deployment, pools} (experiments.spec.experiment)


# ---- the topology ---------------------------------------------------------------
class LinkRecord(Whole):
    """One direction's LinkParams (topology.profiles), every field kept."""

    rate_mbit: float  # 0 = unlimited


class ProfileRecord(Whole):
    """A resolved Profile.to_dict() (topology.profiles)."""

    name: str
    a_to_b: LinkRecord
    b_to_a: LinkRecord


class HostRecord(Record):
    name: str
    cluster: str  # a | b
    ip: str
    role: str


class AppliedChange(Record):
    """One change of the live link over the whole run (topology.shaping.AppliedChange)."""

    t_s: float  # s after the link came up
    direction: Direction
    params: dict[str, Any]  # the direction's full LinkParams after the change
    cause: str
    t_ns: int | None = None  # older runs: not recorded


class TopologyRecord(Record):
    """Testbed.metadata(): how the topology was made, and every link change of the run."""

    backend: str | None  # the shaping backend that ran (None: it never came up)
    backend_requested: str
    backend_reason: str | None
    lan_shaping: str | None
    wan_profile: ProfileRecord
    lan_profile: ProfileRecord
    hosts: list[HostRecord]
    seed: int
    snaplen_bytes: int
    runtime: str = "process"  # older runs: the only runtime there was
    runtime_metadata: dict[str, Any] | None = None  # the host runtime's record (docker: images, containers)
    link_changes: list[AppliedChange]
    # the userspace shaper's receive steering: its core, the RPS mask, interfaces steered and refused (None: tc)
    receive_steering: dict[str, Any] | None = None
    # the topology file's name, sites, lines (ends, profile, route), paths and sides (topology.net; older runs:
    # None, the two-cluster network)
    topology: dict[str, Any] | None = None


class SharedTopologyRecord(Record):
    """A sweep's shared topology as one of its runs saw it (experiments.run.runner.SharedTopology)."""

    id: int
    runs_before: int
    start_s: float  # how long it took to come up


# ---- each variant ------------------------------------------------------------------
class LinkChange(Record):
    """A change of the WAN link inside a variant's window (experiments.run.window.variant_link_changes)."""

    t_ns: int
    offset_s: float  # s after the window's start
    direction: Direction
    params: dict[str, Any]  # the direction's full LinkParams after the change
    cause: str  # "profile <name> step <i>" | "spec step <i>" (+ " ends") | "restore profile base (...)"


class CrossTrafficEntry(Record):
    """One cross flow's run in one direction (experiments.spec.crosstraffic.metadata_entry)."""

    name: str
    kind: Literal["tcp", "udp"]
    direction: Direction
    start_ns: int  # the iperf3 client's start
    end_ns: int | None  # its exit
    port: int
    iperf_json: str  # iperf3 -J output, relative to the run directory
    streams: int
    congestion: str | None  # tcp: the one used (the kernel's default resolved); udp: None
    rate_mbit: float | None  # None: uncapped


class EmulatorDirection(Record):
    """The userspace emulator in one direction over a window (topology.emulator.health_between)."""

    frames: int
    p50_us: float | None  # lateness against netem's departure time (None: no frames)
    p99_us: float | None
    max_us: float | None
    rx_drops: int  # frames lost for lack of CPU: the socket buffer overflowed ...
    tx_errors: int  # ... or the wire refused them
    tx_retries: int = 0  # sends tried again after the kernel refused them a moment (late, not lost)


class EmulatorHealth(Record):
    a_to_b: EmulatorDirection
    b_to_a: EmulatorDirection
    cpu_share: float | None
    late: bool  # some direction's p99 above topology.emulator.LATE_P99_US (with several lines: some line's)
    scheduling: str | None = None  # the forwarder's: "fifo:<priority>" (real-time) or "other"; None: older runs
    # Several lines (a topology file): the figures above are the worst line's (experiments.run.window.lines_health)
    line: str | None = None  # that line's name (None: the only line)
    lines: dict[str, "EmulatorHealth"] | None = None  # every line's forwarder, by line

    def dropped(self) -> int:
        """Frames lost for lack of CPU, both directions."""
        return sum(d.rx_drops + d.tx_errors for d in (self.a_to_b, self.b_to_a))


class FaultRecord(Record):
    """One fault of experiments.run.faults.FaultPlayer; a field it did not record is left out of the file."""

    at_s: float
    played: bool
    kill: str | None = None  # the target: of a kill, a stop or a hostile_kv fault (one of the three)
    stop: str | None = None
    hostile_kv: str | None = None
    duration_s: float | None = None  # a stop's or a hostile_kv's
    after: dict[str, Any] | None = None  # the cue event: event, worker, request_id, t_ns
    pid: int | None = None  # the PID killed, stopped or of the hostile peer (None: nothing was running)
    resumed: bool | None = None  # a stop: SIGCONT reached the PID stopped
    resumed_t_ns: int | None = None
    resumed_offset_s: float | None = None
    resume_error: str | None = None
    exit: int | None = None  # a hostile peer's exit status
    ended_t_ns: int | None = None
    ended_offset_s: float | None = None
    peer: dict[str, Any] | None = None  # a hostile peer's counts (experiments.run.hostile_peer)
    error: str | None = None  # why it could not be played
    t_ns: int | None = None
    offset_s: float | None = None  # s after the window's start

    @model_serializer(mode="wrap")
    def _drop_unrecorded(self, handler) -> dict:
        return {k: v for k, v in handler(self).items() if v is not None}


class WarmupSettle(Record):
    """How long the clock waited after the warm-up for its prompt in the MDs' DRC (experiments.run.loadgen.settle)."""

    ok: bool  # an MD held the prompt's whole blocks; False: settle_timeout passed first
    wait_s: float
    cached_tokens: int
    want_tokens: int


class VariantRecord(Record):
    """One variant's course: the roles' start, ready and end, the measured window and what the network did."""

    status: Status
    error: str | None = None
    wall_start: float | None = None  # Unix s at the roles' start: with t_start_ns, the pcap's clock
    wall_end: float | None = None
    t_start_ns: int | None = None  # the roles started
    t_ready_ns: int | None = None  # every role healthy
    t_end_ns: int | None = None  # the roles stopped
    window_start_ns: int | None = None  # the load generator's t0: the schedule's zero
    window_end_ns: int | None = None
    window_extended_s: float | None = None  # held open past the workload, to the last scheduled event
    warmup_settle: WarmupSettle | None = None  # pdd: its warm-up fills an MD's DRC across the WAN
    link_changes: list[LinkChange] = []
    cross_traffic: list[CrossTrafficEntry] = []
    emulator: EmulatorHealth | None = None  # the userspace backend only
    faults: list[FaultRecord] = []
    exit_codes: dict[str, int | None] = {}  # role -> its exit status at the stop

    @property
    def role_start_s(self) -> float:
        """s from the roles' start to every role ready (0 where either is not recorded)."""
        return _span_s(self.t_start_ns, self.t_ready_ns)

    @property
    def measured_s(self) -> float:
        """s from every role ready to the roles stopped (0 where either is not recorded)."""
        return _span_s(self.t_ready_ns, self.t_end_ns)


def _span_s(start_ns: int | None, end_ns: int | None) -> float:
    return (end_ns - start_ns) / 1e9 if start_ns and end_ns else 0.0


class LineScalingRecord(Record):
    """experiments.spec.scaling.scaling_record: the line the run applied is the published one's rates / s (and
    the KV a token carries / s); delay, jitter and loss are not scaled."""

    kv_scale: float
    published_rate_mbit: dict[Direction, float]
    applied_rate_mbit: dict[Direction, float]


# ---- the whole file ------------------------------------------------------------------
class RunMetadata(Record):
    """metadata.json (see the module docstring for which sections which run has)."""

    experiment: str
    complete: bool
    provenance: Provenance
    spec: SpecRecord | None = None
    seeds: Seeds | None = None
    runtime: str | None = None  # process | docker
    workload: dict[str, Any] | None = None  # experiments.spec.workload.hit_profile of the measured requests
    line_scaling: LineScalingRecord | None = None  # None: the published line as it is (kv_scale 1, older runs)
    serve: bool = False
    calibration: dict[str, Any] | None = None  # experiments.run.calibration.CalibrationConfig
    all_checks_ok: bool | None = None
    topology: TopologyRecord | None = None
    shared_topology: SharedTopologyRecord | None = None
    variants: dict[str, VariantRecord] = {}
    variant_order: list[str] | None = None  # the order the variants ran in (spec.order.run_order); None: older runs
    interrupted: bool = False
    error: str | None = None  # what ended the run early: `ExceptionType: message`
    finished_at: str | None = None
    speed_at_end: SpeedRecord | None = None  # the machine's reference speed after a run's last step (None: not known)
    _source: str = PrivateAttr(default=FILE)  # the file it was read from, for errors

    @model_validator(mode="before")
    @classmethod
    def _calibration_provenance(cls, data: Any) -> Any:
        """Older calibrations wrote the provenance's keys at the top level."""
        if isinstance(data, dict) and "provenance" not in data and "git" in data:
            keys = Provenance.model_fields
            data = {k: v for k, v in data.items() if k not in keys} | {
                "provenance": {k: v for k, v in data.items() if k in keys}
            }
        return data

    def require(self, section: str) -> Any:
        """A section that may be absent in general but which the caller cannot do without."""
        value = getattr(self, section)
        if value is None:
            raise MetadataError(f"{self._source}: no `{section}` section (experiment {self.experiment!r})")
        return value

    def variant(self, name: str) -> VariantRecord:
        """A variant's record, or MetadataError naming the variants there are."""
        if name not in self.variants:
            raise MetadataError(f"{self._source}: no variant {name!r} in `variants` (there: {list(self.variants)})")
        return self.variants[name]


def topology_of(testbed) -> TopologyRecord:
    """The running topology's record (topology.net.Testbed.metadata(), validated)."""
    return rundir.parse(TopologyRecord, testbed.metadata(), "Testbed.metadata()", MetadataError)


def write(run_dir: Path, meta: RunMetadata) -> None:
    """run_dir/metadata.json, atomically."""
    rundir.write_json(Path(run_dir) / FILE, meta.model_dump(mode="json"))


@contextlib.contextmanager
def recording(run_dir: Path, meta: RunMetadata) -> Iterator[RunMetadata]:
    """Around a run's steps: how it ended (interrupted by a signal, or the error that ended it, and when)
    goes into meta and metadata.json is written, whatever happens; the exception goes on."""
    try:
        yield meta
    except KeyboardInterrupt:
        meta.interrupted = True
        raise
    except Exception as exc:
        meta.error = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        meta.finished_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        write(run_dir, meta)


def read(run_dir: Path) -> RunMetadata:
    """run_dir/metadata.json, validated; MetadataError naming the file (and the field) when it is not one."""
    path = Path(run_dir) / FILE
    if not path.exists():
        raise MetadataError(f"{run_dir}: no {FILE} (not a run directory)")
    meta = rundir.read_record(RunMetadata, path, MetadataError)
    meta._source = str(path)
    return meta
