"""The roles' CPU time per variant (experiments.analysis.rolecpu): each role's role_cpu event summed per role kind,
the totals and the serving CPU per completed request; a role that never reported (SIGKILL) is missing, never 0;
a run made before role_cpu has none, and a summary.json written before the field still reads (schema 2)."""

import json

import pytest

from experiments.analysis import analyze, rolecpu, summary
from fake_run import make_run

T_NS = 99_000_000_000  # after every event of the fake run


def report(worker: str, role: str, cpu_s: float, startup_cpu_s: float, wall_s: float | None = 30.0) -> dict:
    """A role_cpu event as workers/roles/server.py writes it (user 80%, system 20%)."""
    return {
        "t_ns": T_NS,
        "worker": worker,
        "role": role,
        "event": "role_cpu",
        "request_id": None,
        "user_s": round(0.8 * cpu_s, 3),
        "system_s": round(0.2 * cpu_s, 3),
        "cpu_s": cpu_s,
        "startup_cpu_s": startup_cpu_s,
        "serving_cpu_s": round(cpu_s - startup_cpu_s, 3),
        "wall_s": wall_s,
        "serving_wall_s": 20.0,
    }


DEPLOYED = ["router", "p1", "p2", "rld1", "md1"]


def test_each_role_kind_sums_its_workers_and_the_totals_sum_the_kinds():
    evs = [
        report("router", "router", 2.0, 1.5),
        report("p1", "p", 10.0, 3.0),
        report("p2", "p", 6.0, 3.0),
        report("rld1", "rld", 8.0, 3.0),
        report("md1", "md", 5.0, 3.0, wall_s=None),
    ]
    c = rolecpu.variant_cpu(evs, DEPLOYED, completed=10)
    p = c.roles["p"]
    assert (p.workers, p.cpu_s, p.startup_cpu_s, p.serving_cpu_s, p.wall_s) == (2, 16.0, 6.0, 10.0, 60.0)
    assert (p.user_s, p.system_s) == (12.8, 3.2)
    assert c.roles["md"].wall_s is None  # one age unknown: no sum, not a partial one
    assert (c.cpu_s, c.serving_cpu_s) == (31.0, 17.5)
    assert c.serving_cpu_s_per_request == 1.75
    assert c.missing == []


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    """A fake run whose roles reported their CPU, except pdd's MD (killed): analysed."""
    run = make_run(tmp_path_factory.mktemp("rolecpu"))
    for vdir in (run / "variants").iterdir():
        for w, role, cpu, startup in (
            ("router", "router", 2, 1),
            ("p1", "p", 12, 4),
            ("rld1", "rld", 9, 4),
            ("md1", "md", 7, 4),
        ):
            if (vdir.name, w) == ("pdd", "md1"):
                continue
            with open(vdir / "events" / f"{w}.jsonl", "a") as f:
                f.write(json.dumps(report(w, role, cpu, startup)) + "\n")
    analyze.analyze(run)
    return run


def _one_variant(run, c) -> summary.Summary:
    """The analysed run's summary with pdd alone, its roles_cpu c."""
    s = json.loads((run / "summary.json").read_text())
    s["variants"] = {"pdd": {**s["variants"]["pdd"], "roles_cpu": c.model_dump(mode="json")}}
    return summary.Summary.model_validate(s)


def test_a_role_that_never_reported_is_missing_not_zero(analysed):
    evs = [report("router", "router", 2.0, 1.5), report("p1", "p", 10.0, 3.0), report("rld1", "rld", 8.0, 3.0)]
    evs.append({"t_ns": 1, "worker": "md1", "role": "md", "event": "decode_open", "request_id": "r1"})
    c = rolecpu.variant_cpu(evs, DEPLOYED, completed=4)
    assert c.roles["md"].workers == 0 and c.roles["md"].cpu_s is None and c.roles["md"].missing == ["md1"]
    assert c.roles["p"].workers == 1 and c.roles["p"].cpu_s == 10.0 and c.roles["p"].missing == ["p2"]
    assert c.missing == ["md1", "p2"]
    assert c.cpu_s == 20.0  # the kinds that reported; `missing` names what is not in it
    md = rolecpu.markdown_section(_one_variant(analysed, c))
    row = next(line for line in md if line.startswith("| pdd |"))
    assert "10.0 (7.0); p2 missing" in row and "missing (md1)" in row and "20.0 (partial)" in row


def test_a_worker_its_events_name_but_its_deployment_does_not_counts_too():
    c = rolecpu.variant_cpu([report("rld2", "rld", 4.0, 1.0)], [], completed=0)
    assert c.roles["rld"].cpu_s == 4.0 and c.serving_cpu_s_per_request is None  # nothing completed: no ratio


