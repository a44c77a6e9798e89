"""Smoke test of the serving experiment: topology + roles + load + analysis, all four variants, tiny model.

Runs `experiments/specs/pdd-smoke.yaml` (about a minute) into a temporary
results directory and checks the JSON results, not log text:

- every request of every variant completed with exactly max_tokens tokens;
- token streams are equal across variants, except at logit near-ties
  (summary.json's verdicts: the analysis recomputes the top-2 margin with the
  reference model at each divergence), which are reported;
- pd-cross's median TTFT exceeds pdd's by at least the profile's serialisation
  time of the median uncached suffix (the first token reaches the client from
  the decode side, so pd-cross's WAN transfer is on its path);
- pdd sent fewer bytes across the WAN than pd-cross;
- every plot is a valid PNG; the roles stopped cleanly; nothing is left behind
  (the autouse fixture in conftest.py).
"""

import json

import pytest

from experiments.analysis import plots, records
from experiments.run import runner
from experiments.spec.experiment import load_spec
from workers.sampling import TIE_MARGIN

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    spec = load_spec("pdd-smoke")
    out = runner.run(spec, results=tmp_path_factory.mktemp("results"))
    return spec, out


def test_every_variant_completes_every_request(smoke_run):
    spec, out = smoke_run
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["complete"] is True, meta.get("error") or meta["variants"]
    # the machine's reference speed, before the first variant and after the last (workers.speed)
    for speed in (meta["provenance"]["machine"]["speed"], meta["speed_at_end"]):
        assert speed["prefill_cpu_ms"] > speed["decode_cpu_ms"] > 0 and len(speed["load_average"]) == 3
    for v, w in meta["variants"].items():
        assert w["status"] == "ok" and all(c == 0 for c in w["exit_codes"].values()), (v, w)
    recs = records.read(out)
    assert {r.variant for r in recs} == set(spec.variants)
    bad = [
        (r.variant, r.request_id, r.error, r.output_tokens, r.max_tokens)
        for r in recs
        if not r.ok or r.output_tokens != r.max_tokens
    ]
    assert not bad, bad


def test_token_streams_equal_across_variants(smoke_run):
    _, out = smoke_run
    summary = json.loads((out / "summary.json").read_text())
    for v, s in summary["streams"]["variants"].items():
        print(
            v,
            {k: s[k] for k in ("equal", "diverged", "near_ties", "unexplained", "prompt_differs", "unjudged")},
            s["divergences"][:3],
        )
        assert s["equal"] + s["diverged"] > 0, v
        assert s["unexplained"] == 0, s["divergences"]
        assert s["near_ties"] + s["prompt_differs"] + s["unjudged"] == s["diverged"], s
        assert all(d["margin"] < TIE_MARGIN for d in s["divergences"] if "margin" in d)


def test_pdd_hides_the_wan_that_pd_cross_pays(smoke_run):
    _, out = smoke_run
    s = json.loads((out / "summary.json").read_text())
    pdd, cross = s["variants"]["pdd"], s["variants"]["pd-cross"]
    need_ms = s["reference"]["wan_estimate_ms_median_uncached"]
    gap_ms = cross["ttft_ms"]["p50"] - pdd["ttft_ms"]["p50"]
    print(
        f"TTFT p50: pd-cross {cross['ttft_ms']['p50']:.1f} ms, pdd {pdd['ttft_ms']['p50']:.1f} ms "
        f"(gap {gap_ms:.1f} ms, WAN estimate {need_ms:.2f} ms); TTFT-decode p50: pd-cross "
        f"{cross['ttft_decode_ms']['p50']:.1f} ms, pdd {pdd['ttft_decode_ms']['p50']:.1f} ms"
    )
    assert gap_ms >= need_ms
    assert pdd["wan_bytes_total"] < cross["wan_bytes_total"]
    # With the tiny model the RLD often finishes before the MD holds the KV (no handoff): both are PDD.
    assert pdd["routes"].get("p-rld-md", 0) > 0
    assert pdd["singular"]["count"] >= 1 and pdd["singular"]["kv_bytes_saved"] > 0


def test_plots_are_valid_pngs(smoke_run):
    _, out = smoke_run
    for name in plots.PLOTS:
        data = (out / "plots" / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 2000, name
    for name in ("requests.jsonl", "events.jsonl", "summary.md", "pcap/wan-a.pcap", "pcap/wan-b.pcap"):
        assert (out / name).stat().st_size > 0, name


def _sigint_default() -> None:
    """A terminal's foreground job has SIGINT's default action; a background job of a script ignores it."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_keeps_results_marks_incomplete_and_leaves_nothing(tmp_path):
    """SIGINT to the whole process group (what a terminal's Ctrl-C does) once the first variant is done."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from experiments.run.deploy import REPO

    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "experiments.cli",
            "run",
            "pdd-smoke",
            "--results",
            str(tmp_path),
            "--set",
            "variants=[pd-intra, pdd]",
        ],
        cwd=REPO,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=_sigint_default,
    )
    deadline = time.monotonic() + 150
    meta_path = None
    while time.monotonic() < deadline and proc.poll() is None:
        found = list(tmp_path.glob("*/metadata.json"))
        if found:
            meta_path = found[0]
            variants = json.loads(meta_path.read_text()).get("variants", {})
            if variants.get("pd-intra", {}).get("status") == "ok" and "pdd" in variants:
                break
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=90)
    assert proc.returncode == 130, out[-3000:]
    meta = json.loads(meta_path.read_text())
    assert meta["complete"] is False and meta.get("interrupted") is True
    assert meta["variants"]["pd-intra"]["status"] == "ok" and meta["variants"]["pdd"]["status"] == "interrupted"
    recs = records.read(meta_path.parent)
    assert any(r.variant == "pd-intra" and r.ok for r in recs)
    assert (meta_path.parent / "summary.json").exists()
