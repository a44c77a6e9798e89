"""Faults a spec plays in each variant's window: a target killed, a role hung for a while or its KV port flooded.

Responsible for: the spec's `faults:` entries (`Fault`: what is SIGKILLed, SIGSTOPped for a while or flooded
with hostile KV connections, when on the variant's clock or on which event after it, in which variants) and
their validation.
Not responsible for: playing them (experiments.run.faults.FaultPlayer), how a target is killed, or what the
system makes of it.
"""

from __future__ import annotations

import re

from schema import Float, Str, schema

TARGETS = ("p", "rld", "md", "router", "loadgen", "emulator")
STOP_TARGETS = ("p", "rld", "md", "router")  # roles: a process that can hang
HOSTILE_TARGETS = ("rld", "md")  # the roles with a KV receiver (experiments.spec.deployment.KV_PORTS)
KINDS = ("kill", "stop", "hostile_kv")
STOP_RUNTIMES = ("process",)  # docker: the role is a container (SIGSTOP of its docker client does not reach it)
HOSTILE_RUNTIMES = ("process", "docker")  # ray: the roles may run on other machines, outside our namespaces


@schema
class Fault:
    """One `faults:` entry: exactly one of kill, stop, hostile_kv names its target.

    kill: p | rld | md | router (the role's process, or its container) | loadgen (the load generator) |
      emulator (the userspace WAN emulator: the WAN stops forwarding for the rest of the run)
    stop: p | rld | md | router: the role's process SIGSTOPped at at_s and SIGCONTed duration_s later (a hung
      role; always resumed, also when the window ends first; runtime process only)
    hostile_kv: md | rld: abusive connections to the role's KV port from the client host for duration_s
      (experiments.run.hostile_peer: empty and tiny LAYER frames before BEGIN, a frame dripped byte by byte,
      idle connections)
    at_s: when, seconds after the variant's window opened (the load generator's t0)
    duration_s: how long a stop or hostile_kv lasts (at_s + duration_s inside the window); not for kill
    variants: the variants it plays in; empty = every variant
    after: an event name: the fault waits, from at_s on, for the first such event any role logs (an event
      with a `final` field counts only when final: `handoff_end` = the MD took a request over), and is
      not played if none comes in the window; "" = at at_s. Faults play in time order: one waiting for
      its cue holds back those after it.
    """

    kill: Str = ""
    at_s: Float | None = None
    variants: tuple[Str, ...] = ()
    after: Str = ""
    stop: Str = ""
    hostile_kv: Str = ""
    duration_s: Float = 0.0

    @property
    def kind(self) -> str:
        """kill, stop or hostile_kv: the first the entry sets (validate: exactly one)."""
        return next((k for k in KINDS if getattr(self, k)), "kill")

    @property
    def target(self) -> str:
        return getattr(self, self.kind)


def validate(
    faults: tuple[Fault, ...],
    variants: tuple[str, ...],
    window_s: float,
    workers: tuple[str, ...] = (),
    runtime: str = "process",
) -> None:
    """Raise ValueError naming the entry and field: not exactly one of kill/stop/hostile_kv, an unknown target,
    a time or a duration outside the window, an unknown variant, a target killed twice, a fault the runtime
    cannot play. workers: the deployment's worker names (md2 ...), targets besides TARGETS (a role: its first)."""
    seen: set[tuple[str, str]] = set()
    for i, f in enumerate(faults):
        where = f"faults[{i}]"
        _check_kind(f, where, workers, runtime)
        if f.at_s is None:
            raise ValueError(f"{where}.at_s: required (seconds after the variant's window opened)")
        if not 0 <= f.at_s < window_s:
            raise ValueError(f"{where}.at_s={f.at_s}: must lie in the variant's window [0, {window_s}) s")
        _check_duration(f, where, window_s)
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
        for v in f.variants or variants if f.kill else ():
            if (f.kill, v) in seen:
                raise ValueError(f"{where}: {f.kill} is killed twice in variant {v} (it stays dead after the first)")
            seen.add((f.kill, v))


def _check_kind(f: Fault, where: str, workers: tuple[str, ...], runtime: str) -> None:
    """Exactly one of kill, stop, hostile_kv, naming a target of its kind the runtime can play."""
    given = [k for k in KINDS if getattr(f, k)]
    if len(given) != 1:
        what = f"it has {' and '.join(given)}" if given else "it has none"
        raise ValueError(f"{where}: one of {list(KINDS)} per entry, naming its target; {what}")
    roles_of = {"kill": TARGETS, "stop": STOP_TARGETS, "hostile_kv": HOSTILE_TARGETS}[f.kind]
    allowed = [*roles_of, *(w for w in workers if f.kind == "kill" or w.rstrip("0123456789") in roles_of)]
    if f.target not in allowed:
        raise ValueError(f"{where}.{f.kind}={f.target!r}; allowed: {allowed}")
    runtimes = {"kill": (runtime,), "stop": STOP_RUNTIMES, "hostile_kv": HOSTILE_RUNTIMES}[f.kind]
    if runtime not in runtimes:
        why = {
            "stop": "a role's process runs in a container there, out of reach of SIGSTOP",
            "hostile_kv": "its roles may run on other machines, outside this machine's namespaces",
        }[f.kind]
        raise ValueError(f"{where}.{f.kind}: not under runtime {runtime} ({why}); runtimes: {list(runtimes)}")


def _check_duration(f: Fault, where: str, window_s: float) -> None:
    if f.kind == "kill":
        if f.duration_s:
            raise ValueError(f"{where}.duration_s={f.duration_s}: only for stop and hostile_kv (a kill is for good)")
        return
    if not 0 < f.duration_s <= window_s - f.at_s:
        raise ValueError(
            f"{where}.duration_s={f.duration_s}: must be above 0 and end inside the variant's window "
            f"(at_s + duration_s <= {window_s} s)"
        )


def for_variant(faults: tuple[Fault, ...], variant: str) -> tuple[Fault, ...]:
    """The faults that play in one variant, in time order."""
    return tuple(sorted((f for f in faults if not f.variants or variant in f.variants), key=lambda f: f.at_s or 0.0))
