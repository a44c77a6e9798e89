"""Catalogues of accelerators and model architectures for modelled compute, read from YAML and validated.

Responsible for: the typed entries (`Accelerator`, its `Efficiency`, `ModelArch`), loading the shipped
catalogues (accelerators.yaml, models.yaml next to this file) and a user's own files on top, one clear
error naming the field for bad input (`CatalogueError`), and what follows from an architecture alone:
KV bytes per token (GQA or MLA), the parameter split (dense vs routed experts), the weights' bytes, and
the KV blob's wire shape (`wire_config`: a `workers.model.ModelConfig` whose K/V rows carry exactly the
architecture's KV bytes per token, so the real blob format and KV data plane move the deployment's sizes).
Not responsible for: step times (`workers.modelled.roofline`) or the engine (`workers.modelled.engine`).

Every number of an entry carries its source: `source` maps each numeric field to where it comes from (a spec
sheet, a published config, a measurement, or a stated assumption); a number without one is refused.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Literal

import yaml

from schema import Bool, Float, Int, Range, Str, build, check_choice, schema
from workers.model import DTYPES, ModelConfig

HERE = Path(__file__).resolve().parent
ACCELERATORS_FILE = HERE / "accelerators.yaml"
MODELS_FILE = HERE / "models.yaml"
DTYPE_BYTES = {name: dtype.itemsize for name, dtype in DTYPES.items()}
Positive = Annotated[Float, Range(0)]
Fraction = Annotated[Float, Range(0.001, 1.0)]


class CatalogueError(ValueError):
    """A catalogue entry is malformed or names something unknown."""


@schema
class Efficiency:
    """What fraction of the spec-sheet peaks a real engine reaches, and its fixed cost per step.

    compute: achieved / dense peak FLOP/s (model FLOPs utilisation)
    memory: achieved / peak memory bandwidth
    host_link: achieved / peak host link (KV export/import) bandwidth
    step_overhead_s: fixed time per engine step: launches, Python, sampling (s)
    part_overhead_s: fixed time per request in a step: its own attention call, gathers, sampling (s)
    ramp_tokens: a step of this many tokens reaches half the compute efficiency (tokens): small matmuls do
      not fill the machine (efficiency x T / (T + ramp_tokens)); 0: every step reaches it
    """

    compute: Fraction = 0.5
    memory: Fraction = 0.7
    host_link: Fraction = 0.8
    step_overhead_s: Positive = 0.0
    part_overhead_s: Positive = 0.0
    ramp_tokens: Positive = 0.0

    def slowed(self, factor: float) -> Efficiency:
        """The efficiency of an engine `factor` times slower: each of its steps and KV copies takes factor x the
        time (compute, memory and host link reach 1/factor of theirs, the fixed costs grow by factor; the ramp is
        a size, unchanged). The simulator uses it to run at the pace an emulated run's modelled engines kept."""
        if factor <= 0:
            raise ValueError(f"factor={factor}; must be > 0")
        return dataclasses.replace(
            self,
            compute=self.compute / factor,
            memory=self.memory / factor,
            host_link=self.host_link / factor,
            step_overhead_s=self.step_overhead_s * factor,
            part_overhead_s=self.part_overhead_s * factor,
        )


@schema
class Accelerator:
    """One device.

    name: registry name
    dense_flops: dense (no sparsity) matmul FLOP/s at the models' compute dtype (bf16 for GPUs)
    memory_bandwidth: peak device memory bandwidth (B/s)
    memory_bytes: device memory (B)
    host_link_bandwidth: one direction of the link KV leaves/enters the device by (PCIe) (B/s)
    price_per_hour: rental price of one device (USD/h)
    source: field name -> where its number comes from
    efficiency: fractions of the peaks a real engine reaches (calibrated for this-machine)
    """

    name: Str
    dense_flops: Positive
    memory_bandwidth: Positive
    memory_bytes: Positive
    host_link_bandwidth: Positive
    price_per_hour: Positive
    source: dict[Str, Str]
    efficiency: Efficiency = Efficiency()


