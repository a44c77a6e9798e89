"""The similarity to the published deployment (experiments.analysis.similarity): each ratio from synthetic
per-request records, its interval, the published column, and the table in summary.md of an analysed run."""

import json
import math

import pytest

from experiments.analysis import analyze, similarity, summary, summary_md
from experiments.analysis.records import RequestRecord
from experiments.rundir.metadata import ProfileRecord
from fake_run import make_run

SESSIONS, TURNS = 8, 5  # 40 requests in 8 sessions: enough for a median's interval


def profile(rate_mbit=8.0, delay_ms=50.0) -> ProfileRecord:
    """A WAN of rate_mbit both ways and a round trip of 2 x delay_ms."""
    link = {"rate_mbit": rate_mbit, "delay_ms": delay_ms}
    return ProfileRecord.model_validate({"name": "test", "a_to_b": link, "b_to_a": link})


def rec(i: int, variant="pdd", transfer_ms: float | None = 50.0, rld=4, out=11, gap_ms=10.0, **kw) -> RequestRecord:
    """Request i of a variant: prefill 100 ms, a WAN copy of transfer_ms (None: never landed), P's token, then
    `rld` RLD tokens and the rest on the MD, gap_ms apart."""
    workers = ["p1"] + ["rld1"] * rld + ["md1"] * (out - 1 - rld)
    spans = {"prefill": [0.0, 100.0]}
    if transfer_ms is not None:
        spans["wan_kv"] = [100.0, 100.0 + transfer_ms]
    fields = dict(
        variant=variant,
        request_id=f"r{i:04d}",
        session=f"s{i % SESSIONS}",
        turn=i // SESSIONS,
        kind="turn",
        ok=True,
        error=None,
        prompt_tokens=1000,
        max_tokens=out,
        output_tokens=out,
        route="p-rld-md" if variant == "pdd" else {"pd-cross": "p-md", "colocated": "colocated"}[variant],
        expected_hit=0.9,
        drc_hit=0.9 if variant == "pdd" else None,
        md_cached_tokens=900,
        token_ids=list(range(out)),
        token_ms=[100.0 + gap_ms * k for k in range(out)],
        token_workers=workers,
        t_send_ns=0,
        t_done_ns=1,
        ttft_ms=100.0,
        ttft_decode_ms=100.0 + gap_ms,
        tpot_ms=gap_ms,
        e2e_ms=100.0 + gap_ms * out,
        wan_kv_bytes=50_000,
        spans=spans,
        mode=variant,
        rld_tokens=rld,
        md_tokens=out - 1 - rld,
        p_tokens=1,
    )
    return RequestRecord(**{**fields, **kw})


def ratios(recs, variants=("pdd",), wan=None) -> dict[tuple[str, str], summary.SimilarityRatio]:
    sim = similarity.similarity(recs, list(variants), wan or profile())
    return {(r.variant, r.ratio): r for r in sim.ratios}


def test_each_ratio_of_a_pdd_variant_is_its_median_over_requests():
    # transfer 50 ms over prefill 100 ms; RTT 100 ms over TPOT 10 ms; 50 kB over 8 Mbit/s x 100 ms = 100 kB;
    # transfer 50 ms over the RLD's (11 - 1) x 10 ms; 4 of 11 tokens on the RLD; DRC 90%
    got = ratios([rec(i) for i in range(SESSIONS * TURNS)])
    want = {
        "kv_transfer_over_prefill": 0.5,
        "rtt_over_tpot": 10.0,
        "kv_bytes_over_bdp": 0.5,
        "kv_transfer_over_rld_decode": 0.5,
        "rld_token_share": 4 / 11,
        "drc_hit": 0.9,
    }
    assert {name: pytest.approx(got[("pdd", name)].value) for name in want} == want
    assert all(got[("pdd", name)].n == SESSIONS * TURNS for name in want)


def test_a_median_has_an_interval_from_the_sessions_and_too_few_requests_have_none():
    many = ratios([rec(i, transfer_ms=10.0 + i) for i in range(SESSIONS * TURNS)])[("pdd", "kv_transfer_over_prefill")]
    lo, hi = many.ci95
    assert lo < many.value < hi and many.statistic == similarity.MEDIAN
    few = ratios([rec(i, transfer_ms=10.0 + i) for i in range(6)])[("pdd", "kv_transfer_over_prefill")]
    assert few.value == pytest.approx((10 + 2.5) / 100) and few.ci95 is None


def test_the_token_share_and_the_hit_have_intervals_around_them():
    recs = [rec(i, rld=1 + i % 3, drc_hit=0.8 + 0.01 * (i % 7)) for i in range(SESSIONS * TURNS)]
    got = ratios(recs)
    for name in ("rld_token_share", "drc_hit"):
        r = got[("pdd", name)]
        assert r.ci95[0] < r.value < r.ci95[1] <= 1, name


