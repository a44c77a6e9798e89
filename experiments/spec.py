"""Experiment specs: YAML -> a validated, typed `ExperimentSpec`, with command-line overrides.

Responsible for: the spec's schema (frozen dataclasses, one field per knob,
units in names), reading a spec by registry name (`experiments/specs/<name>.yaml`)
or path, applying `--set dotted.key=value` overrides, and refusing unknown
keys, wrong types and out-of-range values with the field's dotted name and
the allowed values — all before any topology starts. The `deployment`
section is passed to the roles' own validator (`workers.roles.config`).
Not responsible for: running anything (experiments.runner) or generating the
workload (experiments.workload).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

import yaml

from experiments.crosstraffic import CrossFlow
from experiments import faults
from experiments.faults import Fault
from workers.roles.config import HANDOFFS, MODES

SPEC_DIR = Path(__file__).resolve().parent / "specs"
VARIANTS = MODES  # every serving mode is a variant of its own name
Runtime = Literal["process", "docker"]
RUNTIMES = get_args(Runtime)


class SpecError(ValueError):
    """A spec or override is invalid; the message names the field and the allowed values."""


@dataclass(frozen=True)
class SessionWorkload:
    """Synthetic multi-turn agent traffic (see experiments/workload.py for the shape it gives)."""

    sessions: int = 5  # multi-turn agent sessions
    session_rate_per_s: float = 0.3  # Poisson rate of session starts (1/s)
    turns: tuple[int, int] = (6, 10)  # turns per session [lo, hi]
    system_prompt_tokens: int = 512  # shared by every session: the cacheable head (agent tools, rules)
    first_turn_tokens: tuple[int, int] = (48, 160)  # the task text after the system prompt
    turn_tokens: tuple[int, int] = (2, 16)  # user/tool text appended per later turn (most turns)
    big_turn_fraction: float = 0.10  # share of later turns with a large tool result
    big_turn_tokens: tuple[int, int] = (64, 240)  # its size: these are the low-hit requests
    output_tokens: tuple[int, int] = (16, 32)  # max_tokens per turn (every request runs to max_tokens)
    think_s_mean: float = 1.0  # exponential think time between a reply and the next turn (s)
    fresh_requests: int = 2  # one-turn requests: system prompt + a new document
    fresh_tokens: tuple[int, int] = (128, 384)  # the new document's size
    singular_fraction: float = 0.035  # share of singular requests (PDD.md: ~3-4%)
    singular_tokens: tuple[int, int] = (384, 768)  # their uncached input: long ...
    singular_output_tokens: tuple[int, int] = (2, 6)  # ... and a short output
    max_context_tokens: int = 0  # prompt + output cap; 0 = the model's context limit


@dataclass(frozen=True)
class MooncakeOptions:
    """How a Mooncake FAST'25 trace is replayed (source: mooncake; experiments/mooncake.py)."""

    tokens_per_hash_block: int = 512  # tokens per hash id here (the trace's 512; smaller to fit the context)
    time_scale: float = 1.0  # arrival = (timestamp - start_s) x time_scale: 0.1 replays ten times faster
    start_s: float = 0.0  # the window starts at this trace time (s)
    max_requests: int = 100  # the window's first requests (0 = to the end of the trace)
    max_output_tokens: int = 0  # cap on the scaled output (0 = only the context)


@dataclass(frozen=True)
class Workload:
    source: Literal["synthetic", "trace", "mooncake"] = "synthetic"
    trace: str = ""  # JSON-lines trace (source: trace, or mooncake: the FAST'25 format); relative to the repo
    seed: int = 1  # everything random in the workload
    synthetic: SessionWorkload = SessionWorkload()
    mooncake: MooncakeOptions = MooncakeOptions()
    warmup: bool = True  # one system-prompt request per variant before measuring (excluded)


@dataclass(frozen=True)
class SLO:
    """Goodput counts requests meeting every SLO (DistServe-style)."""

    ttft_ms: float = 1000.0  # time to first token at the client
    tpot_ms: float = 150.0  # mean time per output token after the first
    e2e_ms: float = 0.0  # end to end; 0 = not checked


