"""P's step spread in real compute (experiments/sim/realcompute.py StepJitter, docs/simulator.md "P's step spread"):
seeded, mean-preserving, AR(1) in log space, off for modelled compute."""

import math
import random
import statistics

import pytest

from experiments.sim import realcompute
from experiments.sim.config import load_for_simulation, sim_config
from experiments.sim.pipeline import Simulation
from experiments.sim.realcompute import P_STEP_LAG1, P_STEP_SIGMA, StepJitter, the_jitter
from experiments.sim.simulate import workload_of

SPEC = "pdd-vs-baselines"  # real compute
MODELLED = "experiments/specs/sim/pdd-published-scale.yaml"


def records(variant: str = "pd-intra", seed: int = 1, requests: int = 0):
    loaded = load_for_simulation(SPEC, ["profile=wan-regional"])
    reqs = workload_of(loaded)
    sim = Simulation(sim_config(loaded, variant), reqs if not requests else reqs[:requests], seed)
    return [(r.request_id, r.ttft_ms, r.e2e_ms) for r in sim.run()], sim


def test_the_same_seed_gives_the_same_records_and_another_seed_other_ones():
    same, _ = records(seed=3)
    assert records(seed=3)[0] == same
    assert records(seed=4)[0] != same  # pd-intra never crosses the WAN: only P's steps differ


def test_with_the_spread_off_p_takes_the_deterministic_times(monkeypatch):
    """sigma 0: no jitter at all (the_jitter None), so the records are the seed's whatever the seed."""
    on, _ = records(seed=3)
    monkeypatch.setattr(realcompute, "P_STEP_SIGMA", 0.0)
    off, sim = records(seed=3)
    assert all(p.jitter is None for p in sim.p)
    assert records(seed=4)[0] == off
    assert on != off


def test_a_jitter_of_sigma_zero_changes_no_step_time(monkeypatch):
    """StepJitter(0, ...) is factor 1.0 exactly: the records as with no jitter (the multiply is exact)."""
    monkeypatch.setattr(realcompute, "P_STEP_SIGMA", 0.0)
    off, _ = records()
    loaded = load_for_simulation(SPEC, ["profile=wan-regional"])
    zero = Simulation(sim_config(loaded, "pd-intra"), workload_of(loaded), 1)
    for p in zero.p:
        p.jitter = StepJitter(0.0, P_STEP_LAG1, random.Random(0))
    assert [(r.request_id, r.ttft_ms, r.e2e_ms) for r in zero.run()] == off


def test_the_step_factors_have_mean_one_the_fitted_sigma_and_lag1():
    j = StepJitter(P_STEP_SIGMA, P_STEP_LAG1, random.Random(7))
    f = [j(k) for k in range(40_000)]
    assert statistics.fmean(f) == pytest.approx(1.0, abs=0.02)  # mean-preserving
    y = [math.log(x) for x in f]
    assert statistics.stdev(y) == pytest.approx(P_STEP_SIGMA, rel=0.05)
    assert statistics.correlation(y[:-1], y[1:]) == pytest.approx(P_STEP_LAG1, abs=0.03)


def test_a_factor_is_drawn_once_so_a_plan_made_again_gets_the_same_one():
    j = StepJitter(P_STEP_SIGMA, P_STEP_LAG1, random.Random(7))
    first = [j(k) for k in range(5)]
    j.forget(3)
    assert [j(k) for k in range(3, 5)] == first[3:]
    fresh = StepJitter(P_STEP_SIGMA, P_STEP_LAG1, random.Random(7))
    assert [fresh(k) for k in range(8)][5:] == [j(k) for k in range(5, 8)]  # forgetting draws nothing


def test_the_simulated_p_is_as_busy_on_average_as_without_the_spread(monkeypatch):
    """Mean-preserving over a run's steps: P's busy time over seeds within a few % of the deterministic one."""
    busy = [records(seed=s)[1].p[0].busy_s for s in range(12)]
    monkeypatch.setattr(realcompute, "P_STEP_SIGMA", 0.0)
    deterministic = records()[1].p[0].busy_s
    assert statistics.fmean(busy) == pytest.approx(deterministic, rel=0.05)
    assert len(set(busy)) == len(busy)  # and each seed its own


def test_modelled_compute_gets_no_spread():
    loaded = load_for_simulation(MODELLED)
    for variant in loaded.spec.variants:
        for w in sim_config(loaded, variant).workers["p"]:
            assert the_jitter(w.roofline, 1, w.name) is None
    sim = Simulation(sim_config(loaded, "pdd"), workload_of(loaded)[:50], 1)
    assert all(p.jitter is None for p in sim.p)
