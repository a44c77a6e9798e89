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

Instead of fields, `link`, `a_to_b` or `b_to_a` may hold one netem line,
`{netem: "delay 40ms 8ms distribution normal loss 0.1% rate 200mbit"}`: it sets
the fields it names, read with tc's grammar (topology.netem_grammar), as if
they had been written as fields. `LinkParams.netem_line()` is the line the tc
backend applies.

The semantics of every field are those of `tc-netem(8)`.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Annotated, Any, Literal

from schema import Float, Int, Range, Str, build, literal_values, schema
from topology import registry
from topology.netem_grammar import (
    MAX_GAP,
    MAX_LIMIT_PKTS,
    MAX_RATE_MBIT,
    MAX_TIME_MS,
    NetemSyntaxError,
    parse_netem,
    render_netem,
)
from topology.netem_options import FourStateLoss, Slot, check_distribution, is_table_file
from topology.rate_trace import TraceError, load_trace

PROFILE_DIR = Path(__file__).resolve().parent.parent / "netem_profiles"
# The names a distribution may have without a file; a user's table is a .dist file path (topology.netem_options).
DISTRIBUTIONS = ("uniform", "normal", "pareto", "paretonormal")
Direction = Literal["a_to_b", "b_to_a"]
DIRECTIONS = literal_values(Direction)
# netem's own default queue limit (packets); we never go below it.
NETEM_DEFAULT_LIMIT_PKTS = 1000
# Full-size Ethernet frame used to size a queue in packets from a BDP.
FRAME_BYTES = 1514
Pct = Annotated[Float, Range(0, 100)]
Ms = Annotated[Float, Range(0, MAX_TIME_MS)]


class ProfileError(ValueError):
    """A profile file or value is invalid; the message names file, field and allowed values."""


@schema
class GilbertElliott:
    """Gilbert-Elliott loss (netem `loss gemodel p r 1-h 1-k`).

    p_pct: good->bad transition probability per packet (%)
    r_pct: bad->good transition probability per packet (%)
    bad_loss_pct: loss probability in the bad state, netem's 1-h (%)
    good_loss_pct: loss probability in the good state, netem's 1-k (%)
    """

    p_pct: Pct
    r_pct: Pct = 100.0
    bad_loss_pct: Pct = 100.0
    good_loss_pct: Pct = 0.0

    def mean_loss_pct(self) -> float:
        """Stationary loss rate of the two-state chain (%)."""
        p, r = self.p_pct / 100, self.r_pct / 100
        if p + r == 0:
            return self.good_loss_pct
        bad_share = p / (p + r)
        return 100 * (bad_share * self.bad_loss_pct / 100 + (1 - bad_share) * self.good_loss_pct / 100)


# netem's loss models: exclusive, a direction sets one of them.
LOSS_MODELS = ("loss_pct", "loss_ge", "loss_state")
# Every field of LinkParams is one of these two kinds; a new netem field goes into one (a unit test holds it).
# What happens to single packets (dropped, doubled, flipped, reordered):
PACKET_IMPAIRMENTS = (
    "loss_pct", "loss_correlation_pct", "loss_ge", "loss_state", "duplicate_pct", "duplicate_correlation_pct",
    "corrupt_pct", "corrupt_correlation_pct", "reorder_pct", "reorder_correlation_pct", "reorder_gap"
)  # fmt: skip
# When packets leave, and how many wait:
TIMING = ("rate_mbit", "rate_packet_overhead_bytes", "rate_cell_bytes", "rate_cell_overhead_bytes", "rate_trace",
          "limit_pkts", "delay_ms", "jitter_ms", "delay_distribution", "delay_correlation_pct", "slot")  # fmt: skip
# tc reads the rate's overheads as s32 and the cell size as u32 (tc-netem(8) `rate`).
S32 = Annotated[Int, Range(-(2**31), 2**31 - 1)]


