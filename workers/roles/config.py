"""Typed, validated config of a PDD deployment (every address, port and policy knob).

Responsible for: reading one YAML file into frozen dataclasses, refusing
unknown keys and out-of-range values with the field's dotted name and the
allowed values; deriving the addresses peers use (`grpc_address`,
`kv_address`) and the data plane's settings of a path (`PathConfig.send_settings`).
Not responsible for: starting anything (workers/roles/server.py) or the
model's own shapes (workers/model.py).

Pools: `p`, `rld` and `md` are each a list of workers (one worker's mapping
is a pool of one); the router picks a worker of each pool per request
(`policy.pick_p`, `pick_rld`, `pick_md`; workers/roles/routing.py).

Naming scheme: each worker has a `name` (p1, rld1, md1: role + index, as the
topology's host names) that tags its tokens, its event log
(`<events_dir>/<name>.jsonl`) and its gRPC `Worker.Stats`. A worker listens
on `host:grpc_port` (control) and, for decode roles, `host:kv_port` (KV data
plane); `kv_connect` (host:port), when set, is where peers connect instead of
`host:kv_port` (an emulated WAN or a proxy in front of the listener). Where
several lines join the sites, each MD names the `line` it sits behind (the
topology file's line names; `policy.pick_md: line_measured` picks by them).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import yaml
from pydantic import BeforeValidator, Field, StringConstraints

from schema import Bool, Float, Int, Range, Str, build, check_choice, check_range, literal_values, schema

if TYPE_CHECKING:  # importing workers.kvwire loads the engine's KV layout (and torch): not for reading a config
    from workers.kvwire import SendSettings

Mode = Literal["colocated", "pd-intra", "pd-cross", "pdd"]
MODES = literal_values(Mode)
Handoff = Literal["oneshot", "chunked", "auto", "kv"]
HANDOFFS = literal_values(Handoff)
Congestion = Literal["cubic", "bbr", "reno", "default"]
Role = Literal["router", "p", "rld", "md"]
POOL_ROLES = ("p", "rld", "md")
MAX_POOL = 19  # workers per pool at most (topology.naming: 19 hosts per role)
# How the router picks a worker of a pool: by load (P: prefill tokens queued; RLD: free KV, then sessions),
# in turn, or (P, MD: cache_aware) by where the prompt's prefix already lives, bounded by load (routing.pick_p,
# pick_md; P's by the router's mirror of what each P prefilled).
PickP = Literal["least_load", "round_robin", "cache_aware"]
PickRLD = Literal["least_load", "round_robin"]
# line_measured is a value of pick_md rather than a knob of its own: each MD sits behind one line (the
# topology's per-destination route), so choosing a request's line is choosing its MD; a separate knob would
# have to say how it combines with cache_aware, where line_measured folds the MD's DRC hit into the bytes its
# line must carry (routing.pick_md_by_line).
PickMD = Literal["cache_aware", "least_load", "round_robin", "line_measured"]
# A line's name, as the topology file names it (topology.topofile's line names); "" = the one WAN.
LineName = Annotated[Str, StringConstraints(pattern=r"^([a-z][a-z0-9]{0,9})?$")]
Ms = Annotated[Int, Range(10, 3_600_000)]
Device = Literal["cpu", "cuda"]
DEVICES = literal_values(Device)


class ConfigError(ValueError):
    """A config value is missing, unknown or out of range; the message names the field."""


@schema
class WorkerConfig:
    name: Str  # tags tokens, events and stats: role + index (p1, rld1, md1)
    host: Str = "127.0.0.1"  # listen address
    grpc_port: Int = 0  # control plane (checked by validate: 1-65535)
    kv_port: Int = 0  # KV data plane listener (decode roles); 0 = none
    kv_connect: Str = ""  # host:port peers use for KV instead of host:kv_port (e.g. a WAN proxy)
    capacity_tokens: Annotated[Int, Range(1, 1 << 24)] = 4096  # KV slots of this worker's engine (tokens)
    threads: Annotated[Int, Range(1, 256)] = 1  # torch threads of this worker's engine (workers share cores)
    # where this worker's engine (weights, KV cache) lives; KV leaves and arrives through host memory either way
    device: Device = "cpu"
    # compute.mode modelled: the accelerator this worker models (workers/modelled/accelerators.yaml, or the
    # compute.catalogue's) and how many of them (tensor parallel: their peaks and memory add up)
    accelerator: Str = "this-machine"
    devices: Annotated[Int, Range(1, 1024)] = 1
    # MD: the line between the sites its KV crosses (a topology with several lines routes each MD over one);
    # "" = the one WAN. Keys P's per-line WAN estimates and the router's pick_md: line_measured
    line: LineName = ""

    @property
    def grpc_address(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def kv_address(self) -> str:
        return self.kv_connect or f"{self.host}:{self.kv_port}"


@schema
class PathConfig:
    """Settings of one KV path (fast: P->RLD in cluster A; wan: P->MD across the WAN)."""

    connections: Annotated[Int, Range(1, 64)] = 1  # parallel TCP connections per transfer
    congestion: Congestion = "default"  # TCP_CONGESTION per socket; default = the kernel's
    # target KV payload per frame (bytes): bounds memory and interleaves connections (at most kv.max_frame_bytes)
    frame_bytes: Annotated[Int, Range(1024)] = 1 << 20
    # no ACK/progress for this long = stalled: drop the connections and retry
    stall_timeout_ms: Annotated[Int, Range(10, 600_000)] = 2000
    max_retries: Annotated[Int, Range(0, 100)] = 2  # new attempts after a broken or stalled connection
    deadline_ms: Ms = 20000  # give up on the transfer after this long (ms)
    progress_interval_ms: Annotated[Int, Range(0)] = 50  # at most one progress event per transfer per interval
    persistent: Bool = True  # keep connections open for the next transfer to the same peer (no new
    # handshake per transfer); false: a new connection per transfer

    def send_settings(self) -> SendSettings:
        """What the data plane's sender takes (workers/kvwire/seam.py): this path's validated values."""
        from workers.kvwire import SendSettings

        return SendSettings(
            connections=self.connections,
            congestion=self.congestion,
            frame_bytes=self.frame_bytes,
            stall_timeout_ms=self.stall_timeout_ms,
            max_retries=self.max_retries,
            deadline_ms=self.deadline_ms,
            progress_interval_ms=self.progress_interval_ms,
            persistent=self.persistent,
        )


@schema
class KVConfig:
    fast: PathConfig = PathConfig()
    wan: PathConfig = PathConfig(connections=2)
    max_transfer_bytes: Annotated[Int, Range(1)] = 1 << 30  # receivers refuse larger transfers (memory bound)
    max_frame_bytes: Annotated[Int, Range(1024)] = 64 << 20  # receivers refuse larger frames (bytes)


@schema
class LineStatic:
    """A line's figures before it is measured (the runner passes its profile's): rate_mbit, delay_ms one way."""

    rate_mbit: Annotated[Float, Range(0.001, 1e7)]
    delay_ms: Annotated[Float, Range(0.0, 1e6)] = 0.0


@schema
class RouterPolicy:
    mode: Mode = "pdd"  # default mode; GenerateRequest.mode overrides per request
    handoff: Handoff = "oneshot"  # default handoff; GenerateRequest.handoff overrides
    chunk_tokens: Annotated[Int, Range(1, 1 << 20)] = 64  # chunked: tokens per handoff chunk (PDD.md's example)
    wan_rate_mbit: Annotated[Float, Range(0.001, 1e7)] = 200.0  # WAN goodput assumed by the route decision
    # P->MD directly when the estimated WAN transfer is at most this (ms)
    direct_max_transfer_ms: Annotated[Float, Range(0)] = 20.0
    singular_min_uncached_tokens: Annotated[Int, Range(0)] = 48  # singular: this many uncached prompt tokens ...
    singular_max_output_tokens: Annotated[Int, Range(0)] = 8  # ... and at most this many output (PDD.md: ~500)
    ablation_local_rld: Bool = False  # ablation only: let non-singular requests finish on the RLD
    max_prompt_tokens: Annotated[Int, Range(0)] = 0  # 0 = the model's context limit
    # route on the MD's hit as the router's mirror of its DRC expects (no WAN round trip), or "lookup":
    # ask the MD (one WAN RTT)
    drc_estimate: Literal["mirror", "lookup"] = "mirror"
    # the WAN transfer estimate: "static" (wan_rate_mbit) or "measured" (P's WAN KV connections' TCP_INFO:
    # delivery rate + RTT, and P->RLD->MD while the line looks congested)
    wan_estimate: Literal["static", "measured"] = "static"
    pick_p: PickP = "least_load"  # which P prefills a request
    pick_rld: PickRLD = "least_load"  # which RLD relays (or, colocated, serves) it
    pick_md: PickMD = "cache_aware"  # which MD it ends at
    # cache_aware: an MD with this many open sessions takes no more while another has fewer (0: decode.max_sessions)
    md_load_cap: Annotated[Int, Range(0, 100_000)] = 0
    # cache_aware gives way to the least loaded MD while the pool is out of balance: the busiest MD has this
    # many sessions more than the idlest AND more than md_balance_rel times as many (SGLang's router's rule)
    md_balance_abs: Annotated[Int, Range(0, 100_000)] = 4
    md_balance_rel: Annotated[Float, Range(1.0, 1000.0)] = 1.5
    # line_measured: each line's static figures (name -> rate_mbit, delay_ms), its estimate until P has
    # measured it; and the static figures of the route decision on that line (instead of wan_rate_mbit)
    lines: dict[LineName, LineStatic] = Field(default_factory=dict)
    # line_measured: an MD's load as time (ms per open session): the decode batch it joins slows each step
    line_ms_per_session: Annotated[Float, Range(0.0, 1e6)] = 5.0
    # line_measured: a line not measured afresh for this long gets the next request it can take, so its
    # estimate does not go stale (0: never)
    line_explore_s: Annotated[Float, Range(0.0, 1e6)] = 10.0


@schema
class DecodeConfig:
    kv_wait_ms: Ms = 30000  # hard deadline for the prompt KV to arrive; past it the request ends here
    handoff_timeout_ms: Annotated[Int, Range(1)] = 10000  # a handoff RPC slower than this failed; RLD decodes on
    auto_oneshot_load: Annotated[Int, Range(0)] = 2  # auto handoff: oneshot when the RLD has this many sessions
    # the RLD hands over only once it generated this many tokens past P's first (0: as soon as the MD holds
    # the prompt KV); a handoff then carries exactly this many tokens to recompute or import, where the MD
    # was ready before: the handoff microbenchmark's K (experiments/specs/handoff-microbench.yaml)
    handoff_min_tokens: Annotated[Int, Range(0, 1 << 20)] = 0
    max_sessions: Annotated[Int, Range(1, 100_000)] = 64  # concurrent decode sessions per worker; more get
    # RESOURCE_EXHAUSTED
    max_batch: Annotated[Int, Range(1, 4096)] = 32  # sessions decoded in one batched engine step at most
    # tokens per engine step on a decode worker: its sessions' decode tokens plus chunks of a local prefill or
    # of an extend (workers/chunked.py), so a long prompt no longer stalls every session; 0: whole, as before
    step_budget_tokens: Annotated[Int, Range(0, 1 << 20)] = 256


@schema
class PrefillConfig:
    # tokens per engine step on P: chunks of every prompt in flight share a step (a prompt's tail chunk with
    # the next one's first), each layer's KV leaving as it is written; 0: whole prompts, one at a time
    step_budget_tokens: Annotated[Int, Range(0, 1 << 20)] = 256
    # prompts that may wait at once for KV blocks while P's cache is full for now (FIFO; workers/roles/roomqueue.py);
    # one more is refused (RESOURCE_EXHAUSTED). 0: none waits, a prompt without room is refused at once. Each
    # waiting prompt holds one of P's grpc_threads: kept well below them, Cancel and Stats still find a thread
    max_waiting: Annotated[Int, Range(0, 100_000)] = 32
    # how long a prompt may wait for KV blocks before it is refused (RESOURCE_EXHAUSTED): below decode.kv_wait_ms,
    # which the decode side's session waits for this prompt's KV
    room_wait_ms: Ms = 10000


def _one_or_many(value):
    """A pool is a list of workers; one worker's mapping is a pool of one."""
    return [value] if isinstance(value, dict) else value


