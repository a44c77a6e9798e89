"""`pddlab compare`: two runs paired by request where they replayed one workload, two sweeps by their repeats."""

import json
import math

import pytest

from experiments import cli
from experiments.analysis import analyze, compare
from experiments.rundir import metadata
from fake_run import make_run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = []
    for name in ("a", "b"):
        run = make_run(tmp_path_factory.mktemp(name))
        analyze.analyze(run)
        out.append(run)
    return out


def test_two_runs_of_one_workload_are_paired_by_request(runs):
    rows = compare.compare(runs)
    by = {(r.variant, r.metric): r for r in rows}
    assert {v for v, _ in by} == {"colocated", "pd-intra", "pd-cross", "pdd"}
    r = by[("pdd", "ttft_ms.p50")]
    assert r.ratio == pytest.approx(1.0) and r.paired and r.scope == "these two runs"
    assert r.verdict == "not judged"  # 3 sessions: no interval
    md = compare.markdown(rows)
    assert "one run of each cannot tell a change from run-to-run variance" in md


def sweep_dir(path, values):
    path.mkdir()
    agg = [{"index": 0, "values": {}, "variants": {"pdd": {"ttft_p50_ms": {"values": values}}}}]
    (path / "sweep.json").write_text(json.dumps({"aggregate": agg}))
    return path


def test_two_sweeps_compare_their_repeats_geometrically(tmp_path):
    a = sweep_dir(tmp_path / "a", [100.0, 110.0, 90.0, 105.0])
    b = sweep_dir(tmp_path / "b", [150.0, 160.0, 140.0, 155.0])
    [r] = [r for r in compare.compare([a, b]) if r.metric == "ttft_ms.p50"]
    geo = math.exp(sum(map(math.log, [150, 160, 140, 155])) / 4 - sum(map(math.log, [100, 110, 90, 105])) / 4)
    assert r.ratio == pytest.approx(geo) and r.scope == "repeats" and r.verdict == "higher"
    assert r.ci95[0] < geo < r.ci95[1]
    same = sweep_dir(tmp_path / "c", [101.0, 108.0, 93.0, 104.0])
    [r] = [r for r in compare.compare([a, same]) if r.metric == "ttft_ms.p50"]
    assert r.verdict == "no significant difference"


def test_a_run_and_a_sweep_cannot_be_compared(runs, tmp_path, capsys):
    s = sweep_dir(tmp_path / "s", [1.0, 2.0])
    assert cli.main(["compare", str(runs[0]), str(s)]) == 2
    assert "compare runs with runs and sweeps with sweeps" in capsys.readouterr().err
    assert cli.main(["compare", str(tmp_path / "nope"), str(s)]) == 2


def with_speed(run, prefill_cpu_ms):
    """run's metadata.json with a recorded reference speed (None: without one, as older runs)."""
    meta = metadata.read(run)
    speed = None
    if prefill_cpu_ms is not None:
        speed = {"work": "w", "rounds": 3, "prefill_wall_ms": prefill_cpu_ms, "prefill_cpu_ms": prefill_cpu_ms}
        speed |= {"decode_wall_ms": 14.0, "decode_cpu_ms": 14.0, "load_average": [0.1, 0.1, 0.1]}
    meta.provenance.machine = {"cpu_model": "c", "cores": 2, "load_average": [0.1] * 3, "speed": speed}
    metadata.write(run, meta)


def test_two_runs_on_machines_of_different_speed_say_so(runs):
    a, b = runs
    with_speed(a, 220.0)
    with_speed(b, 300.0)
    line = compare.machines(a, b)
    assert "220 ms" in line and "300 ms" in line and "1.36x" in line and "differed by more than 10%" in line
    assert "differed by more than 10%" in compare.markdown(compare.compare(runs))
    with_speed(b, 230.0)
    assert "within 10%" in compare.machines(a, b)
    with_speed(b, None)
    assert "was not recorded" in compare.machines(a, b)
