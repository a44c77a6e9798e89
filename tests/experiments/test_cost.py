"""Hardware cost and BCR (experiments.analysis.cost): each variant's cost per hour from a synthetic resolved spec
and the shipped catalogue, BCR and its ratio over the reference with the goodput interval scaled, the `bcr`
comparisons, summary.md's table, a sweep's "BCR of ... by point" table, and an analysed real-compute run."""

import math
from types import SimpleNamespace

import pytest

from experiments.analysis import analyze, cost, summary, sweep_report
from experiments.analysis.summary import Cost
from fake_run import make_run
from workers.modelled.catalogue import load_catalogue

H800, H20 = 2.5, 1.0  # the shipped catalogue's USD/h (workers/modelled/accelerators.yaml)


@pytest.fixture(scope="module")
def cat():
    return load_catalogue()


def spec(line=2.0, compute_mode="modelled") -> dict:
    """The shape of pdd-bathtub-hetero: P and RLD on h800, MD on h20, 16 devices each; pools 2/2/2, pdd's RLD 1."""
    return {
        "variants": ["pd-intra-strong", "pd-cross", "pdd"],
        "pools": {"p": {"workers": 2}, "rld": {"workers": 2}, "md": {"workers": 2}},
        "deployment": {
            "compute": {"mode": compute_mode, "arch": "kimi-k2", "line_cost_per_hour": line},
            "p": {"accelerator": "h800", "devices": 16},
            "rld": {"accelerator": "h800", "devices": 16},
            "md": {"accelerator": "h20", "devices": 16},
        },
        "variant_defs": {
            "pd-intra-strong": {"mode": "pd-intra"},
            "pdd": {"mode": "pdd", "pools": {"rld": 1}},
        },
    }


def run_summary(goodput=None, comparisons=()) -> dict:
    goodput = goodput or {"pd-intra-strong": 1.0, "pd-cross": 0.5, "pdd": 1.2}
    return {"variants": {v: {"goodput_rps": g} for v, g in goodput.items()}, "comparisons": list(comparisons)}


def goodput_comparison(variant, base, ratio, ci):
    return {
        "metric": "goodput_rps",
        "variant": variant,
        "baseline": base,
        "ratio": ratio,
        "ci95": ci,
        "verdict": "higher",
        "paired": True,
        "scope": "this run",
    }


def test_each_variant_pays_for_the_roles_its_mode_uses_and_the_line_where_it_crosses_sites(cat):
    s = spec()
    intra, cross, pdd = (cost.variant_cost(s, v, cat) for v in ("pd-intra-strong", "pd-cross", "pdd"))
    assert intra.per_hour == 2 * 16 * H800 + 2 * 16 * H800  # P + RLD (the same room's decode), no MD, no line
    assert [w["role"] for w in intra.workers] == ["p", "rld"] and intra.line_per_hour == 0
    assert cross.per_hour == 2 * 16 * H800 + 2 * 16 * H20 + 2.0
    assert pdd.per_hour == 2 * 16 * H800 + 1 * 16 * H800 + 2 * 16 * H20 + 2.0  # its own pools: one RLD
    assert pdd.workers[1] == {
        "role": "rld",
        "workers": 1,
        "accelerator": "h800",
        "devices": 16,
        "price_per_hour": H800,
        "cost_per_hour": 16 * H800,
    }
    # a variant's own deployment override moves its price
    s["variant_defs"]["pdd"]["deployment"] = {"md": {"accelerator": "h800"}}
    assert cost.variant_cost(s, "pdd", cat).per_hour == 5 * 16 * H800 + 2.0


def test_real_compute_has_no_cost_and_says_why(cat):
    c = cost.cost_section(run_summary(), spec(compute_mode="real"), ["pd-intra-strong", "pdd"], cat)
    assert all(v.per_hour is None and v.bcr is None for v in c.variants.values())
    assert "this-machine's price is 0" in c.note
    assert cost.markdown_section(c) == ["## Cost and BCR", "", cost.REAL_NOTE + ".", ""]
    assert cost.markdown_section(None) == []


def test_an_unknown_accelerator_is_an_error_naming_the_field(cat):
    s = spec()
    s["deployment"]["md"]["accelerator"] = "h900"
    with pytest.raises(cost.CostError, match=r"variant pdd: deployment\.md\.accelerator: .*h900"):
        cost.variant_cost(s, "pdd", cat)


def test_bcr_is_requests_under_the_sla_per_usd():
    assert cost.bcr(1.0, 3600.0) == 1.0
    assert math.isclose(cost.bcr(0.5, 100.0), 18.0)
    assert cost.bcr(None, 100.0) is None and cost.bcr(1.0, 0.0) is None and cost.bcr(1.0, None) is None


