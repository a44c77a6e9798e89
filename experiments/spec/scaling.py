"""The line a run applies when compute.kv_scale s scales a published line down to one this machine can shape.

Responsible for: reading s from a spec's `deployment.compute.kv_scale` (one value for the whole run: the
variants share the link), and the pure scaling of a WAN profile and of a schedule: every rate (each
direction's `rate_mbit`, each schedule step's `rate_mbit`) divided by s; delay, jitter, loss and the rest
unchanged (they do not scale with the line, see docs/modelled-compute.md); the record metadata.json keeps.
Not responsible for: the KV bytes a token carries on the wire (workers.modelled.catalogue.wire_config divides
them by the same s) or applying the link (topology).
"""

from __future__ import annotations

import dataclasses

from topology import profiles
from topology.profiles import Profile, ProfileError, ScheduleStep, parse_schedule

MIN_RATE_MBIT = 1.0  # below this a scaled line is a different experiment (and netem's rate granularity)
DIRECTIONS = ("a_to_b", "b_to_a")


class ScalingError(ValueError):
    """The line a run would apply is invalid: the profile or schedule itself, or a kv_scale it cannot take (the
    message names compute.kv_scale and the direction)."""


def applied_profile(spec) -> Profile:
    """The spec's WAN profile (a registry name or a YAML path), parsed, its rates / the run's s."""
    try:
        published = profiles.load_profile(spec.profile)  # the module's, as the tests count it
    except ProfileError as err:
        raise ScalingError(f"profile: {err}") from None
    return scaled_profile(published, spec_kv_scale(spec))


def lan_profile(spec) -> Profile:
    """The spec's LAN profile (every intra-cluster link's, as written: kv_scale does not scale the LAN), parsed;
    ScalingError naming the field."""
    try:
        return profiles.load_profile(spec.lan_profile)
    except ProfileError as err:
        raise ScalingError(f"lan_profile: {err}") from None


def lan_problem(spec) -> str | None:
    """Why the spec's LAN profile does not load (None: it does)."""
    try:
        lan_profile(spec)
    except ScalingError as err:
        return str(err)
    return None


def applied_schedule(spec) -> tuple[ScheduleStep, ...]:
    """The spec's own `schedule:` parsed, its rates / the run's s."""
    try:
        steps = parse_schedule(list(spec.schedule), "schedule")
    except ProfileError as err:
        raise ScalingError(str(err)) from None
    return scaled_schedule(steps, spec_kv_scale(spec), "schedule")


def spec_kv_scale(spec) -> float:
    """The run's s: deployment.compute.kv_scale (1 when unset); a variant that sets another is refused (the
    variants share one link)."""
    s = _kv_scale_of(spec.deployment, "deployment")
    for name, d in (spec.variant_defs or {}).items():
        section = (d or {}).get("deployment") if isinstance(d, dict) else None
        mine = _kv_scale_of(section or {}, f"variant_defs.{name}.deployment")
        if "kv_scale" in _compute(section or {}) and mine != s:
            raise ScalingError(
                f"variant_defs.{name}.deployment.compute.kv_scale={mine:g}: the variants share one line, scaled "
                f"once; set compute.kv_scale in the spec's deployment (now {s:g})"
            )
    return s


def _compute(section: dict) -> dict:
    compute = section.get("compute") if isinstance(section, dict) else None
    return compute if isinstance(compute, dict) else {}


def _kv_scale_of(section: dict, where: str) -> float:
    value = _compute(section).get("kv_scale", 1.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 1:
        raise ScalingError(f"{where}.compute.kv_scale={value!r}: expected a number >= 1")
    return float(value)


def scaled_profile(profile: Profile, s: float) -> Profile:
    """profile with every rate / s (both directions and every schedule step); s = 1: profile itself.
    ScalingError naming compute.kv_scale and the direction where a line has no rate or falls below
    MIN_RATE_MBIT."""
    if s == 1:
        return profile
    for d in DIRECTIONS:
        rate = profile.direction(d).rate_mbit
        if not rate:
            raise ScalingError(
                f"compute.kv_scale={s:g}: profile {profile.name}'s {d} has no rate (unlimited): nothing to scale; "
                "give the profile the published line's rate_mbit, or set kv_scale 1"
            )
        _check_rate(rate / s, s, f"profile {profile.name}'s {d} ({rate:g} Mbit/s)")
    return dataclasses.replace(
        profile,
        a_to_b=dataclasses.replace(profile.a_to_b, rate_mbit=profile.a_to_b.rate_mbit / s),
        b_to_a=dataclasses.replace(profile.b_to_a, rate_mbit=profile.b_to_a.rate_mbit / s),
        schedule=scaled_schedule(profile.schedule, s, f"profile {profile.name}'s schedule"),
    )


def scaled_schedule(steps: tuple[ScheduleStep, ...], s: float, where: str = "schedule") -> tuple[ScheduleStep, ...]:
    """steps with each rate_mbit change / s (an unlimited 0 refused: nothing to scale)."""
    if s == 1:
        return steps
    out = []
    for i, step in enumerate(steps):
        if "rate_mbit" in step.changes:
            rate = step.changes["rate_mbit"]
            if not rate:
                raise ScalingError(
                    f"compute.kv_scale={s:g}: {where}[{i}] ({step.direction}) sets rate_mbit 0 (unlimited): "
                    "nothing to scale"
                )
            _check_rate(rate / s, s, f"{where}[{i}] ({step.direction}, {rate:g} Mbit/s)")
            step = dataclasses.replace(step, changes={**step.changes, "rate_mbit": rate / s})
        out.append(step)
    return tuple(out)


def _check_rate(applied: float, s: float, what: str) -> None:
    if applied < MIN_RATE_MBIT:
        raise ScalingError(
            f"compute.kv_scale={s:g}: {what} would run at {applied:g} Mbit/s, below {MIN_RATE_MBIT:g}; lower kv_scale"
        )


def scaling_record(published: Profile, s: float) -> dict:
    """metadata.json's `line_scaling`: s and each direction's published and applied rate (Mbit/s)."""
    return {
        "kv_scale": s,
        "published_rate_mbit": {d: published.direction(d).rate_mbit for d in DIRECTIONS},
        "applied_rate_mbit": {d: published.direction(d).rate_mbit / s for d in DIRECTIONS},
    }


def spec_scaling_record(spec) -> dict | None:
    """scaling_record of a spec's published profile and s; None when s is 1 (nothing scaled)."""
    s = spec_kv_scale(spec)
    return scaling_record(profiles.load_profile(spec.profile), s) if s != 1 else None