@dataclass(frozen=True)
class Timeouts:
    ready_s: float = 120.0  # every role SERVING within this
    request_s: float = 240.0  # one request, end to end
    issue_s: float = 0.0  # no request is sent later than this into a variant's window
    # (a baseline too slow for it ends with the rest not issued,
    # counted; 0: no limit)
    variant_s: float = 300.0  # hard end of one variant's whole workload (keep it above
    # issue_s + request_s: requests in flight at issue_s end)


@dataclass(frozen=True)
class Capacity:
    """KV slots per worker (tokens): the MD's holds the DRC, so it is the largest."""

    p: int = 16384
    rld: int = 8192
    md: int = 16384


@dataclass(frozen=True)
class ExperimentSpec:
    name: str
    description: str = ""
    profile: str = "wan-cross-country"  # netem profile name or YAML path (the WAN link)
    backend: Literal["auto", "tc", "userspace"] = "auto"
    runtime: Runtime = "process"  # how roles run in the hosts; docker: see runtime.py
    variants: tuple[str, ...] = VARIANTS  # compared on the same topology and workload, in this order:
    # modes, or names defined in variant_defs
    # more variants of one mode side by side: name -> {mode: <a mode>, deployment: {overrides of the roles'
    # config for this variant only, e.g. policy: {wan_estimate: measured}}}
    variant_defs: dict = field(default_factory=dict)
    model: str = "default"  # workers.model config
    weights_seed: int = 0  # every worker loads the same seeded weights
    block_size: int = 16  # KV block / DRC granularity (tokens)
    handoff: Literal[HANDOFFS] = "oneshot"  # workers.roles.config's handoff modes
    capacity_tokens: Capacity = Capacity()
    deployment: dict = field(default_factory=dict)  # overrides of the roles' config: policy, kv, decode
    workload: Workload = Workload()
    slo: SLO = SLO()
    timeouts: Timeouts = Timeouts()
    topology_seed: int = 1  # the userspace emulator's random seed
    snaplen_bytes: int = 128  # pcap bytes kept per frame (headers only)
    # variant: the profile's schedule and `schedule` restart with every variant's window (each variant
    # meets the same impairments); link: they run once, from the moment the link came up
    schedule_clock: Literal["link", "variant"] = "variant"
    schedule: tuple[dict, ...] = ()  # timed link changes, a profile's schedule format, played with it
    cross_traffic: tuple[CrossFlow, ...] = ()  # competing iperf3 flows on the WAN, on each variant's clock
    faults: tuple[Fault, ...] = ()  # components SIGKILLed on each variant's clock (experiments.faults)


def _type_name(tp: Any) -> str:
    if get_origin(tp) is Literal:
        return f"one of {list(get_args(tp))}"
    return getattr(tp, "__name__", str(tp))


