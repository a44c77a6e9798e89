"""Sweeps without a topology: axes, validation, the grid and its seeds, derived profiles, aggregation, resume."""

import json

import pytest
import yaml

from experiments.run import sweep
from experiments.analysis import sweep_report
from experiments.run.sweep import Plan, Point, SweepError, parse_over, validate
from topology.profiles import DIRECTIONS, load_profile


def plan(*overs: str, repeat: int = 1, **kw) -> Plan:
    return Plan(
        "pdd-smoke",
        ("runtime=process",),
        kw.pop("profile", None),
        None,
        tuple(parse_over(o) for o in overs),
        repeat,
        **kw,
    )


def test_values_are_yaml_and_commas_inside_brackets_stay():
    assert parse_over("link.loss_pct=0,1.5,3").values == (0, 1.5, 3)
    assert parse_over("workload.synthetic.turns=[2, 3],[3,4]").values == ([2, 3], [3, 4])
    assert parse_over("profile=wan-regional,wan-lossy").values == ("wan-regional", "wan-lossy")


@pytest.mark.parametrize(
    "over,repeat,words",
    [
        (["link.loss_pct="], 1, ["link.loss_pct", "non-empty"]),
        (["link.loss_pct=1,,2"], 1, ["non-empty"]),
        (["link.loss_pct"], 1, ["KEY=V1,V2"]),
        (["link.loss_pct=1,1"], 1, ["twice"]),
        (["foo.bar=1,2"], 1, ["foo.bar", "unknown key", "link.FIELD", "workload"]),
        (["link.lossy=1,2"], 1, ["lossy", "allowed", "loss_pct"]),
        (["link.loss_pct=a,b"], 1, ["loss_pct", "expected float"]),
        (["link.loss_pct=200"], 1, ["loss_pct", "out of range"]),
        (["workload.synthetic.sessions=2,x"], 1, ["workload.synthetic.sessions", "expected int"]),
        (["profile=wan-lossy,nope"], 1, ["nope", "available", "wan-regional"]),
        (["link.loss_pct=1"], 0, ["--repeat 0"]),
        ([], 1, ["nothing to sweep"]),
        (["link.loss_pct=1", "link.loss_pct=2"], 1, ["swept twice"]),
    ],
)
def test_bad_sweeps_are_refused_naming_the_key_and_what_is_allowed(over, repeat, words):
    with pytest.raises(SweepError) as err:
        validate(plan(*over, repeat=repeat))
    for w in words:
        assert w in str(err.value), (w, str(err.value))


def test_the_grid_is_the_axes_product_times_repeats_with_a_seed_per_repeat():
    points = validate(plan("link.loss_pct=0,3", "workload.synthetic.sessions=1,2", repeat=2))
    assert len(points) == 8
    assert [p.index for p in points] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert points[0].values == {"link.loss_pct": 0, "workload.synthetic.sessions": 1}
    assert [p.seed for p in points[:2]] == [1, 2]  # pdd-smoke's seed is 1
    assert points[0].name == "p00-r0-0-1" and points[7].name == "p03-r1-3-2"
    assert [p.seed for p in validate(plan("link.loss_pct=0,3", repeat=2, same_seed=True))] == [1, 1, 1, 1]
    assert [p.seed for p in validate(plan("workload.seed=5,9", repeat=2))] == [5, 5, 9, 9]


def test_repeats_alone_are_a_sweep_of_one_point():
    points = validate(plan(repeat=3))
    assert [p.name for p in points] == ["p00-r0", "p00-r1", "p00-r2"] and [p.seed for p in points] == [1, 2, 3]


def test_the_same_command_gives_every_point_the_same_workload(tmp_path):
    from experiments.spec import workload

    def workloads(pl):
        return [
            [(r.request_id, r.head_tokens) for r in workload.build(sweep.point_spec(pl, p, tmp_path))]
            for p in validate(pl)
        ]

    first = workloads(plan("link.loss_pct=0,3", repeat=2))
    assert first == workloads(plan("link.loss_pct=0,3", repeat=2))
    assert first[0] == first[2] and first[0] != first[1]  # the link does not change it; the repeat's seed does


def test_a_profile_field_becomes_a_derived_profile_and_a_swept_loss_replaces_the_loss_model(tmp_path):
    pl = plan("link.loss_pct=2", profile="wan-lossy")
    (p,) = validate(pl)
    spec = sweep.point_spec(pl, p, tmp_path)
    derived = load_profile(spec.profile)
    base = load_profile("wan-lossy")
    for d in ("a_to_b", "b_to_a"):
        link = derived.direction(d)
        assert link.loss_pct == 2 and link.loss_ge is None
        assert link.delay_ms == base.direction(d).delay_ms and link.rate_mbit == base.direction(d).rate_mbit
    assert spec.workload.seed == 1 and "sweep: link.loss_pct=2" in derived.description


