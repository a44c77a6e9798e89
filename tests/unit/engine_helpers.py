"""Helpers of the engine tests (tiny model): prompts, requests, the greedy reference and its near-tie rule.

Greedy streams are compared with `greedy_divergence`: two numerically different paths may pick different
tokens only where the reference logits' top-2 margin is below TIE_MARGIN (1e-4); such a near-tie is
reported as a warning, and the streams are not compared after it.
"""

import warnings

import torch

from workers.engine import Engine, GenerationRequest
from workers.model import TINY
from workers.sampling import TIE_MARGIN, greedy_divergence

BS = 8  # block size (tokens): small, so prompts span several blocks


def prompt(seed: int, n: int) -> tuple[int, ...]:
    return tuple(torch.randint(0, TINY.vocab_size, (n,), generator=torch.Generator().manual_seed(seed)).tolist())


def req(rid: str, tokens, max_tokens: int = 16, **kw) -> GenerationRequest:
    return GenerationRequest(rid, tuple(tokens), max_tokens, **kw)


def reference_greedy(engine: Engine, tokens, n: int) -> list[int]:
    """n greedy tokens by full-sequence forward passes, no KV cache."""
    seq = list(tokens)
    for _ in range(n):
        seq.append(int(engine.reference_logits(seq)[-1].argmax()))
    return seq[len(tokens) :]


def assert_greedy_match(engine: Engine, tokens, got, want, what: str) -> None:
    d = greedy_divergence(list(got), list(want), lambda i: engine.reference_logits(list(tokens) + list(want[:i]))[-1])
    if d is None:
        return
    assert d.is_tie, (
        f"{what}: token {d.index} is {d.got}, expected {d.want}; top-2 margin {d.margin:.3g} >= {TIE_MARGIN}"
    )
    warnings.warn(f"{what}: near-tie at token {d.index} (margin {d.margin:.2e}), streams diverge after it")


def drain(engine: Engine) -> None:
    """Finish nothing, evict everything: afterwards every block must be free."""
    engine.kv.free(engine.radix.evict(engine.kv.num_blocks))
