"""scripts/validate_sim.py compare-repeats: pooling repeated runs, their interval and the verdicts (pure logic)."""

import json
import sys
from pathlib import Path

import pytest
from scipy import stats

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import validate_sim as vs  # noqa: E402


def _variant(p50: float, p90: float, kv_bytes: int, issued: int = 42, requests: int = 42) -> dict:
    return {
        "requests": requests,
        "issued": issued,
        "ttft_ms": {"p50": p50, "p90": p90, "ci95": {"p50": [p50 * 0.9, p50 * 1.1], "p90": None}},
        "wan_kv_bytes_total": kv_bytes,
        "hit_rate": {"expected_mean": 0.9244},
    }


def _summary(p50: float = 500.0, requests: int = 42, **top) -> dict:
    return {
        "variants": {"pd-intra": _variant(p50, 2 * p50, 0, requests=requests), "pdd": _variant(p50, 3 * p50, 1000)},
        "slo": {"ttft_ms": 1000.0},
        "reference": {"kv_bytes_per_token": 49152, "median_uncached_tokens": 20.0},
        **top,
    }


def test_pool_is_the_mean_with_students_t_interval_and_the_run_to_run_cv():
    p = vs.pool([100.0, 110.0, 120.0])
    half = stats.t.ppf(0.975, 2) * 10.0 / 3**0.5  # sample std 10, n 3
    assert p.n == 3 and p.mean == pytest.approx(110.0)
    assert p.ci95 == pytest.approx((110.0 - half, 110.0 + half))
    assert p.cv == pytest.approx(10.0 / 110.0)


def test_one_run_has_no_interval_nor_cv_and_is_not_judgeable():
    p = vs.pool([500.0])
    assert p.ci95 is None and p.cv is None
    j = vs.judge(p, 500.0, 0.15)
    assert j.verdict.startswith("one run") and j.consistent is None


def test_a_tight_pool_gives_a_pass_or_fail_by_the_error_against_its_mean():
    p = vs.pool([1000.0, 1010.0, 990.0])  # half-width ~25, far under 15% of 1000
    assert vs.judge(p, 1100.0, 0.15).verdict == "within +-15%"
    assert vs.judge(p, 1200.0, 0.15).verdict == "outside +-15%"
    assert vs.judge(p, 1200.0, 0.15).error == pytest.approx(0.2)
    assert vs.judge(p, 1200.0, 0.25).verdict == "within +-25%"  # p90's tolerance


def test_consistent_means_inside_the_runs_interval():
    p = vs.pool([1000.0, 1010.0, 990.0])
    assert vs.judge(p, 1005.0, 0.15).consistent is True
    assert vs.judge(p, 1100.0, 0.15).consistent is False  # within 15%, yet outside the runs' interval


def test_a_pool_wider_than_the_tolerance_is_not_judgeable_even_where_the_error_is_small():
    p = vs.pool([300.0, 1000.0, 600.0])  # mean 633, interval ~[-237, 1503]
    j = vs.judge(p, 633.0, 0.15)
    assert j.verdict == "not judgeable at this n" and j.consistent is True


def test_a_wide_pool_entirely_away_from_the_simulated_figure_says_so():
    p = vs.pool([100.0, 130.0, 115.0])  # half-width ~37 > 15% of 115; interval ~[78, 152]
    assert vs.judge(p, 300.0, 0.15).verdict == "not judgeable at this n; off even at the interval's edge"
    assert vs.judge(p, 160.0, 0.15).verdict == "not judgeable at this n"  # 160/1.15 = 139 lies in the interval


def test_runs_that_measured_zero_bytes_are_exact_or_off():
    p = vs.pool([0.0, 0.0])
    assert vs.judge(p, 0.0, 0.15).verdict == "exact"
    assert vs.judge(p, 10.0, 0.15).verdict.startswith("off")


def test_a_run_of_another_experiment_is_refused_with_the_field_named():
    ref = vs.identity(_summary())
    assert vs.mismatch(vs.Run("m", "wan-lossy", _summary(p50=900.0)), ref, "pdd-vs-baselines") is None
    why = vs.mismatch(vs.Run("m", "wan-lossy", _summary(requests=40)), ref, "pdd-vs-baselines")
    assert why and "variants" in why
    other = _summary(slo={"ttft_ms": 500.0})
    assert "slo" in vs.mismatch(vs.Run("m", "wan-lossy", other), ref, "pdd-vs-baselines")


def test_metadata_of_another_spec_or_profile_is_refused():
    ref = vs.identity(_summary())
    meta = {"experiment": "pdd-bathtub", "spec": {"profile": "wan-regional"}}
    why = vs.mismatch(vs.Run("m", "wan-lossy", _summary(), meta), ref, "pdd-vs-baselines")
    assert "experiment pdd-bathtub" in why and "profile wan-regional" in why
    assert "simulated" in vs.mismatch(vs.Run("m", "x", _summary(simulated=True)), ref, "pdd-vs-baselines")


