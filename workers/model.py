"""The decoder-only transformer the workers run, and its deterministic weights.

Responsible for: the model (Llama-style: RMSNorm, rotary positions, grouped-
query attention, SwiGLU MLP, untied LM head) in one readable file; the named
configs; generating weights from a seed, saving them once to a file with a
content hash, and loading them identically in every process.
Not responsible for: where KV lives and how a batch attends to it (the model
calls a `KVBinding` that `workers.attention` implements), batching, sampling or
request bookkeeping (`workers.engine`).

Weights file naming: `<weights_dir>/<config name>-<seed>.pt`, where
weights_dir defaults to `$PDDLAB_CACHE_DIR/weights` or `<repo>/.cache/weights`.
The file holds the config, the seed, the state dict and the SHA-256 of the
tensors; loading recomputes the hash and refuses a mismatch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
import torch.nn as nn
import torch.nn.functional as F

from workers import cache

log = logging.getLogger(__name__)

WEIGHTS_FORMAT_VERSION = 1
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class WeightsError(RuntimeError):
    """A weights file is corrupt or was made for another config/seed."""


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the transformer. Every field is part of the KV fingerprint.

    name: registry name, also the weights file stem
    vocab_size: token IDs are in [0, vocab_size)
    n_layer: transformer blocks
    n_head: query heads
    n_kv_head: key/value heads (GQA when < n_head); sets KV bytes with head_dim
    head_dim: channels per head
    d_model: residual width; equals n_head * head_dim
    d_ff: SwiGLU hidden width
    max_seq_len: context length (tokens): prompt + generated
    dtype: weights and KV dtype, a key of DTYPES
    rope_theta: rotary base
    norm_eps: RMSNorm epsilon
    """

    name: str
    vocab_size: int
    n_layer: int
    n_head: int
    n_kv_head: int
    head_dim: int
    d_model: int
    d_ff: int
    max_seq_len: int
    dtype: str = "float32"
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        if self.d_model != self.n_head * self.head_dim:
            raise ValueError(f"{self.name}: d_model {self.d_model} != n_head {self.n_head} * head_dim {self.head_dim}")
        if self.n_head % self.n_kv_head:
            raise ValueError(f"{self.name}: n_head {self.n_head} must be a multiple of n_kv_head {self.n_kv_head}")
        if self.dtype not in DTYPES:
            raise ValueError(f"{self.name}: dtype {self.dtype!r} not in {sorted(DTYPES)}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def dtype_bytes(self) -> int:
        return DTYPES[self.dtype].itemsize

    @property
    def kv_bytes_per_token(self) -> int:
        """KV cache bytes one token occupies: layers x (K and V) x kv heads x head_dim x dtype bytes."""
        return self.n_layer * 2 * self.n_kv_head * self.head_dim * self.dtype_bytes

    def fingerprint(self) -> str:
        """Stable hex digest of every field (the architecture, not the weights)."""
        blob = json.dumps(dataclasses.asdict(self), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()


# tiny: for unit tests; GQA (4 query heads over 2 KV heads) so that path is tested.
# KV per token: 2 layers * 2 (K,V) * 2 kv heads * 16 dims * 4 B = 512 B.
TINY = ModelConfig(
    name="tiny", vocab_size=256, n_layer=2, n_head=4, n_kv_head=2, head_dim=16, d_model=64, d_ff=128, max_seq_len=128
)

# default: KV per token in the range of production ~1T-parameter models (PDD.md: 10-80 KB,
# ~50 KB typical): 12 layers * 2 (K,V) * 8 kv heads * 64 dims * 4 B (fp32) = 49,152 B = 48 KiB,
# so a 100-token handoff as KV is ~4.8 MB (published: 4649 KB).
# Weights: 12 * (4*512^2 attn + 3*512*1536 MLP) = 40.9M + 2 * 32768*512 (embedding, untied
# head) = 33.6M -> 74.5M params, 298 MB in fp32: one CPU thread prefills ~1K tokens in about
# a second and reads the weights once per decode step in tens of ms.
DEFAULT = ModelConfig(
    name="default",
    vocab_size=32768,
    n_layer=12,
    n_head=8,
    n_kv_head=8,
    head_dim=64,
    d_model=512,
    d_ff=1536,
    max_seq_len=4096,
)

# small: for pools of several workers on two cores (issue 14, point 7): a sixth of default's matmul work per token
# and a smaller vocabulary, KV per token still in PDD.md's range (the third of default's):
# 8 layers * 2 (K,V) * 4 kv heads * 64 dims * 4 B = 16 KiB, so a 100-token handoff as KV is ~1.6 MB.
# Weights: 8 * (4*256^2 attn + 3*256*768 MLP) = 6.8M + 2 * 8192*256 (embedding, untied head) = 4.2M -> 11.0M
# params, 44 MB in fp32: one CPU thread prefills ~6K tokens a second and decodes a step in a few ms.
SMALL = ModelConfig(
    name="small",
    vocab_size=8192,
    n_layer=8,
    n_head=4,
    n_kv_head=4,
    head_dim=64,
    d_model=256,
    d_ff=768,
    max_seq_len=4096,
)

# Half-precision variants of each shape, for GPU workers (issue 15, point 4): `<name>-fp16`, `<name>-bf16`. Same
# shapes, half the weight and KV bytes: small-fp16 holds 8 KiB of KV per token, default-bf16 24 KiB. Their weights
# are their own (drawn in fp32 from the seed, then rounded): KV moves only between workers of one config. CPU torch
# runs them too, slower than fp32 (no fast half-precision kernels on most CPUs): they are for GPUs.
HALF_DTYPES = {"fp16": "float16", "bf16": "bfloat16"}


def half_variants(config: ModelConfig) -> tuple[ModelConfig, ...]:
    """config in each half precision, named `<name>-<fp16|bf16>`."""
    return tuple(dataclasses.replace(config, name=f"{config.name}-{s}", dtype=d) for s, d in HALF_DTYPES.items())


def precision_base(name: str) -> str:
    """The fp32 config a half-precision variant was made from (`small-bf16` -> `small`); others: the name itself.
    Shapes and vocabulary are the base's, so is its tokenizer."""
    base, _, suffix = name.rpartition("-")
    return base if suffix in HALF_DTYPES and base else name


CONFIGS: dict[str, ModelConfig] = {c.name: c for base in (TINY, SMALL, DEFAULT) for c in (base, *half_variants(base))}


def get_config(name: str) -> ModelConfig:
    """The named config; a miss lists the valid names."""
    try:
        return CONFIGS[name]
    except KeyError:
        raise KeyError(f"unknown model config {name!r}; valid: {sorted(CONFIGS)}") from None


def resolve_device(device: str = "auto") -> torch.device:
    """'auto' -> cuda where present, cpu otherwise; anything else is passed to torch."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


class KVBinding(Protocol):
    """Where attention keeps its KV and how it attends to it; implemented by `workers.attention.PassKV`."""

    def attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Store this pass's k, v (B, T, n_kv_head, head_dim); return the attention of q (B, T, n_head, head_dim)
        over every position each query may see, (B, T, n_head, head_dim)."""
        ...


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def apply_rope(x: torch.Tensor, rot: torch.Tensor) -> torch.Tensor:
    """Rotary embedding on channel pairs (Llama's layout). x: (B, T, H, hs); rot: (B, T, 1, hs/2) complex.
    One complex multiply: ~9x faster on a CPU than rotate-half's four strided multiplies and a cat."""
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))  # (B, T, H, hs/2) complex
    return torch.view_as_real(pairs * rot).flatten(3).type_as(x)  # (B, T, H, hs)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.n_kv_head, config.head_dim
        qkv_dim = (config.n_head + 2 * config.n_kv_head) * config.head_dim
        self.c_attn = nn.Linear(config.d_model, qkv_dim, bias=False)  # fused q, k, v
        self.c_proj = nn.Linear(config.d_model, config.d_model, bias=False)

    def forward(self, x: torch.Tensor, rot: torch.Tensor, kv: KVBinding | None) -> torch.Tensor:
        B, T, C = x.shape
        nh, nkv, hs = self.n_head, self.n_kv_head, self.head_dim
        q, k, v = self.c_attn(x).split([nh * hs, nkv * hs, nkv * hs], dim=2)
        q = apply_rope(q.view(B, T, nh, hs), rot)  # (B, T, nh, hs)
        k = apply_rope(k.view(B, T, nkv, hs), rot)  # (B, T, nkv, hs)
        v = v.view(B, T, nkv, hs)  # (B, T, nkv, hs)
        if kv is not None:
            return self.c_proj(kv.attention(self.layer, q, k, v).reshape(B, T, C))
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),  # (B, nh|nkv, T, hs)
            is_causal=True,
            enable_gqa=nh != nkv,
        )  # (B, nh, T, hs)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.d_model, 2 * config.d_ff, bias=False)  # fused gate, up
        self.c_proj = nn.Linear(config.d_ff, config.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.c_fc(x).chunk(2, dim=-1)  # (B, T, d_ff) each
        return self.c_proj(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.attn_norm = RMSNorm(config.d_model, config.norm_eps)
        self.attn = Attention(config, layer)
        self.mlp_norm = RMSNorm(config.d_model, config.norm_eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, rot: torch.Tensor, kv: KVBinding | None) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), rot, kv)
        return x + self.mlp(self.mlp_norm(x))


