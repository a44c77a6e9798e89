"""`pddlab simulate --sweep` (experiments/sim/sweep.py): its axes, grid, per-variant rows, BCR and cheapest point."""

from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from experiments.sim import sweep
from experiments.spec.experiment import SLO
from workers.modelled.catalogue import load_catalogue

ACCELS = ["h20", "h800"]
SPEC = Path(__file__).resolve().parents[2] / "experiments/specs/sim/pdd-published-scale.yaml"


def rec(t_send_s, t_done_s, ttft=100.0, tpot=10.0, ok=True, route="p-md", rld=0, out=10, hit=0.9, md_cached=90):
    return SimpleNamespace(
        ok=ok, ttft_ms=ttft, tpot_ms=tpot, e2e_ms=ttft + tpot * out, t_send_ns=int(t_send_s * 1e9),
        t_done_ns=int(t_done_s * 1e9), output_tokens=out, rld_tokens=rld, route=route, expected_hit=hit,
        md_cached_tokens=md_cached, prompt_tokens=100,
    )  # fmt: skip


def test_axes_read_as_pddlab_sweeps_over_and_bad_ones_name_the_key():
    axes = sweep.parse_axes(["pools.md.workers=8,14", "price.h20=1.0,3"])
    assert [(a.key, a.values) for a in axes] == [("pools.md.workers", (8, 14)), ("price.h20", (1.0, 3))]
    with pytest.raises(sweep.SimSweepError, match=r"--sweep pools.md.workers: needs a non-empty"):
        sweep.parse_axes(["pools.md.workers="])
    with pytest.raises(sweep.SimSweepError, match="swept twice"):
        sweep.parse_axes(["price.h20=1", "price.h20=2"])


@pytest.mark.parametrize(
    "item, match",
    [
        ("poools.md.workers=1,2", r"--sweep poools.md.workers: unknown key"),
        ("price.tpu9=1,2", r"--sweep price.tpu9: no accelerator 'tpu9'"),
        ("price.h20=1,-2", r"--sweep price.h20: prices are positive numbers"),
        ("price.h20=cheap", r"--sweep price.h20: prices are positive numbers"),
        ("link.speed=1,2", r"--sweep link.speed: unknown profile field 'speed'"),
    ],
)
def test_a_key_the_spec_profile_or_catalogue_lacks_is_refused_by_name(item, match):
    with pytest.raises(sweep.SimSweepError, match=match):
        sweep.check_keys(sweep.parse_axes([item]), ACCELS)


def test_good_keys_pass():
    sweep.check_keys(sweep.parse_axes(["pools.md.workers=1", "link.rate_mbit=10", "price.h20=2"]), ACCELS)


def test_the_grid_is_the_product_and_prices_share_a_simulation():
    points = sweep.grid(sweep.parse_axes(["pools.md.workers=8,14", "price.h20=1,3"]))
    assert points == [
        {"pools.md.workers": 8, "price.h20": 1},
        {"pools.md.workers": 8, "price.h20": 3},
        {"pools.md.workers": 14, "price.h20": 1},
        {"pools.md.workers": 14, "price.h20": 3},
    ]
    assert len({sweep.simulated(p) for p in points}) == 2


def test_a_points_overrides_set_spec_fields_and_derive_a_profile_for_link_fields(tmp_path):
    sets = sweep.overrides(
        {"pools.md.workers": 8, "price.h20": 2.0, "link.rate_mbit": 40000}, "wan-regional", tmp_path, "p00"
    )
    assert sets[0] == "pools.md.workers=8"
    assert sets[1] == f"profile={tmp_path / 'p00.yaml'}" and len(sets) == 2
    derived = yaml.safe_load((tmp_path / "p00.yaml").read_text())
    assert derived["a_to_b"]["rate_mbit"] == derived["b_to_a"]["rate_mbit"] == 40000


