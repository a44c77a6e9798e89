"""The spec's memory estimate follows what a worker allocates: the small model's KV tensors under real compute, a
byte a slot (and the token IDs its prefix cache keys) under modelled compute, where no KV tensors exist."""

import pytest

from experiments.spec.deployment import PROCESS_BASE_MB, memory_estimate_mb
from experiments.spec.experiment import SpecError, load_spec
from workers.model import get_config

# pdd-published's pools at what 16 x h800 and 16 x h20 hold beside kimi-k2's weights (~1.59M and ~4.87M tokens)
LARGE = ["capacity_tokens.p=1500000", "capacity_tokens.rld=1500000", "capacity_tokens.md=4000000"]


def test_a_modelled_deployment_with_its_accelerators_capacities_fits_this_machine():
    spec = load_spec("pdd-published", LARGE)  # refused as "more than this machine's" while slots cost small's KV
    need = memory_estimate_mb(spec)
    assert need["md"][0] < 2048  # MiB: process, 4M one-byte slots and their token IDs, one whole-context blob
    assert need["md"][0] > need["p"][0] > PROCESS_BASE_MB  # the slots still count


def test_a_modelled_estimate_does_not_depend_on_the_small_model():
    small = memory_estimate_mb(load_spec("pdd-published", LARGE))
    default = memory_estimate_mb(load_spec("pdd-published", [*LARGE, "model=default"]))  # a tokenizer only
    assert small == default


def test_a_real_compute_estimate_still_counts_the_models_kv_for_every_slot():
    spec = load_spec("pdd-vs-baselines", ["capacity_tokens.md=64000"])
    more = load_spec("pdd-vs-baselines", ["capacity_tokens.md=128000"])
    mb, more_mb = memory_estimate_mb(spec)["md"][0], memory_estimate_mb(more)["md"][0]
    assert more_mb - mb == pytest.approx(64000 * get_config(spec.model).kv_bytes_per_token / 2**20, abs=1)


def test_a_real_compute_deployment_of_the_same_capacities_is_still_refused():
    with pytest.raises(SpecError, match="more than this machine's"):
        load_spec("pdd-vs-baselines", ["capacity_tokens.md=4000000"])
