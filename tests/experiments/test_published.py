"""Beside the published figures (experiments.analysis.published): each of PDD.md's figures against a run's value
with its interval, the ratio and the flag where they differ by more than 2x; in summary.json and summary.md of a
pdd-published run only."""

import pytest

from experiments.analysis import analyze, published, summary, summary_md
from experiments.rundir import metadata
from fake_run import make_run


def stats(**kw) -> dict:
    """A Stats mapping: values and, for `ci_<key>`, its interval."""
    ci = {k[3:]: v for k, v in kw.items() if k.startswith("ci_")}
    return {"n": 40, "beyond_completed": [], **{k: v for k, v in kw.items() if not k.startswith("ci_")}, "ci95": ci}


def synthetic() -> dict:
    """pd-intra / pd-cross / pdd as the analysis leaves them (only what the table reads)."""
    wan = lambda p50, mx: {"wan": {"time_ms": stats(p50=p50, max=mx, ci_p50=[0.8 * p50, 1.3 * p50])}}  # noqa: E731
    return {
        "variants": {
            "pd-intra": {"ttft_ms": stats(p50=4000.0, ci_p50=[3500.0, 4600.0])},
            "pd-cross": {
                "ttft_ms": stats(
                    p50=7000.0, p90=40000.0, p99=None, ci_p50=[6000.0, 8000.0], ci_p90=None, beyond_completed=["p99"]
                ),
                "kv_paths": wan(3000.0, 50000.0),
                "wan_kv_bytes_total": 8_000_000_000,
            },  # fmt: skip
            "pdd": {
                "ttft_ms": stats(p50=4100.0),
                "kv_paths": wan(900.0, 4000.0),
                "wan_kv_bytes_total": 2_000_000_000,
                "hit_rate": {"drc_mean": 0.45},
                "rld_token_share": 0.2,
                "handoff": {
                    "count": 30,
                    "latency_ms": stats(mean=300.0, max=700.0, std=40.0, ci_mean=[280.0, 330.0]),
                    "payload_bytes": stats(mean=1300.0),
                    "tokens": stats(mean=260.0, p50=250.0),
                },
            },
        },
        "comparisons": [
            {
                "metric": "wan_bytes_offered",
                "variant": "pdd",
                "baseline": "pd-cross",
                "ratio": 0.25,
                "ci95": [0.2, 0.5],
            },
        ],  # fmt: skip
        "similarity": {"ratios": [{"ratio": "rld_token_share", "variant": "pdd", "value": 0.2, "ci95": [0.1, 0.3]}]},
    }


def by_figure(rows) -> dict:
    return {r.figure: r for r in rows}


def test_each_published_figure_stands_beside_this_runs_value_and_interval():
    rows = by_figure(published.rows(synthetic(), {}, kv_bytes_per_token=70_272))
    r = rows["naive cross-DC TTFT p50"]
    assert (r.variant, r.value, r.ci95, r.published) == ("pd-cross", 7000.0, [6000.0, 8000.0], (6700, 6700))
    assert r.ratio == pytest.approx(7000 / 6700) and r.off is False
    assert rows["naive cross-DC TTFT p90"].ratio == pytest.approx(40000 / 18300) and rows["naive cross-DC TTFT p90"].off
    p99 = rows["naive cross-DC TTFT p99"]  # on failed requests: no value, no verdict
    assert (p99.value, p99.ratio, p99.off) == (None, None, None) and "did not complete" in p99.note
    assert rows["same-room PD TTFT p50"].variant == "pd-intra"
    # the reduction: the inverse of pdd's WAN bytes over pd-cross's, its interval inverted
    red = rows["WAN-traffic reduction at ~90% hit (up to 10x)"]
    assert red.value == pytest.approx(4.0) and red.ci95 == pytest.approx([2.0, 5.0])
    assert red.off and "pdd's DRC hit 45.0%" in red.note and "1 / (1 - hit)" in red.note  # 10 / 4: off, and why
    share = rows["RLD token share"]
    assert share.value == pytest.approx(20.0) and share.ci95 == pytest.approx([10.0, 30.0])
    assert share.off and "decode time" in share.note  # 3.2x the published 6.2%: flagged, with the usual reason
    assert (
        rows["100-token handoff: KV payload"].value == pytest.approx(7027.2)
        and rows["100-token handoff: KV payload"].variant is None
    )
    assert rows["100-token handoff: token-ID payload"].value == pytest.approx(0.5)  # 1300 B / 260 tokens x 100
    lat = rows["handoff by token IDs: latency mean"]
    assert (lat.value, lat.ci95, lat.off) == (300.0, [280.0, 330.0], False)
    assert rows["handoff by token IDs: latency std"].ratio == pytest.approx(40 / 4.8)