def test_bcr_over_the_reference_scales_the_goodput_interval_by_the_cost_ratio(cat):
    comps = [goodput_comparison("pdd", "pd-intra-strong", 1.2, [1.1, 1.3])]
    c = cost.cost_section(run_summary(comparisons=comps), spec(), spec()["variants"], cat)
    assert c.reference == "pd-intra-strong"  # the variant of mode pd-intra
    ref, pdd = c.variants["pd-intra-strong"], c.variants["pdd"]
    assert math.isclose(pdd.bcr, 1.2 * 3600 / pdd.per_hour) and math.isclose(ref.bcr, 3600 / ref.per_hour)
    k = ref.per_hour / pdd.per_hour  # 160 / 154
    assert math.isclose(pdd.over_reference, 1.2 * k)
    assert pdd.over_reference_ci95 == pytest.approx([1.1 * k, 1.3 * k])
    # pd-cross has no goodput comparison with the reference: the ratio of the BCRs, no interval
    cross = c.variants["pd-cross"]
    assert math.isclose(cross.over_reference, cross.bcr / ref.bcr) and cross.over_reference_ci95 is None
    assert ref.over_reference is None


def test_a_comparison_the_other_way_round_is_inverted(cat):
    comps = [goodput_comparison("pd-intra-strong", "pdd", 0.8, [0.5, 1.0])]
    c = cost.cost_section(run_summary(comparisons=comps), spec(), spec()["variants"], cat)
    k = c.variants["pd-intra-strong"].per_hour / c.variants["pdd"].per_hour
    assert math.isclose(c.variants["pdd"].over_reference, k / 0.8)
    assert c.variants["pdd"].over_reference_ci95 == pytest.approx([k / 1.0, k / 0.5])


def test_a_variant_named_pd_intra_is_the_reference_before_one_of_its_mode():
    s = spec()
    assert cost.reference(s, ["pd-intra-strong", "pd-intra", "pdd"]) == "pd-intra"
    assert cost.reference(s, ["pd-cross", "pdd"]) is None


def test_bcr_comparisons_stand_beside_the_goodput_ones_with_their_own_verdict(cat):
    comps = [
        goodput_comparison("pdd", "pd-intra-strong", 1.02, [0.99, 1.05]),
        goodput_comparison("pdd", "pd-cross", 2.0, [1.5, 2.5]),
    ]
    data = run_summary(comparisons=comps)
    c = cost.cost_section(data, spec(), spec()["variants"], cat)
    out = {x["baseline"]: x for x in cost.bcr_comparisons(data, c)}
    intra = out["pd-intra-strong"]
    k = 160.0 / 154.0
    assert intra["metric"] == "bcr" and math.isclose(intra["ratio"], 1.02 * k)
    assert intra["ci95"] == pytest.approx([0.99 * k, 1.05 * k])
    assert intra["verdict"] == "higher"  # cheaper hardware lifts an n.s. goodput gain past 1
    assert intra["paired"] is True and intra["scope"] == "this run"
    assert math.isclose(out["pd-cross"]["ratio"], 2.0 * 114.0 / 154.0)


def test_the_markdown_table_gives_each_variants_cost_bcr_and_ratio_beside_the_published(cat):
    comps = [goodput_comparison("pdd", "pd-intra-strong", 1.2, [1.1, 1.3])]
    c = cost.cost_section(run_summary(comparisons=comps), spec(), spec()["variants"], cat)
    md = "\n".join(cost.markdown_section(c))
    assert "## Cost and BCR" in md and "BCR ÷ pd-intra-strong's" in md
    row = next(line for line in md.splitlines() if line.startswith("| pdd |"))
    k = 160.0 / 154.0
    assert f"{1.2 * k:.2f} [{1.1 * k:.2f}, {1.3 * k:.2f}] (+{100 * (1.2 * k - 1):.1f}%)" in row
    assert "p 2×16 h800, rld 1×16 h800, md 2×16 h20" in row and "| 154.00 |" in row and "| 0.963 |" in row
    assert "1 (reference)" in next(line for line in md.splitlines() if line.startswith("| pd-intra-strong |"))
    assert "+37.5%" in md and "+27.8%" in md


