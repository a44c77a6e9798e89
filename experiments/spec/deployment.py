"""The roles' deployment config for a spec and a variant, as data (pure: nothing starts here).

Responsible for: every worker's address (derived from `topology.naming`, ports
written once below) and the deployment dict the roles' validator reads
(workers/roles/config.py): the spec's model, capacities and `deployment`
overrides, the variant's mode and its own overrides, the WAN rate from the
profile.
Not responsible for: starting roles (experiments.run.deploy) or validating the rest
of the spec (experiments.spec.experiment, which calls this to judge `deployment`).
"""

from __future__ import annotations

from pathlib import Path

from topology import naming

# Ports, the same on every host (each host has its own address).
PORTS = {"router": 50050, "p": 50051, "rld": 50052, "md": 50053}
KV_PORTS = {"rld": 50062, "md": 50063}
ROLES = ("router", "p", "rld", "md")


def worker_names(pools: dict[str, int] | None = None) -> dict[str, list[str]]:
    """role -> its workers' (= hosts') names: router; p1..pN, rld1..rldM, md1..mdK (pools: role -> N, 1 each
    by default)."""
    n = {"router": 1, "p": 1, "rld": 1, "md": 1, **(pools or {})}
    return {
        role: ["router"] if role == "router" else [naming.host_name(role, i) for i in range(1, n[role] + 1)]
        for role in ROLES
    }


def role_of(worker: str) -> str:
    """router | p | rld | md of a worker name (p2 -> p)."""
    return worker if worker == "router" else worker.rstrip("0123456789")


def worker_ip(worker: str, addresses: dict[str, str] | None = None) -> str:
    """The host address of a worker name (router, p1, md2, ...) or of a role's first worker (p = p1); addresses:
    host -> address in a topology file's network (experiments.spec.sites.addresses; None: topology.naming's)."""
    role = role_of(worker)
    index = 0 if role == "router" else int(worker[len(role) :] or 1)
    if addresses is not None:
        return addresses["router" if role == "router" else naming.host_name(role, index)]
    return naming.host_ip(role, index)


def grpc_address(worker: str) -> str:
    """host:port of a worker's gRPC (a role name: its first worker)."""
    return f"{worker_ip(worker)}:{PORTS[role_of(worker)]}"


def roles_config(
    events_dir: str,
    model: str = "tiny",
    seed: int = 0,
    block_size: int = 16,
    capacity_tokens: dict[str, int] | None = None,
    pools: dict[str, int] | None = None,
    threads: dict[str, int] | None = None,
    devices: dict[str, str] | None = None,
    sections: dict | None = None,
    addresses: dict[str, str] | None = None,
    worker_lines: dict[str, str] | None = None,
    **more,
) -> dict:
    """The roles' deployment config (workers/roles/config.py) as data: every worker on its host of the
    topology at PORTS / KV_PORTS; pools: workers per role (p, rld, md; 1 each by default); capacity_tokens,
    threads and devices (cpu | cuda) per role (else the config default); further sections (policy, kv,
    decode, ...: `sections`, then `more`) merged in (a role's section, e.g. md: {capacity_tokens: ...}, applies
    to each worker of its pool). A section named like an argument (a spec's deployment.pools) goes in
    `sections`: the roles' validator refuses it by name. addresses: the hosts' addresses in a topology file's
    network (None: the default topology's); worker_lines: MD -> the topology line it sits behind (its `line`)."""
    cap, threads, devices = capacity_tokens or {}, threads or {}, devices or {}
    sections = {**(sections or {}), **more}
    data = {"model": model, "seed": seed, "block_size": block_size, "events_dir": events_dir}
    for role, names in worker_names(pools).items():
        workers = []
        for name in names:
            w = {"name": name, "host": worker_ip(name, addresses), "grpc_port": PORTS[role]}
            if role in KV_PORTS:
                w["kv_port"] = KV_PORTS[role]
            if role in cap:
                w["capacity_tokens"] = cap[role]
            if role in threads:
                w["threads"] = threads[role]
            if role in devices:
                w["device"] = devices[role]
            if name in (worker_lines or {}):
                w["line"] = worker_lines[name]
            workers.append(w)
        data[role] = workers[0] if role == "router" else workers
    for role in ("p", "rld", "md"):  # a role's overrides reach every worker of its pool
        if isinstance(sections.get(role), dict):
            data[role] = [_merge(w, sections[role]) for w in data[role]]
            sections = {k: v for k, v in sections.items() if k != role}
    for section, value in sections.items():
        if isinstance(value, dict) and isinstance(data.get(section), dict):
            data[section] = _merge(data[section], value)
        else:
            data[section] = value
    return data