@schema
class ModelArch:
    """A model architecture, from its published config fields.

    name: registry name
    attention: gqa (K and V per kv head) | mla (one compressed latent + a rope key per layer)
    layers: transformer blocks (num_hidden_layers)
    hidden_size: residual width
    heads: query heads (num_attention_heads)
    vocab_size: token IDs are in [0, vocab_size)
    params: all parameters, embeddings included
    active_params: parameters one token uses (MoE: shared + its routed experts); default params (dense)
    experts: routed experts per MoE layer (0: dense)
    experts_per_token: routed experts each token uses
    weight_bytes: bytes per stored weight (4 fp32, 2 bf16, 1 fp8)
    kv_dtype: dtype of the KV cache (float32 | bfloat16 | float16)
    tied_embeddings: the LM head is the embedding table (its bytes are not counted twice)
    kv_heads, head_dim: GQA only
    kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim: MLA only
    max_seq_len: context length (tokens)
    source: field name -> where its number comes from
    """

    name: Str
    attention: Literal["gqa", "mla"]
    layers: Annotated[Int, Range(1)]
    hidden_size: Annotated[Int, Range(1)]
    heads: Annotated[Int, Range(1)]
    vocab_size: Annotated[Int, Range(2)]
    params: Positive
    max_seq_len: Annotated[Int, Range(2)]
    source: dict[Str, Str]
    active_params: Positive | None = None
    experts: Annotated[Int, Range(0)] = 0
    experts_per_token: Annotated[Int, Range(0)] = 0
    weight_bytes: Annotated[Float, Range(0.5, 4)] = 2.0
    kv_dtype: Literal["float32", "bfloat16", "float16"] = "bfloat16"
    tied_embeddings: Bool = False
    kv_heads: Annotated[Int, Range(1)] | None = None
    head_dim: Annotated[Int, Range(1)] | None = None
    kv_lora_rank: Annotated[Int, Range(1)] | None = None
    qk_rope_head_dim: Annotated[Int, Range(1)] | None = None
    qk_nope_head_dim: Annotated[Int, Range(1)] | None = None
    v_head_dim: Annotated[Int, Range(1)] | None = None

    @property
    def active(self) -> float:
        return self.params if self.active_params is None else self.active_params

    @property
    def kv_dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.kv_dtype]

    @property
    def kv_elements_per_layer(self) -> int:
        """KV cache elements one token holds in one layer: GQA K and V per kv head; MLA the latent + rope key."""
        if self.attention == "gqa":
            return 2 * self.kv_heads * self.head_dim
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def kv_bytes_per_token(self) -> int:
        """GQA: 2 x layers x kv_heads x head_dim x dtype bytes; MLA: layers x (kv_lora_rank + rope dim) x bytes."""
        return self.layers * self.kv_elements_per_layer * self.kv_dtype_bytes

    @property
    def lm_head_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def embedding_params(self) -> int:
        """The embedding table: indexed, never multiplied (0 extra when tied to the LM head)."""
        return 0 if self.tied_embeddings else self.vocab_size * self.hidden_size

    @property
    def routed_params(self) -> float:
        """Parameters in routed experts, from total = dense + routed and active = dense + routed x k/E."""
        if not self.experts:
            return 0.0
        return (self.params - self.active) / (1 - self.experts_per_token / self.experts)

    @property
    def dense_body_params(self) -> float:
        """Parameters every token multiplies by, neither routed experts nor the embedding table or LM head."""
        return self.params - self.routed_params - self.embedding_params - self.lm_head_params

    @property
    def attention_flops_per_pair(self) -> int:
        """FLOPs of one query attending to one position in all layers: QK^T and AV, 2 per multiply-add."""
        if self.attention == "gqa":
            qk = v = self.heads * self.head_dim
        else:  # MLA in its decompressed form (what prefill runs)
            qk, v = self.heads * (self.qk_nope_head_dim + self.qk_rope_head_dim), self.heads * self.v_head_dim
        return 2 * (qk + v) * self.layers

    @property
    def weights_bytes(self) -> float:
        return self.params * self.weight_bytes


GQA_FIELDS = ("kv_heads", "head_dim")
MLA_FIELDS = ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
ACCEL_NUMBERS = ("dense_flops", "memory_bandwidth", "memory_bytes", "host_link_bandwidth", "price_per_hour")
MODEL_NUMBERS = ("layers", "hidden_size", "heads", "vocab_size", "params")