def _coerce(tp: Any, value: Any, path: str) -> Any:
    """value as type tp, or SpecError naming path and what is allowed."""
    origin = get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return build(tp, value, path)
    if origin is Literal:
        if value not in get_args(tp):
            raise SpecError(f"{path}={value!r}; allowed: {list(get_args(tp))}")
        return value
    if origin is tuple:
        args = get_args(tp)
        if not isinstance(value, (list, tuple)):
            raise SpecError(f"{path}: expected a list, got {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(args[0], v, f"{path}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise SpecError(f"{path}: expected {len(args)} values, got {list(value)!r}")
        return tuple(_coerce(a, v, f"{path}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
    if tp is dict or origin is dict:
        if not isinstance(value, dict):
            raise SpecError(f"{path}: expected a mapping, got {value!r}")
        return value
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp in (int, float, str, bool) and (not isinstance(value, tp) or (tp is int and isinstance(value, bool))):
        raise SpecError(f"{path}: expected {tp.__name__}, got {value!r}")
    return value


def build(cls: type, data: Any, where: str = "") -> Any:
    """Build dataclass cls from a mapping, refusing unknown keys and wrong types."""
    if not isinstance(data, dict):
        raise SpecError(f"{where or 'spec'}: expected a mapping, got {data!r}")
    hints = get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise SpecError(f"{where or 'spec'}: unknown key(s) {unknown}; allowed: {names}")
    kwargs = {k: _coerce(hints[k], v, f"{where}.{k}" if where else k) for k, v in data.items()}
    missing = [
        f.name
        for f in dataclasses.fields(cls)
        if f.name not in data and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise SpecError(f"{where or 'spec'}: required field(s) {missing} missing; fields: {names}")
    try:
        return cls(**kwargs)
    except TypeError as err:
        raise SpecError(f"{where or 'spec'}: {err}") from None


def _range(path: str, value: float, lo: float, hi: float) -> None:
    if not lo <= value <= hi:
        raise SpecError(f"{path}={value} out of range [{lo}, {hi}]")


def _pair(path: str, pair: tuple[int, int], lo: int, hi: int) -> None:
    _range(f"{path}[0]", pair[0], lo, hi)
    _range(f"{path}[1]", pair[1], pair[0], hi)


def _validate_workload(w: Workload, context_tokens: int) -> None:
    s = w.synthetic
    _range("workload.synthetic.sessions", s.sessions, 0, 1000)
    _range("workload.synthetic.session_rate_per_s", s.session_rate_per_s, 1e-3, 1e3)
    _pair("workload.synthetic.turns", s.turns, 1, 1000)
    _range("workload.synthetic.system_prompt_tokens", s.system_prompt_tokens, 0, context_tokens - 2)
    for name in ("first_turn_tokens", "turn_tokens", "big_turn_tokens", "fresh_tokens", "singular_tokens"):
        _pair(f"workload.synthetic.{name}", getattr(s, name), 1, context_tokens)
    _pair("workload.synthetic.output_tokens", s.output_tokens, 1, context_tokens)
    _pair("workload.synthetic.singular_output_tokens", s.singular_output_tokens, 1, context_tokens)
    _range("workload.synthetic.big_turn_fraction", s.big_turn_fraction, 0, 1)
    _range("workload.synthetic.singular_fraction", s.singular_fraction, 0, 0.5)
    _range("workload.synthetic.think_s_mean", s.think_s_mean, 0, 600)
    _range("workload.synthetic.fresh_requests", s.fresh_requests, 0, 10000)
    _range("workload.synthetic.max_context_tokens", s.max_context_tokens, 0, context_tokens)
    if w.source in ("trace", "mooncake") and not w.trace:
        raise SpecError(f"workload.trace: required when workload.source is {w.source!r}")
    m = w.mooncake
    _range("workload.mooncake.tokens_per_hash_block", m.tokens_per_hash_block, 1, 512)
    _range("workload.mooncake.time_scale", m.time_scale, 1e-6, 1e3)
    _range("workload.mooncake.start_s", m.start_s, 0, 1e7)
    _range("workload.mooncake.max_requests", m.max_requests, 0, 1_000_000)
    _range("workload.mooncake.max_output_tokens", m.max_output_tokens, 0, context_tokens - 1)


# A spec's name names its run directory: no separators, no traversal.
SPEC_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}")
# Keys of the roles' config the testbed sets itself (deployment overrides may not).
PLACED_TOP = ("events_dir", "weights_dir", "model", "seed", "block_size")
PLACED_ROLE = {"name", "host", "grpc_port", "kv_port", "kv_connect"}


def validate(spec: ExperimentSpec) -> ExperimentSpec:
    """Ranges, registries and cross-field rules; returns spec or raises SpecError."""
    from topology.profiles import ProfileError, load_profile
    from workers.model import CONFIGS

    if not isinstance(spec.name, str) or not SPEC_NAME.fullmatch(spec.name):
        raise SpecError(
            f"name={spec.name!r}: letters, digits, '.', '_' and '-' only, at most 64, not starting with '.' or '-' "
            "(it names the run directory under results/)"
        )
    if spec.model not in CONFIGS:
        raise SpecError(f"model={spec.model!r}; allowed: {sorted(CONFIGS)}")
    _validate_variant_defs(spec)
    known = (*VARIANTS, *spec.variant_defs)
    bad = [v for v in spec.variants if v not in known]
    if bad or not spec.variants or len(set(spec.variants)) != len(spec.variants):
        raise SpecError(
            f"variants={list(spec.variants)}: each once, from {list(known)} (modes, or names defined in variant_defs)"
        )
    try:
        profile = load_profile(spec.profile)
    except ProfileError as err:
        raise SpecError(f"profile: {err}") from None
    _range("block_size", spec.block_size, 1, 4096)
    _range("snaplen_bytes", spec.snaplen_bytes, 64, 65535)
    for role in ("p", "rld", "md"):
        _range(f"capacity_tokens.{role}", getattr(spec.capacity_tokens, role), spec.block_size, 1 << 22)
    _range("slo.ttft_ms", spec.slo.ttft_ms, 0.001, 1e7)
    _range("slo.tpot_ms", spec.slo.tpot_ms, 0.001, 1e7)
    _range("slo.e2e_ms", spec.slo.e2e_ms, 0, 1e8)
    for name in ("ready_s", "request_s", "variant_s"):
        _range(f"timeouts.{name}", getattr(spec.timeouts, name), 1, 86400)
    _range("timeouts.issue_s", spec.timeouts.issue_s, 0, 86400)  # past variant_s it changes nothing
    _validate_workload(spec.workload, CONFIGS[spec.model].max_seq_len)
    _validate_deployment(spec)
    _validate_impairment(spec, profile)
    try:
        faults.validate(spec.faults, spec.variants, spec.timeouts.variant_s)
    except ValueError as err:
        raise SpecError(str(err)) from None
    return spec


def variant_mode(spec: ExperimentSpec, variant: str) -> str:
    """The mode a variant runs (its own name, or its variant_defs entry's mode)."""
    return spec.variant_defs[variant]["mode"] if variant in spec.variant_defs else variant


def variant_overrides(spec: ExperimentSpec, variant: str) -> dict:
    """The variant's own overrides of the roles' config ({} for a plain mode)."""
    return (spec.variant_defs.get(variant) or {}).get("deployment") or {}


def _validate_variant_defs(spec: ExperimentSpec) -> None:
    from experiments.deployment import deployment_dict
    from workers.roles.config import ConfigError, parse_config

    for name, d in spec.variant_defs.items():
        where = f"variant_defs.{name}"
        if name in VARIANTS or not isinstance(name, str) or not name:
            raise SpecError(f"{where}: a defined variant needs a name of its own, not one of {list(VARIANTS)}")
        if not isinstance(d, dict) or set(d) - {"mode", "deployment"} or "mode" not in d:
            raise SpecError(f"{where}: expected {{mode, deployment}}; got {d!r}")
        if d["mode"] not in VARIANTS:
            raise SpecError(f"{where}.mode={d['mode']!r}; allowed: {list(VARIANTS)}")
        if not isinstance(d.get("deployment", {}), dict):
            raise SpecError(f"{where}.deployment: expected a mapping")
        _placement_keys(d.get("deployment") or {}, f"{where}.deployment")
        try:
            parse_config(deployment_dict(spec, "/nonexistent", d["mode"], d.get("deployment")))
        except ConfigError as err:
            raise SpecError(f"{where}.deployment: {err}") from None


def spec_schedule(spec: ExperimentSpec):
    """The spec's `schedule:` as validated ScheduleSteps."""
    from topology.profiles import ProfileError, parse_schedule

    try:
        return parse_schedule(list(spec.schedule), "schedule")
    except ProfileError as err:
        raise SpecError(str(err)) from None


def _validate_impairment(spec: ExperimentSpec, profile) -> None:
    """The schedule and the cross flows fit in a variant's window and on the link."""
    from experiments import crosstraffic
    from topology.profiles import schedule_end_s

    steps, window_s = spec_schedule(spec), spec.timeouts.variant_s
    if spec.schedule_clock == "variant":
        for what, sched in ((f"profile {profile.name}'s schedule", profile.schedule), ("schedule", steps)):
            end_s = schedule_end_s(sched)
            if end_s > window_s:
                raise SpecError(
                    f"{what}: its last event at {end_s:g} s lies beyond timeouts.variant_s="
                    f"{window_s:g}; allowed: events within [0, {window_s:g}] s of a variant's window "
                    "(shorten it, raise timeouts.variant_s, or set schedule_clock: link)"
                )
    rates = {d: profile.direction(d).rate_mbit for d in ("a_to_b", "b_to_a")}
    try:
        crosstraffic.validate_flows(spec.cross_traffic, rates, window_s, crosstraffic.kernel_congestion_algorithms())
    except crosstraffic.CrossTrafficError as err:
        raise SpecError(str(err)) from None


def _placement_keys(overrides: dict, where: str) -> None:
    """The testbed places the workers and owns the run's paths: overrides may tune the roles, not move them."""
    for key in PLACED_TOP:
        if key in overrides:
            raise SpecError(f"{where}.{key}: set by the testbed (the spec's own field or the run directory), not here")
    for role in ("router", "p", "rld", "md"):
        section = overrides.get(role)
        for key in PLACED_ROLE & set(section if isinstance(section, dict) else ()):
            raise SpecError(f"{where}.{role}.{key}: set by the topology (where the testbed places the worker)")


def _validate_deployment(spec: ExperimentSpec) -> None:
    """The roles' validator judges the `deployment` overrides (field names as in workers/roles/config.py)."""
    from experiments.deployment import deployment_dict
    from workers.roles.config import ConfigError, parse_config

    _placement_keys(spec.deployment, "deployment")
    try:
        parse_config(deployment_dict(spec, events_dir="/nonexistent"))
    except ConfigError as err:
        raise SpecError(f"deployment: {err}") from None


def _set_dotted(data: dict, key: str, value: Any) -> None:
    """data[a][b][c] = value for key 'a.b.c'; checks the path against the schema first."""
    parts = key.split(".")
    cls: Any = ExperimentSpec
    node = data
    for i, part in enumerate(parts):
        where = ".".join(parts[: i + 1])
        if cls is not None:
            names = [f.name for f in dataclasses.fields(cls)]
            if part not in names:
                parent = ".".join(parts[:i]) or "spec"
                raise SpecError(f"--set {key}: {parent} has no field {part!r}; allowed: {names}")
            tp = get_type_hints(cls)[part]
            cls = tp if dataclasses.is_dataclass(tp) else None
        elif not isinstance(node, dict):
            raise SpecError(f"--set {key}: {where} is not a mapping")
        if i == len(parts) - 1:
            node[part] = value
        else:
            child = node.get(part)
            if not isinstance(child, dict):
                child = node[part] = {}
            node = child


def parse_overrides(items: list[str]) -> list[tuple[str, Any]]:
    """['a.b=1', ...] -> [('a.b', 1), ...]; values are YAML (numbers, lists, strings)."""
    out = []
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise SpecError(f"--set {item!r}: expected dotted.key=value")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as err:
            raise SpecError(f"--set {item!r}: value is not valid YAML: {err}") from None
        out.append((key.strip(), value))
    return out


def available_specs(directory: Path = SPEC_DIR) -> list[str]:
    """Registry names: the YAML files in experiments/specs/."""
    return sorted(p.stem for p in directory.glob("*.yaml"))


def spec_path(name_or_path: str, directory: Path = SPEC_DIR) -> Path:
    """A spec by registry name or path; a miss lists the names."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml"):
        if not path.exists():
            raise SpecError(f"{path}: no such spec file")
        return path
    path = directory / f"{name_or_path}.yaml"
    if not path.exists():
        raise SpecError(f"unknown experiment {name_or_path!r}; available: {', '.join(available_specs(directory))}")
    return path


def load_spec(name_or_path: str, overrides: list[str] = (), **top_level: Any) -> ExperimentSpec:
    """Read, override (top_level first, then --set items) and validate a spec."""
    path = spec_path(name_or_path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise SpecError(f"{path}: not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping at the top")
    for key, value in top_level.items():
        if value is not None:
            _set_dotted(data, key, value)
    for key, value in parse_overrides(list(overrides)):
        _set_dotted(data, key, value)
    try:
        return validate(build(ExperimentSpec, data))
    except SpecError as err:
        raise SpecError(f"{path.name}: {err}") from None


def to_dict(spec: ExperimentSpec) -> dict:
    """The resolved spec as plain data (metadata.json)."""
    return dataclasses.asdict(spec)


def from_dict(data: dict) -> ExperimentSpec:
    """Inverse of to_dict (analysis reads the spec back from metadata.json)."""
    return build(ExperimentSpec, data)
