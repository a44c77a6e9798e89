"""Netem profiles: the typed model of a link's impairments, and its loader.

Responsible for: reading `netem_profiles/*.yaml`, validating every field once
(unknown keys, ranges, distributions, schedules), and handing the rest of the
testbed typed, immutable objects (`Profile`, `LinkParams`, `ScheduleStep`).
Not responsible for: applying the impairments (see `topology.shaping`, which
turns `LinkParams` into tc commands or userspace-emulator settings).

Schema (one file per profile; all keys optional except `name`):

    name: cross-country              # must equal the file name without .yaml
    description: one line for the README table
    link: {LinkParams fields}        # both directions
    a_to_b: {LinkParams fields}      # overrides for cluster A -> cluster B
    b_to_a: {LinkParams fields}      # overrides for cluster B -> cluster A
    schedule:                        # timed changes, `at_s` non-decreasing
      - at_s: 20                     # seconds after the link came up
        duration_s: 10               # optional: revert after this long
        direction: both              # both | a_to_b | b_to_a
        set: {LinkParams fields}

The semantics of every field are those of `tc-netem(8)`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

PROFILE_DIR = Path(__file__).resolve().parent.parent / "netem_profiles"
DISTRIBUTIONS = ("uniform", "normal", "pareto", "paretonormal")
DIRECTIONS = ("a_to_b", "b_to_a")
# netem's own default queue limit (packets); we never go below it.
NETEM_DEFAULT_LIMIT_PKTS = 1000
# Full-size Ethernet frame used to size a queue in packets from a BDP.
FRAME_BYTES = 1514


class ProfileError(ValueError):
    """A profile file or value is invalid; the message names file, field and allowed values."""


@dataclass(frozen=True)
class GilbertElliott:
    """Gilbert-Elliott loss (netem `loss gemodel p r 1-h 1-k`).

    p_pct: good->bad transition probability per packet (%)
    r_pct: bad->good transition probability per packet (%)
    bad_loss_pct: loss probability in the bad state, netem's 1-h (%)
    good_loss_pct: loss probability in the good state, netem's 1-k (%)
    """

    p_pct: float
    r_pct: float = 100.0
    bad_loss_pct: float = 100.0
    good_loss_pct: float = 0.0

    def mean_loss_pct(self) -> float:
        """Stationary loss rate of the two-state chain (%)."""
        p, r = self.p_pct / 100, self.r_pct / 100
        if p + r == 0:
            return self.good_loss_pct
        bad_share = p / (p + r)
        return 100 * (bad_share * self.bad_loss_pct / 100 + (1 - bad_share) * self.good_loss_pct / 100)


@dataclass(frozen=True)
class LinkParams:
    """One direction of a link, with tc-netem semantics.

    rate_mbit: serialization rate (Mbit/s, 1e6 bit/s); 0 = unlimited
    limit_pkts: queue limit (packets); 0 = derived: max(1000, in-delay + 1.5 x BDP)
    delay_ms: mean one-way delay added by the link (ms)
    jitter_ms: delay variation (ms): half-width for uniform, sigma otherwise
    delay_distribution: uniform | normal | pareto | paretonormal
    delay_correlation_pct: correlation of successive delay draws (%)
    loss_pct: independent random loss (%)
    loss_correlation_pct: correlation of successive loss draws (%)
    loss_ge: Gilbert-Elliott loss model instead of loss_pct
    duplicate_pct: packets sent twice (%)
    corrupt_pct: packets with one flipped bit (%)
    reorder_pct: packets sent at once, ahead of the delayed ones (%)
    reorder_gap: reorder only every gap-th packet; 0 = netem's default
    """

    rate_mbit: float = 0.0
    limit_pkts: int = 0
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    delay_distribution: str = "uniform"
    delay_correlation_pct: float = 0.0
    loss_pct: float = 0.0
    loss_correlation_pct: float = 0.0
    loss_ge: GilbertElliott | None = None
    duplicate_pct: float = 0.0
    corrupt_pct: float = 0.0
    reorder_pct: float = 0.0
    reorder_gap: int = 0

    @property
    def effective_limit_pkts(self) -> int:
        """Queue limit actually applied: explicit, or derived so TCP can fill the link.

        netem counts every frame it holds, also those merely waiting out their
        delay, so the derived limit is the frames in flight inside the delay
        plus 1.5 round-trip BDPs of real buffer (with one BDP, TCP at 200 Mbit/s
        and 30 ms overflowed it in bursts and reached only 74-86% of the rate).
        """
        if self.limit_pkts:
            return self.limit_pkts
        if not self.rate_mbit:
            return NETEM_DEFAULT_LIMIT_PKTS
        one_way_s = (self.delay_ms + 2 * self.jitter_ms) / 1000
        frames_per_s = self.rate_mbit * 1e6 / 8 / FRAME_BYTES
        in_delay_pkts = frames_per_s * one_way_s
        bdp_pkts = frames_per_s * 2 * one_way_s  # the reverse direction assumed alike
        return max(NETEM_DEFAULT_LIMIT_PKTS, math.ceil(in_delay_pkts + 1.5 * bdp_pkts))

    @property
    def expected_loss_pct(self) -> float:
        """Long-run loss rate this direction should show (%)."""
        return self.loss_ge.mean_loss_pct() if self.loss_ge else self.loss_pct

    def replace(self, **changes: Any) -> "LinkParams":
        """A copy with some fields changed, validated."""
        return link_params_from_dict({**self.to_dict(), **changes}, where="<replace>")

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (for metadata.json and the emulator's control socket)."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class ScheduleStep:
    """A timed change of a live link.

    at_s: seconds after the schedule's start (the link coming up, or a variant's window opening)
    duration_s: revert to the previous parameters after this long (s); None = keep
    direction: both | a_to_b | b_to_a
    changes: LinkParams fields to change
    """

    at_s: float
    changes: dict[str, Any]
    direction: str = "both"
    duration_s: float | None = None


@dataclass(frozen=True)
class Profile:
    """A named pair of link directions plus an optional schedule."""

    name: str
    description: str
    a_to_b: LinkParams
    b_to_a: LinkParams
    schedule: tuple[ScheduleStep, ...] = ()
    path: Path | None = None

    def direction(self, name: str) -> LinkParams:
        """The LinkParams of direction `a_to_b` or `b_to_a`."""
        return {"a_to_b": self.a_to_b, "b_to_a": self.b_to_a}[name]

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of the resolved profile (for metadata.json)."""
        return {
            "name": self.name,
            "description": self.description,
            "a_to_b": self.a_to_b.to_dict(),
            "b_to_a": self.b_to_a.to_dict(),
            "schedule": [dataclasses.asdict(s) for s in self.schedule],
            "path": str(self.path) if self.path else None,
        }


