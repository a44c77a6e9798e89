"""Fixtures of the unit tests that run the tiny model's engine (test_engine, test_chunked)."""

import pytest
from engine_helpers import BS

from workers.engine import Engine


@pytest.fixture(scope="module")
def weights_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("weights")


@pytest.fixture(scope="module")
def make_engine(weights_dir):
    def make(capacity_tokens=2048, prefix_cache=True, seed=0):
        return Engine(
            "tiny",
            seed=seed,
            capacity_tokens=capacity_tokens,
            block_size=BS,
            device="cpu",
            prefix_cache=prefix_cache,
            weights_dir=weights_dir,
        )

    return make
