"""Timed schedules on a live link, played against a recording backend (pure logic, short real time)."""
import time

from topology.profiles import LinkParams, ScheduleStep
from topology.shaping import LinkState, ScheduleRunner, _expand


class RecordingBackend:
    name = "recording"

    def __init__(self):
        self.applied = []

    def apply(self, direction, params):
        self.applied.append((direction, params))


def test_expand_orders_steps_and_reverts():
    steps = (ScheduleStep(at_s=1, changes={"loss_pct": 5}, duration_s=2),
             ScheduleStep(at_s=3, changes={"delay_ms": 9}))
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
