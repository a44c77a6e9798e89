"""What the simulator simulates for one variant of a spec: its workers' step-time models, policy, KV sizes, line.

Responsible for: loading a spec for simulation (`load_for_simulation`: the emulated run's loader and checks,
so a bad spec is refused with the same message, less the checks that only concern this machine: its memory,
its GPUs, its cores) and, per variant, a `SimConfig`: every worker of its pools as a `WorkerModel` (the roofline
of the deployment's architecture on the worker's accelerator x devices: compute.mode modelled; or, for real
compute, the spec's small model on the catalogue's `this-machine`, scaled to the emulated runs' measured times and
slowed by the variant's `contention`: experiments.sim.realcompute), the roles' validated policy, the KV bytes
a token carries, the published WAN line (the profile as written: the simulator needs no kv_scale) and the LAN
(the spec's lan_profile: P's link in cluster A, which the fast path crosses).
Not responsible for: running anything (experiments.sim.pipeline) or the line's behaviour (experiments.sim.wan).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from experiments.spec import experiment as ex
from experiments.spec.deployment import deployment_dict
from experiments.spec.experiment import Loaded
from experiments.spec.scaling import lan_profile, spec_kv_scale
from topology.profiles import DIRECTIONS, FRAME_BYTES, load_profile, parse_schedule
from topology.shaping import link_states, merge_schedules
from workers.modelled.catalogue import CatalogueError
from workers.modelled.roofline import Roofline
from workers.roles.config import ConfigError, DeploymentConfig, catalogue, kv_bytes_per_token, parse_config

from experiments.sim.realcompute import Contention, MeasuredRoofline
from experiments.sim.wan import MSS_BYTES, LineParams, line_from_profile

# the pools each mode uses (colocated: the RLD serves everything; pd-intra: no MD; pd-cross: no RLD; pdd: all three)
ROLES_USED = {"colocated": ("rld",), "pd-intra": ("p", "rld"), "pd-cross": ("p", "md"), "pdd": ("p", "rld", "md")}
WAN_MODES = ("pd-cross", "pdd")  # the modes whose P sends KV over the WAN (to the MD)
REAL_ACCELERATOR = "this-machine"  # real compute: the small model runs on this machine's CPU (calibrated entry)
HANDOFF_ID_BYTES = 15  # a handoff's payload per token ID (PDD.md: 100 tokens ~ 1.5 KB)


class SimError(ValueError):
    """The spec cannot be simulated; the message names the field."""


@dataclass(frozen=True)
class WorkerModel:
    """One worker: name (p1, rld2, md3); role; roofline: its step times; max_batch: sessions per decode step;
    capacity_tokens: its KV slots (tokens)"""

    name: str
    role: str
    roofline: Roofline
    max_batch: int
    capacity_tokens: int

    @property
    def accelerators(self) -> int:
        return self.roofline.devices


@dataclass(frozen=True)
class SimConfig:
    """One variant as the simulator runs it.

    variant, mode, handoff: as the spec names them; deployment: the roles' validated config (policy, kv, decode);
    workers: role -> its pool; kv_bytes_per_token: the architecture's KV per token (B, unscaled: the published
    line is simulated); route_kv_bytes_per_token: what the router's route decision multiplies (the wire's, /
    kv_scale, against the scaled rate in policy.wan_rate_mbit: the same decision as the emulated run's);
    line: the A->B direction of the published line; lan: P's link in cluster A (experiments.sim.config.lan_line);
    wan_connections: TCP connections per WAN KV transfer;
    wan_congestion: their congestion control (kv.wan.congestion)"""

    variant: str
    mode: str
    handoff: str
    deployment: DeploymentConfig
    workers: dict[str, tuple[WorkerModel, ...]]
    kv_bytes_per_token: int
    route_kv_bytes_per_token: int
    line: LineParams
    lan: LineParams
    line_schedule: tuple  # ((s from the workload's start, the A->B line from then on), ...): a schedule's changes
    wan_connections: int
    wan_congestion: str
    issue_s: float = 0.0  # timeouts.issue_s: no request is sent later than this into the variant (0: no limit)

    @property
    def policy(self):
        return self.deployment.policy

    @property
    def accelerators(self) -> int:
        """Accelerators of the pools this variant uses (colocated: the RLD pool only; pd-intra: no MD)."""
        return sum(w.accelerators for role in ROLES_USED[self.mode] for w in self.workers[role])


def load_for_simulation(name_or_path: str, overrides: list[str] = ()) -> Loaded:
    """Read, override and validate a spec as `pddlab run` does (experiment.load: the same errors, word for word),
    without the checks that only concern this machine (its memory, GPUs and cores: a simulated deployment runs
    nowhere)."""
    return ex.load(name_or_path, overrides, check_machine=False)


def sim_config(loaded: Loaded, variant: str, pace: Mapping[str, float] | None = None) -> SimConfig:
    """The variant of a loaded spec as the simulator runs it; SimError naming what cannot be simulated.
    pace: role -> how many times the roofline's time its modelled engines take (validation only: the pace an
    emulated run's modelled engines kept, summary.json's roles_cpu; None: the roofline's)."""
    spec = loaded.spec
    mode = ex.variant_mode(spec, variant)
    data = deployment_dict(
        spec, "/nonexistent", mode, ex.variant_overrides(spec, variant), loaded.profile, ex.variant_pools(spec, variant)
    )
    try:
        cfg = parse_config(data)
        cat = catalogue(cfg)
    except (ConfigError, CatalogueError) as err:
        raise SimError(f"deployment: {err}") from None
    modelled = cfg.compute.mode == "modelled"
    arch_name = cfg.compute.arch if modelled else spec.model
    if arch_name not in cat.models:
        raise SimError(
            f"model={arch_name!r}: no architecture of that name in the catalogue (workers/modelled/models.yaml), "
            f"so no step times; allowed: {sorted(cat.models)}"
        )
    arch = cat.model(arch_name)
    if pace and not modelled:
        raise SimError("pace: only modelled compute has a roofline to keep pace with (real compute's is measured)")
    pools, busy = {}, contention(mode, {role: len(cfg.pool(role)) for role in ("p", "rld", "md")})
    for role in ("p", "rld", "md"):
        pools[role] = tuple(
            WorkerModel(
                w.name,
                role,
                _roofline(cat, arch, w, role, cfg, modelled, busy, (pace or {}).get(role, 1.0)),
                cfg.decode.max_batch,
                w.capacity_tokens,
            )
            for w in cfg.pool(role)
        )
    published = load_profile(spec.profile)
    return SimConfig(
        variant=variant,
        mode=mode,
        handoff=spec.handoff,
        deployment=cfg,
        workers=pools,
        kv_bytes_per_token=arch.kv_bytes_per_token if modelled else kv_bytes_per_token(cfg),
        route_kv_bytes_per_token=kv_bytes_per_token(cfg),
        line=line_from_profile(published),
        line_schedule=line_schedule(spec, published),
        lan=lan_line(lan_profile(spec), spec_kv_scale(spec)),
        wan_connections=cfg.kv.wan.connections,
        wan_congestion=cfg.kv.wan.congestion,
        issue_s=spec.timeouts.issue_s,
    )


