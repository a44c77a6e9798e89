"""The roles' deployment config for a spec and a variant, as data (pure: nothing starts here).

Responsible for: every worker's address (derived from `topology.naming`, ports
written once below) and the deployment dict the roles' validator reads
(workers/roles/config.py): the spec's model, capacities and `deployment`
overrides, the variant's mode and its own overrides, the WAN rate from the
profile.
Not responsible for: starting roles (experiments.deploy) or validating the rest
of the spec (experiments.spec, which calls this to judge `deployment`).
"""

from __future__ import annotations

from pathlib import Path

from topology import naming

# Ports, the same on every host (each host has its own address).
PORTS = {"router": 50050, "p": 50051, "rld": 50052, "md": 50053}
KV_PORTS = {"rld": 50062, "md": 50063}


def worker_names() -> dict[str, str]:
    """role -> worker (= host) name."""
    return {
        "router": "router",
        "p": naming.host_name("p", 1),
        "rld": naming.host_name("rld", 1),
        "md": naming.host_name("md", 1),
    }


def worker_ip(role: str) -> str:
    return naming.host_ip(role, 0 if role == "router" else 1)


def grpc_address(role: str) -> str:
    return f"{worker_ip(role)}:{PORTS[role]}"


def roles_config(
    events_dir: str,
    model: str = "tiny",
    seed: int = 0,
    block_size: int = 16,
    capacity_tokens: dict[str, int] | None = None,
    **sections,
) -> dict:
    """The roles' deployment config (workers/roles/config.py) as data: every worker on its host of the
    topology at PORTS / KV_PORTS; capacity_tokens per role (p, rld, md; else the config default); further
    sections (policy, kv, decode, ...) merged in."""
    names, cap = worker_names(), capacity_tokens or {}
    data = {"model": model, "seed": seed, "block_size": block_size, "events_dir": events_dir}
    for role in ("router", "p", "rld", "md"):
        data[role] = {"name": names[role], "host": worker_ip(role), "grpc_port": PORTS[role]}
        if role in KV_PORTS:
            data[role]["kv_port"] = KV_PORTS[role]
        if role in cap:
            data[role]["capacity_tokens"] = cap[role]
    for section, value in sections.items():
        if isinstance(value, dict) and isinstance(data.get(section), dict):
            data[section] = _merge(data[section], value)
        else:
            data[section] = value
    return data


def deployment_dict(spec, events_dir: str, mode: str = "pdd", overrides: dict | None = None, wan=None) -> dict:
    """The roles' deployment config for this spec and variant mode, as data; spec.deployment merged in,
    then the variant's own overrides (spec.variant_defs). wan: the WAN Profile the link runs (the route
    decision's rate comes from it; None: spec.profile, loaded)."""
    data = roles_config(
        events_dir,
        spec.model,
        spec.weights_seed,
        spec.block_size,
        {"p": spec.capacity_tokens.p, "rld": spec.capacity_tokens.rld, "md": spec.capacity_tokens.md},
        policy={"mode": mode, "handoff": spec.handoff, "wan_rate_mbit": _wan_rate_mbit(wan or spec.profile)},
    )
    return _merge(_merge(data, spec.deployment), overrides or {})


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