def test_a_swept_loss_state_replaces_the_loss_model_and_a_swept_loss_pct_replaces_it(tmp_path):
    pl = plan("link.loss_state={p13_pct: 1, p31_pct: 25},{p13_pct: 2}", profile="wan-lossy")  # wan-lossy: loss_ge
    derived = [load_profile(sweep.point_spec(pl, p, tmp_path).profile) for p in validate(pl)]
    assert [d.a_to_b.loss_state.p13_pct for d in derived] == [1, 2]
    assert all(d.direction(x).loss_ge is None and d.direction(x).loss_pct == 0 for d in derived for x in DIRECTIONS)
    four_state = derived[0].path.rename(tmp_path / "four-state.yaml")
    four_state.write_text(four_state.read_text().replace(derived[0].name, "four-state"))
    pl = plan("link.loss_pct=2", profile=str(four_state))
    (again,) = [load_profile(sweep.point_spec(pl, p, tmp_path).profile) for p in validate(pl)]
    assert again.a_to_b.loss_pct == 2 and again.a_to_b.loss_state is None


def test_one_direction_only_and_the_other_untouched(tmp_path):
    pl = plan("a_to_b.delay_ms=80")
    (p,) = validate(pl)
    derived = load_profile(sweep.point_spec(pl, p, tmp_path).profile)
    base = load_profile("wan-cross-country")  # pdd-smoke's profile
    assert derived.a_to_b.delay_ms == 80 and derived.b_to_a == base.b_to_a


def test_a_profile_axis_and_a_spec_field_reach_the_spec(tmp_path):
    pl = plan("profile=wan-regional,wan-lossy", "slo.ttft_ms=300")
    specs = [sweep.point_spec(pl, p, tmp_path) for p in validate(pl)]
    assert [s.profile for s in specs] == ["wan-regional", "wan-lossy"] and {s.slo.ttft_ms for s in specs} == {300}


def done_point(index, repeat, ttft, ratio, ci=None, variants=("pd-cross", "pdd")):
    metrics = {v: {name: {"value": None, "ci95": None} for name in sweep_report.METRICS} for v in variants}
    metrics["pdd"]["ttft_p50_ms"] = {"value": ttft, "ci95": ci}
    comps = {"ttft_ms.p50 / pd-cross": {"variant": "pdd", "ratio": ratio, "ci95": [ratio - 0.1, ratio + 0.1]}}
    return Point(
        index,
        {"link.loss_pct": index},
        repeat,
        repeat + 1,
        f"p{index:02d}-r{repeat}",
        "complete",
        metrics=metrics,
        comparisons=comps,
    )


def test_repeats_aggregate_to_a_mean_with_a_t_interval():
    agg = sweep_report.aggregate(
        [done_point(0, 0, 100.0, 0.5), done_point(0, 1, 110.0, 0.7), done_point(0, 2, 120.0, 0.6)]
    )
    m = agg[0]["variants"]["pdd"]["ttft_p50_ms"]
    # mean 110, sd 10, t(2) = 4.303: 110 +- 4.303 * 10 / sqrt(3)
    assert m["n"] == 3 and m["mean"] == pytest.approx(110)
    assert m["ci95"] == pytest.approx([110 - 24.843, 110 + 24.843], abs=0.01)
    c = agg[0]["comparisons"]["ttft_ms.p50 / pd-cross"]
    # the geometric mean of 0.5, 0.7, 0.6 and t(2) on the logs: never a bound below zero
    assert c["mean"] == pytest.approx((0.5 * 0.7 * 0.6) ** (1 / 3)) and c["verdict"] == "lower" and c["n"] == 3
    assert 0 < c["ci95"][0] < c["mean"] < c["ci95"][1] < 1 and c["scope"] == "repeats"
    assert agg[0]["variants"]["pd-cross"]["ttft_p50_ms"] == {"n": 0}


def test_a_repeat_that_lost_requests_counts_and_is_named():
    lossy = done_point(0, 1, 900.0, 3.0)
    lossy.status = "incomplete"  # a variant lost requests: its latencies rank them worst
    agg = sweep_report.aggregate([done_point(0, 0, 100.0, 1.0), lossy])
    m = agg[0]["variants"]["pdd"]["ttft_p50_ms"]
    assert m["n"] == 2 and m["mean"] == pytest.approx(500.0) and 900.0 in m["values"]
    assert agg[0]["counted"] == 2 and agg[0]["complete"] == 1 and agg[0]["incomplete"] == ["p00-r1"]
    md = sweep_report.markdown(plan("link.loss_pct=0"), [done_point(0, 0, 100.0, 1.0), lossy], agg)
    assert "2 counted" in md and "p00-r1: incomplete" in md


