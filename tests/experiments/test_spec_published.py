"""EXP=pdd-published validates as shipped: the published deployment (kimi-k2 modelled, a 10 Gbit/s line scaled to
200 Mbit/s), and the Mooncake slice at the trace's own lengths, which only a modelled architecture's context
admits."""

import statistics

import pytest

from experiments.spec import experiment as specmod, workload as wl
from experiments.spec.experiment import SpecError


def test_the_published_spec_loads_with_its_scaled_line():
    loaded = specmod.load("pdd-published")
    assert loaded.profile.a_to_b.rate_mbit == 200.0  # intercity-10g: 10,000 Mbit/s / kv_scale 50
    assert set(loaded.spec.variants) == {"pd-intra", "pd-cross", "pdd"}


def test_its_workload_keeps_the_traces_own_lengths():
    reqs = wl.build(specmod.load_spec("pdd-published"))
    assert len(reqs) == 39
    assert statistics.mean(r.prompt_len for r in reqs) > 10_000 and max(r.prompt_len for r in reqs) > 50_000
    assert statistics.mean(r.max_tokens for r in reqs) > 300


def test_a_context_beyond_the_small_models_needs_modelled_compute():
    with pytest.raises(SpecError, match=r"workload.synthetic.max_context_tokens=131072 out of range \[0, 4096\]"):
        specmod.load_spec("pdd-mooncake", ["workload.synthetic.max_context_tokens=131072"])