def deployment_dict(
    spec, events_dir: str, mode: str = "pdd", overrides: dict | None = None, wan=None, pools: dict | None = None
) -> dict:
    """The roles' deployment config for this spec and variant mode, as data; spec.deployment merged in,
    then the variant's own overrides (spec.variant_defs). wan: the WAN Profile the link runs (the route
    decision's rate comes from it; None: spec.profile, loaded, its rates / compute.kv_scale as the run applies
    it); pools: the variant's workers per role (None: the spec's pools)."""
    from experiments.spec import sites
    from experiments.spec.scaling import applied_profile

    wan = wan or applied_profile(spec)
    policy = {"mode": mode, "handoff": spec.handoff, "wan_rate_mbit": _wan_rate_mbit(wan)}
    worker_lines, line_policy = sites.line_policy(spec, wan)  # a topology file's lines ({} for the default)
    sections = _merge(_merge({"policy": {**policy, **line_policy}}, spec.deployment), overrides or {})
    return roles_config(
        events_dir,
        spec.model,
        spec.weights_seed,
        spec.block_size,
        {role: getattr(spec.capacity_tokens, role) for role in ("p", "rld", "md")},
        pools or pool_sizes(spec),
        {role: getattr(spec.pools, role).threads for role in ("p", "rld", "md")},
        {role: getattr(spec.pools, role).device for role in ("p", "rld", "md")},
        sections,
        sites.addresses(spec),
        worker_lines,
    )


def ray_nodes(spec) -> list:
    """One Ray node per worker host of the spec's pools (ray_rt.netns.HostNode), each offering what its
    worker asks (ray_rt.placement), the head in the router's host."""
    from ray_rt.netns import HostNode
    from ray_rt.placement import deployment_needs

    needs = {n.role: n for n in deployment_needs(spec.pools)}
    names = worker_names(pool_sizes(spec))
    out = []
    for role in ("router", "p", "rld", "md"):
        n = needs[role]
        out += [HostNode(w, worker_ip(w), n.cluster, n.num_cpus, n.num_gpus, n.memory_mb) for w in names[role]]
    return out


def pool_cpusets(spec) -> dict[str, str]:
    """role -> the cores its workers run on, where its pool names any (spec.pools.<role>.cpuset)."""
    return {role: getattr(spec.pools, role).cpuset for role in ("p", "rld", "md") if getattr(spec.pools, role).cpuset}


def pool_sizes(spec) -> dict[str, int]:
    """role -> workers in its pool (spec.pools)."""
    return {role: getattr(spec.pools, role).workers for role in ("p", "rld", "md")}


def _wan_rate_mbit(profile) -> float:
    """The A->B rate the router's route decision assumes: the profile's (a Profile, or a name or path to
    load), 200 if unlimited."""
    from topology.profiles import load_profile

    wan = load_profile(profile) if isinstance(profile, (str, Path)) else profile
    return float(wan.a_to_b.rate_mbit or 200.0)


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


# ---------------------------------------------------------------- memory a deployment needs (estimate)
# A role's process before its model: Python, torch, gRPC (a tiny-model worker's RSS when SERVING here: 323 MiB,
# benchmarks/bench_scale.py).
PROCESS_BASE_MB = 330
# The router and the load generator together.
FRONT_MB = 600


# Ray in the topology (runtime ray): each host's node (GCS or raylet, agents, idle workers) and each worker's
# actor, measured by make test-ray (two nodes ~880 MiB before any role; an actor 86 MiB).
RAY_NODE_MB = 450
RAY_ACTOR_MB = 90


