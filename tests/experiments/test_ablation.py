"""The ablation's analysis (pure): hits, the RLD's share and sessions, TTFT per time bin, and the verdict."""

from types import SimpleNamespace

import pytest

from experiments.analysis import ablation

S = 1_000_000_000


def rec(variant, rid, t_s, route, md_cached, prompt=100, ttft=50.0):
    return SimpleNamespace(
        variant=variant,
        request_id=rid,
        issued=True,
        kind="turn",
        t_send_ns=int(t_s * S),
        route=route,
        md_cached_tokens=md_cached,
        prompt_tokens=prompt,
        ok=True,
        ttft_ms=ttft,
    )


def p_done(variant, rid, cached, computed):
    return {"variant": variant, "event": "prefill_done", "role": "p", "request_id": rid, "t_ns": 0,
            "cached_tokens": cached, "computed_tokens": computed}  # fmt: skip


def rld(variant, rid, event, t_s):
    return {"variant": variant, "event": event, "worker": "rld1", "request_id": rid, "t_ns": int(t_s * S)}


def run(variant, md_hits, on_rld_from_bin, sessions_open):
    """Three 20 s bins of two requests each; P always hits 90%; the MD as given."""
    recs, evs = [], []
    for i, md in enumerate(md_hits):
        rid, t = f"{variant}-{i}", 10 * i
        route = "p-rld-ablation" if i // 2 >= on_rld_from_bin else "p-rld-md"
        recs.append(rec(variant, rid, t, route, md))
        evs.append(p_done(variant, f"{variant}.{rid}", 90, 10))  # the roles log <variant>.<request id>
    for k in range(sessions_open):  # sessions opened at 40 s and never closed
        evs.append(rld(variant, f"{variant}-open{k}", "decode_open", 40))
    return recs, evs


def test_bins_and_a_verdict_that_holds():
    pr, pe = run("pdd", [90, 90, 88, 90, 90, 90], 9, 1)
    ar, ae = run("ablation", [90, 90, 40, 30, 20, 10], 1, 4)
    pdd = ablation.over_time(pr, pe, "pdd", 0)
    abl = ablation.over_time(ar, ae, "ablation", 0)
    assert [b["t_s"] for b in abl] == [0, 20, 40] and [b["requests"] for b in abl] == [2, 2, 2]
    assert abl[0]["p_hit"] == 90 and abl[2]["md_hit"] == 15 and abl[1]["on_rld"] == 100 and abl[0]["on_rld"] == 0
    assert abl[1]["rld_sessions"] == 0 and abl[2]["rld_sessions"] == pytest.approx(4)
    v = ablation.verdict(pdd, abl)
    assert v["md_hit_gap_pp"] == {"pdd": 0, "ablation": 75} and v["rld_sessions"] == {"pdd": 1, "ablation": 4}
    assert v["md_hit_falls_behind"] and v["rld_saturates"] and v["claim_holds"]


def test_a_verdict_that_does_not_hold_says_so():
    pr, pe = run("pdd", [90] * 6, 9, 2)
    ar, ae = run("ablation", [90, 90, 85, 85, 84, 86], 1, 3)
    v = ablation.verdict(ablation.over_time(pr, pe, "pdd", 0), ablation.over_time(ar, ae, "ablation", 0))
    assert not v["md_hit_falls_behind"] and not v["rld_saturates"] and not v["claim_holds"]


def collapsed_run():
    """records, events and spec of a run whose ablation variant `abl` collapses (the claim holds)."""
    spec = SimpleNamespace(
        variants=["pdd", "abl"],
        variant_defs={"abl": {"mode": "pdd", "deployment": {"policy": {"ablation_local_rld": True}}}},
    )
    pr, pe = run("pdd", [90] * 6, 9, 1)
    ar, ae = run("abl", [90, 90, 40, 30, 20, 10], 1, 4)
    return pr + ar, pe + ae, spec


def test_summary_only_for_a_spec_with_pdd_and_an_ablation_variant():
    s = ablation.summarize(*collapsed_run())
    assert s["ablation_variant"] == "abl" and s["verdict"]["claim_holds"] and len(s["variants"]["abl"]) == 3
    recs, evs, _ = collapsed_run()
    assert ablation.summarize(recs, evs, SimpleNamespace(variants=["pdd", "pd-intra"], variant_defs={})) is None


def test_the_section_and_the_plot_render(tmp_path):
    from experiments.analysis import plots, summary_md

    s = ablation.summarize(*collapsed_run())
    text = "\n".join(summary_md._ablation_section(s))
    assert "behind P's by 0.0 points in pdd and 75.0 in abl" in text and "The claim" in text and "holds." in text
    assert "| abl | 90/90% · 0% · 0.0 | 90/35% · 100% · 0.0 | 90/15% · 100% · 4.0 |" in text
    plots.ablation_over_time(s, tmp_path / "ablation.png")
    assert (tmp_path / "ablation.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