def test_a_variants_row_goodput_hits_rld_share_and_last_third():
    recs = [
        rec(0, 1),
        rec(1, 2, ttft=2000),  # misses the TTFT SLO
        rec(2, 4, route="p-rld-ablation", rld=10, md_cached=0),
        rec(3, 4, ok=False),
    ]
    row = sweep.variant_row(recs, SLO(ttft_ms=1000, tpot_ms=50), per_hour=360.0)
    assert row["goodput_rps"] == pytest.approx(2 / 4)  # 2 met the SLO over 4 s
    assert row["slo_attainment"] == pytest.approx(0.5)
    assert row["bcr"] == pytest.approx(0.5 * 3600 / 360)
    assert row["goodput_per_cost_hour"] == pytest.approx(0.5 / 360)
    assert row["rld_token_share"] == pytest.approx(10 / 30)
    assert row["on_rld"] == pytest.approx(25.0)
    assert row["p_hit"] == pytest.approx(90.0) and row["md_hit"] == pytest.approx(67.5)
    # the arrivals span 3 s; the last third from 2 s: requests 3 and 4; the RLD's request is in flight 1 s of 1 s
    assert row["rld_in_flight_last_third"] == pytest.approx(1.0)
    # by third (0-1, 1-2, 2-3 s): the RLD's request (sent at 2 s) is in flight in the last alone
    assert row["rld_in_flight_by_third"] == pytest.approx([0.0, 0.0, 1.0])
    assert row["ttft_p90_ms"] == float("inf")  # a failed request ranks worst


def test_bcr_over_the_reference_and_the_cheapest_row_meeting_the_sla():
    keys = ("point", "variant", "bcr", "per_hour", "slo_attainment", "goodput_rps")
    rows = [
        dict(zip(keys, row), values={"k": row[0] + 1})
        for row in [
            (0, "pd-intra", 100.0, 960, 0.95, 10),
            (0, "pdd", 137.5, 946, 0.85, 12),
            (1, "pd-intra", 50.0, 960, 0.95, 5),
            (1, "pdd", None, 900, 0.92, 0),
        ]
    ]
    sweep.with_reference(rows, "pd-intra")
    assert [r["bcr_over_reference"] for r in rows] == [1.0, 1.375, 1.0, None]
    best = sweep.mark_cheapest(rows, 0.9)
    assert best is rows[3] and [r["cheapest"] for r in rows] == [False, False, False, True]
    assert sweep.mark_cheapest(rows, 0.99) is None and not any(r["cheapest"] for r in rows)
    sweep.mark_cheapest(rows, 0.9)
    for r in rows:
        r.update(ttft_p50_ms=1, ttft_p90_ms=2, rld_token_share=0, on_rld=0, p_hit=90, md_hit=90)
        r.update(rld_in_flight_last_third=0, rld_in_flight_by_third=[0, 1, 2], ttft_p50_last_third_ms=1)
    md = sweep.markdown(rows, ["k"], "pd-intra", 0.9, ["# head"])
    assert "| 2 | **pdd** (cheapest) |" in md and "pdd at {'k': 2}, 900.0 USD/h" in md
    assert "| 0.0 / 1.0 / 2.0 | 1 |" in md  # the RLD's load by third, then the last third's TTFT p50


def test_a_price_axis_reprices_the_catalogue():
    cat = load_catalogue()
    repriced = sweep._repriced(cat, {"price.h20": 3.25, "pools.md.workers": 8})
    assert repriced.accelerator("h20").price_per_hour == 3.25
    assert repriced.accelerator("h800").price_per_hour == cat.accelerator("h800").price_per_hour
    assert cat.accelerator("h20").price_per_hour != 3.25  # the shipped catalogue is left as it was


def test_the_cli_refuses_a_bad_axis_before_simulating(capsys, tmp_path):
    from experiments.cli import main

    assert main(["simulate", str(SPEC), "--sweep", "pools.mdd.workers=1,2", "--out", str(tmp_path)]) == 2
    assert "pddlab: error: --sweep {'pools.mdd.workers': 1}" in capsys.readouterr().err
    assert not (tmp_path / "sweep.md").exists()
