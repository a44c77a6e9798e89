"""The simulator's event loop (experiments/sim/clock.py) against SimPy 4.1.2, which it replaces: the same random
processes (timeouts, events one process triggers for another, `a | b`, interrupts, processes started and waited
for, timers; a delay yielded where SimPy yields its Timeout) on both give the same trace, same-time events in the
same order."""

import random

import pytest
import simpy

from experiments.sim import clock

DELAYS = (0.0, 0.0, 0.5, 1.0, 1.5)  # few distinct times: many events fall on the same instant


def scenario(env, interrupt_cls, call_in, start, sleep, seed: int) -> list:
    """Processes that wait, trigger, interrupt and spawn each other at random, and sleepers that wait delays and
    trigger events (never interrupted); the trace of what ran when."""
    rng, trace, events, procs = random.Random(seed), [], [], []

    def timer(tag):
        trace.append((env.now, "timer", tag))
        if rng.random() < 0.3:
            events and not events[-1].triggered and events[-1].succeed(tag)

    def worker(name: str, steps: int):
        trace.append((env.now, "start", name))
        for i in range(steps):
            roll = rng.random()
            try:
                if roll < 0.35:
                    yield env.timeout(rng.choice(DELAYS))
                elif roll < 0.5:
                    ev = env.event()
                    events.append(ev)
                    env.timeout(rng.choice(DELAYS)).callbacks.append(lambda e, ev=ev: ev.triggered or ev.succeed(i))
                    trace.append((env.now, name, "got", (yield ev)))
                elif roll < 0.6 and events:
                    a, b = rng.choice(events), env.timeout(rng.choice(DELAYS))
                    yield a | b
                    trace.append((env.now, name, "any", a.triggered, b.processed))
                elif roll < 0.7 and events:
                    ev = rng.choice(events)
                    if not ev.triggered:
                        ev.succeed(name)
                    yield ev  # perhaps processed already: resumed at once
                elif roll < 0.8:
                    call_in(rng.choice(DELAYS), timer, f"{name}.{i}")
                elif roll < 0.87 and len(procs) < 40:
                    child = env.process(worker(f"{name}.{i}", rng.randint(1, 4)))
                    procs.append(child)
                    trace.append((env.now, name, "joined", (yield child)))
                elif roll < 0.93 and len(procs) < 40:
                    procs.append(start(env, worker(f"{name}~{i}", rng.randint(1, 4))))
                else:
                    alive = [p for p in procs if p.is_alive and p is not env.active_process]
                    if alive:
                        rng.choice(alive).interrupt(name)
                    yield env.timeout(rng.choice(DELAYS))
            except interrupt_cls as irq:
                trace.append((env.now, name, "interrupted by", irq.cause))
        trace.append((env.now, "end", name))
        return name

    def sleeper(name: str, steps: int):
        for i in range(steps):
            trace.append((env.now, name, "woke", (yield sleep(rng.choice(DELAYS)))))
            if events and rng.random() < 0.3 and not events[0].triggered:
                events[0].succeed(f"{name}.{i}")

    for k in range(6):
        procs.append(env.process(worker(f"p{k}", rng.randint(3, 12))))
        env.process(sleeper(f"s{k}", rng.randint(1, 8)))
    env.run()
    return trace


def on_simpy(seed: int) -> list:
    env = simpy.Environment()

    def call_in(delay, fn, arg):
        env.timeout(delay).callbacks.append(lambda _e: fn(arg))

    return scenario(env, simpy.Interrupt, call_in, lambda env, gen: env.process(gen), env.timeout, seed)


def on_clock(seed: int) -> list:
    env = clock.Environment()
    return scenario(env, clock.Interrupt, env.call_in, lambda env, gen: env.start(gen), lambda delay: delay, seed)


@pytest.mark.parametrize("seed", range(40))
def test_the_loop_runs_what_simpy_runs_in_simpys_order(seed):
    expected = on_simpy(seed)
    assert len(expected) > 20  # the scenario did something
    assert on_clock(seed) == expected


def test_run_until_stops_before_what_is_due_then():
    env, seen = clock.Environment(), []
    for t in (1.0, 2.0, 3.0):
        env.call_in(t, seen.append, t)
    env.run(until=2.0)
    assert (seen, env.now) == ([1.0], 2.0)
    env.run()
    assert seen == [1.0, 2.0, 3.0]


def test_a_failed_process_crashes_the_run_as_in_simpy():
    env = clock.Environment()

    def bad():
        yield env.timeout(1)
        raise KeyError("boom")

    env.process(bad())
    with pytest.raises(KeyError, match="boom"):
        env.run()


def test_a_process_waiting_for_a_delay_it_yielded_cannot_be_interrupted():
    env = clock.Environment()

    def sleeper():
        yield 2.0

    def interrupter(proc):
        yield 1.0
        proc.interrupt("now")

    env.process(interrupter(env.process(sleeper())))
    with pytest.raises(RuntimeError, match="cannot be interrupted"):
        env.run()
