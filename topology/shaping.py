"""Shaping backends behind one interface, and the timed schedule that drives them.

Responsible for: choosing a backend (`tc` | `userspace` | `auto`), each
backend's own wiring of the WAN (a host of its own on the wire, its
interfaces, its process) and LAN shaping, applying a direction's `LinkParams`
to the live WAN link, live profile swaps, and playing a profile's schedule.
Not responsible for: building the topology (`topology.net`, which asks the
backend what to wire and never branches on its name) or the per-packet
semantics (the kernel's netem, or `topology.netem_model`).

`auto` picks `tc` when the kernel accepts a netem qdisc and `userspace`
otherwise; the choice and its reason are logged and recorded in run metadata.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

from topology import lan_tbf, naming, tc
from topology.profiles import DIRECTIONS, LinkParams, Profile, ScheduleStep, schedule_end_s
from topology.trace_player import TracePlayer

log = logging.getLogger(__name__)
BACKENDS = ("auto", "tc", "userspace")

# Runs argv inside a named topology host (None: the root namespace), raising on failure.
HostRunner = Callable[[str | None, list[str]], str]
# The argv prefix that runs a command inside a named topology host's namespaces.
PrefixOf = Callable[[str], list[str]]


class ShapingError(RuntimeError):
    """A backend could not be chosen, started or applied."""


@dataclass(frozen=True)
class BackendChoice:
    """Which backend runs and why (recorded in every run's metadata)."""

    name: str
    requested: str
    reason: str


def choose_backend(requested: str) -> BackendChoice:
    """Resolve `auto` by asking the kernel for netem; validate explicit choices."""
    if requested not in BACKENDS:
        raise ShapingError(f"unknown shaping backend {requested!r}; allowed: {', '.join(BACKENDS)}")
    has_netem = tc.kernel_has_netem()
    if requested == "tc" and not has_netem:
        raise ShapingError("backend 'tc' needs sch_netem, which this kernel lacks; use --backend userspace or auto")
    if requested == "auto":
        name = "tc" if has_netem else "userspace"
        reason = "kernel has sch_netem" if has_netem else "kernel lacks sch_netem"
    else:
        name, reason = requested, "requested explicitly"
    choice = BackendChoice(name=name, requested=requested, reason=reason)
    log.info("shaping backend: %s (%s)", choice.name, choice.reason)
    return choice


class Backend(Protocol):
    """What the topology needs from a shaping backend: how to wire the WAN, and the link's shaping.

    wire_host: a host of the backend's own between the gateways (its interfaces `<wire_host>-eth0` towards
    gwa and `-eth1` towards gwb), or None: the gateways' WAN interfaces are joined directly.
    lan_shaping: what it does to the intra-cluster links, in words (run metadata).
    pid / exit_code: the backend's own process while it runs / its exit status once it died (None where
    it has none: the kernel shapes)."""

    name: str
    wire_host: str | None
    lan_shaping: str

    @property
    def pid(self) -> int | None: ...
    @property
    def exit_code(self) -> int | None: ...
    def wire_up(self) -> None: ...  # after addressing: the wire host's interfaces ready to carry frames
    def shape_lan(self, ends: list[tuple[str | None, str]], params: LinkParams) -> None: ...  # (host, dev)
    # every topology interface (host, dev; a switch's: host None): move the kernel's receive work off the
    # shaper's own core where it has one; what was done, for the run's metadata (None: nothing to do)
    def steer_receive(self, ends: list[tuple[str | None, str]]) -> dict | None: ...
    def start(self, a_to_b: LinkParams, b_to_a: LinkParams) -> None: ...
    def apply(self, direction: str, params: LinkParams) -> None: ...
    def stats(self) -> dict: ...
    def health(self) -> dict | None: ...  # the shaper's own health snapshot (userspace), None (kernel)
    def stop(self) -> None: ...


class TcBackend:
    """The kernel's netem as the root qdisc of each gateway's WAN interface."""

    name = "tc"
    wire_host = None
    lan_shaping = "netem"
    pid = None  # the kernel shapes: no process of its own
    exit_code = None

    def steer_receive(self, ends: list[tuple[str | None, str]]) -> None:
        """The kernel shapes in the senders' own context: no core of a shaper's to keep free."""

    def __init__(self, run: HostRunner, interfaces: dict[str, tuple[str, str]] | None = None):
        self._run = run
        # direction (a_to_b: the line's forward) -> (gateway, interface) whose egress shapes it
        self._interfaces = interfaces or naming.wan_interfaces()
        self._installed: set[str] = set()
        self._players: dict[str, TracePlayer] = {}  # directions with a rate trace (topology.trace_player)
        self._kept: dict[str, frozenset[str]] = {}  # direction -> what its netem holds that a change keeps (tc.kept_by)

    def _install(self, direction: str, params: LinkParams, verb: str) -> None:
        host, dev = self._interfaces[direction]
        old = self._players.pop(direction, None)
        if old:
            old.stop()
        kept = self._kept.get(direction, frozenset())
        stale = tc.stale_after_change(kept, params) if verb == "change" else ()
        if stale:
            # Reinstalled: a change would keep these in use (tc.stale_after_change). Queued packets are lost (logged).
            log.warning("%s: netem reinstalled to drop its %s (queued packets lost)", dev, ", ".join(stale))
            self._run(host, tc.delete_root_cmd(dev))
            verb, kept = "replace", frozenset()
        self._kept[direction] = tc.kept_after(kept, params) if verb == "change" else tc.kept_by(params)
        if not params.rate_trace:
            self._run(host, tc.netem_cmd(dev, params, verb))
            return
        player = TracePlayer(dev, params, lambda argv: self._run(host, argv))
        self._run(host, player.install_cmd(verb))
        self._players[direction] = player.start()

    def wire_up(self) -> None:
        """Nothing to bring up: the gateways are joined directly."""

    def shape_lan(self, ends: list[tuple[str | None, str]], params: LinkParams) -> None:
        """netem on both ends of every intra-cluster link (see README limits)."""
        for host, dev in ends:
            self._run(host, tc.netem_cmd(dev, params, "replace"))

    def start(self, a_to_b: LinkParams, b_to_a: LinkParams) -> None:
        """Install netem on both directions."""
        for direction, params in (("a_to_b", a_to_b), ("b_to_a", b_to_a)):
            self._install(direction, params, "replace")
            self._installed.add(direction)

    def apply(self, direction: str, params: LinkParams) -> None:
        """Change one direction in place (`tc qdisc change` keeps queued packets); a rate trace is replayed as
        netem rates per window (topology.trace_player)."""
        self._install(direction, params, "change")

    def health(self) -> None:
        """The kernel's netem keeps no lateness record of its own."""
        return None

    def stats(self) -> dict:
        """`tc -s qdisc` output per direction."""
        return {d: self._run(h, ["tc", "-s", "qdisc", "show", "dev", dev]) for d, (h, dev) in self._interfaces.items()}

    def stop(self) -> None:
        """Remove the qdiscs this backend installed."""
        for player in self._players.values():
            player.stop()
        self._players.clear()
        for direction in sorted(self._installed):
            host, dev = self._interfaces[direction]
            try:
                self._run(host, tc.delete_root_cmd(dev))
            except Exception as exc:  # the host may already be gone; log, keep tearing down
                log.warning("removing netem on %s:%s failed: %s", host, dev, exc)
        self._installed.clear()
        self._kept.clear()


def rps_cmd(dev: str, mask: int) -> list[str]:
    """The command (run in the interface's host) that steers its receive processing to the cores of `mask`
    (RPS). A host's /sys shows the machine's own namespace's interfaces, so the command mounts the host's
    sysfs in a mount namespace of its own first, in place of the one there (as `ip netns exec` does); dev and
    mask are the testbed's own names and numbers, never a user's."""
    path = f"/sys/class/net/{dev}/queues/rx-0/rps_cpus"
    return ["unshare", "--mount", "sh", "-c", f"umount -l /sys; mount -t sysfs sysfs /sys && echo {mask:x} > {path}"]


class UserspaceBackend:
    """The userspace emulator forwarding frames between a line's wire host's two interfaces (wan-eth0 and
    wan-eth1 for the default topology's one line)."""

    name = "userspace"
    wire_host = naming.WIRE

    def __init__(
        self,
        run: HostRunner,
        prefix_of: PrefixOf,
        control_path: Path,
        seed: int,
        log_path: Path | None,
        wire: str = naming.WIRE,
    ):
        self._run, self._prefix_of = run, prefix_of
        self.wire_host = wire
        self.lan_shaping = "none (the LAN not shaped yet)"
        self._control_path = control_path
        self._seed = seed
        self._log_path = log_path
        self._emulator = None

    def wire_up(self) -> None:
        """The wire host's two interfaces up and promiscuous: the forwarder sees every frame."""
        for dev in ("eth0", "eth1"):
            self._run(self.wire_host, ["ip", "link", "set", f"{self.wire_host}-{dev}", "promisc", "on", "up"])

    def shape_lan(self, ends: list[tuple[str | None, str]], params: LinkParams) -> None:
        """A token bucket on both ends of every intra-cluster link (topology.lan_tbf): the forwarder sits on
        the WAN only, and a Python hop on every LAN link would cost more than the LAN's delay. A profile that
        needs netem is refused before anything is installed. The qdiscs go with their interfaces at teardown."""
        reason = lan_tbf.refusal(params)
        if reason:
            raise ShapingError(reason)
        for host, dev in ends:
            for argv in lan_tbf.tbf_cmds(dev, params):
                self._run(host, argv)
        self.lan_shaping = lan_tbf.describe(params)

    @property
    def pid(self) -> int | None:
        """The forwarder's PID while it runs."""
        return self._emulator.pid if self._emulator else None

    def steer_receive(self, ends: list[tuple[str | None, str]]) -> dict | None:
        """Where the forwarder has a core of its own (two or more cores): every topology interface's receive
        processing (RPS) on the other cores, so that neither what the forwarder sends (routed, bridged, taken in
        by TCP) nor the roles' own bursts (a fast-path KV transfer, bridged in the sender's context) hold its
        core. The default experiment's p99 lateness: pd-cross 1.5-2.0 ms -> 0.2 ms (the gateways steered),
        pdd 1.7-2.8 ms -> 0.7-0.9 ms (every interface). An interface whose namespace refuses (a container's
        read-only sysfs) is listed, not an error: its traffic is already steered at the switch port before it."""
        from topology.userspace import forwarder_cpu, rps_mask

        cpu = forwarder_cpu()
        mask = rps_mask(cpu)
        if mask is None:
            return None
        done, refused = 0, []
        for host, dev in ends:
            try:
                self._run(host, rps_cmd(dev, mask))
                done += 1
            except Exception as exc:  # noqa: BLE001 - recorded in the run's metadata, not fatal
                log.debug("RPS on %s:%s refused: %s", host or "switch", dev, exc)
                refused.append(f"{host or 'switch'}:{dev}")
        return {"forwarder_cpu": cpu, "rps_mask": f"{mask:x}", "interfaces": done, "refused": refused}

    def start(self, a_to_b: LinkParams, b_to_a: LinkParams) -> None:
        """Start the forwarder in the wire host, on a core of its own where there are two or more (see
        steer_receive); wait until it answers."""
        from topology.emulator import UserspaceEmulator
        from topology.userspace import forwarder_cpu

        cpu = forwarder_cpu()
        self._emulator = UserspaceEmulator(
            if_a=f"{self.wire_host}-eth0",
            if_b=f"{self.wire_host}-eth1",
            a_to_b=a_to_b,
            b_to_a=b_to_a,
            control_path=self._control_path,
            seed=self._seed,
            prefix=self._prefix_of(self.wire_host),
            log_path=self._log_path,
            cpu=cpu,
        )
        self._emulator.start()

    @property
    def exit_code(self) -> int | None:
        """The forwarder's exit status once it has died (killed: the WAN no longer forwards); None while it
        runs (or before it started)."""
        return self._emulator.proc.poll() if self._emulator and self._emulator.proc else None

    def apply(self, direction: str, params: LinkParams) -> None:
        """Change one direction of the running emulator."""
        if self.exit_code is not None:
            raise RuntimeError(f"the userspace emulator is not running (exit status {self.exit_code})")
        self._emulator.set_params(direction, params)

    def stats(self) -> dict:
        """The emulator's per-direction counters ({} once it has died)."""
        if not self._emulator or self.exit_code is not None:
            return {}
        return {d: vars(c) for d, c in self._emulator.stats().items()}

    def health(self) -> dict | None:
        """The forwarder's health snapshot (topology.emulator.health_between compares two); None once it
        has died."""
        return self._emulator.health() if self._emulator and self.exit_code is None else None

    def stop(self) -> None:
        """Stop the forwarder (gracefully, then by its PID)."""
        if self._emulator:
            self._emulator.stop()
            self._emulator = None


def make_backend(
    choice: BackendChoice,
    run: HostRunner,
    prefix_of: PrefixOf,
    workdir: Path,
    seed: int,
    log_dir: Path,
    line: str = naming.WIRE,
    interfaces: dict[str, tuple[str, str]] | None = None,
) -> Backend:
    """The backend choice names, for one line (its wire host's name; interfaces: direction -> the gateway
    interface tc shapes) of a topology whose hosts run and prefix_of reach (workdir: its control socket;
    log_dir: its log, emulator.log for the default line `wan`, emulator-<line>.log for others)."""
    if choice.name == "tc":
        return TcBackend(run, interfaces)
    stem = "emulator" if line == naming.WIRE else f"emulator-{line}"
    return UserspaceBackend(run, prefix_of, workdir / f"{stem}.sock", seed, log_dir / f"{stem}.log", wire=line)


@dataclass
class AppliedChange:
    """One change the schedule (or a live swap) made, for the run's records.

    t_s: seconds after the link came up; t_ns: time.monotonic_ns() at the change (the roles' log clock)
    """

    t_s: float
    direction: str
    params: dict
    cause: str
    t_ns: int = 0


@dataclass
class LinkState:
    """The live WAN link: current parameters per direction and the log of changes."""

    backend: Backend
    current: dict[str, LinkParams]
    started_at: float = field(default_factory=time.monotonic)
    changes: list[AppliedChange] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def set(self, direction: str, params: LinkParams, cause: str) -> AppliedChange:
        """Apply params to one direction and record it."""
        with self._lock:
            self.backend.apply(direction, params)
            self.current[direction] = params
            now_ns = time.monotonic_ns()
            change = AppliedChange(round(now_ns / 1e9 - self.started_at, 4), direction, params.to_dict(), cause, now_ns)
            self.changes.append(change)
        log.info("link %s <- %s (%s)", direction, _brief(params), cause)
        return change

    def swap_profile(self, profile: Profile) -> None:
        """Replace both directions with a new profile's (live)."""
        for direction in DIRECTIONS:
            self.set(direction, profile.direction(direction), f"profile {profile.name}")

    def restore(self, base: dict[str, LinkParams], cause: str) -> list[AppliedChange]:
        """Set every direction that differs from base back to it (a direction already there is left alone:
        the userspace backend would restart its random state for nothing)."""
        return [self.set(d, base[d], cause) for d in DIRECTIONS if self.current[d] != base[d]]


def _brief(p: LinkParams) -> str:
    return f"rate={p.rate_mbit}Mbit delay={p.delay_ms}ms jitter={p.jitter_ms}ms loss={p.expected_loss_pct:.3g}%"


def _step_directions(step: ScheduleStep) -> tuple[str, ...]:
    return DIRECTIONS if step.direction == "both" else (step.direction,)


def merge_schedules(*sources: tuple[str, tuple[ScheduleStep, ...]]) -> tuple[tuple[ScheduleStep, ...], tuple[str, ...]]:
    """Several schedules played as one: (steps in start order, a cause label per step).

    sources: (label, steps) pairs, e.g. ("profile wan-flaky", ...), ("spec", ...); a step's cause is
    "<label> step <i>" with i its index in its own source. Steps starting together keep the sources' order.
    """
    tagged = [(step, f"{label} step {i}") for label, steps in sources for i, step in enumerate(steps)]
    tagged.sort(key=lambda t: t[0].at_s)  # stable
    return tuple(t[0] for t in tagged), tuple(t[1] for t in tagged)


class ScheduleRunner:
    """Plays a schedule on a live link from a background thread; the handle of `Testbed.play_schedule`.

    state: the live link; schedule: the steps; start_ns: the clock's zero (time.monotonic_ns(); None =
    when the link came up); labels: a cause per step (default "schedule step <i>")
    """

    def __init__(
        self,
        state: LinkState,
        schedule: tuple[ScheduleStep, ...],
        start_ns: int | None = None,
        labels: tuple[str, ...] | None = None,
    ):
        self._state = state
        self.start_ns = round(state.started_at * 1e9) if start_ns is None else start_ns
        self._labels = labels or tuple(f"schedule step {i}" for i in range(len(schedule)))
        self._events = timeline(schedule, self.start_ns)
        self.end_ns = self.start_ns + round(schedule_end_s(schedule) * 1e9)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="netem-schedule", daemon=True)
        self.error: Exception | None = None

    def start(self) -> "ScheduleRunner":
        """Start playing (no-op for an empty schedule)."""
        if self._events:
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop before the next change."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def wait(self, timeout_s: float) -> bool:
        """Wait until every change has been played (or the runner stopped); True when it has."""
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        return not self._thread.is_alive()

    @property
    def running(self) -> bool:
        """True while changes remain to be played."""
        return self._thread.is_alive()

    def check(self) -> None:
        """Raise ShapingError if a change failed (the thread stopped there)."""
        if self.error is not None:
            raise ShapingError(f"schedule failed: {self.error}") from self.error

    def _run(self) -> None:
        saved: dict[tuple[int, str], dict] = {}
        for due_ns, index, step, revert in self._events:
            wait_s = (due_ns - time.monotonic_ns()) / 1e9
            if wait_s > 0 and self._stop.wait(wait_s):
                return
            if self._stop.is_set():
                return
            try:
                self._play(index, step, revert, saved)
            except Exception as exc:  # surfaced by the owner: check() / Testbed.check()
                log.error("%s failed: %s", self._labels[index], exc)
                self.error = exc
                return

    def _play(self, index: int, step: ScheduleStep, revert: bool, saved: dict) -> None:
        cause = self._labels[index]
        for direction in _step_directions(step):
            current = self._state.current[direction]
            self._state.set(
                direction, played(current, index, direction, step, revert, saved), f"{cause} ends" if revert else cause
            )


