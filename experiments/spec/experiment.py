"""Experiment specs: YAML -> a validated, typed `ExperimentSpec`, with command-line overrides.

Responsible for: the spec's schema (frozen dataclasses, one field per knob,
units in names), reading a spec by registry name (`experiments/specs/<name>.yaml`)
or path, applying `--set dotted.key=value` overrides, and refusing unknown
keys, wrong types and out-of-range values with the field's dotted name and
the allowed values — all before any topology starts. The `deployment`
section is passed to the roles' own validator (`workers.roles.config`).
Not responsible for: running anything (experiments.run.runner) or generating the
workload (experiments.spec.workload).
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, get_type_hints

from pydantic import BeforeValidator, StringConstraints

import yaml

from experiments.spec import faults, placement, scaling, sites, workload
from experiments.spec.crosstraffic import CrossFlow
from experiments.spec.deployment import pool_sizes, worker_names
from experiments.spec.faults import Fault
from experiments.spec.placement import Cluster
from experiments.spec.runtimes import kind_of
from schema import Bool, Float, Int, Range, Str, check_range, literal_values, schema
from schema import build as schema_build
from topology.profiles import Profile
from workers.roles.config import MODES, Device, Handoff, context_tokens

SPEC_DIR = Path(__file__).resolve().parents[1] / "specs"
VARIANTS = MODES  # every serving mode is a variant of its own name
Runtime = Literal["process", "docker", "ray"]
RUNTIMES = literal_values(Runtime)
Seconds = Annotated[Float, Range(1, 86400)]


class SpecError(ValueError):
    """A spec or override is invalid; the message names the field and the allowed values."""


@schema
class SessionWorkload:
    """Synthetic multi-turn agent traffic (see experiments/spec/workload.py for the shape it gives)."""

    sessions: Annotated[Int, Range(0, 1000)] = 5  # multi-turn agent sessions
    session_rate_per_s: Annotated[Float, Range(1e-3, 1e3)] = 0.3  # Poisson rate of session starts (1/s)
    # rising (or falling) load: [from_s, rate_per_s] pairs; from from_s on, sessions start at that rate
    # (session_rate_per_s before the first step)
    rate_steps: tuple[tuple[Annotated[Float, Range(0, 1e6)], Annotated[Float, Range(1e-3, 1e3)]], ...] = ()
    turns: tuple[Int, Int] = (6, 10)  # turns per session [lo, hi]
    system_prompt_tokens: Int = 512  # shared by every session: the cacheable head (agent tools, rules)
    first_turn_tokens: tuple[Int, Int] = (48, 160)  # the task text after the system prompt
    turn_tokens: tuple[Int, Int] = (2, 16)  # user/tool text appended per later turn (most turns)
    big_turn_fraction: Annotated[Float, Range(0, 1)] = 0.10  # share of later turns with a large tool result
    big_turn_tokens: tuple[Int, Int] = (64, 240)  # its size: these are the low-hit requests
    output_tokens: tuple[Int, Int] = (16, 32)  # max_tokens per turn (every request runs to max_tokens)
    think_s_mean: Annotated[Float, Range(0, 600)] = 1.0  # exponential think time between a reply and the next turn (s)
    fresh_requests: Annotated[Int, Range(0, 10000)] = 2  # one-turn requests: system prompt + a new document
    fresh_tokens: tuple[Int, Int] = (128, 384)  # the new document's size
    singular_fraction: Annotated[Float, Range(0, 0.5)] = 0.035  # share of singular requests (PDD.md: ~3-4%)
    singular_tokens: tuple[Int, Int] = (384, 768)  # their uncached input: long ...
    singular_output_tokens: tuple[Int, Int] = (2, 6)  # ... and a short output
    max_context_tokens: Int = 0  # prompt + output cap; 0 = the model's context limit


@schema
class MooncakeOptions:
    """How a Mooncake FAST'25 trace is replayed (source: mooncake; experiments/spec/mooncake.py)."""

    tokens_per_hash_block: Annotated[Int, Range(1, 512)] = 512  # tokens per hash id (the trace's; less fits context)
    time_scale: Annotated[Float, Range(1e-6, 1e3)] = (
        1.0  # arrival = (timestamp - start_s) x time_scale: 0.1 replays ten times faster
    )
    start_s: Annotated[Float, Range(0, 1e7)] = 0.0  # the window starts at this trace time (s)
    max_requests: Annotated[Int, Range(0, 1_000_000)] = 100  # the window's first requests (0 = to the end of the trace)
    max_output_tokens: Int = 0  # cap on the scaled output (0 = only the context)


