"""The simulated router takes the emulated router's static WAN estimate (workers/roles/routing.py: the line's rate, no
loss bound, as `pddlab run` decides): a spec that asks for the measured estimate is told it is not simulated, as is
one that asks the MDs for their DRC hit (drc_estimate: lookup: the simulator reads it at no cost)."""

import pytest

from experiments.sim.config import load_for_simulation, sim_config
from experiments.sim.simulate import not_simulated

SPEC = "pdd-bathtub-hetero"  # modelled kimi-k2, variants pd-cross and pdd-hetero


def said(sets: list[str], word: str) -> list[str]:
    loaded = load_for_simulation(SPEC, sets)
    return [m for m in not_simulated(loaded, {v: sim_config(loaded, v) for v in loaded.spec.variants}) if word in m]


@pytest.mark.parametrize(
    "setting, word, message",
    [
        (
            "deployment.policy.wan_estimate=measured",
            "wan_estimate",
            "Not simulated: policy.wan_estimate: measured (pdd-hetero): the route decision uses the static estimate "
            "(policy.wan_rate_mbit, the line's rate: no loss bound).",
        ),
        (
            "deployment.policy.drc_estimate=lookup",
            "drc_estimate",
            "Not simulated: policy.drc_estimate: lookup (pdd-hetero): the route decision reads the MD's DRC hit at "
            "no cost (no WAN round trip to ask each MD, no failed lookup).",
        ),
    ],
)
def test_an_estimate_the_simulator_does_not_take_is_named_as_not_simulated(setting, word, message):
    assert said([setting], word) == [message]
    assert said([], word) == []
