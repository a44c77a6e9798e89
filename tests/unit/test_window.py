"""A variant's window without a topology: a Testbed that was never started, its link on a recording backend.

Pure logic and short real time: the schedule on each window's own clock, the base restored at the close,
the hold until the last event, the per-variant link changes, and a failed change raised into the run.
"""

import tempfile
import time

import pytest

from experiments.run import window as winmod
from experiments.spec.experiment import load_spec
from experiments.rundir import metadata
from experiments.rundir.metadata import LinkChange, SharedTopologyRecord, VariantRecord
from experiments.run.window import Impairment, VariantWindow, variant_link_changes
from topology.net import Testbed, TestbedError, TopologyConfig
from topology.profiles import DIRECTIONS, LinkParams, Profile, ScheduleStep, load_profile
from topology.shaping import AppliedChange, LinkState

BASE = LinkParams(rate_mbit=100, delay_ms=10)
PROFILE = Profile(
    "p",
    "",
    BASE,
    BASE,
    schedule=(ScheduleStep(at_s=0.05, changes={"loss_pct": 100}, direction="both", duration_s=0.1),),
)
LABELS = ("profile p step 0",)


class RecordingBackend:
    name = "recording"
    pid = exit_code = None  # no process of its own (topology.shaping.Backend)

    def __init__(self, fail: bool = False):
        self.applied, self.fail = [], fail

    def apply(self, direction, params):
        if self.fail:
            raise RuntimeError("tc qdisc change failed")
        self.applied.append((direction, params))

    def health(self):
        return None  # as the kernel's netem: no lateness record