Pool = Annotated[tuple[WorkerConfig, ...], BeforeValidator(_one_or_many)]


ComputeMode = Literal["real", "modelled"]


@schema
class ComputeConfig:
    """What does the workers' arithmetic. real: the small model computes (workers.model). modelled:
    workers.modelled.ModelledEngine waits the roofline's time of `arch` on each worker's `accelerator` and
    moves `arch`'s KV bytes per token; the network, the protocol, the KV sessions and the routing stay real
    (docs/modelled-compute.md)."""

    mode: ComputeMode = "real"
    arch: Str = ""  # modelled: a model of workers/modelled/models.yaml (or of the catalogue below)
    catalogue: Str = ""  # modelled: a YAML file of accelerators and/or models added to the shipped ones
    # modelled: a line faster than this machine can shape runs at rate / kv_scale, and each token's KV on the
    # wire is arch's / kv_scale too, so transfer times stay those of the published line (the spec scales the
    # profile by the same s: experiments/spec/scaling.py)
    kv_scale: Annotated[Float, Range(1.0, 1e6)] = 1.0
    # the cross-site line's cost (USD per hour) a run's BCR adds to its workers' (experiments/analysis/cost.py);
    # read by the analysis only, any compute mode
    line_cost_per_hour: Annotated[Float, Range(0.0, 1e9)] = 0.0