def test_within_run_verdicts_are_tallied_into_a_false_positive_rate():
    points = [done_point(0, r, 100.0, 1.0) for r in range(20)]
    for r, p in enumerate(points):
        p.comparisons["ttft_ms.p50 / pd-cross"]["verdict"] = "higher" if r == 3 else "no significant difference"
    agg = sweep_report.aggregate(points)
    assert agg[0]["verdicts"]["ttft_ms.p50 / pd-cross"]["higher"] == 1
    fp = sweep_report.false_positives(agg)
    assert (fp["called"], fp["judged"]) == (1, 20) and fp["ci95"][0] < 0.05 < fp["ci95"][1]
    assert "Called different (lower or higher): 1 of 20" in sweep_report.markdown(plan("link.loss_pct=0"), points, agg)


def test_one_repeat_keeps_the_runs_own_interval_and_unfinished_repeats_do_not_count():
    unfinished = done_point(0, 1, 999.0, 9.0)
    unfinished.status = "interrupted"
    agg = sweep_report.aggregate([done_point(0, 0, 100.0, 1.0, ci=[90.0, 130.0]), unfinished])
    m = agg[0]["variants"]["pdd"]["ttft_p50_ms"]
    assert m["mean"] == 100.0 and m["ci95"] == [90.0, 130.0] and agg[0]["complete"] == 1
    assert agg[0]["comparisons"]["ttft_ms.p50 / pd-cross"]["verdict"] == "no significant difference"
    assert agg[0]["not_counted"] == ["p00-r1: interrupted"]


def test_sweep_md_has_a_table_per_metric_the_comparisons_and_what_failed():
    failed = Point(1, {"link.loss_pct": 1}, 0, 1, "p01-r0", "failed", error="VariantError: boom")
    points = [done_point(0, 0, 100.0, 0.5), failed]
    md = sweep_report.markdown(plan("link.loss_pct=0,1"), points, sweep_report.aggregate(points))
    assert "## ttft_p50_ms" in md and "| link.loss_pct=0 |" in md and "## pdd / baseline: ttft_ms.p50" in md
    assert "p01-r0: failed VariantError: boom" in md


def test_resume_keeps_finished_points_and_reruns_those_whose_directory_is_gone(tmp_path):
    pl = plan("link.loss_pct=0,3")
    points = validate(pl)
    (tmp_path / "runs" / points[0].name).mkdir(parents=True)
    (tmp_path / "runs" / points[0].name / "metadata.json").write_text("{}")
    for p in points:
        p.status, p.run_dir = "complete", f"runs/{p.name}"
    (tmp_path / "sweep.json").write_text(
        json.dumps({"plan": pl.to_dict(), "points": [sweep.dataclasses.asdict(p) for p in points]})
    )
    plan2, points2 = sweep.resume(tmp_path)
    assert plan2 == pl and [p.status for p in points2] == ["complete", "pending"]
    with pytest.raises(SweepError, match="no sweep.json"):
        sweep.resume(tmp_path / "runs")


def test_resume_reads_a_finished_run_again_so_a_new_analysis_counts(tmp_path):
    """`pddlab analyze` of a sweep's run after an analysis change, then `--resume`: the point's figures are
    the run's summary.json now, not what sweep.json held."""
    from fake_run import make_run

    from experiments.analysis import analyze

    pl = plan("link.loss_pct=0")
    [p] = validate(pl)
    (tmp_path / "runs").mkdir()
    run = make_run(tmp_path / "runs")
    analyze.analyze(run)
    p.status, p.run_dir, p.metrics = "complete", str(run.relative_to(tmp_path)), {"pdd": {"stale": 1}}
    (tmp_path / "sweep.json").write_text(json.dumps({"plan": pl.to_dict(), "points": [sweep.dataclasses.asdict(p)]}))
    _, [again] = sweep.resume(tmp_path)
    summary = json.loads((run / "summary.json").read_text())
    assert again.status == "complete" and set(again.metrics) == set(summary["variants"])
    assert again.metrics["pdd"]["ttft_p50_ms"]["value"] == summary["variants"]["pdd"]["ttft_ms"]["p50"]


def test_an_earlier_attempt_is_set_aside_not_overwritten(tmp_path):
    d = tmp_path / "p00-r0"
    d.mkdir()
    (d / "metadata.json").write_text("{}")
    sweep._set_aside(d)
    sweep._set_aside(d)  # nothing there now: nothing to do
    assert not d.exists() and (tmp_path / "p00-r0.attempt1" / "metadata.json").exists()


