"""A sweep as a user runs it: `pddlab sweep pdd-smoke --over link.loss_pct=0,3 --repeat 2` (tiny model).

Interrupted with SIGINT once two runs have finished, then finished with `--resume`:

- the runs finished before the interrupt are kept, not run again; an interrupted one is set aside and
  run anew; the interrupt leaves nothing behind (the autouse fixture);
- every point has every variant, each main latency with a 95% interval over its two repeats;
- pd-cross's TCP retransmissions on the WAN grow with the loss (more at 3% than at 0%);
- the points of one invocation share one topology (only the link changes between them);
- every run directory is an ordinary, analysed run; the sweep's plots are PNGs.
"""

import json
import signal
import subprocess
import sys
import time

import pytest

from experiments.analysis import sweep_report
from experiments.rundir.files import REPO

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
VARIANTS = ("colocated", "pd-intra", "pd-cross", "pdd")
# Two points, not three: the interrupt, the resume, intervals over repeats and retransmissions growing with
# the loss need no more, and each run is ~35 s of `make test` (CI keeps under 45 minutes).
LOSSES = (0, 3)
REPEATS = 2
RUNS = len(LOSSES) * REPEATS
ARGS = ["sweep", "pdd-smoke", "--over", "link.loss_pct=" + ",".join(map(str, LOSSES)), "--repeat", str(REPEATS)]
ARGS += ["--set", "runtime=process"]
RUN_LIMIT_S = 900


def _interruptible() -> None:
    # A job started in the background of a non-interactive shell (`make test &`, some CI runners) inherits
    # SIGINT ignored, and Python then installs no KeyboardInterrupt handler: give the sweep a terminal's Ctrl-C.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def pddlab(log, *args: str) -> subprocess.Popen:
    """The CLI as a user runs it; its output to a file (an undrained pipe would stall it)."""
    return subprocess.Popen(
        [sys.executable, "-m", "experiments.cli", *args],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        preexec_fn=_interruptible,
    )


def tail(path, n: int = 4000) -> str:
    return path.read_text(errors="replace")[-n:]


def state(out) -> dict:
    return json.loads((out / "sweep.json").read_text())


def _a_run_under_way(out) -> bool:
    """A point not yet complete whose run has begun its variants (on the shared topology): an interrupt now
    meets a run, not the gap between two (where there is nothing to set aside)."""
    done = {p["name"] for p in state(out)["points"] if p["status"] == "complete"}
    for meta in (out / "runs").glob("*/metadata.json"):
        if meta.parent.name not in done:
            try:
                if json.loads(meta.read_text()).get("variants"):
                    return True
            except json.JSONDecodeError:  # being written
                pass
    return False


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    results = tmp_path_factory.mktemp("sweeps")
    log1, log2 = results / "sweep.log", results / "resume.log"
    proc = pddlab(log1.open("w"), *ARGS, "--results", str(results))
    deadline = time.monotonic() + RUN_LIMIT_S
    out = None
    while proc.poll() is None and time.monotonic() < deadline:
        dirs = list(results.glob("*-sweep-pdd-smoke"))
        if dirs and (dirs[0] / "sweep.json").exists():
            out = dirs[0]
            if sum(p["status"] == "complete" for p in state(out)["points"]) >= 2 and _a_run_under_way(out):
                proc.send_signal(signal.SIGINT)  # Ctrl-C, as a user would, while the next run is under way
                break
        time.sleep(0.5)
    proc.wait(timeout=300)
    assert out is not None and proc.returncode == 130, tail(log1)
    before = state(out)
    resumed = pddlab(log2.open("w"), "sweep", "--resume", str(out))
    resumed.wait(timeout=RUN_LIMIT_S)
    assert resumed.returncode == 0, tail(log2)
    return out, before, state(out)


def test_an_interrupted_sweep_keeps_its_finished_runs_and_resume_runs_only_the_rest(swept):
    out, before, after = swept
    kept = {p["name"]: p for p in before["points"] if p["status"] == "complete"}
    assert 2 <= len(kept) < RUNS, [p["status"] for p in before["points"]]
    assert all(p["status"] in ("pending", "interrupted", "complete") for p in before["points"])
    assert [p["status"] for p in after["points"]] == ["complete"] * RUNS, [p["error"] for p in after["points"]]
    for p in after["points"]:
        if p["name"] in kept:
            assert p["wall_s"] == kept[p["name"]]["wall_s"] and p["run_dir"] == kept[p["name"]]["run_dir"]
    interrupted = [p["name"] for p in before["points"] if p["status"] == "interrupted"]
    for name in interrupted:
        assert (out / "runs" / f"{name}.attempt1" / "metadata.json").exists(), name
    assert len(after["resumed"]) == 1 and after["plan"] == before["plan"]


def test_every_point_has_every_variant_with_intervals(swept):
    out, _, after = swept
    assert len(after["aggregate"]) == len(LOSSES)
    for a in after["aggregate"]:
        assert set(a["variants"]) == set(VARIANTS) and a["complete"] == REPEATS
        for v in VARIANTS:
            m = a["variants"][v]["ttft_p50_ms"]
            assert m["n"] == REPEATS and m["ci95"][0] <= m["mean"] <= m["ci95"][1], (a["values"], v, m)
        assert {"ttft_ms.p50 / pd-cross", "ttft_ms.p50 / pd-intra"} <= set(a["comparisons"])
    seeds = {(p["index"], p["repeat"]): p["seed"] for p in after["points"]}
    assert seeds[(0, 0)] != seeds[(0, 1)] and seeds[(0, 0)] == seeds[(1, 0)]


def test_retransmissions_grow_with_loss(swept):
    _, _, after = swept
    retrans = {
        a["values"]["link.loss_pct"]: a["variants"]["pd-cross"]["wan_kv_retrans_bytes"] for a in after["aggregate"]
    }
    print({k: v.get("values") for k, v in retrans.items()})
    assert retrans[LOSSES[-1]]["mean"] > retrans[LOSSES[0]]["mean"]


def test_the_points_of_one_invocation_share_a_topology(swept):
    out, before, after = swept
    by_id = {}
    for p in after["points"]:
        by_id.setdefault(p["topology"], []).append(p["name"])
    assert None not in by_id and len(by_id) == 2, by_id  # one before the interrupt, one for the resume
    # The first topology also ran the interrupted point, which the resume's topology then ran again.
    runs = [t["runs"] for t in sorted(after["topologies"], key=lambda t: t["id"])]
    interrupted = sum(p["status"] == "interrupted" for p in before["points"])
    kept = sum(p["status"] == "complete" for p in before["points"])
    assert runs == [kept + interrupted, RUNS - kept], after["topologies"]
    for p in after["points"]:
        meta = json.loads((out / p["run_dir"] / "metadata.json").read_text())
        assert meta["shared_topology"]["id"] == p["topology"] and meta["complete"] is True
        assert meta["topology"]["wan_profile"]["a_to_b"]["loss_pct"] == p["values"]["link.loss_pct"]


def test_every_run_is_an_ordinary_analysed_run_and_the_plots_are_pngs(swept):
    out, _, after = swept
    for p in after["points"]:
        run = out / p["run_dir"]
        for name in ("summary.json", "summary.md", "requests.jsonl", "pcap/wan-a.pcap"):
            assert (run / name).exists(), (p["name"], name)
    for name in sweep_report.PLOTTED:
        data = (out / "plots" / f"{name}.png").read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 2000, name
    md = (out / "sweep.md").read_text()
    assert "## ttft_p50_ms" in md and "## Per-point overhead" in md and "shared" in md
