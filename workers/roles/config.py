"""Typed, validated config of a PDD deployment (every address, port and policy knob).

Responsible for: reading one YAML file into frozen dataclasses, refusing
unknown keys and out-of-range values with the field's dotted name and the
allowed values; deriving the addresses peers use (`grpc_address`,
`kv_address`).
Not responsible for: starting anything (workers/roles/server.py) or the
model's own shapes (workers/model.py).

Naming scheme: each worker has a `name` (p1, rld1, md1: role + index, as the
topology's host names) that tags its tokens, its event log
(`<events_dir>/<name>.jsonl`) and its gRPC `Worker.Stats`. A worker listens
on `host:grpc_port` (control) and, for decode roles, `host:kv_port` (KV data
plane); `kv_connect` (host:port), when set, is where peers connect instead of
`host:kv_port` (an emulated WAN or a proxy in front of the listener).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

MODES = ("colocated", "pd-intra", "pd-cross", "pdd")
HANDOFFS = ("oneshot", "chunked", "auto", "kv")
CONGESTION = ("cubic", "bbr", "reno", "default")


class ConfigError(ValueError):
    """A config value is missing, unknown or out of range; the message names the field."""


@dataclass(frozen=True)
class WorkerConfig:
    name: str  # tags tokens, events and stats: role + index (p1, rld1, md1)
    host: str = "127.0.0.1"  # listen address
    grpc_port: int = 0  # control plane
    kv_port: int = 0  # KV data plane listener (decode roles); 0 = none
    kv_connect: str = ""  # host:port peers use for KV instead of host:kv_port (e.g. a WAN proxy)
    capacity_tokens: int = 4096  # KV slots of this worker's engine (tokens)

    @property
    def grpc_address(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def kv_address(self) -> str:
        return self.kv_connect or f"{self.host}:{self.kv_port}"


@dataclass(frozen=True)
class PathConfig:
    """Settings of one KV path (fast: P->RLD in cluster A; wan: P->MD across the WAN)."""

    connections: int = 1  # parallel TCP connections per transfer
    congestion: str = "default"  # TCP_CONGESTION per socket; default = the kernel's
    frame_bytes: int = 1 << 20  # target KV payload per frame (bytes): bounds memory and interleaves connections
    stall_timeout_ms: int = 2000  # no ACK/progress for this long = stalled: drop the connections and retry
    max_retries: int = 2  # new attempts after a broken or stalled connection
    deadline_ms: int = 20000  # give up on the transfer after this long (ms)
    progress_interval_ms: int = 50  # at most one progress event per transfer per interval
    persistent: bool = True  # keep connections open for the next transfer to the same peer (no new
    # handshake per transfer); false: a new connection per transfer


@dataclass(frozen=True)
class KVConfig:
    fast: PathConfig = PathConfig()
    wan: PathConfig = PathConfig(connections=2)
    max_transfer_bytes: int = 1 << 30  # receivers refuse larger transfers (memory bound)
    max_frame_bytes: int = 64 << 20  # receivers refuse larger frames (bytes)


@dataclass(frozen=True)
class RouterPolicy:
    mode: str = "pdd"  # default mode; GenerateRequest.mode overrides per request
    handoff: str = "oneshot"  # default handoff; GenerateRequest.handoff overrides
    chunk_tokens: int = 64  # chunked: tokens per handoff chunk (PDD.md's example threshold)
    wan_rate_mbit: float = 200.0  # WAN goodput assumed by the route decision (Mbit/s)
    direct_max_transfer_ms: float = 20.0  # P->MD directly when the estimated WAN transfer is at most this
    singular_min_uncached_tokens: int = 48  # singular: at least this many uncached prompt tokens ...
    singular_max_output_tokens: int = 8  # ... and at most this many output tokens (PDD.md: ~500 at scale)
    ablation_local_rld: bool = False  # ablation only: let non-singular requests finish on the RLD
    max_prompt_tokens: int = 0  # 0 = the model's context limit
    drc_estimate: str = "mirror"  # route on the MD's hit as the router's mirror of its DRC expects
    # (no WAN round trip), or "lookup": ask the MD (one WAN RTT)
    wan_estimate: str = "static"  # the WAN transfer estimate: "static" (wan_rate_mbit) or "measured"
    # (P's WAN KV connections' TCP_INFO: delivery rate + RTT, and
    # P->RLD->MD while the line looks congested)


@dataclass(frozen=True)
class DecodeConfig:
    kv_wait_ms: int = 30000  # hard deadline for the prompt KV to arrive; past it the request ends here
    handoff_timeout_ms: int = 10000  # a handoff RPC slower than this failed; the RLD keeps decoding
    auto_oneshot_load: int = 2  # auto handoff: oneshot when the RLD has at least this many sessions
    # the RLD hands over only once it generated this many tokens past P's first (0: as soon as the MD holds
    # the prompt KV); a handoff then carries exactly this many tokens to recompute or import, where the MD
    # was ready before: the handoff microbenchmark's K (experiments/specs/handoff-microbench.yaml)
    handoff_min_tokens: int = 0
    max_sessions: int = 64  # concurrent decode sessions per worker; more get RESOURCE_EXHAUSTED
    max_batch: int = 32  # sessions decoded in one batched engine step at most (1: each alone)


@dataclass(frozen=True)
class DeploymentConfig:
    router: WorkerConfig
    p: WorkerConfig
    rld: WorkerConfig
    md: WorkerConfig
    model: str = "tiny"  # workers.model config name
    seed: int = 0  # weights seed: every worker must agree
    block_size: int = 16  # KV block and DRC granularity (tokens)
    events_dir: str = "events"  # one <worker>.jsonl per worker
    weights_dir: str = ""  # "" = workers.model.default_weights_dir()
    max_message_bytes: int = 4 << 20  # gRPC message limit: larger requests get RESOURCE_EXHAUSTED
    grpc_threads: int = 80  # server thread pool per worker (each open stream holds one): >= max_sessions + 8
    kv: KVConfig = KVConfig()
    policy: RouterPolicy = RouterPolicy()
    decode: DecodeConfig = DecodeConfig()

    def worker(self, name: str) -> WorkerConfig:
        """The worker with this name; a miss lists the names."""
        for w in (self.router, self.p, self.rld, self.md):
            if w.name == name:
                return w
        raise ConfigError(
            f"no worker named {name!r}; workers: {[w.name for w in (self.router, self.p, self.rld, self.md)]}"
        )


_NESTED = {
    "router": WorkerConfig,
    "p": WorkerConfig,
    "rld": WorkerConfig,
    "md": WorkerConfig,
    "kv": KVConfig,
    "fast": PathConfig,
    "wan": PathConfig,
    "policy": RouterPolicy,
    "decode": DecodeConfig,
}


def _build(cls: type, data: Any, where: str) -> Any:
    """Build dataclass cls from a mapping, refusing unknown keys and wrong types."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(fields)}")
    kwargs = {}
    for name, value in data.items():
        path = f"{where}.{name}" if where else name
        if name in _NESTED and dataclasses.is_dataclass(_NESTED[name]):
            kwargs[name] = _build(_NESTED[name], value, path)
        else:
            kwargs[name] = _coerce(fields[name], value, path)
    try:
        return cls(**kwargs)
    except TypeError as err:
        raise ConfigError(f"{where or 'config'}: {err}") from None


