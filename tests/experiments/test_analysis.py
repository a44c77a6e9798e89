"""The analysis reads only the run directory: records, metrics, summary, plots, pcap."""

import json
import math

import pytest

from experiments.analysis import analyze, metrics, pcap, plots, summary_pdd
from experiments.rundir import clientlog
from experiments.rundir.clientlog import TokenRow
from experiments.rundir.metadata import SpecRecord
from experiments.analysis.records import read as read_records
from fake_run import make_run

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run = make_run(tmp_path_factory.mktemp("analysis"))
    analyze.analyze(run)
    return run


def test_summary_has_every_metric_per_variant(run):
    s = json.loads((run / "summary.json").read_text())
    assert set(s["variants"]) == {"colocated", "pd-intra", "pd-cross", "pdd"}
    for v in s["variants"].values():
        for key in ("ttft_ms", "ttft_decode_ms", "tpot_ms", "itl_ms", "e2e_ms"):
            assert set(v[key]) >= {"mean", "p50", "p90", "p95", "p99", "max"}
        assert v["completed"] == v["requests"] == 9
        assert set(v["hit_rate"]["buckets"]) == {"0-90", "90-93", "93-95", "95-97", "97-98", "98-99", "99-100"}
    p, x = s["variants"]["pdd"], s["variants"]["pd-cross"]
    assert p["wan_bytes_total"] < x["wan_bytes_total"]
    assert p["handoff"]["count"] == 9 and p["handoff"]["latency_ms"]["mean"] == pytest.approx(70)
    assert p["handoff"]["extend_ms"]["mean"] == pytest.approx(2)
    assert p["decode_batch"]["mean"] == pytest.approx(1.5, abs=1e-5)  # (4 x 2 + 12 x 4/3) / 16 steps
    assert 0 < p["rld_token_share"] < 0.5 and p["hit_rate"]["drc_mean"] > 0
    assert x["ttft_ms"]["p50"] == pytest.approx(90) and p["ttft_ms"]["p50"] == pytest.approx(20)
    assert s["streams"]["reference"] == "colocated"
    assert p["wan_bytes_pcap"] == {} and s["variants"]["colocated"]["wan_bytes_pcap"] == {"a_to_b": 3000, "b_to_a": 66}


def test_every_variant_has_vllms_benchmark_names_read_from_the_same_stats(run):
    s = json.loads((run / "summary.json").read_text())
    recs = [r for r in read_records(run) if r.variant == "pd-cross" and r.kind != "warmup"]
    v = s["variants"]["pd-cross"]
    names = v["vllm"]
    for metric, key in (("ttft", "ttft_ms"), ("tpot", "tpot_ms"), ("itl", "itl_ms"), ("e2el", "e2e_ms")):
        for stat, ours in (("mean", "mean"), ("median", "p50"), ("std", "std"), ("p90", "p90"), ("p99", "p99")):
            assert names[f"{stat}_{metric}_ms"] == v[key][ours], (stat, metric)
    assert names["median_ttft_ms"] == pytest.approx(90)
    assert names["completed"] == 9 and names["total_output_tokens"] == sum(r.output_tokens for r in recs)
    assert names["total_input_tokens"] == sum(r.prompt_tokens for r in recs) > 0
    dur = v["duration_s"]
    assert names["request_throughput"] == pytest.approx(9 / dur)
    assert names["output_throughput"] == pytest.approx(names["total_output_tokens"] / dur)
    total = names["total_input_tokens"] + names["total_output_tokens"]
    assert names["total_token_throughput"] == pytest.approx(total / dur)
    assert names["request_goodput"] == v["goodput_rps"]


def test_intervals_only_where_the_sample_supports_them_and_pdd_is_compared_with_each_baseline(run):
    s = json.loads((run / "summary.json").read_text())
    for v in s["variants"].values():
        st = v["ttft_ms"]
        assert st["failed"] == 0 and st["n"] == 9
        for key in ("mean", "p50", "p90", "p99"):
            ci = st["ci95"][key]
            assert ci is None or ci[0] <= st[key] <= ci[1], (key, st)
        assert st["ci95"]["p90"] is None and st["ci95"]["p99"] is None  # 9 requests in 3 sessions: too few
    comps = {(c["baseline"], c["metric"]): c for c in s["comparisons"]}
    assert {c["variant"] for c in s["comparisons"]} == {"pdd"}
    assert {b for b, _ in comps} == {"colocated", "pd-intra", "pd-cross"}
    c = comps[("pd-cross", "ttft_ms.p50")]
    assert c["ratio"] == pytest.approx(20 / 90) and c["paired"] and c["scope"] == "this run"
    assert c["ci95"] is None and c["verdict"] == "not judged"  # 3 sessions cannot support an interval
    md = (run / "summary.md").read_text()
    assert "## With 95% confidence intervals" in md and "## pdd over each baseline" in md