def test_the_sweep_table_gives_the_bcr_ratio_over_repeats_beside_the_published():
    def point(values, bcr, goodput):
        return {
            "values": values,
            "comparisons": {
                "bcr / pd-intra-strong": {"variant": "pdd", **bcr},
                "goodput_rps / pd-intra-strong": {"variant": "pdd", **goodput},
            },
        }

    agg = [
        point(
            {"workload.fixed_hit.hit": 0.2},
            {"mean": 1.1, "ci95": [1.0, 1.2], "n": 3},
            {"mean": 1.05, "ci95": None, "n": 1},
        ),
        point(
            {"workload.fixed_hit.hit": 0.9},
            {"mean": 1.4, "ci95": [1.3, 1.5], "n": 3},
            {"mean": 1.3, "ci95": [1.2, 1.4], "n": 3},
        ),
    ]
    lines = sweep_report.bcr_tables(agg)
    assert lines[0] == "## BCR of pdd over pd-intra-strong by point"
    assert (
        "| workload.fixed_hit.hit=0.2 | 1.100 [1.00, 1.20] (+10.0%) (n=3) | 1.050 (+5.0%) | 1.375 (+37.5%) | "
        in "\n".join(lines)
    )
    assert (
        "| workload.fixed_hit.hit=0.9 | 1.400 [1.30, 1.50] (+40.0%) (n=3) | 1.300 [1.20, 1.40] (+30.0%) (n=3)"
        in "\n".join(lines)
    )
    assert sweep_report.bcr_tables([{"values": {}, "comparisons": {}}]) == []


def test_a_sweep_aggregates_the_bcr_comparison_over_repeats_as_a_geometric_mean():
    class P:
        def __init__(self, ratio):
            self.index, self.values, self.status, self.name = 0, {"hit": 0.9}, "complete", "p0"
            self.metrics = {"pdd": sweep_report.point_metrics({"goodput_rps": 1.0})}
            self.comparisons = {
                "bcr / pd-intra-strong": {"variant": "pdd", "ratio": ratio, "ci95": None, "verdict": "x"}
            }

    agg = sweep_report.aggregate([P(1.2), P(1.5), P(1.35)])
    c = agg[0]["comparisons"]["bcr / pd-intra-strong"]
    assert math.isclose(c["mean"], (1.2 * 1.5 * 1.35) ** (1 / 3)) and c["n"] == 3 and c["ci95"][0] < c["mean"]
    plan = SimpleNamespace(spec="pdd-bathtub-hetero", axes=(), repeat=3)
    assert "## BCR of pdd over pd-intra-strong by point" in sweep_report.markdown(plan, [], agg)  # in sweep.md


def test_an_analysed_real_compute_run_has_a_cost_section_saying_why_it_is_empty(tmp_path):
    run = make_run(tmp_path)
    analyze.analyze(run)
    s = summary.read(run)
    assert isinstance(s.cost, Cost) and s.cost.note == cost.REAL_NOTE
    assert not [c for c in s.comparisons if c.metric == "bcr"]
    assert "## Cost and BCR" in (run / "summary.md").read_text()


def test_the_shipped_hetero_spec_costs_resemble_the_published_comparison():
    from experiments.spec.experiment import load_spec, to_dict

    d = to_dict(load_spec("pdd-bathtub-hetero", ["workload.fixed_hit.hit=0.2"]))
    costs = {v: cost.variant_cost(d, v).per_hour for v in d["variants"]}
    assert costs == {"pd-intra-strong": 160.0, "pd-cross": 114.0, "pdd-hetero": 154.0}
    assert cost.reference(d, d["variants"]) == "pd-intra-strong"
    lo, hi = cost.PUBLISHED_COST  # pdd's hardware 3.5-7.1% cheaper than same-room PD's, as published
    assert lo <= costs["pdd-hetero"] / costs["pd-intra-strong"] <= hi


def test_an_analysed_modelled_run_prices_each_variant_and_compares_bcr(tmp_path):
    import json

    run = make_run(tmp_path)
    meta = json.loads((run / "metadata.json").read_text())
    meta["spec"]["deployment"] = {
        **meta["spec"]["deployment"],
        "compute": {"mode": "modelled", "arch": "kimi-k2", "line_cost_per_hour": 2.0},
        "p": {"accelerator": "h800", "devices": 16},
        "rld": {"accelerator": "h800", "devices": 16},
        "md": {"accelerator": "h20", "devices": 16},
    }
    (run / "metadata.json").write_text(json.dumps(meta))
    analyze.analyze(run)
    s = summary.read(run)
    per_hour = {v: c.per_hour for v, c in s.cost.variants.items()}
    assert per_hour == {"colocated": 40.0, "pd-intra": 80.0, "pd-cross": 58.0, "pdd": 98.0}  # pools of one
    assert s.cost.reference == "pd-intra" and s.cost.note is None
    by = {(c.metric, c.baseline): c for c in s.comparisons}
    goodput, bcr = by[("goodput_rps", "pd-intra")], by[("bcr", "pd-intra")]
    assert math.isclose(bcr.ratio, goodput.ratio * 80.0 / 98.0)
    assert math.isclose(s.cost.variants["pdd"].over_reference, bcr.ratio)
    md = (run / "summary.md").read_text()
    assert "| pdd | pdd | p 1×16 h800, rld 1×16 h800, md 1×16 h20 | 2.00 | 98.00 |" in md