def test_a_range_is_off_only_outside_half_its_low_end_to_twice_its_high_end():
    rows = by_figure(published.rows(synthetic(), {}))
    within, beyond = (
        rows["naive cross-DC KV transfer p50, of 1-20 s"],
        rows["naive cross-DC KV transfer max, of 1-20 s"],
    )
    assert (within.value, within.ratio, within.off) == (3000.0, None, False)
    assert (beyond.value, beyond.off) == (50000.0, True)  # 50 s > 2 x 20 s
    assert rows["100-token handoff: KV payload"].value is None  # real compute: no architecture


def test_variants_are_found_by_mode():
    s = synthetic()
    s["variants"] = {"naive": s["variants"].pop("pd-cross"), **s["variants"]}
    spec = {"variant_defs": {"naive": {"mode": "pd-cross"}}}
    assert by_figure(published.rows(s, spec))["naive cross-DC TTFT p50"].variant == "naive"


def test_the_table_in_markdown_flags_what_is_off():
    s = synthetic()
    s["published"] = {"rows": [vars(r) for r in published.rows(s, {}, 70_272)]}
    md = "\n".join(published.markdown_section(s["published"]))
    assert "## Beside the published figures (shared/PDD.md)" in md
    assert "| naive cross-DC TTFT p50 (ms) | pd-cross | 7,000 [6,000, 8,000] | 6,700 | 1.04× |" in md
    assert "| naive cross-DC TTFT p90 (ms) | pd-cross | 40,000 | 18,300 | 2.19× **off > 2×** |" in md
    assert (
        "| naive cross-DC KV transfer max, of 1-20 s (ms) | pd-cross | 50,000 | 1,000-20,000 | – **off > 2×** |" in md
    )
    assert "7 of 14 figures differ from the published ones by more than 2×" in md
    assert published.markdown_section(None) == [] and published.markdown_section({"rows": []}) == []


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The fake run analysed twice: as pdd-smoke (no table) and renamed pdd-published (the table)."""
    plain = make_run(tmp_path_factory.mktemp("plain"), variants=("pd-intra", "pd-cross", "pdd"))
    named = make_run(tmp_path_factory.mktemp("named"), variants=("pd-intra", "pd-cross", "pdd"))
    meta = metadata.read(named)
    meta.experiment = "pdd-published"
    metadata.write(named, meta)
    for run in (plain, named):
        analyze.analyze(run)
    return plain, named


def test_only_a_run_that_asks_gets_the_table_in_summary_json_and_md(runs):
    plain, named = runs
    assert summary.read(plain).published is None
    assert "## Beside the published figures" not in (plain / "summary.md").read_text()
    assert "published" not in summary.read(named).reference  # its own key, typed in Summary
    rows = summary.read(named).published["rows"]
    assert [r["figure"] for r in rows][:2] == ["same-room PD TTFT p50", "naive cross-DC TTFT p50"]
    ttft = rows[1]
    assert ttft["variant"] == "pd-cross" and ttft["value"] is not None and ttft["published"] == [6700, 6700]
    md = (named / "summary.md").read_text()
    assert md.index("## Beside the published figures") < md.index("## KV transfers by path")
    assert summary_md.markdown(summary.read(named), metadata.read(named)) == md