# name -> (min, max) for numeric fields; None = unbounded above.
_RANGES: dict[str, tuple[float, float | None]] = {
    "rate_mbit": (0, 100_000),
    "limit_pkts": (0, 10_000_000),
    "delay_ms": (0, 60_000),
    "jitter_ms": (0, 60_000),
    "delay_correlation_pct": (0, 100),
    "loss_pct": (0, 100),
    "loss_correlation_pct": (0, 100),
    "duplicate_pct": (0, 100),
    "corrupt_pct": (0, 100),
    "reorder_pct": (0, 100),
    "reorder_gap": (0, 1_000_000),
}
_INT_FIELDS = {"limit_pkts", "reorder_gap"}
_LINK_FIELDS = tuple(f.name for f in dataclasses.fields(LinkParams))
_GE_FIELDS = tuple(f.name for f in dataclasses.fields(GilbertElliott))


def _check_keys(data: dict, allowed: tuple[str, ...], where: str) -> None:
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: expected a mapping, got {type(data).__name__}")
    unknown = sorted(set(data) - set(allowed))
    if unknown:
        raise ProfileError(f"{where}: unknown key(s) {unknown}; allowed: {', '.join(allowed)}")


def _number(value: Any, name: str, where: str, lo: float, hi: float | None, integer: bool) -> float | int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProfileError(f"{where}.{name}: expected a number, got {value!r}")
    if integer and not float(value).is_integer():
        raise ProfileError(f"{where}.{name}: expected an integer, got {value!r}")
    if math.isnan(value) or value < lo or (hi is not None and value > hi):
        raise ProfileError(f"{where}.{name}: {value!r} is out of range; allowed: {lo} to {hi}")
    return int(value) if integer else float(value)


def _gilbert_elliott(data: Any, where: str) -> GilbertElliott:
    _check_keys(data, _GE_FIELDS, where)
    if "p_pct" not in data:
        raise ProfileError(f"{where}.p_pct: required (good->bad transition probability, 0 to 100)")
    values = {k: _number(v, k, where, 0, 100, False) for k, v in data.items()}
    return GilbertElliott(**values)


