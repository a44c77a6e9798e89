"""Comparisons between variants: paired by request, clustered by session, latencies over every issued request
(failures ranked worst), WAN bytes as offered, and no verdict where the machinery fell behind."""

import math

import pytest

from experiments.analysis import metrics
from experiments.analysis.analyze import mark_machinery
from experiments.analysis.records import RequestRecord
from experiments.spec.experiment import SLO


def record(variant: str, session: int, turn: int, ttft: float, ok: bool = True, wan: int = 0) -> RequestRecord:
    return RequestRecord(
        variant=variant, request_id=f"s{session}-t{turn}", session=f"s{session}", turn=turn, kind="turn", ok=ok,
        error=None if ok else "boom", prompt_tokens=100, max_tokens=4, output_tokens=4 if ok else 0,
        route="p-rld-md", expected_hit=0.9, drc_hit=None, md_cached_tokens=0, token_ids=[1, 2, 3, 4],
        token_ms=[ttft, ttft + 10, ttft + 20, ttft + 30], token_workers=["rld1"] * 4, t_send_ns=turn * 10**9,
        t_done_ns=turn * 10**9 + 10**8, ttft_ms=ttft if ok else None, ttft_decode_ms=ttft, tpot_ms=10.0,
        e2e_ms=ttft + 30, wan_bytes=wan,
    )  # fmt: skip


def pair(ratio: float, sessions: int = 12, turns: int = 6) -> list[RequestRecord]:
    """The same requests in two variants; a session's level shared by both (the pairing removes it)."""
    recs = []
    for s in range(sessions):
        for t in range(turns):
            base = 100 * (1 + s) + 7 * t
            recs.append(record("pd-intra", s, t, base, wan=1000 + s))
            recs.append(record("pdd", s, t, base * ratio * (1 + 0.02 * ((s * t) % 3 - 1)), wan=250 + s))
    return recs


def test_a_clear_effect_is_resolved_paired_by_request():
    comps = {c["metric"]: c for c in metrics.comparisons(pair(2.0), ["pd-intra", "pdd"], SLO())}
    c = comps["ttft_ms.p50"]
    assert c["paired"] and c["scope"] == "this run" and c["verdict"] == "higher"
    assert c["ci95"][0] < c["ratio"] < c["ci95"][1] and c["ci95"][1] / c["ci95"][0] < 1.3  # the pairing pays


def test_a_failed_request_ranks_worst_in_the_quantiles():
    recs = [record("pdd", s, 0, 100.0 + s) for s in range(9)] + [record("pdd", 9, 0, 0.0, ok=False)]
    st = metrics.request_stats(recs, lambda r: r.ttft_ms)
    assert st["n"] == 9 and st["failed"] == 1 and st["p50"] == pytest.approx(104.5)
    assert st["p99"] is None and "p99" in st["beyond_completed"] and st["max"] is None


def test_wan_bytes_are_compared_as_offered():
    recs = pair(1.0)
    [w] = [c for c in metrics.comparisons(recs, ["pd-intra", "pdd"], None, {"pdd": 500, "pd-intra": 2000})
           if c["metric"] == "wan_bytes_offered"]  # fmt: skip
    app = sum(r.wan_bytes for r in recs if r.variant == "pdd") / sum(r.wan_bytes for r in recs if r.variant != "pdd")
    assert w["ratio"] == pytest.approx(0.25) and w["verdict"] == "lower"
    assert w["ci95"][0] < 0.25 < w["ci95"][1]
    assert math.isclose(w["ci95"][0] * w["ci95"][1], 0.25**2 * _geo(recs) / app**2, rel_tol=1e-9)
    assert not [c for c in metrics.comparisons(recs, ["pd-intra", "pdd"], None, {}) if c["metric"].startswith("wan")]


def _geo(recs):
    """lo * hi of the application bytes' own interval (the offered one is moved on the log scale)."""
    x, y = (metrics._sample(recs, v, lambda r: float(r.wan_bytes), latency=False) for v in ("pdd", "pd-intra"))
    lo, hi = metrics.confidence.ratio_interval(x, y, "sum")
    return lo * hi


def test_no_verdict_where_the_emulator_fell_behind():
    summary = {
        "variants": {
            "pdd": {"emulator": _emulator(late=False), "emulator_p99_late_ms": 0.2},
            "pd-intra": {"emulator": _emulator(late=True), "emulator_p99_late_ms": 81.0},
        },
        "comparisons": metrics.comparisons(pair(2.0), ["pd-intra", "pdd"], SLO()),
    }
    assert any(c["verdict"] == "higher" for c in summary["comparisons"])
    mark_machinery(summary)
    for c in summary["comparisons"]:
        assert c["verdict"] == "not judged" and "pd-intra (p99 81.0 ms late)" in c["caveat"]


def _emulator(late: bool) -> dict:
    d = {"frames": 1, "p50_us": 1, "p99_us": 1, "max_us": 1, "rx_drops": 0, "tx_errors": 0}
    return {"a_to_b": d, "b_to_a": d, "cpu_share": 0.1, "late": late}