def _coerce(f: dataclasses.Field, value: Any, path: str) -> Any:
    want = {"int": int, "float": float, "str": str, "bool": bool}.get(str(f.type))
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if want is not None and (not isinstance(value, want) or (want is int and isinstance(value, bool))):
        raise ConfigError(f"{path}: expected {want.__name__}, got {value!r}")
    return value


def _check_range(path: str, value: float, lo: float, hi: float) -> None:
    if not lo <= value <= hi:
        raise ConfigError(f"{path}={value} out of range [{lo}, {hi}]")


def _check_choice(path: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{path}={value!r}; allowed: {list(allowed)}")


GRPC_SPARE_THREADS = 8  # server threads beyond the decode streams, for the short RPCs


def validate(cfg: DeploymentConfig) -> DeploymentConfig:
    """Check ranges and cross-field rules; return cfg unchanged or raise ConfigError."""
    from workers.model import CONFIGS

    _check_choice("model", cfg.model, tuple(CONFIGS))
    _check_range("block_size", cfg.block_size, 1, 4096)
    _check_range("max_message_bytes", cfg.max_message_bytes, 1024, 1 << 30)
    _check_range("grpc_threads", cfg.grpc_threads, 4, 1024)
    for role in ("router", "p", "rld", "md"):
        w: WorkerConfig = getattr(cfg, role)
        _check_range(f"{role}.grpc_port", w.grpc_port, 1, 65535)
        _check_range(f"{role}.capacity_tokens", w.capacity_tokens, cfg.block_size, 1 << 24)
    for role in ("rld", "md"):
        _check_range(f"{role}.kv_port", getattr(cfg, role).kv_port, 1, 65535)
    names = [cfg.router.name, cfg.p.name, cfg.rld.name, cfg.md.name]
    if len(set(names)) != len(names):
        raise ConfigError(f"worker names must differ: {names}")
    for path in ("fast", "wan"):
        p: PathConfig = getattr(cfg.kv, path)
        _check_range(f"kv.{path}.connections", p.connections, 1, 64)
        _check_choice(f"kv.{path}.congestion", p.congestion, CONGESTION)
        _check_range(f"kv.{path}.frame_bytes", p.frame_bytes, 1024, cfg.kv.max_frame_bytes)
        _check_range(f"kv.{path}.stall_timeout_ms", p.stall_timeout_ms, 10, 600_000)
        _check_range(f"kv.{path}.max_retries", p.max_retries, 0, 100)
        _check_range(f"kv.{path}.deadline_ms", p.deadline_ms, 10, 3_600_000)
    _check_choice("policy.mode", cfg.policy.mode, MODES)
    _check_choice("policy.handoff", cfg.policy.handoff, HANDOFFS)
    _check_choice("policy.drc_estimate", cfg.policy.drc_estimate, ("mirror", "lookup"))
    _check_choice("policy.wan_estimate", cfg.policy.wan_estimate, ("static", "measured"))
    _check_range("policy.chunk_tokens", cfg.policy.chunk_tokens, 1, 1 << 20)
    _check_range("policy.wan_rate_mbit", cfg.policy.wan_rate_mbit, 0.001, 1e7)
    _check_range("decode.kv_wait_ms", cfg.decode.kv_wait_ms, 10, 3_600_000)
    _check_range("decode.max_sessions", cfg.decode.max_sessions, 1, 100_000)
    _check_range("decode.max_batch", cfg.decode.max_batch, 1, 4096)
    _check_range("decode.handoff_min_tokens", cfg.decode.handoff_min_tokens, 0, 1 << 20)
    if cfg.grpc_threads < cfg.decode.max_sessions + GRPC_SPARE_THREADS:
        raise ConfigError(
            f"grpc_threads={cfg.grpc_threads} must be at least decode.max_sessions ({cfg.decode.max_sessions}) "
            f"+ {GRPC_SPARE_THREADS}: every decode stream holds a thread, and KVReady, Handoff and the DRC "
            "query must not queue behind them"
        )
    return cfg


def parse_config(data: dict) -> DeploymentConfig:
    """Dict (parsed YAML) -> validated DeploymentConfig."""
    return validate(_build(DeploymentConfig, data, ""))


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
    """'host:port' -> (host, port); raise ConfigError on anything else."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ConfigError(f"address {address!r} is not host:port")
    return host, int(port)
