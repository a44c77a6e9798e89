"""The simulator's event loop: SimPy 4.1.2's order of events for what experiments/sim uses, at less cost per event.

Responsible for: `Environment` (the clock, `now`, and the queue of what happens next, in SimPy's order: by time,
then urgent before normal, then the order they were scheduled in), `Event` (succeed; callbacks, run in the order
they were added; triggered, processed, value; `a | b`), `Timeout`, `Process` (a generator that yields events and
is resumed with their values, started by an urgent event as SimPy starts one; `interrupt` throws `Interrupt` into
it), and three things SimPy has no word for: `Environment.call_in` (fn(arg) at now + delay: a timer that is no
event, where SimPy needs a Timeout whose callback calls fn), `Environment.start` (a process whose end nobody
waits for: no event at its end) and a process's `yield delay` (a Timeout's wait without the Timeout).
Not responsible for: what is simulated (experiments.sim.pipeline, .workers, .wan, .kvroom).

Why not SimPy (issue 30: the published deployment at >= 10,000 requests simulated per second). A published-scale
run is ~20 events a request (bench_sim's pd-cross: 197,644 for 10,000 requests, 45% of them timers whose one
callback calls a function, 10,000 the ends of processes nobody waits for), and SimPy spends on each what the model
does not need: a Timeout object, its callback list, a lambda, `Environment.step`'s call and checks (a chain of
300,000 timers, each scheduling the next: 1.0 us a timer in SimPy, 0.55 us as `call_in` here, this machine). Here
a queue entry is (time, priority, sequence, fn, arg) and the loop calls fn(arg): an event's entry processes the
event (its callbacks), a timer's calls its function. The order is SimPy's entry for entry: each entry is pushed
where SimPy pushes its event, with the same time and priority and a sequence number from the same kind of counter;
the entries SimPy has and this loop does not (a `start`ed process's end, which has no callbacks) did nothing when
processed, so leaving them out moves nothing else. tests/unit/test_sim_clock.py runs the same random processes on
both and compares the traces; the simulator's records are byte-identical to SimPy's (docs/simulator.md, "Scale").
"""

from __future__ import annotations

from heapq import heappop, heappush
from itertools import count

URGENT, NORMAL = 0, 1  # SimPy's priorities: a process's start and an interruption go before other same-time events
PENDING = object()  # an event's value before it is triggered


class Interrupt(Exception):
    """Thrown into a process by Process.interrupt(cause)."""

    @property
    def cause(self):
        return self.args[0]


class Event:
    """Something that happens at one instant: succeed(value) schedules it now; then its callbacks run, each
    called with the event, in the order they were added, and `callbacks` becomes None (processed)."""

    __slots__ = ("env", "callbacks", "_value", "_ok", "_defused")

    def __init__(self, env: Environment):
        self.env, self.callbacks, self._value, self._defused = env, [], PENDING, False

    @property
    def triggered(self) -> bool:
        return self._value is not PENDING

    @property
    def processed(self) -> bool:
        return self.callbacks is None

    @property
    def ok(self) -> bool:
        return self._ok

    @property
    def value(self):
        if self._value is PENDING:
            raise AttributeError(f"value of {self!r} is not yet available")
        return self._value

    def succeed(self, value=None) -> Event:
        if self._value is not PENDING:
            raise RuntimeError(f"{self!r} has already been triggered")
        self._ok, self._value = True, value
        env = self.env
        heappush(env._queue, (env.now, NORMAL, next(env._seq), env._process, self))
        return self

    def fail(self, exception: BaseException) -> Event:
        """Scheduled as succeed schedules it, but failed: its exception is thrown into the processes waiting."""
        self.succeed(exception)._ok = False
        return self

    def __or__(self, other: Event) -> AnyOf:
        return AnyOf(self.env, (self, other))


class Timeout(Event):
    """An event that happens delay seconds from now (value: its value)."""

    __slots__ = ()

    def __init__(self, env: Environment, delay: float, value=None):
        if delay < 0:
            raise ValueError(f"negative delay {delay}")
        self.env, self.callbacks, self._value, self._ok, self._defused = env, [], value, True, False
        heappush(env._queue, (env.now + delay, NORMAL, next(env._seq), env._process, self))


class AnyOf(Event):
    """Happens once any of its events has been processed (SimPy's Condition.any_events); fails when one fails."""

    __slots__ = ("_events",)

    def __init__(self, env: Environment, events: tuple[Event, ...]):
        super().__init__(env)
        self._events = events
        for event in events:
            if event.callbacks is None:
                self._check(event)
            else:
                event.callbacks.append(self._check)
        self.callbacks.append(self._drop_checks)

    def _check(self, event: Event) -> None:
        if self._value is not PENDING:
            return
        if not event._ok:
            event._defused = True
            self.fail(event._value)
        else:
            self.succeed()

    def _drop_checks(self, _event: Event) -> None:
        for event in self._events:
            if event.callbacks and self._check in event.callbacks:
                event.callbacks.remove(self._check)