@schema
class FixedHit:
    """One-turn requests that all share one prefix: every prompt's hit is `hit` (source: fixed_hit; the
    knob of the bathtub sweep, experiments/specs/pdd-bathtub.yaml)."""

    requests: Annotated[Int, Range(1, 100_000)] = 40
    rate_per_s: Annotated[Float, Range(1e-3, 1e3)] = 1.0  # Poisson arrivals (1/s)
    prompt_tokens: Annotated[Int, Range(2, 1 << 20)] = 1024  # every prompt's length
    hit: Annotated[Float, Range(0, 0.999)] = 0.9  # the shared prefix's share of each prompt (block-aligned)
    output_tokens: tuple[Int, Int] = (16, 32)  # max_tokens per request [lo, hi]


@schema
class Workload:
    source: Literal["synthetic", "trace", "mooncake", "fixed_hit"] = "synthetic"
    trace: Str = ""  # JSON-lines trace (source: trace, or mooncake: the FAST'25 format); relative to the repo
    seed: Int = 1  # everything random in the workload
    synthetic: SessionWorkload = SessionWorkload()
    mooncake: MooncakeOptions = MooncakeOptions()
    fixed_hit: FixedHit = FixedHit()
    warmup: Bool = True  # one system-prompt request per variant before measuring (excluded)


@schema
class SLO:
    """Goodput counts requests meeting every SLO (DistServe-style)."""

    ttft_ms: Annotated[Float, Range(0.001, 1e7)] = 1000.0  # time to first token at the client
    tpot_ms: Annotated[Float, Range(0.001, 1e7)] = 150.0  # mean time per output token after the first
    e2e_ms: Annotated[Float, Range(0, 1e8)] = 0.0  # end to end; 0 = not checked


@schema
class Timeouts:
    ready_s: Seconds = 120.0  # every role SERVING within this
    request_s: Seconds = 240.0  # one request, end to end
    # no request is sent later than this into a variant's window (a baseline too slow for it ends with
    # the rest not issued, counted; 0: no limit; past variant_s it changes nothing)
    issue_s: Annotated[Float, Range(0, 86400)] = 0.0
    variant_s: Seconds = 300.0  # hard end of one variant's whole workload (keep it above
    # issue_s + request_s: requests in flight at issue_s end)


@schema
class Capacity:
    """KV slots per worker (tokens): the MD's holds the DRC, so it is the largest."""

    p: Int = 16384
    rld: Int = 8192
    md: Int = 16384


CPUSET = r"^$|^\d+(-\d+)?(,\d+(-\d+)?)*$"  # cores as taskset and docker --cpuset-cpus take them: 0,2-3


def _core_list(value):
    """A cpuset written as a bare number in YAML (cpuset: 1) is that core."""
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