@schema
class DeploymentConfig:
    router: WorkerConfig
    p: Pool  # the prefill workers (cluster A)
    rld: Pool  # the relay-decode workers (cluster A)
    md: Pool  # the main-decode workers (cluster B)
    model: Str = "tiny"  # workers.model config name
    seed: Int = 0  # weights seed: every worker must agree
    block_size: Annotated[Int, Range(1, 4096)] = 16  # KV block and DRC granularity (tokens)
    events_dir: Str = "events"  # one <worker>.jsonl per worker
    weights_dir: Str = ""  # "" = workers.model.default_weights_dir()
    # gRPC message limit: larger requests get RESOURCE_EXHAUSTED
    max_message_bytes: Annotated[Int, Range(1024, 1 << 30)] = 4 << 20
    # server thread pool per worker (each open stream holds one): >= max_sessions + 8
    grpc_threads: Annotated[Int, Range(4, 1024)] = 80
    kv: KVConfig = KVConfig()
    policy: RouterPolicy = RouterPolicy()
    prefill: PrefillConfig = PrefillConfig()
    decode: DecodeConfig = DecodeConfig()
    compute: ComputeConfig = ComputeConfig()

    @property
    def workers(self) -> tuple[WorkerConfig, ...]:
        """Every worker: the router, then the P, RLD and MD pools."""
        return (self.router, *self.p, *self.rld, *self.md)

    def worker(self, name: str) -> WorkerConfig:
        """The worker with this name; a miss lists the names."""
        for w in self.workers:
            if w.name == name:
                return w
        raise ConfigError(f"no worker named {name!r}; workers: {[w.name for w in self.workers]}")

    def role_of(self, name: str) -> str:
        """router | p | rld | md: the pool the named worker belongs to."""
        for role in ("router", *POOL_ROLES):
            if any(w.name == name for w in self.pool(role)):
                return role
        raise ConfigError(f"no worker named {name!r}; workers: {[w.name for w in self.workers]}")

    def pool(self, role: str) -> tuple[WorkerConfig, ...]:
        """The workers of a role (the router is a pool of one)."""
        return (self.router,) if role == "router" else getattr(self, role)