class Transformer(nn.Module):
    """Decoder-only LM. forward() returns logits at the positions asked for."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(Block(config, i) for i in range(config.n_layer))
        self.norm_f = RMSNorm(config.d_model, config.norm_eps)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self._rope: torch.Tensor | None = None  # built on first use, on the weights' device

    def rope_table(self) -> torch.Tensor:
        """Unit rotations (max_seq_len, head_dim/2) complex64, computed from the config, not stored."""
        device = self.wte.weight.device
        if self._rope is None or self._rope.device != device:
            c = self.config
            inv_freq = 1.0 / c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float32) / c.head_dim)
            angles = torch.outer(torch.arange(c.max_seq_len, dtype=torch.float32), inv_freq)  # (S, hs/2)
            self._rope = torch.polar(torch.ones_like(angles), angles).to(device)
        return self._rope

    def forward(
        self,
        idx: torch.Tensor,
        positions: torch.Tensor | None = None,
        kv: KVBinding | None = None,
        last_only: bool = False,
        logits_at: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """idx, positions: (B, T) int64. kv None = plain causal forward over idx alone.
        Returns logits (B, T, V); (B, 1, V) when last_only; (B, R, V) at the T-indices logits_at (R,);
        in float32. Rows nobody reads skip the LM head, the largest matmul."""
        B, T = idx.shape
        if positions is None:
            positions = torch.arange(T, device=idx.device).expand(B, T)  # (B, T)
        rot = self.rope_table()[positions].unsqueeze(2)  # (B, T, 1, hs/2)
        x = self.wte(idx)  # (B, T, C)
        for block in self.blocks:
            x = block(x, rot, kv)
        if last_only:
            x = x[:, -1:, :]  # (B, 1, C): prefill needs only the next token's logits
        elif logits_at is not None:
            x = x[:, logits_at, :]  # (B, R, C)
        return self.lm_head(self.norm_f(x)).float()

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


# ---------------------------------------------------------------- weights


def default_weights_dir() -> Path:
    """$PDDLAB_CACHE_DIR/weights, else <repo>/.cache/weights (workers.cache)."""
    return cache.weights_dir()


def weights_path(config: ModelConfig, seed: int, weights_dir: Path | None = None) -> Path:
    return (weights_dir or default_weights_dir()) / f"{config.name}-{seed}.pt"


def _param_shapes(config: ModelConfig) -> dict[str, torch.Size]:
    with torch.device("meta"):
        return {name: p.shape for name, p in Transformer(config).named_parameters()}


def generate_state(config: ModelConfig, seed: int) -> dict[str, torch.Tensor]:
    """Weights drawn from one CPU generator in sorted-name order: same seed, same bits, anywhere."""
    gen = torch.Generator().manual_seed(seed)
    resid_std = 0.02 / math.sqrt(2 * config.n_layer)  # GPT-2: scale residual projections by depth
    state = {}
    for name, shape in sorted(_param_shapes(config).items()):
        if name.endswith("norm.weight") or name.endswith("norm_f.weight"):
            t = torch.ones(shape)
        else:
            std = resid_std if name.endswith("c_proj.weight") else 0.02
            t = torch.randn(shape, generator=gen) * std
        state[name] = t.to(config.torch_dtype)
    return state


def state_sha256(state: dict[str, torch.Tensor]) -> str:
    """SHA-256 over every tensor's name, dtype, shape and bytes, in sorted-name order."""
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def get_or_create_weights(config: ModelConfig, seed: int = 0, weights_dir: Path | None = None) -> Path:
    """Path of the weights file for (config, seed), generating and saving it atomically if absent."""
    path = weights_path(config, seed, weights_dir)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    log.info("generating weights %s (seed %d) -> %s", config.name, seed, path)
    state = generate_state(config, seed)
    payload = {
        "format": WEIGHTS_FORMAT_VERSION,
        "config": dataclasses.asdict(config),
        "seed": seed,
        "sha256": state_sha256(state),
        "state_dict": state,
    }
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(payload, f)
        os.replace(tmp, path)  # atomic: concurrent creators write identical bytes, last one wins
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