def check_model(m: ModelArch, where: str) -> ModelArch:
    """The rules between fields: the attention's own fields present, MoE fields together, sources given."""
    for name in GQA_FIELDS if m.attention == "gqa" else MLA_FIELDS:
        if getattr(m, name) is None:
            raise CatalogueError(f"{where}.{name}: required for attention {m.attention}")
    if (m.experts == 0) != (m.experts_per_token == 0) or m.experts_per_token > m.experts:
        raise CatalogueError(f"{where}.experts_per_token={m.experts_per_token}: must be in [1, experts={m.experts}]")
    if m.active > m.params:
        raise CatalogueError(f"{where}.active_params={m.active_params}: more than params={m.params}")
    if m.experts and m.active_params is None:
        raise CatalogueError(f"{where}.active_params: required for a mixture of experts")
    if m.dense_body_params <= 0:
        raise CatalogueError(f"{where}.params={m.params}: not more than the embedding and LM head")
    if m.attention == "mla" and m.kv_elements_per_layer % 2:
        raise CatalogueError(f"{where}.kv_lora_rank: kv_lora_rank + qk_rope_head_dim must be even (K/V rows)")
    _check_sources(m, MODEL_NUMBERS + (("active_params",) if m.active_params is not None else ()), where)
    return m


def _check_sources(entry, numbers: tuple[str, ...], where: str) -> None:
    missing = [n for n in numbers if n not in entry.source]
    if missing:
        raise CatalogueError(f"{where}.source.{missing[0]}: required (where the number comes from)")


def wire_config(m: ModelArch, kv_scale: float = 1.0) -> ModelConfig:
    """A ModelConfig whose KV blob rows carry m's KV bytes per token: GQA as it is; MLA as one 'kv head' of
    half the latent + rope key in K and the other half in V. Only the KV shape is meaningful. kv_scale s > 1:
    a line scaled down by s carries KV scaled down by s, one 'kv head' of round(half a layer's elements / s)
    (at least 1), so a token's wire bytes are m's / s (to a row's rounding)."""
    if kv_scale < 1:
        raise ValueError(f"kv_scale={kv_scale}: must be >= 1")
    n_kv, hd = (m.kv_heads, m.head_dim) if m.attention == "gqa" else (1, m.kv_elements_per_layer // 2)
    if kv_scale != 1:
        n_kv, hd = 1, max(1, round(m.kv_elements_per_layer / 2 / kv_scale))
    return ModelConfig(
        name=f"modelled-{m.name}",
        vocab_size=m.vocab_size,
        n_layer=m.layers,
        n_head=n_kv,
        n_kv_head=n_kv,
        head_dim=hd,
        d_model=n_kv * hd,
        d_ff=1,
        max_seq_len=m.max_seq_len,
        dtype=m.kv_dtype,
    )


@dataclasses.dataclass(frozen=True)
class Catalogue:
    """The accelerators and models by name."""

    accelerators: dict[str, Accelerator]
    models: dict[str, ModelArch]

    def accelerator(self, name: str) -> Accelerator:
        check_choice("accelerator", name, sorted(self.accelerators), CatalogueError)
        return self.accelerators[name]

    def model(self, name: str) -> ModelArch:
        check_choice("model", name, sorted(self.models), CatalogueError)
        return self.models[name]


def _read(path: Path) -> dict[str, list]:
    """A catalogue file's lists by key (accelerators, models; a key left out: empty)."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise CatalogueError(f"{path}: {exc}") from exc
    if not isinstance(data, dict) or not set(data) <= {"accelerators", "models"}:
        raise CatalogueError(f"{path}: expected a mapping with keys accelerators and/or models")
    lists = {key: data.get(key) or [] for key in ("accelerators", "models")}
    for key, entries in lists.items():
        if not isinstance(entries, list):
            raise CatalogueError(f"{path}: {key}: expected a list")
    return lists


def check_accelerator(a: Accelerator, where: str) -> Accelerator:
    """Every number's source given."""
    _check_sources(a, ACCEL_NUMBERS, where)
    return a


# A catalogue file's lists: the type of each entry and the rules between its fields.
KINDS = {"accelerators": (Accelerator, check_accelerator), "models": (ModelArch, check_model)}


def parse_entries(key: str, entries: list, where: str) -> dict:
    """name -> entry of one list of a catalogue file (key: accelerators | models), each built and checked; an error
    names the file (where), the list and the entry."""
    cls, check = KINDS[key]
    out = {}
    for i, e in enumerate(entries):
        at = f"{where}: {key}[{e.get('name', i) if isinstance(e, dict) else i}]"
        entry = check(build(cls, e, at, CatalogueError), at)
        out[entry.name] = entry
    return out


def load_catalogue(*extra: Path) -> Catalogue:
    """The shipped catalogues, then each extra YAML file's accelerators and models (same name: replaced)."""
    found: dict[str, dict] = {key: {} for key in KINDS}
    for path in (ACCELERATORS_FILE, MODELS_FILE, *map(Path, extra)):
        for key, entries in _read(Path(path)).items():
            found[key] |= parse_entries(key, entries, str(path))
    return Catalogue(found["accelerators"], found["models"])
