"""A roofline of one engine step: time = max(FLOPs / achieved FLOP/s, bytes / achieved bandwidth) + fixed overheads.

Responsible for: the FLOPs and memory bytes of an engine step (any mix of prefill chunks, decode tokens and
extends: each part is n new tokens on top of c tokens of KV, with logits at some of its rows) for a model
architecture, and its time on `devices` accelerators (tensor parallel: peaks add up) at the accelerator's
stated efficiency; KV export/import time over the host link. Pure arithmetic, no clock.
Not responsible for: where the numbers come from (`workers.modelled.catalogue`) or waiting (the engine).

FLOPs of a step of T new tokens (2 per multiply-add):
    2 x (dense body + active routed params) x T        the projections and MLPs (MoE: the experts a token uses)
  + 2 x vocab x hidden x (rows with logits)           the LM head
  + attention_flops_per_pair x sum over new tokens of the positions each attends to (causal)
Bytes it moves:
    weight bytes of the dense body + of the routed experts the step's T tokens touch (uniform routing:
    a fraction 1 - (1 - k/E)^T of them) + of the LM head when any row has logits
  + the KV of every position a part attends to, read once, and of its new positions, written once
Compute runs at efficiency x T / (T + ramp_tokens) of the peak (a step of few tokens does not fill the machine).
Overheads: step_overhead_s per step, + part_overhead_s per request in it (a CPU engine attends request by
request; a GPU's paged-attention kernel does a batch at once: ~0 there).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from workers.modelled.catalogue import Accelerator, Efficiency, ModelArch


@dataclass(frozen=True)
class Part:
    """One request's share of a step: new_tokens computed on top of cached_tokens of KV; logit_rows of them
    get the LM head (prefill: 1, decode: 1, extend: all or 1)."""

    new_tokens: int
    cached_tokens: int = 0
    logit_rows: int = 1


@dataclass(frozen=True)
class StepCost:
    """flops: FLOPs; bytes: memory bytes moved; compute_s, memory_s: each at the achieved peak (s);
    overhead_s: the fixed cost of the step and its parts (s); seconds: max(compute_s, memory_s) + overhead_s."""

    flops: float
    bytes: float
    compute_s: float
    memory_s: float
    overhead_s: float

    @property
    def seconds(self) -> float:
        return max(self.compute_s, self.memory_s) + self.overhead_s

    @property
    def bound(self) -> str:
        """Which roof the step sits under: compute or memory."""
        return "compute" if self.compute_s >= self.memory_s else "memory"


class Roofline:
    """accelerator: the device (peaks and its efficiency, unless `efficiency` overrides it)
    model: the architecture
    devices: accelerators one engine spans (tensor parallel: FLOP/s, bandwidth and memory add up)
    efficiency: overrides the accelerator's (calibration)"""

    def __init__(
        self, accelerator: Accelerator, model: ModelArch, devices: int = 1, efficiency: Efficiency | None = None
    ):
        if devices < 1:
            raise ValueError(f"devices={devices}; must be at least 1")
        self.accelerator, self.model, self.devices = accelerator, model, devices
        self.efficiency = efficiency or accelerator.efficiency

    @property
    def flops_per_s(self) -> float:
        """Achieved FLOP/s of a large step."""
        return self.accelerator.dense_flops * self.devices * self.efficiency.compute

    def step_flops_per_s(self, tokens: int) -> float:
        """Achieved FLOP/s of a step of this many tokens (small ones do not fill the machine: ramp_tokens)."""
        return self.flops_per_s * tokens / (tokens + self.efficiency.ramp_tokens)

    @property
    def bytes_per_s(self) -> float:
        """Achieved memory bandwidth (B/s)."""
        return self.accelerator.memory_bandwidth * self.devices * self.efficiency.memory

    def flops(self, parts: Sequence[Part]) -> float:
        m = self.model
        tokens = sum(p.new_tokens for p in parts)
        rows = sum(p.logit_rows for p in parts)
        active_body = m.dense_body_params + m.routed_params * _routed_share(m)
        pairs = sum(p.new_tokens * p.cached_tokens + p.new_tokens * (p.new_tokens + 1) / 2 for p in parts)
        return 2 * active_body * tokens + 2 * m.lm_head_params * rows + m.attention_flops_per_pair * pairs

    def bytes(self, parts: Sequence[Part]) -> float:
        m = self.model
        tokens = sum(p.new_tokens for p in parts)
        touched = 1 - (1 - _routed_share(m)) ** tokens if m.experts else 0.0
        head = m.lm_head_params if any(p.logit_rows for p in parts) else 0
        weights = (m.dense_body_params + m.routed_params * touched + head) * m.weight_bytes
        kv = sum(p.cached_tokens + 2 * p.new_tokens for p in parts) * m.kv_bytes_per_token
        return weights + kv

    def step(self, parts: Sequence[Part]) -> StepCost:
        """The cost of one step over these parts (no parts: nothing runs, zero)."""
        if not parts:
            return StepCost(0.0, 0.0, 0.0, 0.0, 0.0)
        f, b = self.flops(parts), self.bytes(parts)
        e = self.efficiency
        overhead = e.step_overhead_s + e.part_overhead_s * len(parts)
        compute_s = f / self.step_flops_per_s(sum(p.new_tokens for p in parts))
        return StepCost(f, b, compute_s, b / self.bytes_per_s, overhead)

    def prefill_s(self, new_tokens: int, cached_tokens: int = 0) -> float:
        """A prompt's uncached new_tokens on top of cached_tokens, logits at its last row (s)."""
        return self.step([Part(new_tokens, cached_tokens, 1)]).seconds

    def decode_s(self, contexts: Sequence[int]) -> float:
        """One decode step of a batch: a token for each request, on its context of KV (tokens) (s)."""
        return self.step([Part(1, c, 1) for c in contexts]).seconds

    def extend_s(self, k: int, context: int, all_logits: bool = True) -> float:
        """k token IDs on top of context tokens of KV, logits at every row or the last only (s)."""
        return self.step([Part(k, context, k if all_logits else 1)]).seconds

    def kv_transfer_s(self, n_tokens: int) -> float:
        """Exporting or importing n_tokens of KV over the host link (s)."""
        link = self.accelerator.host_link_bandwidth * self.devices * self.efficiency.host_link
        return n_tokens * self.model.kv_bytes_per_token / link

    def kv_capacity_tokens(self, memory_fraction: float = 0.9) -> int:
        """KV tokens that fit: memory_fraction of the devices' memory minus the weights (tokens); raises
        ValueError when the weights alone do not fit."""
        room = self.accelerator.memory_bytes * self.devices * memory_fraction - self.model.weights_bytes
        if room < self.model.kv_bytes_per_token:
            raise ValueError(
                f"model {self.model.name}: weights of {self.model.weights_bytes / 1e9:.1f} GB leave no room for KV "
                f"in {self.devices} x {self.accelerator.name} ({self.accelerator.memory_bytes / 1e9:.0f} GB, "
                f"{memory_fraction:.0%} usable): use more devices"
            )
        return int(room // self.model.kv_bytes_per_token)


def _routed_share(m: ModelArch) -> float:
    """The fraction of routed experts one token uses (k / E; 0 for a dense model)."""
    return m.experts_per_token / m.experts if m.experts else 0.0