@dataclass(frozen=True)
class LoadedWeights:
    """A verified state dict. sha256: content hash, part of every KV fingerprint."""

    config: ModelConfig
    seed: int
    sha256: str
    state_dict: dict[str, torch.Tensor]


def load_weights(path: Path, config: ModelConfig, seed: int) -> LoadedWeights:
    """Load and verify a weights file; raise WeightsError on any mismatch."""
    payload = torch.load(path, map_location="cpu", weights_only=True)
    if payload.get("format") != WEIGHTS_FORMAT_VERSION:
        raise WeightsError(f"{path}: format {payload.get('format')!r}, expected {WEIGHTS_FORMAT_VERSION}")
    if payload["config"] != dataclasses.asdict(config) or payload["seed"] != seed:
        raise WeightsError(
            f"{path}: made for config {payload['config'].get('name')!r} seed {payload['seed']}, "
            f"not {config.name!r} seed {seed} (or the config changed: delete the file)"
        )
    sha = state_sha256(payload["state_dict"])
    if sha != payload["sha256"]:
        raise WeightsError(f"{path}: content hash {sha[:16]} != recorded {payload['sha256'][:16]}: file is corrupt")
    return LoadedWeights(config, seed, sha, payload["state_dict"])


def build_model(
    config: ModelConfig, seed: int = 0, device: str = "auto", weights_dir: Path | None = None
) -> tuple[Transformer, LoadedWeights]:
    """The model with the (config, seed) weights on device, in eval mode, without autograd."""
    weights = load_weights(get_or_create_weights(config, seed, weights_dir), config, seed)
    with torch.device("meta"):
        model = Transformer(config)
    model.load_state_dict(weights.state_dict, assign=True)
    model = model.to(resolve_device(device)).eval().requires_grad_(False)
    for module in model.modules():
        if isinstance(module, nn.Linear):
            # the same (out, in) matrix stored column-major: F.linear then runs x @ W^T as x @ Wt on a contiguous
            # Wt, which MKL streams at ~22 GB/s for one row against ~15 for row-major W (a decode step of one
            # request is that matrix-vector product, 12 times over, plus the LM head); equal at many rows
            module.weight = nn.Parameter(module.weight.t().contiguous().t(), requires_grad=False)
    return model, weights


def model_fingerprint(config: ModelConfig, weights_sha256: str) -> bytes:
    """16 bytes identifying architecture + weights; KV is only portable between equal fingerprints."""
    return hashlib.sha256(f"{config.fingerprint()}|{weights_sha256}".encode()).digest()[:16]
