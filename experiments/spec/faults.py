"""Faults a spec plays in each variant's window: a role, the load generator or the WAN's emulator killed on cue.

Responsible for: the spec's `faults:` entries (`Fault`: what is SIGKILLed, when
on the variant's clock or on which event after it, in which variants) and their
validation.
Not responsible for: playing them (experiments.run.faults.FaultPlayer), how a
target is killed, or what the system makes of it.
"""

from __future__ import annotations

import re

from schema import Float, Str, schema

TARGETS = ("p", "rld", "md", "router", "loadgen", "emulator")


@schema
class Fault:
    """One `faults:` entry.

    kill: p | rld | md | router (the role's process, or its container) | loadgen (the load generator) |
      emulator (the userspace WAN emulator: the WAN stops forwarding for the rest of the run)
    at_s: when, seconds after the variant's window opened (the load generator's t0)
    variants: the variants it plays in; empty = every variant
    after: an event name: the kill waits, from at_s on, for the first such event any role logs (an event
      with a `final` field counts only when final: `handoff_end` = the MD took a request over), and is
      not played if none comes in the window; "" = at at_s. Faults play in time order: one waiting for
      its cue holds back those after it.
    """

    kill: Str
    at_s: Float
    variants: tuple[Str, ...] = ()
    after: Str = ""


def validate(
    faults: tuple[Fault, ...], variants: tuple[str, ...], window_s: float, workers: tuple[str, ...] = ()
) -> None:
    """Raise ValueError naming the entry: an unknown target, a time outside the window, an unknown variant, a
    target twice. workers: the deployment's worker names (md2 ...), targets besides TARGETS (a role: its first)."""
    seen: set[tuple[str, str]] = set()
    for i, f in enumerate(faults):
        where = f"faults[{i}]"
        if f.kill not in (*TARGETS, *workers):
            raise ValueError(f"{where}.kill={f.kill!r}; allowed: {[*TARGETS, *workers]}")
        if not 0 <= f.at_s < window_s:
            raise ValueError(f"{where}.at_s={f.at_s}: must lie in the variant's window [0, {window_s}) s")
        if f.after and not re.fullmatch(r"[a-z][a-z_]*", f.after):
            raise ValueError(f"{where}.after={f.after!r}: an event name (lower case and '_'), e.g. handoff_end")
        unknown = [v for v in f.variants if v not in variants]
        if unknown:
            raise ValueError(f"{where}.variants: {unknown} not among the spec's variants {list(variants)}")
        if f.kill == "emulator" and tuple(f.variants or variants) != variants[-1:]:
            raise ValueError(
                f"{where}: the emulator stays dead once killed (the WAN no longer forwards): kill it only in the "
                f"spec's last variant, variants: [{variants[-1]}]"
            )
        for v in f.variants or variants:
            if (f.kill, v) in seen:
                raise ValueError(f"{where}: {f.kill} is killed twice in variant {v} (it stays dead after the first)")
            seen.add((f.kill, v))


def for_variant(faults: tuple[Fault, ...], variant: str) -> tuple[Fault, ...]:
    """The faults that play in one variant, in time order."""
    return tuple(sorted((f for f in faults if not f.variants or variant in f.variants), key=lambda f: f.at_s))
