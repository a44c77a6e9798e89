"""The simulator at an emulated run's pace (experiments/sim/config.py sim_config(pace=), Efficiency.slowed,
scripts/validate_sim.py paced): modelled engines taking f x the roofline's time, recorded as such; refused for
real compute; the pace read from a run's summary."""

import json
import sys
from pathlib import Path

import pytest

from experiments.sim.config import SimError, load_for_simulation, sim_config
from experiments.sim.simulate import simulate
from experiments.sim.workers import StepSeconds
from experiments.spec.experiment import to_dict
from workers.modelled.catalogue import load_catalogue
from workers.modelled.roofline import Part, Roofline

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import validate_sim as vs  # noqa: E402

CAT = load_catalogue()
STEPS = ([Part(2048, 0, 1)], [Part(1, 9000, 1)] * 8, [Part(512, 30_000, 1), Part(1, 4000, 1)])


@pytest.mark.parametrize("accel", ["h800", "h20"])
@pytest.mark.parametrize("factor", [1.0, 1.37, 4.0])
def test_a_slowed_efficiency_makes_every_step_and_copy_factor_times_as_long(accel, factor):
    a, m = CAT.accelerator(accel), CAT.model("kimi-k2")
    plain, slow = Roofline(a, m, 16), Roofline(a, m, 16, a.efficiency.slowed(factor))
    for parts in STEPS:
        assert slow.step(parts).seconds == pytest.approx(factor * plain.step(parts).seconds, rel=1e-12)
    assert slow.kv_transfer_s(14_000) == pytest.approx(factor * plain.kv_transfer_s(14_000), rel=1e-12)
    with pytest.raises(ValueError, match="factor=0"):
        a.efficiency.slowed(0)


def test_a_paced_variant_slows_the_roles_named_and_no_other():
    loaded = load_for_simulation("pdd-published")
    plain, paced = sim_config(loaded, "pdd"), sim_config(loaded, "pdd", {"p": 1.5})
    parts = [(4096, 0, 1)]
    for role, factor in (("p", 1.5), ("rld", 1.0), ("md", 1.0)):
        for a, b in zip(plain.workers[role], paced.workers[role]):
            # the simulator's own step arithmetic (StepSeconds' exact path), not only Roofline.step
            assert StepSeconds(b.roofline)(parts) == pytest.approx(factor * StepSeconds(a.roofline)(parts), rel=1e-12)


def test_real_compute_refuses_a_pace():
    with pytest.raises(SimError, match="pace: only modelled compute"):
        sim_config(load_for_simulation("pdd-vs-baselines"), "pdd", {"p": 1.2})


def test_a_paced_simulation_is_slower_and_says_it_was_paced():
    loaded = load_for_simulation("pdd-published")
    plain = simulate(loaded, requests=12).summary
    paced = simulate(loaded, requests=12, pace={"pd-intra": {"p": 2.0}}).summary
    assert paced.variants["pd-intra"].ttft_ms.p50 > plain.variants["pd-intra"].ttft_ms.p50
    assert paced.variants["pdd"].ttft_ms.p50 == plain.variants["pdd"].ttft_ms.p50  # its variant alone
    assert paced.analysed_by["pace"] == {"pd-intra": {"p": 2.0}} and "pace" not in plain.analysed_by
    assert [w["kind"] for w in paced.warnings if w["kind"] == "paced"] == ["paced"]


def _roles(**paces) -> dict:
    """A summary's roles_cpu.roles with each named role's modelled and late s (real compute's router: none)."""
    roles = {"router": {"workers": 1, "cpu_s": 2.0, "modelled_s": None, "modelled_late_s": None}}
    roles.update({k: {"workers": 2, "modelled_s": m, "modelled_late_s": late} for k, (m, late) in paces.items()})
    return {"roles": roles}


def test_the_pace_is_read_from_each_variants_roles_cpu():
    summary = {
        "variants": {
            "pd-intra": {"roles_cpu": _roles(p=(50.0, 0.5), rld=(20.0, 2.0))},
            "pdd": {"roles_cpu": _roles(p=(40.0, 10.0), md=(25.0, 0.0))},
        }
    }
    assert vs.emulated_pace(summary) == {
        "pd-intra": {"p": pytest.approx(1.01), "rld": pytest.approx(1.1)},
        "pdd": {"p": pytest.approx(1.25), "md": 1.0},
    }


def test_a_run_without_a_recorded_pace_is_refused():
    real = {"variants": {"pdd": {"roles_cpu": {"roles": {"p": {"workers": 1, "cpu_s": 9.0}}}}, "pd-intra": {}}}
    with pytest.raises(ValueError, match="no modelled role recorded its pace"):
        vs.emulated_pace(real)


def test_a_runs_own_spec_is_simulated_as_its_metadata_keeps_it(tmp_path):
    ran = load_for_simulation("pdd-published", ["deployment.compute.kv_scale=100", "workload.seed=7"])
    (tmp_path / "metadata.json").write_text(json.dumps({"spec": to_dict(ran.spec)}))
    again = vs.run_spec(tmp_path).spec
    assert again.deployment["compute"]["kv_scale"] == 100 and again.workload.seed == 7
    assert again.profile == ran.spec.profile and again.variants == ran.spec.variants


def test_a_run_without_metadata_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no metadata.json"):
        vs.run_spec(tmp_path)
