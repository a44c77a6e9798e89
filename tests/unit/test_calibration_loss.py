"""A loss outside its interval is measured again once; the last probe run is judged (pure logic:
the probe runs are ProbeResults built here, not sent)."""

from experiments import calibration
from experiments.calibration import CalibrationConfig, DirectionResult, markdown_table
from experiments.linkstats import Expected, ProbePlan, fidelity_checks, probe_stats
from topology.profiles import load_profile
from topology.udp_probe import ProbeResult

PLAN = ProbePlan(count=2000, interval_ms=10.0)
EXPECTED = Expected(
    delay_mean_ms=25.0,
    delay_std_ms=3.0,
    loss_pct=0.1,
    loss_lo_pct=0.0,
    loss_hi_pct=0.3,
    reordering_expected=False,
)


def _run(lost: int) -> ProbeResult:
    seqs = list(range(lost, PLAN.count))
    return ProbeResult(sent_count=PLAN.count, seqs=seqs, delays_ns=[25_000_000 + (s % 7) * 1_000_000 for s in seqs])


def _result(direction: str, lost: int) -> DirectionResult:
    measured = probe_stats(_run(lost))
    return DirectionResult(direction, {}, EXPECTED, measured, fidelity_checks(EXPECTED, measured))


def _calibrate_again(monkeypatch, tmp_path, first: dict, again: list[dict]) -> list[DirectionResult]:
    runs = iter(again)
    calls = []

    def probes(testbed, plan, out_dir):
        calls.append(out_dir.name)
        return {d: _run(n) for d, n in next(runs).items()}

    monkeypatch.setattr(calibration, "run_probes", probes)
    results = [_result(d, n) for d, n in first.items()]
    calibration._remeasure_loss(None, CalibrationConfig(probes=PLAN), tmp_path, results)
    return results, calls


def _loss(r: DirectionResult):
    return next(c for c in r.checks if c.name == "loss_pct")


def test_a_loss_inside_its_interval_is_not_measured_again(monkeypatch, tmp_path):
    results, calls = _calibrate_again(monkeypatch, tmp_path, {"a_to_b": 2, "b_to_a": 6}, [])
    assert calls == []
    assert [r.loss_tries for r in results] == [[0.1], [0.3]]
    assert all(_loss(r).ok for r in results)


def test_a_loss_outside_is_probed_again_and_the_last_run_judged(monkeypatch, tmp_path):
    results, calls = _calibrate_again(monkeypatch, tmp_path, {"a_to_b": 2, "b_to_a": 9}, [{"a_to_b": 30, "b_to_a": 3}])
    assert calls == ["probes-2"]
    a, b = results
    assert a.loss_tries == [0.1] and _loss(a).measured == 0.1  # passed the first time: the first run stands
    assert b.loss_tries == [0.45, 0.15] and _loss(b).measured == 0.15 and _loss(b).ok
    assert b.measured.loss_pct == 0.45  # the other checks' numbers stay the first run's
    table = markdown_table(load_profile("wan-flaky"), "tc", results)
    assert "| b_to_a | loss_pct per probe run (the last is judged) | | 0.45, 0.15 | | |" in table
    assert "a_to_b | loss_pct per probe run" not in table


def test_a_link_that_loses_too_much_fails_every_run(monkeypatch, tmp_path):
    results, calls = _calibrate_again(monkeypatch, tmp_path, {"a_to_b": 2, "b_to_a": 20}, [{"a_to_b": 0, "b_to_a": 18}])
    assert len(calls) == calibration.LOSS_TRIES - 1
    assert not _loss(results[1]).ok and _loss(results[1]).measured == 0.9
    assert results[1].loss_tries == [1.0, 0.9]