def played(
    current: LinkParams, index: int, direction: str, step: ScheduleStep, revert: bool, saved: dict
) -> LinkParams:
    """A direction's parameters after step `index` begins (its changes; saved keeps the fields they replace) or
    ends (revert: those fields as they were before it)."""
    if revert:
        return current.replace(**saved.pop((index, direction)))
    saved[(index, direction)] = {k: current.to_dict()[k] for k in step.changes}
    return current.replace(**step.changes)


def link_states(start: dict[str, LinkParams], schedule: tuple[ScheduleStep, ...]) -> list[tuple[float, dict]]:
    """What a schedule does to a link, as the shaper plays it: (s from the schedule's start, direction ->
    LinkParams) after each change or revert, in time order (the simulator's line: experiments.sim)."""
    current, saved, out = dict(start), {}, []
    for at_s, index, step, revert in _expand(schedule):
        for direction in _step_directions(step):
            current[direction] = played(current[direction], index, direction, step, revert, saved)
        out.append((at_s, dict(current)))
    return out


def _expand(schedule: tuple[ScheduleStep, ...]) -> list[tuple[float, int, ScheduleStep, bool]]:
    """(time, step index, step, is_revert), in time order; reverts of equal time first."""
    events = [(s.at_s, i, s, False) for i, s in enumerate(schedule)]
    events += [(s.at_s + s.duration_s, i, s, True) for i, s in enumerate(schedule) if s.duration_s]
    return sorted(events, key=lambda e: (e[0], not e[3], e[1]))


def timeline(schedule: tuple[ScheduleStep, ...], start_ns: int) -> list[tuple[int, int, ScheduleStep, bool]]:
    """The schedule on a clock that starts at start_ns: (due time.monotonic_ns(), step index, step, is_revert)."""
    return [(start_ns + round(at_s * 1e9), i, step, revert) for at_s, i, step, revert in _expand(schedule)]
