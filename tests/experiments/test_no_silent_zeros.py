"""A measurement that is missing is None (null in summary.json, "–" in summary.md), never 0."""

import math

from experiments.analysis import crosstraffic, metrics, records
from experiments.analysis.records import RequestRecord
from experiments.analysis.summary import Stats


def record(**kw) -> RequestRecord:
    base = dict(variant="pdd", request_id="s0-t1", session="s0", turn=1, kind="turn", ok=True, error=None,
                prompt_tokens=100, max_tokens=4, output_tokens=4, route="p-rld-md", expected_hit=0.9, drc_hit=0.9,
                md_cached_tokens=90, token_ids=[1, 2, 3, 4], token_ms=[10.0, 20.0, 30.0, 40.0],
                token_workers=["rld1", "rld1", "md1", "md1"], t_send_ns=0, t_done_ns=50_000_000, ttft_ms=10.0,
                ttft_decode_ms=20.0, tpot_ms=10.0, e2e_ms=40.0)  # fmt: skip
    return RequestRecord(**{**base, **kw})


def ev(event: str, **fields) -> dict:
    return {"event": event, "t_ns": 0, "request_id": "s0-t1", **fields}


def test_a_chunked_handoff_counts_every_chunk_it_shipped():
    evs = [
        ev("handoff_start", mode="chunked", final=False, tokens=2, payload_bytes=120),
        ev("handoff_end", mode="chunked", final=False, duration_ns=3_000_000),
        ev("handoff_start", mode="chunked", final=False, tokens=2, payload_bytes=110),
        ev("handoff_end", mode="chunked", final=False, duration_ns=2_000_000),
        ev("handoff_end", mode="ids", final=True, duration_ns=4_000_000, tokens=1, payload_bytes=40),
    ]
    rec = record()
    records._bytes(evs, rec)
    records._handoff(evs, rec, 0)
    assert rec.wan_handoff_bytes == 270 and rec.handoff["payload_bytes"] == 270


def test_a_handoff_without_a_duration_is_not_a_zero_ms_handoff():
    rec = record()
    records._handoff([ev("handoff_end", mode="ids", final=True, tokens=2, payload_bytes=40)], rec, 0)
    assert rec.handoff["duration_ms"] is None
    h = metrics._handoffs([rec, record(handoff={**rec.handoff, "duration_ms": 80.0})])
    assert h["count"] == 2 and h["latency_ms"]["n"] == 1 and h["latency_ms"]["mean"] == 80.0


def test_iperf3_without_intervals_measured_no_throughput():
    r = crosstraffic.parse_result({"intervals": [], "end": {}, "error": "unable to connect"}, "tcp")
    assert r.mean_mbit is None and r.error == "unable to connect"


def test_a_variant_with_nothing_measured_reports_none_not_zero():
    s = metrics.variant_summary([], metrics_slo())
    assert s["throughput_rps"] is None and s["goodput_rps"] is None and s["slo_attainment"] is None
    assert s["rld_token_share"] is None and s["md_token_share"] is None and s["hit_rate"]["expected_mean"] is None


def test_a_request_missing_from_the_workload_has_no_expected_hit():
    s = metrics.variant_summary(
        [record(expected_hit=None), record(request_id="s0-t2", expected_hit=0.5)], metrics_slo()
    )
    assert s["hit_rate"]["expected_mean"] == 0.5
    assert sum(b["requests"] for b in s["hit_rate"]["buckets"].values()) == 1


def metrics_slo():
    from experiments.spec.experiment import SLO

    return SLO()


def test_an_interval_that_ends_on_failed_requests_is_summarised_not_refused():
    """Most requests failed: p50's interval reaches into them (its upper end None, 'failed'); the summary's
    Stats takes it (a variant where most requests failed once crashed the analysis)."""
    xs = [100.0 + i for i in range(20)] + [math.inf] * 25
    d = metrics.stats(xs, list(range(45)))
    assert d["ci95"]["p50"][1] is None
    assert Stats(**d).ci95["p50"][1] is None