@schema
class Pool:
    """One pool of workers: how many, and what each may use (the way to make pools unequal on one machine).

    workers: workers in the pool, each on a host of its own (p1..pN in cluster A, md1..mdN in cluster B)
    cpus: each worker's CPU time in cores (docker --cpus); 0 = the Docker runtime's default for the role
    memory_mb: each worker's memory limit (MiB, docker --memory); 0 = the runtime's default for the role
    threads: torch threads of each worker's engine
    cpuset: the cores its workers run on ("1", "0-1"; "" = any): each cluster's own hardware on one machine
      (docker --cpuset-cpus; the process runtime: taskset)
    device: where each worker's engine runs (cuda: checked before start where the workers will run)
    Under runtime ray (ray_rt.placement), where each worker may run and what it reserves there:
    cluster: the site, a or b: nodes labelled pddlab/cluster=<it>; "" = the role's own (p, rld: a; md: b)
    num_cpus: Ray logical CPUs per worker; 0 = cpus, else 1
    num_gpus: GPUs per worker; 0 = 1 for device cuda, else none
    accelerator_type: the node's ray.io/accelerator-type label (H100, A100, L4 ...); "" = any
    labels: further label selector entries its nodes must satisfy (Ray's syntax: v, !v, in(v1, v2))
    """

    workers: Annotated[Int, Range(1, 19)] = 1
    cpus: Annotated[Float, Range(0, 256)] = 0.0
    memory_mb: Annotated[Int, Range(0, 1 << 22)] = 0
    threads: Annotated[Int, Range(1, 256)] = 1
    cpuset: Annotated[Str, BeforeValidator(_core_list), StringConstraints(pattern=CPUSET)] = ""
    device: Device = "cpu"
    cluster: Literal["", "a", "b"] = ""
    num_cpus: Annotated[Float, Range(0, 1024)] = 0.0
    num_gpus: Annotated[Float, Range(0, 64)] = 0.0
    accelerator_type: Str = ""
    labels: dict[Str, Str] = field(default_factory=dict)


@schema
class Pools:
    """The worker pools of a deployment (PDD.md: a small RLD pool, a large MD pool)."""

    p: Pool = Pool()
    rld: Pool = Pool()
    md: Pool = Pool()


@schema
class ExperimentSpec:
    name: Str
    description: Str = ""
    profile: Str = "wan-cross-country"  # netem profile name or YAML path (the WAN link: the topology's first line)
    topology: Str = "two-clusters"  # topology file name or YAML path (topology.topofile; experiments.spec.sites)
    # every intra-cluster link's profile (name or YAML path): the LAN the fast path (P -> RLD) crosses
    lan_profile: Str = "lan"
    backend: Literal["auto", "tc", "userspace"] = "auto"
    runtime: Runtime = "process"  # how roles run in the hosts; docker: see runtime.py
    variants: tuple[Str, ...] = VARIANTS  # compared on the same topology and workload (the tables' order):
    # modes, or names defined in variant_defs
    # the order they run in: shuffled (seeded by workload.seed, recorded in metadata.json; colocated, whose
    # replies stand in for other variants' failed turns, first) so that no variant owns a position in the run
    # (the first after the topology came up, the last on a longer-lived machine); as_listed: `variants`' order
    variant_order: Literal["shuffled", "as_listed"] = "shuffled"
    variant_order_seed: Int | None = None  # picks the shuffled order; None: workload.seed (a sweep sets the repeat)
    # more variants of one mode side by side: name -> {mode: <a mode>, deployment: {overrides of the roles'
    # config for this variant only, e.g. policy: {wan_estimate: measured}}}
    variant_defs: dict = field(default_factory=dict)
    model: Str = "default"  # workers.model config
    weights_seed: Int = 0  # every worker loads the same seeded weights
    block_size: Annotated[Int, Range(1, 4096)] = 16  # KV block / DRC granularity (tokens)
    handoff: Handoff = "oneshot"  # workers.roles.config's handoff modes
    # the handoff modes the measured requests take in turn (in the workload's order), e.g. [oneshot, kv]: both
    # modes of a comparison interleaved in one window (the handoff microbenchmark); () = each variant's own
    handoff_per_request: tuple[Handoff, ...] = ()
    capacity_tokens: Capacity = Capacity()
    pools: Pools = Pools()  # workers per role and their limits; the router picks among them (policy.pick_*)
    cluster: Cluster = Cluster()  # where the roles run: this machine, or a Ray cluster (runtime ray)
    deployment: dict = field(default_factory=dict)  # overrides of the roles' config: policy, kv, decode
    workload: Workload = Workload()
    slo: SLO = SLO()
    timeouts: Timeouts = Timeouts()
    topology_seed: Int = 1  # the userspace emulator's random seed
    snaplen_bytes: Annotated[Int, Range(64, 65535)] = 128  # pcap bytes kept per frame (headers only)
    # variant: the profile's schedule and `schedule` restart with every variant's window (each variant
    # meets the same impairments); link: they run once, from the moment the link came up
    schedule_clock: Literal["link", "variant"] = "variant"
    schedule: tuple[dict, ...] = ()  # timed link changes, a profile's schedule format, played with it
    cross_traffic: tuple[CrossFlow, ...] = ()  # competing iperf3 flows on the WAN, on each variant's clock
    faults: tuple[Fault, ...] = ()  # components SIGKILLed on each variant's clock (experiments.spec.faults)