def test_derived_profiles_are_valid_profile_files(tmp_path):
    pl = plan("link.delay_ms=10,20")
    for p in validate(pl):
        path = sweep.point_spec(pl, p, tmp_path).profile
        data = yaml.safe_load(open(path))
        assert data["name"] == p.name.replace("-r0", "") and "link" not in data


def test_a_points_metrics_come_from_its_summary_with_the_runs_own_intervals():
    s = {
        "ttft_ms": {"p50": 120.0, "ci95": {"p50": [100.0, 150.0]}},
        "fallbacks": {"completed_on_rld:md_never_ready": 2, "kv_send_retry": 1},
        "handoff": {"count": 3, "latency_ms": {"mean": 5.0, "std": 1.0, "ci95": {"mean": [4.0, 6.0]}}},
        "wan_bytes": {"bytes_retrans": 10},
    }
    m = sweep_report.point_metrics(s)
    assert m["ttft_p50_ms"] == {"value": 120.0, "ci95": [100.0, 150.0]} and m["fallbacks"]["value"] == 3
    assert m["handoffs"]["value"] == 3 and m["handoff_mean_ms"] == {"value": 5.0, "ci95": [4.0, 6.0]}
    assert m["handoff_std_ms"]["value"] == 1.0 and m["wan_kv_retrans_bytes"]["value"] == 10
    assert m["tpot_p50_ms"]["value"] is None and m["goodput_rps"]["value"] is None


def test_the_ratio_plot_draws_each_baselines_ratio_against_the_swept_value(tmp_path):
    from experiments.analysis import plots

    pl = plan("link.loss_pct=0,1")
    points = [done_point(0, r, 100.0, 0.5 + r / 10) for r in range(2)] + [done_point(1, r, 90.0, 0.9) for r in range(2)]
    for p in points[2:]:
        p.values = {"link.loss_pct": 1}
    agg = sweep_report.aggregate(points)
    [path] = plots.sweep_ratio_plots(pl.axes, agg, tmp_path, ("ttft_ms.p50",))
    assert path.name == "ttft_ms.p50_ratio.png" and path.read_bytes()[:4] == b"\x89PNG"
    assert plots.sweep_ratio_plots(pl.axes, agg, tmp_path, ("nothing",)) == []


def test_goodput_ratio_counts_requests_meeting_the_slo_per_second_of_each_variant():
    from types import SimpleNamespace

    from experiments.analysis import metrics

    def rec(variant, i, ttft):
        return SimpleNamespace(
            variant=variant, issued=True, ok=True, ttft_ms=ttft, tpot_ms=10.0, e2e_ms=100.0,
            t_send_ns=i * 10**9, t_done_ns=i * 10**9 + 10**8, session=f"s{i % 10}", request_id=f"r{i}",
        )  # fmt: skip

    slo = SimpleNamespace(ttft_ms=100.0, tpot_ms=50.0, e2e_ms=0.0)
    # both over 29.1 s; pdd meets the SLO in 24 of 30, pd-intra in 12 of 30: ratio 2; 10 sessions of 3 requests,
    # the same requests in both (paired)
    recs = [rec("pdd", i, 50 if i < 24 else 500) for i in range(30)]
    recs += [rec("pd-intra", i, 50 if i < 12 else 500) for i in range(30)]
    [entry] = metrics._goodput_ratio(recs, "pdd", "pd-intra", slo)
    assert entry["ratio"] == pytest.approx(2.0) and entry["metric"] == "goodput_rps" and entry["paired"]
    assert entry["ci95"][0] < 2.0 < entry["ci95"][1]


def test_goodput_ratio_has_no_interval_where_every_request_met_the_slo():
    """All met in both: the ratio is the windows' (here 29.1 s over 30.1 s), which resampling cannot move; a
    zero-width interval ([0.97, 0.97], verdict 'lower') would claim what one run cannot hold."""
    from types import SimpleNamespace

    from experiments.analysis import metrics

    def rec(variant, i, late_ns):
        return SimpleNamespace(
            variant=variant, issued=True, ok=True, ttft_ms=50.0, tpot_ms=10.0, e2e_ms=100.0,
            t_send_ns=i * 10**9, t_done_ns=i * 10**9 + 10**8 + late_ns, session=f"s{i % 10}", request_id=f"r{i}",
        )  # fmt: skip

    slo = SimpleNamespace(ttft_ms=100.0, tpot_ms=50.0, e2e_ms=0.0)
    recs = [rec("pdd", i, 10**9 if i == 29 else 0) for i in range(30)] + [rec("pd-intra", i, 0) for i in range(30)]
    [entry] = metrics._goodput_ratio(recs, "pdd", "pd-intra", slo)
    assert entry["ratio"] == pytest.approx(29.1 / 30.1)
    assert entry["ci95"] is None and entry["verdict"] == "not judged"
