"""The engine's typed inputs and outputs: a generation request and what each engine call returns.

Responsible for: the dataclasses that cross the engine's boundary (requests in;
open, prefill, extend, import, step and final results out), so that callers
and the engine agree on one definition. Not responsible for: any behaviour
(`workers.engine`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workers.sampling import SamplingParams


@dataclass(frozen=True)
class GenerationRequest:
    """request_id: unique among open requests
    prompt_tokens: token IDs of the prompt
    max_tokens: tokens to generate (>= 1), counting any appended by extend/import
    sampling: greedy by default
    use_prefix_cache: match and feed the engine's radix cache (if it has one)
    """

    request_id: str
    prompt_tokens: tuple[int, ...]
    max_tokens: int
    sampling: SamplingParams = SamplingParams()
    use_prefix_cache: bool = True


@dataclass(frozen=True)
class OpenResult:
    """cached_tokens: prompt tokens whose KV came from the prefix cache (tokens)
    reserved_tokens: KV slots reserved for the request (tokens)"""

    request_id: str
    cached_tokens: int
    reserved_tokens: int


@dataclass(frozen=True)
class PrefillResult:
    """computed_tokens: prompt tokens run through the model (tokens)"""

    request_id: str
    first_token: int
    cached_tokens: int
    computed_tokens: int


@dataclass(frozen=True)
class ExtendResult:
    """logits: (k, vocab) float32 on the CPU, row i predicting the token after position start_pos + i
    (only the last row, (1, vocab), when extend was asked for the next token alone)
    next_token: sampled from the last row; appended unless the request is done"""

    request_id: str
    start_pos: int
    logits: torch.Tensor
    next_token: int


@dataclass(frozen=True)
class ImportResult:
    """Positions start..end were in the blob; written_tokens of them were new to this engine."""

    request_id: str
    start: int
    end: int
    written_tokens: int
    appended_tokens: int


@dataclass(frozen=True)
class GenerationResult:
    request_id: str
    prompt_tokens: tuple[int, ...]
    output_tokens: tuple[int, ...]
    cached_tokens: int
    finish_reason: str  # "length" (max_tokens reached), "stopped" (finished early, e.g. handed off) or "aborted"


@dataclass(frozen=True)
class StepPart:
    """One request's part of an engine step: KV of positions start..start+n_tokens-1 computed.
    completed: every token of the request had KV afterwards, so its next token was sampled"""

    request_id: str
    start: int
    n_tokens: int
    completed: bool


@dataclass(frozen=True)
class StepResult:
    """parts: in the pass's row order; tokens: request_id -> token sampled, for each completed part"""

    parts: tuple[StepPart, ...]
    tokens: dict[str, int]


@dataclass(frozen=True)
class LayerWrite:
    """One layer of one request's part of a forward pass is in the cache (a P role streams it from here).
    slots: the cache slots of positions start..start+len(slots)-1, (n,) int64"""

    request_id: str
    layer: int
    start: int
    slots: torch.Tensor