def build(cls: type, data: Any, where: str = "") -> Any:
    """Build schema class cls from a mapping, refusing unknown keys, wrong types and values out of range."""
    return schema_build(cls, data, where, SpecError)


def _range(path: str, value: float, lo: float, hi: float) -> None:
    check_range(path, value, lo, hi, SpecError)


def _pair(path: str, pair: tuple[int, int], lo: int, hi: int) -> None:
    _range(f"{path}[0]", pair[0], lo, hi)
    _range(f"{path}[1]", pair[1], pair[0], hi)


def _validate_workload(w: Workload, context_tokens: int) -> None:
    s = w.synthetic
    _pair("workload.synthetic.turns", s.turns, 1, 1000)
    starts = [at for at, _ in s.rate_steps]
    if starts != sorted(set(starts)):
        raise SpecError(f"workload.synthetic.rate_steps: from_s must increase, got {starts}")
    _range("workload.synthetic.system_prompt_tokens", s.system_prompt_tokens, 0, context_tokens - 2)
    for name in ("first_turn_tokens", "turn_tokens", "big_turn_tokens", "fresh_tokens", "singular_tokens"):
        _pair(f"workload.synthetic.{name}", getattr(s, name), 1, context_tokens)
    _pair("workload.synthetic.output_tokens", s.output_tokens, 1, context_tokens)
    _pair("workload.synthetic.singular_output_tokens", s.singular_output_tokens, 1, context_tokens)
    _range("workload.synthetic.max_context_tokens", s.max_context_tokens, 0, context_tokens)
    if w.source in ("trace", "mooncake") and not w.trace:
        raise SpecError(f"workload.trace: required when workload.source is {w.source!r}")
    m = w.mooncake
    _range("workload.mooncake.max_output_tokens", m.max_output_tokens, 0, context_tokens - 1)
    f = w.fixed_hit
    if w.source == "fixed_hit":  # its defaults fit the default model, not every model
        _range("workload.fixed_hit.prompt_tokens", f.prompt_tokens, 2, context_tokens - 1)
        _pair("workload.fixed_hit.output_tokens", f.output_tokens, 1, context_tokens - f.prompt_tokens)


# A spec's name names its run directory, a defined variant's its folder: no separators, no traversal.
SPEC_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}")
# Keys of the roles' config the testbed sets itself (deployment overrides may not).
PLACED_TOP = ("events_dir", "weights_dir", "model", "seed", "block_size")
PLACED_ROLE = {"name", "host", "grpc_port", "kv_port", "kv_connect"}


def _path_name(field_name: str, value: Any, names: str, key: bool = False) -> None:
    """A name that becomes a path (the spec's, a defined variant's) is one plain path component: SpecError
    naming the field otherwise (key: the value is a key of the mapping field_name)."""
    if not isinstance(value, str) or not SPEC_NAME.fullmatch(value):
        shown = f"{field_name}: key {value!r}" if key else f"{field_name}={value!r}"
        raise SpecError(
            f"{shown}: letters, digits, '.', '_' and '-' only, at most 64, not starting with '.' or '-' "
            f"(it names {names})"
        )


@dataclass(frozen=True)
class Loaded:
    """A validated spec with its WAN profile parsed once (what a run is built from)."""

    spec: ExperimentSpec
    profile: Profile


