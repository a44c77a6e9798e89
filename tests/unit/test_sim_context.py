"""The context a modelled spec's requests are cut to: the shared validator (`pddlab run` and `pddlab simulate`)
refuses a prompt that leaves no output token in it, instead of building requests with max_tokens <= 0."""

import pytest

from experiments.sim.config import load_for_simulation
from experiments.spec import workload
from experiments.spec.experiment import SpecError, load_spec

SPEC = "pdd-bathtub-hetero"  # modelled kimi-k2 (context 131,072), model small (4,096: the workload's cut)
LONG = ["workload.source=fixed_hit", "workload.fixed_hit.prompt_tokens=8192", "workload.fixed_hit.requests=2"]


@pytest.mark.parametrize("load", [load_for_simulation, lambda name, sets: load_spec(name, sets, check_machine=False)])
def test_a_fixed_hit_prompt_past_the_cut_is_refused_with_its_numbers(load):
    with pytest.raises(SpecError) as err:
        load(SPEC, LONG)
    message = str(err.value)
    assert "yaml: workload.fixed_hit.prompt_tokens=8192 leaves no output token in the 4096-token" in message
    assert "workload.synthetic.max_context_tokens (at most 131072" in message and "\n" not in message


def test_a_synthetic_first_turn_past_the_cut_is_refused():
    sets = ["workload.source=synthetic", "workload.synthetic.system_prompt_tokens=3000",
            "workload.synthetic.first_turn_tokens=[500, 1500]"]  # fmt: skip
    with pytest.raises(SpecError, match=r"first_turn_tokens\[1\]=1500 \+ 3000 of system prompt leaves no output"):
        load_for_simulation(SPEC, sets)


def test_lifting_the_cut_to_the_architectures_context_gives_every_request_its_output():
    loaded = load_for_simulation(SPEC, [*LONG, "workload.synthetic.max_context_tokens=131072"])
    reqs = [r for r in workload.build(loaded.spec) if r.kind != "warmup"]
    assert {r.prompt_len for r in reqs} == {8192} and min(r.max_tokens for r in reqs) >= 1