class Process(Event):
    """A generator run as SimPy runs one: started by an urgent event now; each event it yields resumes it with
    the event's value once processed (at once if it already was; a failed event's exception is thrown into it);
    the process is itself an event that happens when the generator returns (its value: the return value). It may
    also yield a delay (s, a number): resumed after it with None, as after `yield env.timeout(delay)`, the same
    queue entry without the Timeout (it cannot be interrupted meanwhile)."""

    __slots__ = ("_generator", "_target", "_waited")

    def __init__(self, env: Environment, generator, waited: bool = True):
        self.env, self.callbacks, self._value, self._defused = env, [], PENDING, False
        self._generator, self._target, self._waited = generator, None, waited
        heappush(env._queue, (env.now, URGENT, next(env._seq), self._resume, _STARTED))

    @property
    def is_alive(self) -> bool:
        return self._value is PENDING

    def interrupt(self, cause=None) -> None:
        """Throw Interrupt(cause) into the process, at once but after what is due now with urgent priority."""
        if self._value is not PENDING:
            raise RuntimeError(f"{self!r} has terminated and cannot be interrupted")
        if self is self.env.active_process:
            raise RuntimeError("a process is not allowed to interrupt itself")
        env = self.env
        heappush(env._queue, (env.now, URGENT, next(env._seq), self._interrupted, Interrupt(cause)))

    def _interrupted(self, interrupt: Interrupt) -> None:
        if self._value is not PENDING:  # it ended since
            return
        if self._target is _ASLEEP:
            raise RuntimeError(f"{self!r} waits for a delay it yielded and cannot be interrupted: yield a Timeout")
        self._target.callbacks.remove(self._resume)
        failed = Event(self.env)
        failed._ok, failed._value = False, interrupt
        self._resume(failed)

    def _resume(self, event: Event) -> None:
        env = self.env
        env.active_process = self
        send, resume = self._generator.send, self._resume
        while True:
            try:
                if event._ok:
                    event = send(event._value)
                else:
                    event._defused = True
                    exc = type(event._value)(*event._value.args)
                    exc.__cause__ = event._value
                    event = self._generator.throw(exc)
            except StopIteration as stop:
                self._ok, self._value, event = True, stop.value, None
                if self._waited:
                    heappush(env._queue, (env.now, NORMAL, next(env._seq), env._process, self))
                break
            except BaseException as err:
                self._ok, self._value, event = False, err, None
                heappush(env._queue, (env.now, NORMAL, next(env._seq), env._process, self))
                break
            if event.__class__ is float or event.__class__ is int:  # a delay: resumed after it, as by a Timeout
                if event < 0:
                    raise ValueError(f"negative delay {event}")
                heappush(env._queue, (env.now + event, NORMAL, next(env._seq), resume, _STARTED))
                event = _ASLEEP
                break
            callbacks = event.callbacks
            if callbacks is not None:
                callbacks.append(resume)
                break
        self._target = event
        env.active_process = None


class _Started:
    """What a process's start resumes it with (SimPy's Initialize: ok, value None)."""

    __slots__ = ()
    _ok, _value = True, None


_STARTED = _Started()
_ASLEEP = _Started()  # what a process that yielded a delay waits for


class _Stop(Exception):
    """Ends Environment.run at its until."""


def _stop(_arg) -> None:
    raise _Stop


class Environment:
    """The clock and the queue. now: the simulated time (s); active_process: the process running, if any."""

    def __init__(self, initial_time: float = 0.0):
        self.now, self.active_process = initial_time, None
        self._queue: list[tuple] = []
        self._seq = count()

    def event(self) -> Event:
        return Event(self)

    def timeout(self, delay: float, value=None) -> Timeout:
        return Timeout(self, delay, value)

    def process(self, generator) -> Process:
        """Run generator as a process; the returned process is an event at its end."""
        return Process(self, generator)

    def start(self, generator) -> Process:
        """Run generator as a process whose end nobody waits for (no event at its end: yield it or add callbacks
        to it and they never run)."""
        return Process(self, generator, waited=False)

    def call_in(self, delay: float, fn, arg=None) -> None:
        """fn(arg) at now + delay, where SimPy would process a Timeout(delay) whose one callback calls it."""
        if delay < 0:
            raise ValueError(f"negative delay {delay}")
        heappush(self._queue, (self.now + delay, NORMAL, next(self._seq), fn, arg))

    def peek(self) -> float:
        return self._queue[0][0] if self._queue else float("inf")

    def run(self, until: float | None = None) -> None:
        """Process everything scheduled, in order, until nothing is left (until: or until that time, before what
        is due then, as SimPy stops)."""
        if until is not None:
            if until <= self.now:
                raise ValueError(f"until ({until}) must be later than now ({self.now})")
            heappush(self._queue, (self.now + (until - self.now), URGENT, next(self._seq), _stop, None))
        queue, pop = self._queue, heappop
        try:
            while queue:
                self.now, _, _, fn, arg = pop(queue)
                fn(arg)
        except _Stop:
            pass

    def _process(self, event: Event) -> None:
        callbacks, event.callbacks = event.callbacks, None
        for callback in callbacks:
            callback(event)
        if not event._ok and not event._defused:
            exc = type(event._value)(*event._value.args)
            exc.__cause__ = event._value
            raise exc