def parse_profile(spec: ExperimentSpec) -> Profile:
    """The WAN profile the run applies (experiments.spec.scaling.applied_profile); SpecError naming the field."""
    from experiments.spec.scaling import ScalingError, applied_profile

    try:
        return applied_profile(spec)
    except ScalingError as err:
        raise SpecError(str(err)) from None


def validate(spec: ExperimentSpec, profile: Profile | None = None, *, check_machine: bool = True) -> ExperimentSpec:
    """Ranges, registries and cross-field rules; returns spec or raises SpecError. profile: the spec's WAN profile
    if parsed already; check_machine=False: not this machine's memory, cores, GPUs (the simulator's runs nowhere)."""
    from workers.model import CONFIGS

    _path_name("name", spec.name, "the run directory under results/")
    if spec.model not in CONFIGS:
        raise SpecError(f"model={spec.model!r}; allowed: {sorted(CONFIGS)}")
    known = (*VARIANTS, *spec.variant_defs)
    bad = [v for v in spec.variants if v not in known]
    if bad or not spec.variants or len(set(spec.variants)) != len(spec.variants):
        raise SpecError(
            f"variants={list(spec.variants)}: each once, from {list(known)} (modes, or names defined in variant_defs)"
        )
    profile = parse_profile(spec) if profile is None else profile
    _refuse(scaling.lan_problem(spec))
    _refuse(sites.topology_problem(spec))  # before the deployment: the workers' addresses come from it
    for role in ("p", "rld", "md"):
        _range(f"capacity_tokens.{role}", getattr(spec.capacity_tokens, role), spec.block_size, 1 << 22)
    _validate_variant_defs(spec, profile)
    cfg = _validate_deployment(spec, profile)  # before the pools: their memory estimate reads the roles' parsed config
    _validate_workload(spec.workload, context_tokens(cfg))  # the small model's context, or the modelled arch's
    _refuse(workload.context_problem(spec, context_tokens(cfg)))  # the context build cuts requests to
    _validate_pools(spec, profile, check_machine)
    if check_machine:
        _validate_devices(spec)
    _refuse(placement.placement_problem(spec))  # labels, sites, the cluster's address
    _validate_impairment(spec, profile)
    _refuse(placement.cluster_problem(spec, profile))
    try:
        workers = tuple(w for names in worker_names(pool_sizes(spec)).values() for w in names if w != "router")
        faults.validate(spec.faults, spec.variants, spec.timeouts.variant_s, workers, spec.runtime)
    except ValueError as err:
        raise SpecError(str(err)) from None
    return spec


def variant_mode(spec: ExperimentSpec, variant: str) -> str:
    """The mode a variant runs (its own name, or its variant_defs entry's mode)."""
    return spec.variant_defs[variant]["mode"] if variant in spec.variant_defs else variant


def variant_overrides(spec: ExperimentSpec, variant: str) -> dict:
    """The variant's own overrides of the roles' config ({} for a plain mode)."""
    return (spec.variant_defs.get(variant) or {}).get("deployment") or {}


def _validate_variant_defs(spec: ExperimentSpec, profile: Profile) -> None:
    from experiments.spec.deployment import deployment_dict
    from workers.roles.config import ConfigError, parse_config

    for name, d in spec.variant_defs.items():
        _path_name("variant_defs", name, "its folder variants/<name>/ in the run directory", key=True)
        where = f"variant_defs.{name}"
        if name in VARIANTS:
            raise SpecError(f"{where}: a defined variant needs a name of its own, not one of {list(VARIANTS)}")
        if not isinstance(d, dict) or set(d) - {"mode", "deployment", "pools"} or "mode" not in d:
            raise SpecError(f"{where}: expected {{mode, deployment}} (and optionally pools); got {d!r}")
        if d["mode"] not in VARIANTS:
            raise SpecError(f"{where}.mode={d['mode']!r}; allowed: {list(VARIANTS)}")
        if not isinstance(d.get("deployment", {}), dict):
            raise SpecError(f"{where}.deployment: expected a mapping")
        _placement_keys(d.get("deployment") or {}, f"{where}.deployment")
        _variant_pools(spec, d.get("pools") or {}, f"{where}.pools")
        try:
            parse_config(deployment_dict(spec, "/nonexistent", d["mode"], d.get("deployment"), wan=profile))
        except ConfigError as err:
            raise SpecError(f"{where}.deployment: {err}") from None