def link_params_from_dict(data: dict[str, Any], where: str) -> LinkParams:
    """Validate a mapping of LinkParams fields; `where` prefixes every error."""
    _check_keys(data, _LINK_FIELDS, where)
    values: dict[str, Any] = {}
    for name, value in data.items():
        if name == "delay_distribution":
            if value not in DISTRIBUTIONS:
                raise ProfileError(
                    f"{where}.delay_distribution: {value!r} is unknown; allowed: {', '.join(DISTRIBUTIONS)}"
                )
            values[name] = value
        elif name == "loss_ge":
            values[name] = (
                None
                if value is None
                else (value if isinstance(value, GilbertElliott) else _gilbert_elliott(value, f"{where}.loss_ge"))
            )
        else:
            lo, hi = _RANGES[name]
            values[name] = _number(value, name, where, lo, hi, name in _INT_FIELDS)
    params = LinkParams(**values)
    if params.loss_ge and params.loss_pct:
        raise ProfileError(f"{where}: loss_pct and loss_ge are exclusive; set one of them")
    if params.reorder_pct and not params.delay_ms:
        raise ProfileError(f"{where}.reorder_pct: reordering needs delay_ms > 0 (as in tc-netem)")
    if params.reorder_gap and not params.reorder_pct:
        raise ProfileError(f"{where}.reorder_gap: needs reorder_pct > 0 (as in tc-netem)")
    return params


def parse_schedule(data: Any, where: str) -> tuple[ScheduleStep, ...]:
    """Validate a list of schedule steps (a profile's `schedule`, or an experiment's); `where` prefixes errors."""
    if not isinstance(data, (list, tuple)):
        raise ProfileError(f"{where}: expected a list of steps")
    steps, last_at = [], 0.0
    for i, raw in enumerate(data):
        at = f"{where}[{i}]"
        _check_keys(raw, ("at_s", "duration_s", "direction", "set"), at)
        if "at_s" not in raw or "set" not in raw:
            raise ProfileError(f"{at}: 'at_s' and 'set' are required")
        at_s = _number(raw["at_s"], "at_s", at, 0, None, False)
        if at_s < last_at:
            raise ProfileError(
                f"{at}.at_s: {at_s} goes back in time (previous step at {last_at}); steps must be in order"
            )
        duration = raw.get("duration_s")
        if duration is not None:
            duration = _number(duration, "duration_s", at, 0, None, False)
            if duration == 0:
                raise ProfileError(f"{at}.duration_s: must be > 0 or omitted")
        direction = raw.get("direction", "both")
        if direction not in ("both", *DIRECTIONS):
            raise ProfileError(f"{at}.direction: {direction!r} is unknown; allowed: both, a_to_b, b_to_a")
        link_params_from_dict(raw["set"], f"{at}.set")  # validate the field names and values
        steps.append(ScheduleStep(at_s=at_s, changes=dict(raw["set"]), direction=direction, duration_s=duration))
        last_at = at_s
    return tuple(steps)


def profile_from_dict(data: Any, source: str, path: Path | None = None) -> Profile:
    """Validate a whole profile mapping; `source` (a file name) prefixes every error."""
    _check_keys(data, ("name", "description", "link", "a_to_b", "b_to_a", "schedule"), source)
    if not isinstance(data.get("name"), str) or not data["name"]:
        raise ProfileError(f"{source}: 'name' is required (a string)")
    base = data.get("link") or {}
    _check_keys(base, _LINK_FIELDS, f"{source}: link")
    dirs = {d: link_params_from_dict({**base, **(data.get(d) or {})}, f"{source}: {d}") for d in DIRECTIONS}
    schedule = parse_schedule(data.get("schedule") or [], f"{source}: schedule")
    return Profile(
        name=data["name"], description=str(data.get("description", "")), schedule=schedule, path=path, **dirs
    )


def schedule_end_s(schedule: tuple[ScheduleStep, ...]) -> float:
    """When a schedule's last event happens (s after its start): the latest step start or revert; 0 if empty."""
    return max((s.at_s + (s.duration_s or 0.0) for s in schedule), default=0.0)


def available_profiles(directory: Path = PROFILE_DIR) -> list[str]:
    """Names of the shipped profiles."""
    return sorted(p.stem for p in directory.glob("*.yaml"))


def load_profile(name_or_path: str | Path, directory: Path = PROFILE_DIR) -> Profile:
    """Load a profile by registry name or by path to a YAML file."""
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = directory / f"{name_or_path}.yaml"
        if not path.exists():
            raise ProfileError(
                f"unknown profile {str(name_or_path)!r}; available: {', '.join(available_profiles(directory))}"
            )
    if not path.exists():
        raise ProfileError(f"{path}: no such profile file")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ProfileError(f"{path}: not valid YAML: {exc}") from exc
    profile = profile_from_dict(data, str(path), path)
    if profile.name != path.stem:
        raise ProfileError(f"{path}: name {profile.name!r} must equal the file name {path.stem!r}")
    return profile