def test_rows_pool_each_variant_and_metric_and_keep_the_sent_range():
    runs = [vs.Run("a", "p", _summary(400.0)), vs.Run("b", "p", _summary(600.0))]
    runs[1].summary["variants"]["pdd"]["issued"] = 30
    sim = _summary(500.0)["variants"]
    rows = {(r.variant, r.metric): r for r in vs.rows_for("p", runs, sim)}
    assert len(rows) == 6
    r = rows[("pdd", "ttft_p50_ms")]
    assert r.emulated.values == (400.0, 600.0) and r.simulated == 500.0 and r.simulated_ci95 == [450.0, 550.0]
    assert r.sent == (30, 42, 42) and r.judgement.error == pytest.approx(0.0)
    assert rows[("pdd", "ttft_p90_ms")].emulated.mean == pytest.approx(1500.0)


def test_find_runs_reads_any_number_of_matrices_at_either_depth(tmp_path):
    for path in ("m1/wan-lossy", "m2/profiles/wan-lossy", "m2/profiles/wan-regional"):
        (tmp_path / path).mkdir(parents=True)
        (tmp_path / path / "summary.json").write_text(json.dumps(_summary()))
    (tmp_path / "m2/profiles/wan-lossy/metadata.json").write_text(json.dumps({"experiment": "pdd-vs-baselines"}))
    runs = vs.find_runs([tmp_path / "m1", tmp_path / "m2"])
    assert sorted(r.profile for r in runs) == ["wan-lossy", "wan-lossy", "wan-regional"]
    assert [r.metadata is not None for r in runs if r.matrix.endswith("m2") and r.profile == "wan-lossy"] == [True]


def test_variants_off_the_wan_pool_over_every_profile_against_one_simulated_figure():
    kept = {"a": [vs.Run("m", "a", _summary(400.0))], "b": [vs.Run("m", "b", _summary(600.0))]}
    sims = {"a": _summary(500.0)["variants"], "b": _summary(500.0)["variants"]}
    rows = vs.rows_across(kept, sims, ["pd-intra"])
    assert {(r.profile, r.variant) for r in rows} == {("all profiles", "pd-intra")}
    assert rows[0].emulated.values == (400.0, 600.0) and rows[0].emulated.n == 2
    sims["b"] = _summary(510.0)["variants"]
    with pytest.raises(ValueError, match="differ between profiles"):
        vs.rows_across(kept, sims, ["pd-intra"])


def test_runs_needed_is_the_least_n_whose_t_interval_fits_the_tolerance():
    # cv 0.14 at +-15%: n = 5 gives t(4) 2.776 x 0.14 / 2.236 = 0.174 (too wide), n = 6: 2.571 x 0.14 / 2.449 = 0.147
    assert vs.runs_needed(0.14, 0.15) == 6
    assert vs.runs_needed(0.0, 0.15) == 2 and vs.runs_needed(None, 0.15) is None
    assert vs.runs_needed(5.0, 0.01, most=50) == 51


def test_a_scaled_run_s_wire_bytes_are_multiplied_back_to_the_deployment_s(tmp_path):
    # kv_scale 50: each token's KV crossed as 1/50 of its bytes; the simulator counts the deployment's
    assert vs.kv_scale(tmp_path) == 1.0  # no metadata.json: unscaled
    (tmp_path / "metadata.json").write_text(json.dumps({"line_scaling": {"kv_scale": 50.0}}))
    assert vs.kv_scale(tmp_path) == 50.0
    (tmp_path / "metadata.json").write_text(json.dumps({"line_scaling": None}))
    assert vs.kv_scale(tmp_path) == 1.0


def test_a_run_names_the_machines_reference_speed_where_its_metadata_kept_it():
    speed = {"prefill_cpu_ms": 222.6, "decode_cpu_ms": 14.4}
    kept = vs.Run("m", "wan-lossy", _summary(), {"provenance": {"machine": {"cores": 2, "speed": speed}}})
    assert kept.speed == ", machine 223 ms"
    assert vs.Run("m", "wan-lossy", _summary(), {"provenance": {"machine": {"cores": 2}}}).speed == ""
    assert vs.Run("m", "wan-lossy", _summary()).speed == ""  # no metadata kept beside the summary