def _variant_pools(spec: ExperimentSpec, pools: dict, where: str) -> None:
    """A variant's own pool sizes: a subset of the spec's workers (the topology has the spec's hosts)."""
    if not isinstance(pools, dict):
        raise SpecError(f"{where}: expected a mapping of p, rld, md to worker counts; got {pools!r}")
    for role, n in pools.items():
        if role not in ("p", "rld", "md"):
            raise SpecError(f"{where}: unknown key(s) [{role!r}]; allowed: ['p', 'rld', 'md']")
        most = getattr(spec.pools, role).workers
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= most:
            raise SpecError(f"{where}.{role}={n!r} out of range [1, {most}] (pools.{role}.workers)")


def variant_pools(spec: ExperimentSpec, variant: str) -> dict[str, int]:
    """role -> the workers a variant runs: the spec's pools, or fewer where its variant_defs entry says (the same
    worker budget for variants of different shapes)."""
    from experiments.spec.deployment import pool_sizes

    own = (spec.variant_defs.get(variant) or {}).get("pools") or {}
    return {**pool_sizes(spec), **own}


def spec_schedule(spec: ExperimentSpec):
    """The spec's `schedule:` as validated ScheduleSteps, its rates / compute.kv_scale (spec.scaling)."""
    from experiments.spec.scaling import ScalingError, applied_schedule

    try:
        return applied_schedule(spec)
    except ScalingError as err:
        raise SpecError(str(err)) from None


def _validate_impairment(spec: ExperimentSpec, profile) -> None:
    """The schedule and the cross flows fit in a variant's window and on the link."""
    from experiments.spec import crosstraffic
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


def machine_memory_mb() -> int:
    """MemAvailable of this machine (MiB): what new workers can have without swapping."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024
    raise SpecError("/proc/meminfo has no MemAvailable: cannot check the deployment's memory")


def _validate_pools(spec: ExperimentSpec, profile: Profile | None = None, check_machine: bool = True) -> None:
    """Every worker fits its own memory limit, and all of them fit the machine (the estimate is in the error)."""
    from experiments.spec.deployment import FRONT_MB, memory_estimate_mb, ray_overhead_mb

    here = check_machine and not spec.cluster.address  # a Ray cluster's nodes: checked at placement (ray_rt)
    cores = os.cpu_count() or 1
    for role in ("p", "rld", "md") if here else ():
        cpuset = getattr(spec.pools, role).cpuset
        used = [int(x) for part in cpuset.split(",") if part for x in part.split("-")]
        if any(c >= cores for c in used):
            raise SpecError(f"pools.{role}.cpuset={cpuset!r}: this machine has cores 0-{cores - 1}")
    need = memory_estimate_mb(spec, wan=profile)
    for role, (mb, _) in need.items():
        limit = getattr(spec.pools, role).memory_mb
        if limit and limit < mb:
            raise SpecError(
                f"pools.{role}.memory_mb={limit}: one {role} worker needs about {mb} MiB (model {spec.model}, "
                f"capacity_tokens.{role}={getattr(spec.capacity_tokens, role)}); allowed: >= {mb} or 0 (the default)"
            )
    ray_mb = ray_overhead_mb(spec) if kind_of(spec).ray_nodes else 0
    total = FRONT_MB + ray_mb + sum(mb * n for mb, n in need.values())
    if here and total > (available := machine_memory_mb()):
        parts = ", ".join(f"{n} {role} x {mb} MiB" for role, (mb, n) in need.items())
        ray = f" + {ray_mb} MiB (Ray's nodes and actors)" if ray_mb else ""
        raise SpecError(
            f"pools: {parts} + {FRONT_MB} MiB (router, load generator){ray} = {total} MiB, more than this machine's "
            f"{available} MiB available; allowed: fewer workers (pools.*.workers), smaller capacity_tokens or model"
        )


def _validate_devices(spec: ExperimentSpec, cuda_here: bool | None = None, gpus_here: int | None = None) -> None:
    """A pool on cuda needs a GPU where its workers run (experiments.spec.placement.device_problem)."""
    _refuse(placement.device_problem(spec, cuda_here, gpus_here))


def _refuse(problem: str | None) -> None:
    if problem:
        raise SpecError(problem)


def _validate_deployment(spec: ExperimentSpec, profile: Profile):
    """The roles' validator judges the `deployment` overrides (names as in workers/roles/config.py): its config."""
    from experiments.spec.deployment import deployment_dict
    from workers.roles.config import ConfigError, parse_config

    _placement_keys(spec.deployment, "deployment")
    try:
        return parse_config(deployment_dict(spec, events_dir="/nonexistent", wan=profile))
    except ConfigError as err:
        raise SpecError(f"deployment: {err}") from None