def test_a_wan_copy_that_never_landed_ranks_longest():
    # on a slow line the RLD finishes first: 30 of 40 copies never land, so the median is among them
    recs = [rec(i, transfer_ms=None if i % 4 else 50.0) for i in range(SESSIONS * TURNS)]
    r = ratios(recs)[("pdd", "kv_transfer_over_rld_decode")]
    assert (r.value, r.beyond, r.never_landed, r.n) == (None, True, 30, 40)
    recs = [rec(i, transfer_ms=None if i % 4 == 0 else 50.0) for i in range(SESSIONS * TURNS)]
    r = ratios(recs)[("pdd", "kv_transfer_over_rld_decode")]
    assert (r.value, r.beyond, r.never_landed) == (pytest.approx(0.5), False, 10)


def test_the_rld_decode_time_takes_the_variants_gap_where_the_rld_made_one_token():
    # request 0 hands off after one RLD token: its TPOT on the RLD is the variant's median gap (10 ms)
    recs = [rec(0, rld=1, transfer_ms=200.0)] + [rec(i, transfer_ms=200.0) for i in range(1, 3)]
    r = ratios(recs)[("pdd", "kv_transfer_over_rld_decode")]
    assert r.value == pytest.approx(2.0) and r.n == 3


def test_ratios_apply_only_where_the_variant_has_them():
    recs = [rec(i, v) for v in ("colocated", "pd-cross", "pdd") for i in range(10)]
    got = ratios(recs, ("colocated", "pd-cross", "pdd"))
    assert not [k for k in got if k[0] == "colocated"]  # nothing crosses the WAN
    assert {k[1] for k in got if k[0] == "pd-cross"} == {
        "kv_transfer_over_prefill",
        "rtt_over_tpot",
        "kv_bytes_over_bdp",
    }
    unlimited = ratios(recs, ("pdd",), profile(rate_mbit=0.0))
    assert ("pdd", "kv_bytes_over_bdp") not in unlimited and ("pdd", "rtt_over_tpot") in unlimited


def test_the_published_column_is_derived_from_pdd_md_or_says_not_published():
    recs = [rec(i, v) for v in ("pd-cross", "pdd") for i in range(10)]
    got = ratios(recs, ("pd-cross", "pdd"))
    pub = {k: (r.published.relation, r.published.value) for k, r in got.items() if r.published.value is not None}
    assert pub == {
        ("pdd", "kv_transfer_over_prefill"): ("≥", pytest.approx(1 / 4.2)),  # P50 transfer 1 s / TTFT 4.2 s
        ("pd-cross", "kv_transfer_over_prefill"): ("≥", pytest.approx(2.5 / 4.2)),  # TTFT 4.2 -> 6.7 s
        ("pdd", "kv_transfer_over_rld_decode"): ("≈", 0.062),
        ("pdd", "rld_token_share"): ("≈", 0.062),
        ("pdd", "drc_hit"): ("≈", 0.90),
    }
    for k in (("pdd", "rtt_over_tpot"), ("pdd", "kv_bytes_over_bdp"), ("pd-cross", "kv_bytes_over_bdp")):
        assert got[k].published.basis.startswith("not published"), k


def test_the_table_shows_each_ratio_beside_the_published_value():
    recs = [rec(i, transfer_ms=None if i % 4 else 50.0) for i in range(SESSIONS * TURNS)]
    sim = similarity.similarity(recs, ["pdd"], profile())
    table = "\n".join(summary_md.similarity_section(sim))
    assert "## Similarity to the published deployment" in table
    assert "base RTT 100.0 ms" in table and "bandwidth-delay product 0.10 MB" in table
    assert "| RLD token share | pdd | 0.364 [" in table and "| 0.062 | 5.87× | 40 |" in table
    assert "| WAN RTT ÷ TPOT | pdd | 10 [10, 10] | not published | – | 40 |" in table
    assert "| pdd | never landed (30 of 40) | 0.062 | – | 40 |" in table
    assert "| ≥ 0.238 | " in table  # published lower bound, so this run's factor is an upper one


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The fake run, analysed (the analysis adds its similarity)."""
    run = make_run(tmp_path_factory.mktemp("similarity"))
    analyze.analyze(run)
    return run


def test_an_analysed_run_states_its_similarity_in_summary_json_and_md(run):
    sim = summary.read(run).similarity
    by = {(r.variant, r.ratio) for r in sim.ratios}
    assert (sim.rtt_ms, sim.rate_mbit, sim.bdp_bytes) == (60.0, 200.0, 1.5e6)  # fake_run: 30 ms each way
    assert {("pd-cross", "kv_transfer_over_prefill"), ("pdd", "rld_token_share"), ("pdd", "drc_hit")} <= by
    md = (run / "summary.md").read_text()
    assert "## Similarity to the published deployment" in md
    assert md.index("## Similarity") < md.index("## KV transfers by path")


def test_a_summary_without_similarity_still_reads(tmp_path, run):
    old = json.loads((run / "summary.json").read_text())
    del old["similarity"]
    (tmp_path / "summary.json").write_text(json.dumps(old))
    assert summary.read(tmp_path).similarity is None


def test_nothing_to_compare_is_no_section():
    assert summary_md.similarity_section(None) == []
    sim = similarity.similarity([rec(i, "colocated") for i in range(5)], ["colocated"], None)
    assert sim.ratios == [] and sim.rtt_ms is None and summary_md.similarity_section(sim) == []
    assert math.isclose(similarity.wan_setting(profile())[0], 100.0)