GRPC_SPARE_THREADS = 8  # server threads beyond the decode streams, for the short RPCs


def validate(cfg: DeploymentConfig) -> DeploymentConfig:
    """The rules that tie fields together (the schema checks each field alone); cfg unchanged or ConfigError."""
    from workers.model import CONFIGS

    check_choice("model", cfg.model, tuple(CONFIGS), ConfigError)
    for role in POOL_ROLES:
        check_range(f"{role}: workers", len(cfg.pool(role)), 1, MAX_POOL, ConfigError)
    for role in ("router", *POOL_ROLES):
        for path, w in _paths(cfg, role):
            check_range(f"{path}.grpc_port", w.grpc_port, 1, 65535, ConfigError)
            check_range(f"{path}.capacity_tokens", w.capacity_tokens, cfg.block_size, 1 << 24, ConfigError)
            if role in ("rld", "md"):
                check_range(f"{path}.kv_port", w.kv_port, 1, 65535, ConfigError)
    names = [w.name for w in cfg.workers]
    if len(set(names)) != len(names):
        raise ConfigError(f"worker names must differ: {names}")
    endpoints = [(w.host, w.grpc_port) for w in cfg.workers]
    if len(set(endpoints)) != len(endpoints):
        raise ConfigError(f"two workers listen on one host:grpc_port: {endpoints}")
    for path in ("fast", "wan"):
        frame = getattr(cfg.kv, path).frame_bytes
        check_range(f"kv.{path}.frame_bytes", frame, 1024, cfg.kv.max_frame_bytes, ConfigError)
    budget, batch = cfg.decode.step_budget_tokens, cfg.decode.max_batch
    if 0 < budget <= batch:
        raise ConfigError(
            f"decode.step_budget_tokens={budget} must exceed decode.max_batch ({batch}), or be 0 (whole): a step's "
            "decode tokens come first, and a prefill's or an extend's chunks need room beside them"
        )
    check_compute(cfg)
    check_lines(cfg)
    if cfg.grpc_threads < cfg.decode.max_sessions + GRPC_SPARE_THREADS:
        raise ConfigError(
            f"grpc_threads={cfg.grpc_threads} must be at least decode.max_sessions ({cfg.decode.max_sessions}) "
            f"+ {GRPC_SPARE_THREADS}: every decode stream holds a thread, and KVReady, Handoff and the DRC "
            "query must not queue behind them"
        )
    return cfg