def test_the_analysis_writes_roles_cpu_per_variant_and_summary_md_shows_it(analysed):
    s = summary.read(analysed)
    pd = s.variants["pd-intra"].roles_cpu
    assert pd.cpu_s == 30.0 and pd.serving_cpu_s == 17.0 and pd.missing == []
    assert pd.serving_cpu_s_per_request == round(17.0 / s.variants["pd-intra"].completed, 4)
    pdd = s.variants["pdd"].roles_cpu
    assert pdd.missing == ["md1"] and pdd.roles["md"].cpu_s is None and pdd.cpu_s == 23.0
    md = (analysed / "summary.md").read_text()
    assert "## Roles' CPU time" in md
    assert "| pdd | 12.0 (8.0) | 9.0 (5.0) | missing (md1) | 2.0 (1.0) | 23.0 (partial) |" in md


def test_a_run_whose_roles_predate_role_cpu_has_none(tmp_path):
    run = make_run(tmp_path)
    analyze.analyze(run)
    s = summary.read(run)
    assert all(v.roles_cpu is None for v in s.variants.values())
    assert "Roles' CPU time" not in (run / "summary.md").read_text()


def test_a_summary_written_before_the_field_still_reads(tmp_path, analysed):
    old = json.loads((analysed / "summary.json").read_text())
    for v in old["variants"].values():
        del v["roles_cpu"]
    (tmp_path / "summary.json").write_text(json.dumps(old))
    assert summary.read(tmp_path).variants["pdd"].roles_cpu is None


def modelled(event: dict, modelled_s: float, late_s: float, late_max_ms: float) -> dict:
    """A role_cpu event of a modelled engine (workers.modelled.engine.ModelledEngine.pace)."""
    return {**event, "modelled_s": modelled_s, "modelled_late_s": late_s, "modelled_late_max_ms": late_max_ms}


def test_a_modelled_role_kinds_pace_sums_its_workers_and_a_slow_one_is_warned_about(analysed):
    evs = [
        report("router", "router", 2.0, 1.5),
        modelled(report("p1", "p", 10.0, 3.0), 20.0, 5.0, 80.0),
        modelled(report("p2", "p", 6.0, 3.0), 20.0, 1.0, 120.0),
        modelled(report("rld1", "rld", 8.0, 3.0), 10.0, 0.5, 9.0),
        modelled(report("md1", "md", 5.0, 3.0), 10.0, 0.0, 0.0),
    ]
    c = rolecpu.variant_cpu(evs, DEPLOYED, completed=10)
    p = c.roles["p"]
    assert (p.modelled_s, p.modelled_late_s, p.modelled_late_max_ms) == (40.0, 6.0, 120.0)
    assert p.pace == pytest.approx(1.15) and c.roles["rld"].pace == pytest.approx(1.05) and c.roles["md"].pace == 1.0
    assert c.roles["router"].pace is None  # the router models nothing
    warned = rolecpu.late_warnings("pdd", c)
    assert [(w["kind"], w["variant"]) for w in warned] == [("modelled_compute_late", "pdd")]  # P alone: > 1.10
    assert "modelled P ran 1.15x" in warned[0]["message"]
    md = rolecpu.markdown_section(_one_variant(analysed, c))
    assert "## Modelled compute's pace" in md
    assert "| pdd | P | 40.0 | 6.00 | 120.0 | 1.150 |" in md


def test_real_compute_has_no_pace_and_no_pace_section(analysed):
    s = summary.read(analysed)
    assert all(r.pace is None for v in s.variants.values() for r in v.roles_cpu.roles.values())
    assert not [w for w in s.warnings if w["kind"] == "modelled_compute_late"]
    assert "Modelled compute's pace" not in (analysed / "summary.md").read_text()


def _paced_variant(p_pace: float) -> dict:
    """A variant's summary part with its modelled P at p_pace and its MD on time."""
    c = rolecpu.variant_cpu(
        [
            modelled(report("p1", "p", 10.0, 3.0), 40.0, 40.0 * (p_pace - 1), 90.0),
            modelled(report("md1", "md", 5.0, 3.0), 10.0, 0.0, 0.0),
        ],
        ["p1", "md1"],
        completed=4,
    )
    return {"roles_cpu": c.model_dump(mode="json")}


def test_a_comparison_using_a_variant_whose_modelled_compute_ran_late_is_not_judged():
    summary = {
        "variants": {"pd-intra": _paced_variant(1.01), "pdd": _paced_variant(1.25), "pd-cross": _paced_variant(1.05)},
        "comparisons": [
            {"variant": "pdd", "baseline": "pd-intra", "verdict": "lower", "caveat": None},
            {"variant": "pd-cross", "baseline": "pd-intra", "verdict": "higher", "caveat": None},
            {"variant": "pdd", "baseline": "pd-cross", "verdict": "lower", "caveat": "the emulator fell behind in x"},
        ],
    }
    rolecpu.mark_late(summary)
    first, second, third = summary["comparisons"]
    assert first["verdict"] == "not judged" and first["caveat"] == "the modelled compute ran late in pdd (P 1.25x)"
    assert second == {"variant": "pd-cross", "baseline": "pd-intra", "verdict": "higher", "caveat": None}  # on pace
    assert third["verdict"] == "not judged"
    assert third["caveat"] == "the emulator fell behind in x; the modelled compute ran late in pdd (P 1.25x)"