def test_requests_and_events_files(run):
    recs = read_records(run)
    assert len(recs) == 4 * 10  # warm-up included, excluded from the metrics
    r = next(r for r in recs if r.variant == "pdd" and r.kind == "turn" and r.turn > 1)
    assert r.route == "p-rld-md" and r.drc_hit == pytest.approx(r.md_cached_tokens / r.prompt_tokens)
    assert r.wan_bytes == r.wan_kv_bytes + 40 and r.spans["wan_kv"][0] <= r.spans["wan_kv"][1]
    evs = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    assert all(a["t_ns"] <= b["t_ns"] for a, b in zip(evs, evs[1:])) and {e["variant"] for e in evs} >= {"pdd"}


def test_summary_md_and_plots(run):
    md = (run / "summary.md").read_text()
    assert "| pdd |" in md and "TTFT-decode" in md and "## PDD" in md
    row = next(line for line in md.splitlines() if line.startswith("| pdd |"))
    assert row.split(" | ")[5] == "1.5"  # the decode batch column
    for name in plots.PLOTS:
        data = (run / "plots" / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 2000, name


def test_analysis_is_repeatable(run):
    first = json.loads((run / "summary.json").read_text())
    analyze.analyze(run)
    assert json.loads((run / "summary.json").read_text())["variants"] == first["variants"]


def test_not_a_run_directory(tmp_path):
    with pytest.raises(analyze.AnalysisError, match="no metadata.json"):
        analyze.analyze(tmp_path)


def test_pcap_parser(run):
    frames = pcap.read_frames(run / "pcap" / "wan-a.pcap")
    assert [(f.wire_bytes, f.direction) for f in frames] == [(1500, "a_to_b"), (1500, "a_to_b"), (66, "b_to_a")]
    assert pcap.bytes_between(frames, 1000.0, 1000.25) == {"a_to_b": 3000}
    assert pcap.direction("10.1.0.21") == "a_to_b" and pcap.direction("10.2.0.61") == "b_to_a"
    assert len(pcap.delivered(frames, frames)) == 3
    tp = pcap.throughput(frames, bin_s=0.5)
    assert tp["a_to_b"][0] == (0.0, 3000 * 8 / 0.5 / 1e6)


def test_a_truncated_last_record_ends_the_capture(run, tmp_path):
    cut = tmp_path / "cut.pcap"
    cut.write_bytes((run / "pcap" / "wan-a.pcap").read_bytes()[:-10])  # tcpdump killed mid-record
    assert [f.wire_bytes for f in pcap.read_frames(cut)] == [1500, 1500]


def test_pcap_rejects_other_files(tmp_path):
    (tmp_path / "x.pcap").write_bytes(b"\x0a\x0d\x0d\x0a" + b"\x00" * 40)
    with pytest.raises(pcap.PcapError, match="not a pcap file"):
        pcap.read_frames(tmp_path / "x.pcap")


def test_percentiles_match_numpy():
    import numpy as np

    xs = [5, 1, 9, 3, 7, 2]
    for p in (50, 90, 95, 99):
        assert metrics.percentile(xs, p) == pytest.approx(np.percentile(xs, p))
    assert math.isnan(metrics.percentile([], 50)) and metrics.stats([]) == {"n": 0}


def test_stream_divergence_is_reported(run):
    recs = read_records(run)
    for r in recs:
        if r.variant == "pdd" and r.request_id == "r0002":
            r.token_ids = r.token_ids[:3] + [999] + r.token_ids[4:]
    out = metrics.compare_streams([r for r in recs if r.kind != "warmup"], ["colocated", "pdd"])
    assert out["variants"]["pdd"]["diverged"] == 1 and out["variants"]["pdd"]["divergences"][0]["index"] == 3


def test_divergences_get_a_near_tie_verdict(tmp_path):
    from workers.engine import Engine
    from workers.sampling import TIE_MARGIN, top2_margin

    prompt, toks = [5, 9, 17, 33, 2], [40, 41, 42, 43]

    def line(variant, rid, prompt, toks):
        rec = clientlog.new_record(rid, variant, variant, "s", 1, "agent", len(toks), prompt, 0)
        rec.tokens = [TokenRow(i, t, "w", 0, 0) for i, t in enumerate(toks)]
        return clientlog.line(rec)

    for v, lines in {
        "colocated": [line("colocated", "a", prompt, toks), line("colocated", "b", prompt, toks)],
        "pdd": [line("pdd", "a", prompt, toks[:2] + [7, 8]), line("pdd", "b", prompt[:4], toks)],
    }.items():
        (tmp_path / "variants" / v).mkdir(parents=True)
        (tmp_path / "variants" / v / "client.jsonl").write_text("".join(lines))
    streams = {
        "reference": "colocated",
        "variants": {
            "pdd": {
                "equal": 0,
                "diverged": 3,
                "divergences": [
                    {"request_id": "a", "index": 2, "prompt_differs": False},
                    {"request_id": "b", "index": 0, "prompt_differs": False},
                ],
            }
        },
    }
    spec = SpecRecord(variants=["colocated", "pdd"], model="tiny", weights_seed=0, profile="p", slo={})
    analyze.judge_divergences(tmp_path, streams, spec)
    s = streams["variants"]["pdd"]
    want = top2_margin(Engine("tiny", seed=0, prefix_cache=False).reference_logits(prompt + toks[:2])[-1])
    a, b = s["divergences"]
    assert a["margin"] == pytest.approx(want) and a["near_tie"] == (want < TIE_MARGIN)
    assert b["prompt_differs"] and "margin" not in b
    assert (s["near_ties"] + s["unexplained"], s["prompt_differs"], s["unjudged"]) == (1, 1, 1)  # 3rd not listed


def test_requests_missing_from_a_client_log_count_against_the_workload(tmp_path):
    """A load generator killed mid-run leaves a short client log: the summary must still count every
    workload request, the missing ones as failed with their cause, not report 'done 3/3' of 10."""
    run = make_run(tmp_path, variants=("pdd",))
    log = run / "variants" / "pdd" / "client.jsonl"
    lines = log.read_text().splitlines()
    log.write_text("\n".join(lines[:4]) + "\n")  # the warm-up and three measured requests
    analyze.analyze(run)
    p = json.loads((run / "summary.json").read_text())["variants"]["pdd"]
    assert p["requests"] == 9 and p["completed"] == 3 and p["failed"] == 6, p
    assert all("no record: the load generator stopped" in e for e in p["errors"]), p["errors"]
    assert "3/9" in (run / "summary.md").read_text()


def _handoffs(modes: dict, latencies: list[float]) -> dict:
    lat = metrics.stats(latencies)
    return {
        "handoff": {
            "count": len(latencies),
            "modes": modes,
            "latency_ms": lat,
            "tokens": {"p50": 101},
            "payload_bytes": {"mean": 500},
            "extend_ms": {"mean": 3.0},
        }
    }


def test_handoffs_by_variant_and_the_std_ratio_of_ids_to_kv():

    per = {
        "ids": _handoffs({"oneshot": 3}, [300.0, 302.0, 304.0]),  # std 2
        "kv": _handoffs({"kv": 3}, [150.0, 190.0, 230.0]),  # std 40
        "pd-intra": {"handoff": {"count": 0}},
    }
    assert summary_pdd.std_ratio(per) == pytest.approx(2 / 40)
    lines = "\n".join(summary_pdd._handoff_section(per))
    assert "## Handoffs by variant" in lines and "| ids | oneshot: 3 | 3 | 101 |" in lines
    assert "302.0 / 2.0 / 302.0" in lines and "std(IDs) / std(KV) of the handoff latency: 0.05" in lines
    assert "| pd-intra |" not in lines and "published" in lines
    assert summary_pdd.std_ratio({"ids": per["ids"]}) is None and summary_pdd._handoff_section({}) == []


def test_stats_has_the_sample_std():
    assert metrics.stats([1.0, 3.0])["std"] == pytest.approx(math.sqrt(2)) and metrics.stats([5.0])["std"] == 0.0


def test_a_wan_without_a_fixed_rate_is_analysed(tmp_path):
    """A rate trace (wan-cellular-trace) or an unlimited line has no rate_mbit: the pdd section says so (the
    analysis of the default experiment on wan-cellular-trace raised a TypeError formatting None)."""
    run = make_run(tmp_path)
    meta = json.loads((run / "metadata.json").read_text())
    for d in ("a_to_b", "b_to_a"):
        meta["topology"]["wan_profile"][d]["rate_mbit"] = 0.0  # what a rate trace records
    (run / "metadata.json").write_text(json.dumps(meta))
    analyze.analyze(run)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["reference"]["wan_rate_mbit"] is None
    assert "no fixed WAN rate" in (run / "summary.md").read_text()