def check_lines(cfg: DeploymentConfig) -> None:
    """Only MDs name lines, all of them or none; policy.lines names those lines; pick_md: line_measured needs
    two lines or more, each with its static figures. ConfigError naming the field."""
    for role in ("router", "p", "rld"):
        for path, w in _paths(cfg, role):
            if w.line:
                raise ConfigError(f"{path}.line={w.line!r}: only an MD sits behind a line (its KV crosses it)")
    mds = _paths(cfg, "md")
    named = {w.line for _, w in mds if w.line}
    unnamed = [path for path, w in mds if not w.line]
    if named and unnamed:
        raise ConfigError(f"{unnamed[0]}.line: empty while other MDs name lines {sorted(named)}: name every MD's line")
    for name in cfg.policy.lines:
        if name not in named:
            raise ConfigError(f"policy.lines.{name}: no MD sits behind line {name!r}; the MDs' lines: {sorted(named)}")
    if cfg.policy.pick_md != "line_measured":
        return
    if len(named) < 2:
        raise ConfigError(
            f"policy.pick_md=line_measured needs MDs behind two lines or more (md.line); named: {sorted(named)}"
        )
    for path, w in mds:
        if w.line not in cfg.policy.lines:
            raise ConfigError(
                f"policy.lines.{w.line}: required by pick_md line_measured ({path}.line={w.line!r}): the line's "
                "rate_mbit and delay_ms, its estimate until it is measured"
            )


