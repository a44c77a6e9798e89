"""Timed schedules on a live link, played against a recording backend (pure logic, short real time)."""

import time

import pytest

from topology.profiles import LinkParams, ScheduleStep, schedule_end_s
from topology.shaping import LinkState, ScheduleRunner, ShapingError, _expand, merge_schedules, timeline


class RecordingBackend:
    name = "recording"

    def __init__(self):
        self.applied = []

    def apply(self, direction, params):
        self.applied.append((direction, params))


def test_expand_orders_steps_and_reverts():
    steps = (ScheduleStep(at_s=1, changes={"loss_pct": 5}, duration_s=2), ScheduleStep(at_s=3, changes={"delay_ms": 9}))
    assert [(t, i, rev) for t, i, _, rev in _expand(steps)] == [(1, 0, False), (3, 0, True), (3, 1, False)]


def test_schedule_applies_and_reverts_only_changed_fields():
    base = LinkParams(delay_ms=10, loss_pct=0.1)
    backend = RecordingBackend()
    state = LinkState(backend=backend, current={"a_to_b": base, "b_to_a": base})
    steps = (ScheduleStep(at_s=0.05, changes={"loss_pct": 5}, duration_s=0.1, direction="a_to_b"),)
    runner = ScheduleRunner(state, steps)
    runner.start()
    time.sleep(0.4)
    runner.stop()
    assert runner.error is None
    assert [(d, p.loss_pct) for d, p in backend.applied] == [("a_to_b", 5), ("a_to_b", 0.1)]
    assert state.current["a_to_b"] == base and state.current["b_to_a"] == base
    starts = [c.t_s for c in state.changes]
    assert 0.04 <= starts[0] < starts[1] and starts[1] - starts[0] >= 0.09


def test_stop_cancels_future_steps():
    backend = RecordingBackend()
    state = LinkState(backend=backend, current={"a_to_b": LinkParams(), "b_to_a": LinkParams()})
    runner = ScheduleRunner(state, (ScheduleStep(at_s=30, changes={"loss_pct": 1}),))
    runner.start()
    runner.stop()
    assert backend.applied == []


class FailingBackend(RecordingBackend):
    """Refuses every change, as a failed `tc qdisc change` would."""

    def apply(self, direction, params):
        raise RuntimeError("tc: RTNETLINK answers: Invalid argument")


def _base_state(backend, params=LinkParams(delay_ms=10)):
    return LinkState(backend=backend, current={"a_to_b": params, "b_to_a": params})


def test_timeline_puts_the_schedule_on_a_variant_clock():
    steps = (
        ScheduleStep(at_s=1.5, changes={"loss_pct": 5}, duration_s=2),
        ScheduleStep(at_s=3.5, changes={"delay_ms": 9}),
    )
    start_ns = 7_000_000_000
    got = [(due, i, rev) for due, i, _, rev in timeline(steps, start_ns)]
    assert got == [
        (start_ns + 1_500_000_000, 0, False),
        (start_ns + 3_500_000_000, 0, True),
        (start_ns + 3_500_000_000, 1, False),
    ]


def test_merge_keeps_each_source_label_and_start_order():
    profile = (ScheduleStep(at_s=10, changes={"loss_pct": 5}), ScheduleStep(at_s=40, changes={"loss_pct": 20}))
    spec = (ScheduleStep(at_s=10, changes={"delay_ms": 80}), ScheduleStep(at_s=20, changes={"loss_pct": 100}))
    steps, labels = merge_schedules(("profile wan-flaky", profile), ("spec", spec))
    assert [s.at_s for s in steps] == [10, 10, 20, 40]
    assert labels == ("profile wan-flaky step 0", "spec step 0", "spec step 1", "profile wan-flaky step 1")
    assert schedule_end_s(steps) == 40
    assert schedule_end_s((ScheduleStep(at_s=5, changes={}, duration_s=7),)) == 12 and schedule_end_s(()) == 0


def test_schedule_starts_at_the_given_clock_and_records_monotonic_times():
    backend = RecordingBackend()
    state = _base_state(backend)
    start_ns = time.monotonic_ns() + 100_000_000  # the variant's window opens 0.1 s from now
    runner = ScheduleRunner(
        state,
        (ScheduleStep(at_s=0.05, changes={"loss_pct": 5}, direction="b_to_a"),),
        start_ns=start_ns,
        labels=("spec step 0",),
    ).start()
    assert runner.wait(2)
    [change] = state.changes
    assert change.cause == "spec step 0" and change.direction == "b_to_a"
    assert start_ns + 50_000_000 <= change.t_ns < start_ns + 50_000_000 + 200_000_000
    assert runner.end_ns == start_ns + 50_000_000


def test_a_failed_change_surfaces_through_check():
    state = _base_state(FailingBackend())
    runner = ScheduleRunner(state, (ScheduleStep(at_s=0, changes={"loss_pct": 5}),)).start()
    runner.wait(2)
    with pytest.raises(ShapingError, match="schedule failed: tc: RTNETLINK"):
        runner.check()


def test_restore_changes_only_directions_off_their_base():
    backend = RecordingBackend()
    base = LinkParams(delay_ms=10)
    state = _base_state(backend, base)
    state.set("a_to_b", base.replace(loss_pct=100), "outage")
    changes = state.restore({"a_to_b": base, "b_to_a": base}, "restore profile base")
    assert [(c.direction, c.cause) for c in changes] == [("a_to_b", "restore profile base")]
    assert state.current["a_to_b"] == base and len(backend.applied) == 2