def _set_dotted(data: dict, key: str, value: Any) -> None:
    """data[a][b][c] = value for key 'a.b.c'; checks the path against the schema first."""
    parts = key.split(".")
    shown = key if key.isprintable() else repr(key)  # one line, whatever the key holds
    cls: Any = ExperimentSpec
    node = data
    for i, part in enumerate(parts):
        where = ".".join(parts[: i + 1])
        if cls is not None:
            names = [f.name for f in dataclasses.fields(cls)]
            if part not in names:
                parent = ".".join(parts[:i]) or "spec"
                raise SpecError(f"--set {shown}: {parent} has no field {part!r}; allowed: {names}")
            tp = get_type_hints(cls)[part]
            cls = tp if dataclasses.is_dataclass(tp) else None
        elif not isinstance(node, dict):
            raise SpecError(f"--set {shown}: {where} is not a mapping")
        if i == len(parts) - 1:
            node[part] = value
        else:
            child = node.get(part)
            if not isinstance(child, dict):
                child = node[part] = {}
            node = child


def yaml_problem(err: yaml.YAMLError) -> str:
    """A YAML parser's error in one line: its problem and where (PyYAML's own message spans several lines)."""
    problem = getattr(err, "problem", None)
    mark = getattr(err, "problem_mark", None)
    if problem:
        return f"{problem} (column {mark.column + 1})" if mark is not None else problem
    return str(err).splitlines()[0] if str(err) else type(err).__name__


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
            raise SpecError(f"--set {item!r}: value is not valid YAML: {yaml_problem(err)}") from None
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
    return load(name_or_path, overrides, **top_level).spec


def load(name_or_path: str, overrides: list[str] = (), *, check_machine: bool = True, **top_level: Any) -> Loaded:
    """load_spec, keeping the WAN profile it parsed (once) to validate the spec (check_machine: as validate's)."""
    path = spec_path(name_or_path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise SpecError(f"{path}: not valid YAML: {yaml_problem(err)}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping at the top")
    for key, value in top_level.items():
        if value is not None:
            _set_dotted(data, key, value)
    for key, value in parse_overrides(list(overrides)):
        _set_dotted(data, key, value)
    try:
        spec = build(ExperimentSpec, data)
        profile = parse_profile(spec)
        return Loaded(validate(spec, profile, check_machine=check_machine), profile)
    except SpecError as err:
        raise SpecError(f"{path.name}: {err}") from None


def to_dict(spec: ExperimentSpec) -> dict:
    """The resolved spec as plain data (metadata.json)."""
    return dataclasses.asdict(spec)


def from_dict(data: dict) -> ExperimentSpec:
    """Inverse of to_dict (analysis reads the spec back from metadata.json)."""
    return build(ExperimentSpec, data)