def line_schedule(spec, published) -> tuple[tuple[float, LineParams], ...]:
    """The A->B line after each change of the profile's and the spec's schedules (unscaled, as the line), played
    as each emulated variant's window plays them from the workload's start (schedule_clock: variant); link: none
    (played once from the link's coming up: simulate.not_simulated says so)."""
    if spec.schedule_clock != "variant":
        return ()
    steps, _labels = merge_schedules(
        ("profile", published.schedule), ("spec", parse_schedule(list(spec.schedule), "schedule"))
    )
    start = {d: published.direction(d) for d in DIRECTIONS}
    return tuple(
        (at_s, line_from_profile(replace(published, a_to_b=now["a_to_b"], b_to_a=now["b_to_a"])))
        for at_s, now in link_states(start, steps)
    )


def lan_line(profile, kv_scale: float = 1.0) -> LineParams:
    """P's link in cluster A (the fast path), from the spec's LAN profile: its rate times TCP's payload share of
    a frame, times kv_scale (an emulated run's LAN is not scaled, and carries 1/kv_scale of the KV)."""
    lan = line_from_profile(profile)
    return replace(lan, rate_bps=lan.rate_bps * MSS_BYTES / FRAME_BYTES * kv_scale)


def contention(mode: str, pool_sizes: dict[str, int]) -> Contention:
    """What shares the machine's cores with each engine of a real-compute variant (pool_sizes: role -> workers):
    the engines of the pools its mode uses, and its P workers as WAN senders where the mode crosses the WAN."""
    return Contention(
        engines=sum(pool_sizes[role] for role in ROLES_USED[mode]),
        wan_senders=pool_sizes["p"] if mode in WAN_MODES else 0,
    )


def _roofline(
    cat, arch, worker, role: str, cfg: DeploymentConfig, modelled: bool, busy: Contention, pace: float = 1.0
) -> Roofline:
    """A worker's step times: the roofline of the architecture on its accelerator (modelled compute; pace times
    as long where a pace is given), or the small model on this-machine scaled to what the emulated runs measured,
    slowed by its variant's contention (real compute: experiments.sim.realcompute), its prefill chunked as the
    engine's step budget."""
    if modelled:
        accelerator = cat.accelerator(worker.accelerator)
        return Roofline(accelerator, arch, worker.devices, accelerator.efficiency.slowed(pace) if pace != 1 else None)
    budget = cfg.prefill.step_budget_tokens if role == "p" else cfg.decode.step_budget_tokens
    return MeasuredRoofline(
        cat.accelerator(REAL_ACCELERATOR),
        arch,
        worker.devices,
        prefill_worker=role == "p",
        chunk_tokens=budget or (1 << 20),
        contention=busy,
    )
