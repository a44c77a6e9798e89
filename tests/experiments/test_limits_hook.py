"""The analysis judges every WAN KV transfer's limit (experiments.analysis.limits) in every analysed run: the
counts per variant in summary.json and summary.md, and the warning where a scaled line's run rests on
slow-start or loss-limited transfers."""

import pytest

from experiments.analysis import analyze, limits, summary
from experiments.rundir import metadata
from experiments.rundir.metadata import LineScalingRecord
from fake_run import make_run


def _scaled(run, kv_scale: float):
    """The fake run as if its 200 Mbit/s line were a published line of 200 x kv_scale Mbit/s."""
    meta = metadata.read(run)
    meta.line_scaling = LineScalingRecord(
        kv_scale=kv_scale,
        published_rate_mbit={"a_to_b": 200.0 * kv_scale, "b_to_a": 200.0 * kv_scale},
        applied_rate_mbit={"a_to_b": 200.0, "b_to_a": 200.0},
    )
    metadata.write(run, meta)
    return run


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The fake run of the newer data plane (TCP_INFO, retransmissions), analysed at kv_scale 1."""
    run = make_run(tmp_path_factory.mktemp("limits"), tcp=True)
    analyze.analyze(run)
    return run


def test_an_analysed_run_counts_each_variants_wan_transfers_by_limit(run):
    s = summary.read(run)
    for v in ("pd-cross", "pdd"):
        lim = s.variants[v].transfer_limits
        assert lim is not None and lim["line_mbit"] == 200.0 and lim["kv_scale"] == 1.0
        judged = sum(lim[k] for k in limits.LIMITS)
        assert judged == len(lim["transfers"]) > 0
        # fake_run's transfers: a few kB in 50-140 ms at a 30-60 ms RTT, under one BDP: slow start bound
        assert lim["slow_start"] == judged
    assert s.variants["colocated"].transfer_limits["transfers"] == []  # no WAN: judged, nothing to judge
    md = (run / "summary.md").read_text()
    assert "## WAN KV transfers: what limited them" in md
    assert f"| pdd | 200.0 (1) | 0 | {s.variants['pdd'].transfer_limits['slow_start']} | 0 | 0 | 0 |" in md
    assert "| colocated | 200.0" not in md
    assert not [w for w in s.warnings if w["kind"] == "scaled_line_loss_limited"]  # kv_scale 1: faithful


def test_a_scaled_run_resting_on_loss_limited_transfers_is_warned_about(tmp_path):
    run = _scaled(make_run(tmp_path, variants=("colocated", "pdd"), tcp=True), 50.0)
    analyze.analyze(run)
    s = summary.read(run)
    assert s.variants["pdd"].transfer_limits["kv_scale"] == 50.0
    [w] = [w for w in s.warnings if w["kind"] == "scaled_line_loss_limited"]
    assert w["variant"] == "pdd" and "kv_scale=50" in w["message"]
    md = (run / "summary.md").read_text()
    assert md.index("## Warnings") < md.index("slow start) on a line scaled by kv_scale=50")
    assert "| pdd | 200.0 (50) |" in md