def check_compute(cfg: DeploymentConfig) -> None:
    """compute.mode modelled: the architecture and every worker's accelerator are in the catalogue, and each
    worker's capacity_tokens fits its devices' memory beside the weights; ConfigError naming the field."""
    if cfg.compute.mode == "real":
        if cfg.compute.arch or cfg.compute.catalogue or cfg.compute.kv_scale != 1:
            raise ConfigError(
                "compute.arch, compute.catalogue and compute.kv_scale apply to compute.mode modelled only"
            )
        return
    from workers.modelled.catalogue import CatalogueError
    from workers.modelled.roofline import Roofline

    try:
        cat = catalogue(cfg)
        arch = cat.model(cfg.compute.arch) if cfg.compute.arch else None
    except CatalogueError as err:
        raise ConfigError(f"compute: {err}") from None
    if arch is None:
        raise ConfigError(f"compute.arch: required for compute.mode modelled; allowed: {sorted(cat.models)}")
    for role in POOL_ROLES:
        for path, w in _paths(cfg, role):
            try:
                room = Roofline(cat.accelerator(w.accelerator), arch, w.devices).kv_capacity_tokens()
            except (CatalogueError, ValueError) as err:
                raise ConfigError(f"{path}.accelerator: {err}") from None
            if w.capacity_tokens > room:
                raise ConfigError(
                    f"{path}.capacity_tokens={w.capacity_tokens}: {w.devices} x {w.accelerator} hold {room} KV "
                    f"tokens of {arch.name} beside its weights"
                )


def catalogue(cfg: DeploymentConfig):
    """The accelerators and models a modelled deployment names from (the shipped ones and compute.catalogue)."""
    from workers.modelled.catalogue import load_catalogue

    return load_catalogue(*([Path(cfg.compute.catalogue)] if cfg.compute.catalogue else []))


def kv_bytes_per_token(cfg: DeploymentConfig) -> int:
    """KV bytes a token of the deployment's model carries on the wire: the small model's, or (modelled) the
    architecture's / compute.kv_scale."""
    if cfg.compute.mode == "modelled":
        from workers.modelled.catalogue import wire_config

        return wire_config(catalogue(cfg).model(cfg.compute.arch), cfg.compute.kv_scale).kv_bytes_per_token
    from workers.model import get_config

    return get_config(cfg.model).kv_bytes_per_token


def context_tokens(cfg: DeploymentConfig) -> int:
    """The context a request must fit (prompt + max_tokens): the small model's, or (modelled) the
    architecture's."""
    if cfg.compute.mode == "modelled":
        return catalogue(cfg).model(cfg.compute.arch).max_seq_len
    from workers.model import get_config

    return get_config(cfg.model).max_seq_len


def _paths(cfg: DeploymentConfig, role: str) -> list[tuple[str, WorkerConfig]]:
    """(the dotted path an error names, the worker) for each worker of a role: p, or p[1] in a pool of several."""
    pool = cfg.pool(role)
    return [(role if len(pool) == 1 else f"{role}[{i}]", w) for i, w in enumerate(pool)]


def parse_config(data: dict) -> DeploymentConfig:
    """Dict (parsed YAML) -> validated DeploymentConfig."""
    try:
        return validate(build(DeploymentConfig, data, "", ConfigError))
    except ConfigError as err:
        # A pool written as one worker's mapping is named as written: `p.bogus`, not `p[0].bogus`.
        message = str(err)
        for role in POOL_ROLES:
            if isinstance(data, dict) and isinstance(data.get(role), dict):
                message = message.replace(f"{role}[0]", role)
        raise ConfigError(message) from None


def load_config(path: str | Path) -> DeploymentConfig:
    """YAML file -> validated DeploymentConfig; errors name the file and the field."""
    path = Path(path)
    try:
        return parse_config(yaml.safe_load(path.read_text()) or {})
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None


def to_dict(cfg: DeploymentConfig) -> dict:
    """The resolved config as plain data (to write a YAML file or record a run)."""
    return dataclasses.asdict(cfg)


def parse_address(address: str) -> tuple[str, int]:
    """'host:port' -> (host, port), by the data plane's rule (workers.kvwire.parse_address); ConfigError on
    anything else."""
    from workers.kvwire import parse_address as parse_kv_address

    try:
        return parse_kv_address(address)
    except ValueError as err:
        raise ConfigError(str(err)) from None
