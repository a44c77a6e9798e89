"""The fault tier's shared fixture: the greedy reference a completed request's tokens are checked against."""

import pytest

from workers.engine import Engine, GenerationRequest
from workers.sampling import greedy_divergence


@pytest.fixture(scope="module")
def reference():
    """check(prompt, got): got is the greedy reference, or differs first where the reference logits nearly
    tie (float rounding may flip a greedy choice there); raises AssertionError otherwise."""
    engine = Engine("tiny", seed=0, capacity_tokens=4096, block_size=8, device="cpu", prefix_cache=False)

    def check(prompt: list[int], got: list[int], what: str) -> None:
        want = list(engine.generate(GenerationRequest("ref", tuple(prompt), len(got))).output_tokens)
        d = greedy_divergence(got, want, lambda i: engine.reference_logits(prompt + want[:i])[-1])
        assert d is None or d.is_tie, f"{what}: token {d.index} is {d.got}, reference {d.want}"

    return check