@schema
class LinkParams:
    """One direction of a link, with tc-netem semantics.

    rate_mbit: serialization rate (Mbit/s, 1e6 bit/s); 0 = unlimited
    rate_packet_overhead_bytes: added to each frame's length for the rate (bytes; may be negative)
    rate_cell_bytes: the rate counts whole cells of this size (bytes, e.g. 53 for ATM); 0 = no cells
    rate_cell_overhead_bytes: added to each cell (bytes; may be negative)
    rate_trace: a Mahimahi trace file instead of rate_mbit (topology.rate_trace); "" = none
    limit_pkts: queue limit (packets); 0 = derived: max(1000, in-delay + 2 x BDP)
    delay_ms: mean one-way delay added by the link (ms)
    jitter_ms: delay variation (ms): half-width for uniform, sigma otherwise
    delay_distribution: uniform | normal | pareto | paretonormal | a .dist file path (iproute2's format)
    delay_correlation_pct: correlation of successive delay draws (%)
    loss_pct: independent random loss (%)
    loss_correlation_pct: correlation of successive loss draws (%)
    loss_ge: Gilbert-Elliott loss model instead of loss_pct
    loss_state: 4-state Markov loss model instead of loss_pct
    duplicate_pct: packets sent twice (%)
    duplicate_correlation_pct: correlation of successive duplicate draws (%)
    corrupt_pct: packets with one flipped bit (%)
    corrupt_correlation_pct: correlation of successive corrupt draws (%)
    reorder_pct: packets sent at once, ahead of the delayed ones (%)
    reorder_correlation_pct: correlation of successive reorder draws (%)
    reorder_gap: reorder only every gap-th packet; 0 = netem's default
    slot: packet slotting (frames leave only in slots); None = none
    """

    rate_mbit: Annotated[Float, Range(0, MAX_RATE_MBIT)] = 0.0
    rate_packet_overhead_bytes: S32 = 0
    rate_cell_bytes: Annotated[Int, Range(0, 2**32 - 1)] = 0
    rate_cell_overhead_bytes: S32 = 0
    rate_trace: Str = ""
    limit_pkts: Annotated[Int, Range(0, MAX_LIMIT_PKTS)] = 0
    delay_ms: Ms = 0.0
    jitter_ms: Ms = 0.0
    delay_distribution: Str = "uniform"
    delay_correlation_pct: Pct = 0.0
    loss_pct: Pct = 0.0
    loss_correlation_pct: Pct = 0.0
    loss_ge: GilbertElliott | None = None
    loss_state: FourStateLoss | None = None
    duplicate_pct: Pct = 0.0
    duplicate_correlation_pct: Pct = 0.0
    corrupt_pct: Pct = 0.0
    corrupt_correlation_pct: Pct = 0.0
    reorder_pct: Pct = 0.0
    reorder_correlation_pct: Pct = 0.0
    reorder_gap: Annotated[Int, Range(0, MAX_GAP)] = 0
    slot: Slot | None = None

    def __post_init__(self) -> None:
        if sum(bool(getattr(self, name)) for name in LOSS_MODELS) > 1:
            raise ValueError("loss_pct, loss_ge and loss_state are exclusive; set one of them")
        try:
            check_distribution(self.delay_distribution)
        except ValueError as err:
            raise ValueError(f"delay_distribution: {err}") from None
        for name in ("duplicate", "corrupt", "reorder"):
            if getattr(self, f"{name}_correlation_pct") and not getattr(self, f"{name}_pct"):
                raise ValueError(f"{name}_correlation_pct: needs {name}_pct > 0 (it would change nothing)")
        self._check_rate()
        if self.reorder_pct and not self.delay_ms:
            raise ValueError("reorder_pct: reordering needs delay_ms > 0 (as in tc-netem)")
        if self.reorder_gap and not self.reorder_pct:
            raise ValueError("reorder_gap: needs reorder_pct > 0 (as in tc-netem)")
        if self.jitter_ms and self.delay_distribution != "uniform" and not self.delay_ms:
            raise ValueError(f"delay_distribution: {self.delay_distribution} needs delay_ms > 0 (tc-netem refuses it)")

    def _check_rate(self) -> None:
        if (self.rate_packet_overhead_bytes or self.rate_cell_bytes) and not self.rate_mbit:
            raise ValueError("rate_packet_overhead_bytes, rate_cell_bytes: need rate_mbit > 0 (tc's `rate` has them)")
        if self.rate_cell_overhead_bytes and not self.rate_cell_bytes:
            raise ValueError("rate_cell_overhead_bytes: needs rate_cell_bytes > 0 (it is added to each cell)")
        if self.rate_trace and self.rate_mbit:
            raise ValueError("rate_trace and rate_mbit are exclusive: the trace is the rate")
        if self.rate_trace:
            try:
                load_trace(self.rate_trace)
            except TraceError as err:
                raise ValueError(f"rate_trace: {err}") from None

    def lossless(self) -> LinkParams:
        """The same delay, jitter, rate and queue with nothing lost, duplicated, corrupted or reordered (the
        calibration's TCP goodput copy); the fields it clears are PACKET_IMPAIRMENTS, kept beside the fields."""
        return self.replace(**{name: LinkParams.__dataclass_fields__[name].default for name in PACKET_IMPAIRMENTS})

    @property
    def mean_rate_mbit(self) -> float:
        """The rate, or a rate trace's mean over one period (Mbit/s); 0: unlimited."""
        return self.rate_mbit or (load_trace(self.rate_trace).mean_rate_mbit() if self.rate_trace else 0.0)

    @property
    def effective_limit_pkts(self) -> int:
        """Queue limit actually applied: explicit, or derived so TCP can fill the link.

        netem counts every frame it holds, also those merely waiting out their
        delay, so the derived limit is the frames in flight inside the delay
        plus 2 round-trip BDPs of real buffer. With one BDP, TCP at 200 Mbit/s
        and 30 ms overflowed it in bursts and reached only 74-86% of the rate.
        With 1.5, BBR (the kernel default here; its cwnd is 2 x its BDP estimate,
        and it probes above that) overflowed wan-flaky's 2,048 frames (25 ms) from
        its second connection on, on a slower host: 157 of 200 Mbit/s with ~6,000
        retransmits per 8 s test, where 2,643 frames carried 191 in every test.
        """
        if self.limit_pkts:
            return self.limit_pkts
        # A rate trace sizes the queue by its mean rate (both backends: the tc one holds it while the rate moves).
        rate_mbit = self.mean_rate_mbit
        if not rate_mbit:
            return NETEM_DEFAULT_LIMIT_PKTS
        one_way_s = (self.delay_ms + 2 * self.jitter_ms) / 1000
        frames_per_s = rate_mbit * 1e6 / 8 / FRAME_BYTES
        in_delay_pkts = frames_per_s * one_way_s
        bdp_pkts = frames_per_s * 2 * one_way_s  # the reverse direction assumed alike
        return max(NETEM_DEFAULT_LIMIT_PKTS, math.ceil(in_delay_pkts + 2 * bdp_pkts))

    @property
    def expected_loss_pct(self) -> float:
        """Long-run loss rate this direction should show (%)."""
        model = self.loss_ge or self.loss_state
        return model.mean_loss_pct() if model else self.loss_pct

    def netem_line(self) -> str:
        """The netem arguments the tc backend applies to this direction, queue limit resolved (`limit 3303 ...`)."""
        return " ".join(render_netem(self, self.effective_limit_pkts))

    def replace(self, **changes: Any) -> "LinkParams":
        """A copy with some fields changed, validated."""
        return link_params_from_dict({**self.to_dict(), **changes}, where="<replace>")

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (for metadata.json and the emulator's control socket)."""
        return dataclasses.asdict(self)


@schema
class ScheduleStep:
    """A timed change of a live link.

    at_s: seconds after the schedule's start (the link coming up, or a variant's window opening)
    duration_s: revert to the previous parameters after this long (s); None = keep
    direction: both | a_to_b | b_to_a
    changes: LinkParams fields to change
    """

    at_s: Annotated[Float, Range(0)]
    changes: dict[str, Any]
    direction: Literal["both", "a_to_b", "b_to_a"] = "both"
    duration_s: Annotated[Float, Range(0)] | None = None

    def __post_init__(self) -> None:
        if self.duration_s == 0:
            raise ValueError("duration_s: must be > 0 or omitted")


@schema
class _StepFile:
    """A schedule step as written in YAML (`set:` is the changes)."""

    at_s: Annotated[Float, Range(0)]
    set: dict
    direction: Literal["both", "a_to_b", "b_to_a"] = "both"
    duration_s: Annotated[Float, Range(0)] | None = None


@schema
class _ProfileFile:
    """A profile file as written (see the module docstring): `link` holds both directions' common fields."""

    name: Str
    description: Any = ""
    link: dict | None = None
    a_to_b: dict | None = None
    b_to_a: dict | None = None
    schedule: list | None = None


@dataclasses.dataclass(frozen=True)
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

    def netem_lines(self) -> dict[str, str]:
        """Each direction's netem line as the tc backend applies it: {"a_to_b": "limit ...", "b_to_a": "limit ..."}."""
        return {d: self.direction(d).netem_line() for d in DIRECTIONS}

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


def link_params_from_dict(data: dict[str, Any], where: str) -> LinkParams:
    """Validate a mapping of LinkParams fields; `where` prefixes every error."""
    if isinstance(data, dict):
        data = {k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v for k, v in data.items()}
    return build(LinkParams, data, where, ProfileError)


def parse_schedule(data: Any, where: str) -> tuple[ScheduleStep, ...]:
    """Validate a list of schedule steps (a profile's `schedule`, or an experiment's); `where` prefixes errors."""
    if not isinstance(data, (list, tuple)):
        raise ProfileError(f"{where}: expected a list of steps")
    steps, last_at = [], 0.0
    for i, raw in enumerate(data):
        at = f"{where}[{i}]"
        step = build(_StepFile, raw, at, ProfileError)
        if step.at_s < last_at:
            raise ProfileError(
                f"{at}.at_s: {step.at_s} goes back in time (previous step at {last_at}); steps must be in order"
            )
        link_params_from_dict(step.set, f"{at}.set")  # validate the field names and values
        if step.duration_s == 0:
            raise ProfileError(f"{at}.duration_s: must be > 0 or omitted")
        steps.append(ScheduleStep(step.at_s, dict(step.set), step.direction, step.duration_s))
        last_at = step.at_s
    return tuple(steps)


def _link_fields(data: dict[str, Any] | None, where: str) -> dict[str, Any]:
    """A profile's `link`/`a_to_b`/`b_to_a` mapping as LinkParams fields: as written, or read from its netem line."""
    if not data or "netem" not in data:
        return data or {}
    if len(data) > 1:
        others = sorted(k for k in data if k != "netem")
        raise ProfileError(f"{where}: give a netem line or LinkParams fields, not both (also found {others})")
    line = data["netem"]
    if not isinstance(line, str):
        raise ProfileError(f"{where}.netem: expected a netem line (a string), got {line!r}")
    try:
        return parse_netem(line)
    except NetemSyntaxError as err:
        raise ProfileError(f"{where}.netem {line!r}: {err}") from None


def direction_from_dict(data: Any, where: str, folder: Path) -> LinkParams:
    """One direction written alone (a topology line's `forward`): LinkParams fields or a netem line, its files
    relative to `folder`; `where` prefixes every error."""
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: expected LinkParams fields or {{netem: LINE}}, got {data!r}")
    return link_params_from_dict(resolve_files(_link_fields(data, where), folder), where)


def resolve_files(fields: dict[str, Any], folder: Path) -> dict[str, Any]:
    """A direction's fields with its files (rate_trace, a .dist table of delay's or slot's) relative to `folder`."""

    def at(name: Any) -> Any:
        return str(folder / name) if isinstance(name, str) and name and not Path(name).is_absolute() else name

    out = dict(fields)
    if "rate_trace" in out:
        out["rate_trace"] = at(out["rate_trace"])
    if isinstance(out.get("delay_distribution"), str) and is_table_file(out["delay_distribution"]):
        out["delay_distribution"] = at(out["delay_distribution"])
    slot = out.get("slot")
    if isinstance(slot, dict) and isinstance(slot.get("distribution"), str) and is_table_file(slot["distribution"]):
        out["slot"] = {**slot, "distribution": at(slot["distribution"])}
    return out


def profile_from_dict(data: Any, source: str, path: Path | None = None) -> Profile:
    """Validate a whole profile mapping; `source` (a file name) prefixes every error; files a profile names
    (rate_trace, .dist tables) are relative to its own folder."""
    if isinstance(data, dict) and not data.get("name"):
        raise ProfileError(f"{source}: 'name' is required (a string)")
    f = build(_ProfileFile, data, source, ProfileError)
    folder = path.resolve().parent if path else Path.cwd()

    def link_fields(data: dict[str, Any] | None, where: str) -> dict[str, Any]:
        return resolve_files(_link_fields(data, where), folder)

    base = link_fields(f.link, f"{source}: link")
    # The link checked less its loss models (loss_ge, loss_state): it may hold one per direction, each direction
    # dropping the others (`loss_ge: null`); a direction's own set is checked whole below.
    build(LinkParams, {k: v for k, v in base.items() if k not in LOSS_MODELS[1:]}, f"{source}: link", ProfileError)
    dirs = {
        d: link_params_from_dict({**base, **link_fields(getattr(f, d), f"{source}: {d}")}, f"{source}: {d}")
        for d in DIRECTIONS
    }
    schedule = parse_schedule(f.schedule or [], f"{source}: schedule")
    return Profile(name=f.name, description=str(f.description), schedule=schedule, path=path, **dirs)


def schedule_end_s(schedule: tuple[ScheduleStep, ...]) -> float:
    """When a schedule's last event happens (s after its start): the latest step start or revert; 0 if empty."""
    return max((s.at_s + (s.duration_s or 0.0) for s in schedule), default=0.0)


def available_profiles(directory: Path = PROFILE_DIR) -> list[str]:
    """Names of the shipped profiles."""
    return registry.names(directory)


def load_profile(name_or_path: str | Path, directory: Path = PROFILE_DIR) -> Profile:
    """Load a profile by registry name or by path to a YAML file."""
    return registry.load(name_or_path, directory, "profile", ProfileError, profile_from_dict)