@pytest.fixture
def testbed(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    def make(fail=False):
        tb = Testbed(TopologyConfig(wan_profile=PROFILE, lan_profile=PROFILE, play_schedule=False))
        tb.link = LinkState(backend=RecordingBackend(fail), current={d: BASE for d in DIRECTIONS})
        return tb

    return make


class FailsWhileChecked:
    """A played schedule whose change fails while Testbed.check reads it: alive with no error at the first read,
    then (its thread set the error and ended) failed and stopped at every later read."""

    def __init__(self):
        self.reads = 0

    def _read(self, before, after):
        self.reads += 1
        return before if self.reads == 1 else after

    @property
    def running(self):
        return self._read(True, False)

    @property
    def error(self):
        return self._read(None, RuntimeError("tc qdisc change failed"))


def test_a_schedule_failing_while_the_testbed_checks_it_is_raised_not_dropped(testbed):
    """Testbed.check reads each played schedule; one whose change fails between two reads must still be raised
    (now or at the next check), never dropped from the schedules watched unseen."""
    tb = testbed()
    tb._played.append(FailsWhileChecked())
    with pytest.raises(TestbedError, match="schedule failed: tc qdisc change failed"):
        tb.check()
        tb.check()


def _window(tb, tmp_path, name):
    return VariantWindow(tb, Impairment(PROFILE.schedule, LABELS, restore=True), tmp_path / name, tmp_path)


def _close(win: VariantWindow) -> VariantRecord:
    return win.close(VariantRecord(status="running"))


def test_each_window_replays_the_schedule_from_its_own_start(testbed, tmp_path):
    tb = testbed()
    recs = []
    for name in ("v1", "v2"):
        win = _window(tb, tmp_path, name)
        win.open(time.monotonic_ns())
        win.hold(name)
        recs.append(_close(win))
        tb.check()
    assert recs[0].window_end_ns < recs[1].window_start_ns
    for rec in recs:
        causes = [(c.cause, c.direction) for c in rec.link_changes]
        assert causes == [
            ("profile p step 0", "a_to_b"),
            ("profile p step 0", "b_to_a"),
            ("profile p step 0 ends", "a_to_b"),
            ("profile p step 0 ends", "b_to_a"),
        ]
        offsets = [c.offset_s for c in rec.link_changes]
        assert 0.05 <= offsets[0] < 0.15 and 0.15 <= offsets[2] < 0.25
        assert rec.window_extended_s > 0.1
    assert tb.link.current == {d: BASE for d in DIRECTIONS}


def test_the_close_restores_the_base_and_records_it(testbed, tmp_path):
    tb = testbed()
    steps = (ScheduleStep(at_s=0, changes={"delay_ms": 80}, direction="a_to_b"),)  # never reverted
    win = VariantWindow(tb, Impairment(steps, ("spec step 0",), restore=True), tmp_path / "v", tmp_path)
    win.open(time.monotonic_ns())
    win.hold("v")
    rec = _close(win)
    assert [c.cause for c in rec.link_changes] == ["spec step 0", "restore profile base (window closes)"]
    assert rec.link_changes[-1].params["delay_ms"] == 10 and tb.link.current["a_to_b"] == BASE


def test_no_hold_when_the_workload_outlasted_the_schedule(testbed, tmp_path):
    tb = testbed()
    win = _window(tb, tmp_path, "v")
    win.open(time.monotonic_ns() - 5_000_000_000)  # the window opened 5 s ago: every event is past
    assert win.hold("v") == 0.0
    assert _close(win).window_extended_s == 0.0


def test_a_failed_change_fails_the_variant_once(testbed, tmp_path):
    tb = testbed(fail=True)
    win = _window(tb, tmp_path, "v")
    win.open(time.monotonic_ns())
    win.hold("v")
    _close(win)
    with pytest.raises(TestbedError, match="schedule failed: tc qdisc change failed"):
        tb.check()
    tb.check()  # reported once: the next variant plays its own schedule


def test_a_window_that_never_opened_records_nothing(testbed, tmp_path):
    win = _window(testbed(), tmp_path, "v")
    assert _close(win) == VariantRecord(status="running", window_extended_s=0.0)


def test_variant_link_changes_keep_the_window_and_use_its_offsets():
    changes = [
        AppliedChange(0.0, "a_to_b", {"loss_pct": 1}, "before", t_ns=900),
        AppliedChange(0.0, "b_to_a", {"loss_pct": 2}, "inside", t_ns=1_500_000_000),
        AppliedChange(0.0, "a_to_b", {"loss_pct": 3}, "after", t_ns=9_000_000_000),
    ]
    assert variant_link_changes(changes, 1_000_000_000, 2_000_000_000) == [
        LinkChange(t_ns=1_500_000_000, offset_s=0.5, direction="b_to_a", params={"loss_pct": 2}, cause="inside")
    ]


def test_the_variant_clock_merges_the_profile_and_the_spec_schedules():
    spec = load_spec(
        "pdd-vs-baselines", ["schedule=[{at_s: 12, duration_s: 1, set: {loss_pct: 100}}]"], profile="wan-flaky"
    )
    profile = load_profile("wan-flaky")
    imp = winmod.impairment(spec, profile)
    assert imp.restore and imp.labels == (
        "profile wan-flaky step 0",
        "spec step 0",
        "profile wan-flaky step 1",
        "profile wan-flaky step 2",
    )
    assert imp.end_s == 42
    assert winmod.link_profile(spec, profile) is profile  # the topology plays nothing itself


def test_the_link_clock_hands_both_schedules_to_the_topology():
    spec = load_spec(
        "pdd-vs-baselines", ["schedule_clock=link", "schedule=[{at_s: 12, set: {loss_pct: 1}}]"], profile="wan-flaky"
    )
    profile = load_profile("wan-flaky")
    imp = winmod.impairment(spec, profile)
    assert imp.steps == () and not imp.restore
    assert [s.at_s for s in winmod.link_profile(spec, profile).schedule] == [10, 12, 25, 40]


class FakeRuntime:
    """The roles of a variant, without processes."""

    def __init__(self, testbed, config, log_dir, pools=None, cpusets=None):
        pass

    def start(self):
        pass

    def stop(self):
        return {"router": 0}


class FakeShared:
    """A sweep's shared topology, standing for a running one: the testbed that was never started."""

    def __init__(self, tb):
        self.tb = tb

    def fits(self, spec):
        return True

    def record(self):
        return SharedTopologyRecord(id=1, runs_before=0, start_s=0.0)

    def run(self, spec, profile, out, meta):
        from experiments.run import runner

        runner._run_variants(self.tb, spec, out, meta, Impairment(PROFILE.schedule, LABELS, restore=True))


@pytest.fixture
def roles_faked(monkeypatch):
    """The runner without processes: no roles, readiness at once, no analysis."""
    from experiments.run import runner

    monkeypatch.setattr(runner.deploy, "Runtime", FakeRuntime)
    monkeypatch.setattr(runner, "wait_ready", lambda *args: None)
    monkeypatch.setattr(runner, "analyze_safely", lambda out: None)
    return runner


def test_a_failed_schedule_fails_its_variant_keeps_its_record_and_the_run_is_incomplete(
    testbed, tmp_path, monkeypatch, roles_faked
):
    runner = roles_faked

    def drive(tb, spec, variant, out, vdir, runtime, win, window):
        win.open(time.monotonic_ns())
        return "ok"

    monkeypatch.setattr(runner, "_drive", drive)
    spec = load_spec("pdd-smoke", ["runtime=process", "variants=[pd-cross, pdd]"])
    out = runner.run(spec, out=tmp_path / "run", shared=FakeShared(testbed(fail=True)))
    meta = metadata.read(out)  # what the analysis and a sweep read back
    assert meta.complete is False and meta.error is None
    for v in ("pd-cross", "pdd"):  # each variant plays (and fails) its own schedule
        w = meta.variants[v]
        assert w.status == "failed" and "schedule failed: tc qdisc change failed" in w.error, w
        assert w.window_extended_s > 0.1 and w.exit_codes == {"router": 0} and w.window_end_ns is not None


def test_a_window_that_never_opened_fails_a_variant_with_impairments(testbed, tmp_path, monkeypatch, roles_faked):
    runner = roles_faked
    monkeypatch.setattr(runner, "_drive", lambda *args: "ok")  # no t0 line: the window never opens
    spec = load_spec("pdd-smoke", ["runtime=process", "variants=[pdd]"])
    meta = metadata.read(runner.run(spec, out=tmp_path / "run", shared=FakeShared(testbed())))
    assert not meta.complete and meta.variants["pdd"].status == "failed"
    assert "never reported its t0" in meta.variants["pdd"].error


class FakeTestbed:
    """Testbed(cfg) as a context manager over a testbed that was never started; a failing schedule plays."""

    def __init__(self, tb):
        self.tb = tb

    def __call__(self, cfg):
        return self

    def __enter__(self):
        self.tb.play_schedule(PROFILE.schedule, time.monotonic_ns(), LABELS)
        return self.tb

    def __exit__(self, *exc):
        self.tb._stop_schedule()
        return False


def test_a_failed_schedule_step_ends_a_serve_session_incomplete(testbed, tmp_path, monkeypatch, roles_faked):
    """serve plays the link's schedule for as long as it serves: a failed change ends the session, and its
    metadata.json says incomplete and why."""
    import topology.net
    from experiments.serve import session as serve

    class FrontDoor:  # the front door's process, serving (SIGTERM at teardown: it drains and exits 0)
        def poll(self):
            return None

        def send_signal(self, sig):
            pass

        def wait(self, timeout=None):
            return 0

    tb = testbed(fail=True)
    monkeypatch.setattr(tb, "popen", lambda *args, **kwargs: FrontDoor())
    monkeypatch.setattr(tb, "kill", lambda host, proc, grace_s=5.0: None)
    monkeypatch.setattr(topology.net, "Testbed", FakeTestbed(tb))
    monkeypatch.setattr(topology.net, "preflight", lambda: None)
    monkeypatch.setattr(serve.rundir, "new_run_dir", lambda name: tmp_path)
    monkeypatch.setattr(serve, "_wait_line", lambda *args: None)
    monkeypatch.setattr(serve._Forwarder, "start", lambda self: self)
    monkeypatch.setattr(serve._Forwarder, "stop", lambda self: None)
    spec = load_spec("pdd-smoke", ["runtime=process"])
    serving: list[float] = []  # the first until(): serving began (the setup before it, the machine's reference
    # speed among it, takes 2-6 s on this machine: a deadline counted from here would pass before the schedule ran)

    def five_s_served() -> bool:
        serving.append(time.monotonic())
        return serving[-1] - serving[0] > 5

    with pytest.raises(TestbedError, match="schedule failed: tc qdisc change failed"):
        serve.run(spec, "pdd", until=five_s_served)  # the schedule fails 0.05 s after the testbed is up
    meta = metadata.read(tmp_path)
    assert meta.serve and not meta.complete and "schedule failed" in meta.error
    assert meta.variants["pdd"].status == "stopped" and meta.variants["pdd"].exit_codes == {"router": 0}


def test_a_failed_schedule_step_leaves_a_calibration_incomplete_with_its_numbers(testbed, tmp_path, monkeypatch):
    from experiments.run import calibration

    monkeypatch.setattr(calibration, "Testbed", FakeTestbed(testbed(fail=True)))
    monkeypatch.setattr(calibration, "preflight", lambda: None)
    monkeypatch.setattr(calibration, "calibrate", lambda tb, cfg, out: time.sleep(0.3) or [])
    with pytest.raises(TestbedError, match="schedule failed: tc qdisc change failed"):
        calibration.run(PROFILE, results_root=tmp_path / "results")
    [out] = (tmp_path / "results").iterdir()
    meta = metadata.read(out)
    assert not meta.complete and "schedule failed" in meta.error and meta.topology.backend is None
    assert (out / "calibration.json").exists() and meta.seeds.topology == 1
