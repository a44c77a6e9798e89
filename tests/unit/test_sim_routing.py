"""The simulated router takes the emulated router's static WAN estimate (workers/roles/routing.py: the line's rate, no
loss bound, as `pddlab run` decides): a spec that asks for the measured estimate is told it is not simulated."""

from experiments.sim.config import load_for_simulation, sim_config
from experiments.sim.simulate import not_simulated

SPEC = "pdd-bathtub-hetero"  # modelled kimi-k2, variants pd-cross and pdd-hetero


def test_the_measured_estimate_is_named_as_not_simulated():
    loaded = load_for_simulation(SPEC, ["deployment.policy.wan_estimate=measured"])
    configs = {v: sim_config(loaded, v) for v in loaded.spec.variants}
    lines = [m for m in not_simulated(loaded, configs) if "wan_estimate" in m]
    assert lines == [
        "Not simulated: policy.wan_estimate: measured (pdd-hetero): the route decision uses the static estimate "
        "(policy.wan_rate_mbit, the line's rate: no loss bound)."
    ]
    plain = load_for_simulation(SPEC)
    assert not [m for m in not_simulated(plain, {v: sim_config(plain, v) for v in plain.spec.variants}) if "wan_" in m]
