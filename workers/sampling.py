"""Choosing the next token from logits.

Responsible for: the sampling parameters of a request, greedy choice, seeded
temperature/top-k sampling with a per-request generator (so a request's draws
do not depend on what it is batched with); the top-2 logit margin and
`greedy_divergence`, which judge whether two numerically different runs may
legitimately pick different tokens (only at a near-tie).
Not responsible for: computing logits (`workers.model`) or request state
(`workers.engine`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch


@dataclass(frozen=True)
class SamplingParams:
    """temperature: 0 = greedy (argmax); > 0 = sample from softmax(logits / temperature)
    top_k: sample among the k most likely tokens; 0 = all
    seed: seed of the request's own generator (used when temperature > 0)
    """

    temperature: float = 0.0
    top_k: int = 0
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def make_generator(params: SamplingParams) -> torch.Generator | None:
    """A CPU generator seeded for this request, or None when greedy."""
    return None if params.greedy else torch.Generator().manual_seed(params.seed)


def sample_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """Next token from one row of logits (V,)."""
    if params.greedy:
        return int(torch.argmax(logits))
    scaled = logits.float().cpu() / params.temperature
    if 0 < params.top_k < scaled.numel():
        kth = torch.topk(scaled, params.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


def top2_margin(logits: torch.Tensor) -> float:
    """Difference between the largest and second-largest logit of a row (V,)."""
    top = torch.topk(logits.float(), 2).values
    return float(top[0] - top[1])


# Two runs that differ only by float rounding may pick different greedy tokens only where the
# reference logits nearly tie; 1e-4 is far above fp32 rounding of these logits (~1e-6).
TIE_MARGIN = 1e-4


@dataclass(frozen=True)
class Divergence:
    """First place two greedy streams differ. margin: top-2 margin of the reference logits there
    (inf when the streams differ only in length)."""

    index: int
    got: int | None
    want: int | None
    margin: float

    @property
    def is_tie(self) -> bool:
        return self.margin < TIE_MARGIN


def greedy_divergence(
    got: Sequence[int], want: Sequence[int], logits_at: Callable[[int], torch.Tensor]
) -> Divergence | None:
    """None if the streams are equal, else their first difference; logits_at(i) returns the
    reference logits (V,) that predict token i of want."""
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            return Divergence(i, g, w, top2_margin(logits_at(i)))
    if len(got) != len(want):
        n = min(len(got), len(want))
        return Divergence(n, got[n] if n < len(got) else None, want[n] if n < len(want) else None, float("inf"))
    return None