def test_the_wan_table_reads_large_transfers_at_their_busy_goodput_binned_by_concurrency():
    def transfer(kv_bytes, goodput, concurrency, idle=0.0, path="wan"):
        return {"path": path, "kv_bytes": kv_bytes, "goodput_mbit": goodput, "concurrency": concurrency,
                "sender_idle": idle}  # fmt: skip

    summary = _summary()
    summary["variants"]["pdd"]["transfer_limits"] = {
        "transfers": [
            transfer(30e6, 10.0, 1.2, idle=0.5),  # its sender waited half the time for P: 20 Mbit/s while busy
            transfer(30e6, 8.0, 3.1),  # about three others at once: the bin of 4
            transfer(1e6, 50.0, 1.0),  # small: its round trips, not the line's rate
            transfer(30e6, 9.0, 1.0, path="handoff"),
        ]
    }
    got = vs.wan_transfers([vs.Run("m", "wan-lossy", summary)])
    assert sorted(got) == [("wan-lossy", 1), ("wan-lossy", 4)]
    assert [t["goodput_mbit"] for t in got[("wan-lossy", 1)]] == [20.0]
    assert [vs.flows_bin(c) for c in (0.3, 1.4, 1.5, 2.9, 5.6, 5.7)] == [1, 1, 2, 4, 4, 8]  # log-nearest


def test_bursts_are_requests_sent_within_20_ms_of_the_one_before():
    def rec(rid, t_ms, kind="measured"):
        return {"request_id": rid, "t_send_ns": int(t_ms * 1e6), "kind": kind, "workers": {"p": "p1"}}

    recs = [rec("a", 0), rec("b", 5), rec("c", 24), rec("d", 100), rec("w", 101, "warmup"), rec("e", 300)]
    assert [[r["request_id"] for r in b] for b in vs.bursts(recs)] == [["a", "b", "c"]]  # c: 19 ms after b


def test_a_run_that_computed_otherwise_is_refused():
    ref = vs.identity(_summary())
    real = vs.compute_of({})
    modelled = vs.compute_of({"compute": {"mode": "modelled", "arch": "default"}, "p": {"accelerator": "h800"}})
    meta = {
        "experiment": "pdd-vs-baselines",
        "spec": {
            "profile": "wan-lossy",
            "deployment": {
                "compute": {"mode": "modelled", "arch": "default"},
                "p": {"accelerator": "h800", "devices": 1},
            },
        },
    }
    run = vs.Run("m", "wan-lossy", _summary(), meta)
    assert "compute" in vs.mismatch(run, ref, "pdd-vs-baselines", real)
    # the same mode on another accelerator is another experiment too
    assert "compute" in vs.mismatch(run, ref, "pdd-vs-baselines", modelled)
    same = vs.compute_of(meta["spec"]["deployment"])
    assert vs.mismatch(run, ref, "pdd-vs-baselines", same) is None
    # without metadata only the mode is known: the summary's modelled engines' seconds
    bare = _summary()
    assert vs.mismatch(vs.Run("m", "wan-lossy", bare), ref, "pdd-vs-baselines", real) is None
    assert "compute" in vs.mismatch(vs.Run("m", "wan-lossy", bare), ref, "pdd-vs-baselines", modelled)
    for v in bare["variants"].values():
        v["roles_cpu"] = {"roles": {"p": {"modelled_s": 8.0}}}
    assert vs.mismatch(vs.Run("m", "wan-lossy", bare), ref, "pdd-vs-baselines", modelled) is None


def test_wan_spread_reads_the_simulators_copies_as_the_runs_and_the_spread_widens_them():
    # pd-cross on wan-congested (the table covers it): its copies' goodput over their share, two seeds; equal
    # shares keep them near 1 (90th / 10th ~1.2), weights of log-spread 0.5 spread them (~3: validate_sim
    # wan-spread's table in docs/simulator.md, "Uneven shares")
    def p90_over_p10(spread):
        ratios = vs.sim_share_ratios("pdd-vs-baselines", "wan-congested", (), "pd-cross", range(1, 3), spread)
        assert len(ratios) >= 20 and all(r > 0 for r in ratios)
        lo, _mid, hi = vs._quantiles(ratios)
        return hi / lo

    assert p90_over_p10(0.0) < 1.4 < 1.8 < p90_over_p10(0.5)


def test_the_wan_table_writes_its_share_spread_and_the_simulator_reads_it_back(tmp_path):
    from experiments.sim.wan import load_calibration

    summary = _summary()
    copy = {"path": "wan", "kv_bytes": 30e6, "goodput_mbit": 10.0, "concurrency": 1.0, "sender_idle": 0.0}
    summary["variants"]["pdd"]["transfer_limits"] = {"transfers": [copy] * 5}
    run = tmp_path / "matrix" / "wan-lossy"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps(summary))
    out = tmp_path / "calibration.yaml"
    vs.wan_table([tmp_path / "matrix"], "pdd-vs-baselines", out, 0.3)
    cal = load_calibration(out)
    assert cal.share_spread == 0.3 and "--share-spread 0.3" in out.read_text()
    [point] = cal.points
    assert (point.flows, point.transfers, point.per_flow_mbit) == (1, 5, 10.0) and point.factor < 1
