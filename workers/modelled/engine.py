"""ModelledEngine: the real Engine's interface and bookkeeping, waiting the roofline's time instead of computing.

Responsible for: an `Engine` (workers/engine.py) whose forward pass is a wait: every public call (open,
prefill, extend, append_tokens, decode_step, step, finish, abort, export_kv, import_kv, cached_prefix, ...)
is the real engine's own code over the real block allocator and radix prefix cache, but a pass computes no
KV: it takes the roofline's time for its parts (`workers.modelled.roofline`), reports each layer to its
listeners as the pass's time advances (so a P role still streams layer by layer), marks the KV as present
(`workers.modelled.kvstore`) and samples deterministic tokens: a function of the request's tokens alone, so
the same prompt gives the same tokens on any role, accelerator, and after a handoff or a recompute. KV blobs
have the architecture's bytes per token; export and import also take their host-link time. Its KV capacity
is the accelerators' memory minus the weights.
Not responsible for: anything the real engine is not (queueing, the network), logits (there are none:
extend returns an empty (rows, 0) tensor), or real sampling (temperature and top_k are validated, not used).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import torch

from workers.attention import Span
from workers.engine import Engine, ImportResult, _Request
from workers.model import model_fingerprint
from workers.modelled.catalogue import Accelerator, Efficiency, ModelArch, wire_config
from workers.modelled.kvstore import ModelledKV
from workers.modelled.roofline import Part, Roofline, StepCost
from workers.radix import RadixCache

log = logging.getLogger(__name__)

_MASK = (1 << 64) - 1
_FNV_OFFSET, _FNV_PRIME = 0xCBF29CE484222325, 0x100000001B3


def context_hash(tokens: Sequence[int], h: int = _FNV_OFFSET) -> int:
    """FNV-1a over token IDs, continuing from h (so a growing context is hashed once)."""
    for t in tokens:
        h = ((h ^ t) * _FNV_PRIME) & _MASK
    return h


def next_token(h: int, n_tokens: int, vocab_size: int) -> int:
    """The token that follows a context of n_tokens tokens hashing to h (splitmix64 finaliser)."""
    z = (h ^ (n_tokens * 0x9E3779B97F4A7C15)) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return (z ^ (z >> 31)) % vocab_size


class ModelledEngine(Engine):
    """An Engine that waits instead of computing.

    model: the architecture (catalogue.ModelArch)
    accelerator: the device it runs on (catalogue.Accelerator)
    devices: accelerators one engine spans (tensor parallel)
    efficiency: overrides the accelerator's efficiency (calibration)
    capacity_tokens: KV slots (tokens); None: what the devices' memory holds beyond the weights
    block_size: tokens per KV block and prefix-cache granularity (tokens)
    prefix_cache: keep finished requests' blocks in a radix cache
    vocab_size: tokens are drawn from [0, vocab_size) (default the model's; the workload's tokenizer may be smaller)
    kv_scale: the blob carries the architecture's KV bytes per token / kv_scale (a line scaled down by as much;
        the roofline's passes, KV copies and memory keep the real bytes)
    clock, sleep: time source (s) and wait (s); tests pass a fake pair
    """

    def __init__(
        self,
        model: ModelArch,
        accelerator: Accelerator,
        devices: int = 1,
        efficiency: Efficiency | None = None,
        capacity_tokens: int | None = None,
        block_size: int = 16,
        prefix_cache: bool = True,
        vocab_size: int | None = None,
        kv_scale: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.arch, self.roofline = model, Roofline(accelerator, model, devices, efficiency)
        self.config = wire_config(model, kv_scale)
        self.device = torch.device("cpu")
        self.model = None  # no weights: nothing is computed
        self.weights_sha256 = "modelled"
        self.fingerprint = model_fingerprint(self.config, self.weights_sha256)
        room = self.roofline.kv_capacity_tokens()
        if capacity_tokens is not None and capacity_tokens > room:
            raise ValueError(
                f"capacity_tokens={capacity_tokens} exceeds the {room} KV tokens that {devices} x {accelerator.name} "
                f"hold beside {model.name}'s weights"
            )
        self.kv = ModelledKV(self.config, capacity_tokens or room, block_size, self.fingerprint)
        self.radix = RadixCache(block_size) if prefix_cache else None
        self._requests: dict[str, _Request] = {}
        self._vocab = vocab_size or model.vocab_size
        self._clock, self._sleep = clock, sleep
        self.busy_s = 0.0  # modelled time waited, passes and KV copies (s)
        self.late_s = 0.0  # how far past their modelled ends the passes and copies ended, summed (s)
        self.late_max_s = 0.0  # the most one of them ran past its end (s)
        self.last_step: StepCost | None = None
        log.info(
            "modelled engine %s on %d x %s: %d KV blocks of %d tokens, %d B/token, prefix cache %s",
            model.name,
            devices,
            accelerator.name,
            self.kv.num_blocks,
            block_size,
            self.config.kv_bytes_per_token,
            prefix_cache,
        )

    # ------------------------------------------------------------ the pass

    def _forward(
        self,
        parts: Sequence[tuple[_Request, int]],
        logits_at: Sequence[int] | None = None,
        listener: Callable[[int], None] | None = None,
    ) -> torch.Tensor:
        """One modelled pass: wait its roofline time, reporting each layer as its share of that time passes.
        Returns an empty 'logits' tensor (R, 0) at the rows asked for (default: every row)."""
        t0 = self._clock()
        rows = sum(n for _, n in parts) if logits_at is None else len(logits_at)
        ends = [sum(n for _, n in parts[: i + 1]) for i in range(len(parts))]
        at = set(range(ends[-1])) if logits_at is None else set(logits_at)
        costed = [Part(n, r.kv_len, sum(1 for j in range(e - n, e) if j in at)) for (r, n), e in zip(parts, ends)]
        cost = self.last_step = self.roofline.step(costed)
        binding = self.kv.bind([Span(r.block_ids, r.kv_len, n) for r, n in parts])
        if listener is not None:
            binding.listeners.append(listener)
        for req, n in parts:
            start = req.kv_len
            self.kv.store(req.slot_map[start : start + n], req.tokens[start : start + n], start)
        self._wait_layers(t0, cost.seconds, binding.listeners)
        for req, n in parts:
            req.kv_len += n
        return torch.empty(rows, 0)

    def _wait_layers(self, t0: float, seconds: float, listeners: list[Callable[[int], None]]) -> None:
        """Wait until t0 + seconds; with listeners, call them with each layer at its share of the time."""
        self.busy_s += seconds
        layers = self.config.n_layer if listeners else 1
        for layer in range(layers):
            self._wait_until(t0 + seconds * (layer + 1) / layers)
            for call in listeners:
                call(layer)
        self._ended(t0 + seconds)

    def _wait_until(self, deadline: float) -> None:
        left = deadline - self._clock()
        if left > 0:
            self._sleep(left)

    def _ended(self, deadline: float) -> None:
        """A pass or copy modelled to end at deadline ended now: count how late. The wait itself is never late
        by more than the sleep's overshoot; what makes a pass late is its own work (the listeners: reading each
        layer's rows for the KV senders) and a host too busy to wake it in time: the modelled accelerator then
        ran slower than the roofline says, and what the run measured is partly this machine's."""
        over = self._clock() - deadline
        if over > 0:
            self.late_s += over
            self.late_max_s = max(self.late_max_s, over)

    def pace(self) -> dict[str, float]:
        """The role_cpu event's modelled fields (workers/roles/server.py): modelled_s, the roofline's time of
        every pass and KV copy; modelled_late_s, how far past their ends they ended, summed; modelled_late_max_ms,
        the most one ran past its end. (modelled_s + modelled_late_s) / modelled_s is the pace the host kept."""
        return {
            "modelled_s": round(self.busy_s, 6),
            "modelled_late_s": round(self.late_s, 6),
            "modelled_late_max_ms": round(self.late_max_s * 1000, 3),
        }

    def _sample_append(self, req: _Request, logits: torch.Tensor) -> int:
        token = self._context_token(req)
        req.tokens.append(token)
        return token

    def _next_token(self, req: _Request, logits: torch.Tensor) -> int:
        return self._context_token(req) if req.done else self._sample_append(req, logits)

    def _context_token(self, req: _Request) -> int:
        """The token after req.tokens: a function of them alone (hashed incrementally, once per token)."""
        h, n = getattr(req, "ctx_hash", (_FNV_OFFSET, 0))
        h = context_hash(req.tokens[n:], h)
        req.ctx_hash = (h, len(req.tokens))
        return next_token(h, len(req.tokens), self._vocab)

    # ------------------------------------------------------------ KV transfer

    def export_kv(self, request_id: str, start: int = 0, end: int | None = None) -> bytes:
        """The real engine's export (the architecture's KV bytes per token), after its host-link time."""
        t0 = self._clock()
        blob = super().export_kv(request_id, start, end)
        self._copy_wait(t0, (self.kv_len(request_id) if end is None else end) - start)
        return blob

    def _copy_wait(self, t0: float, n_tokens: int) -> None:
        seconds = self.roofline.kv_transfer_s(n_tokens)
        self.busy_s += seconds
        self._wait_until(t0 + seconds)
        self._ended(t0 + seconds)

    def import_kv(self, request_id: str, blob) -> ImportResult:
        """Check a blob (size, checksum, each position's KV) and mark its new positions present, after the
        host-link time of those positions; token IDs past the request's end are appended, as the real engine."""
        t0 = self._clock()
        req = self._get(request_id)
        parsed = self.kv.parse_blob(blob)
        appended = self._check_import(req, parsed)
        self._check_room(req, len(appended), "import KV")
        req.tokens.extend(appended)
        first = max(parsed.start, req.kv_len)
        written = max(0, parsed.end - first)
        if written:
            self.kv.store(req.slot_map[first : parsed.end], req.tokens[first : parsed.end], first)
        req.kv_len = max(req.kv_len, parsed.end)
        self._copy_wait(t0, written)
        return ImportResult(request_id, parsed.start, parsed.end, written, len(appended))

    def reference_logits(self, token_ids: Sequence[int]) -> torch.Tensor:
        raise NotImplementedError("a modelled engine has no weights, hence no logits")