def ray_overhead_mb(spec) -> int:
    """Memory Ray itself takes beside the workers when it runs in the topology: a node per host, an actor per
    worker (the router's host and worker included)."""
    hosts = 1 + sum(pool_sizes(spec).values())
    return hosts * (RAY_NODE_MB + RAY_ACTOR_MB)


def worker_memory_mb(model, capacity_tokens: int, step_rows: int) -> int:
    """An estimate of one worker's memory (MiB): its process, the weights, its preallocated KV cache, and what
    one engine step holds: one layer's attention scores (and their softmax, fp32) of step_rows rows over a whole
    context, plus intermediate buffers the allocator keeps, about half the weights (fitted to bench_scale's
    peaks after a request: default 1,589 MiB measured for P and MD, 1,588 estimated; small 658 / 681; tiny
    334 / 331). step_rows: the worker's step budget (prefill. or decode.step_budget_tokens; 0: whole prompts,
    up to the context at once). model: a
    workers.model ModelConfig."""
    c = model
    attn = c.d_model * (c.n_head * c.head_dim) * 2 + c.d_model * (c.n_kv_head * c.head_dim) * 2
    params = c.n_layer * (attn + 3 * c.d_model * c.d_ff) + 2 * c.vocab_size * c.d_model
    weights = params * c.dtype_bytes
    kv = capacity_tokens * c.kv_bytes_per_token
    rows = min(step_rows or c.max_seq_len, c.max_seq_len)
    step = c.n_head * rows * c.max_seq_len * 4 * 2 + weights // 2
    return PROCESS_BASE_MB + (weights + kv + step) // 2**20


# A modelled worker (workers/modelled) holds no weights and no KV tensors: a byte a KV slot, and the token ID its
# prefix cache keys that slot by (a tuple entry and an int object): 1.88M cached tokens of kimi-k2 on 16 x h20 grew
# a worker by 86 MiB, 48 B a slot (measured, 2026-12-04).
MODELLED_SLOT_BYTES = 48


def modelled_worker_memory_mb(capacity_tokens: int, blob_bytes: int) -> int:
    """An estimate of one modelled worker's memory (MiB): its process, MODELLED_SLOT_BYTES a KV slot, and the
    largest KV blob it builds or receives twice over (export packs it in an array, then copies it to bytes).
    blob_bytes: the KV of the longest request the workload sends, at the wire's bytes a token (compute.kv_scale
    applied)."""
    return PROCESS_BASE_MB + (capacity_tokens * MODELLED_SLOT_BYTES + 2 * blob_bytes) // 2**20


def memory_estimate_mb(spec, wan=None) -> dict[str, tuple[int, int]]:
    """role -> (MiB one of its workers needs, workers) for a spec's deployment (wan: its parsed Profile): the
    small model's weights and KV for every slot under real compute, what a ModelledEngine allocates under
    modelled compute (the small model is then its tokenizer only)."""
    from workers.model import get_config

    from workers.roles.config import kv_bytes_per_token, parse_config

    model, sizes = get_config(spec.model), pool_sizes(spec)
    cfg = parse_config(deployment_dict(spec, events_dir="/nonexistent", wan=wan))  # the roles' step budgets
    capacity = {role: getattr(spec.capacity_tokens, role) for role in ("p", "rld", "md")}
    if cfg.compute.mode == "modelled":
        longest = spec.workload.synthetic.max_context_tokens or model.max_seq_len  # the workload's cut (workload.py)
        return {
            role: (modelled_worker_memory_mb(cap, min(cap, longest) * kv_bytes_per_token(cfg)), sizes[role])
            for role, cap in capacity.items()
        }
    rows = {
        "p": cfg.prefill.step_budget_tokens,
        "rld": cfg.decode.step_budget_tokens,
        "md": cfg.decode.step_budget_tokens,
    }
    return {role: (worker_memory_mb(model, capacity[role], rows[role]), sizes[role]) for role in capacity}
