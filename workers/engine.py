"""The inference engine: one model, one paged KV cache, optionally one radix prefix cache.

Responsible for: validating requests; opening a request (prefix match, pin,
reserving KV blocks for prompt + max_tokens, evicting cached prefixes if
needed); prefill on top of a cached prefix; batched decode steps; extend (one
forward pass over k given token IDs on top of cached KV, returning the logits
at every position); mixed steps (`step`: in one forward pass, any number of
tokens without KV of several requests: prefill chunks, decode tokens, chunks
of appended IDs; each layer of each reported as soon as it is stored);
exporting/importing a token range of a request's KV as bytes; finishing a
request (its full blocks go into the prefix cache).
Not responsible for: queueing, admission order, chunk sizes or batching policy
(`workers/chunked.py`, `workers/roles/batching.py`), the network (the PDD
roles), or threads: an Engine is not thread-safe; one thread drives it.

Request lifecycle, in terms of `tokens` (prompt + generated) and `kv_len`
(positions whose KV is in the cache):

    open()        tokens = prompt, kv_len = cached prefix (whole blocks, < len(prompt))
    prefill()     kv_len = len(prompt), first token sampled and appended
    import_kv()   alternative to prefill: KV arrives as bytes (tokens may be appended)
    decode_step() needs exactly one token without KV; computes it, appends the next
    extend(ids)   appends ids, computes all tokens without KV, appends the next token
    step(parts)   (rid, n): computes the next n tokens without KV; when none is left, appends the next
    finish()      caches whole blocks in the radix tree, frees the rest

A request is done when it has generated max_tokens tokens. Every error is
raised before any state changes, so a bad request leaves the engine and the
other requests as they were.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from workers.errors import (
    BadMaxTokens,
    BadRequestState,
    BadSampling,
    CapacityExceeded,
    DuplicateRequest,
    EmptyPrompt,
    KVRangeError,
    PromptTooLong,
    TokenOutOfVocab,
    UnknownRequest,
)
from workers.attention import Span
from workers.kvcache import KVBlob, KVCache
from workers.model import ModelConfig, build_model, get_config, model_fingerprint, resolve_device
from workers.radix import RadixCache, RadixNode, RadixStats
from workers.requests import (
    ExtendResult,
    GenerationRequest,
    GenerationResult,
    ImportResult,
    LayerWrite,
    OpenResult,
    PrefillResult,
    StepPart,
    StepResult,
)
from workers.sampling import make_generator, sample_token

__all__ = [  # the request and result types are part of the engine's API (defined in workers.requests)
    "Engine",
    "ExtendResult",
    "GenerationRequest",
    "GenerationResult",
    "ImportResult",
    "LayerWrite",
    "OpenResult",
    "PrefillResult",
    "StepPart",
    "StepResult",
]

log = logging.getLogger(__name__)


@dataclass
class _Request:
    request: GenerationRequest
    tokens: list[int]
    kv_len: int
    block_ids: list[int]  # block table: shared prefix blocks, then private ones
    shared_blocks: int  # leading blocks owned by the radix tree
    node: RadixNode | None  # pinned radix node, if any
    slot_map: torch.Tensor  # (reserved_tokens,) slot of each position
    cached_tokens: int
    generator: torch.Generator | None = field(default=None)

    @property
    def prompt_len(self) -> int:
        return len(self.request.prompt_tokens)

    @property
    def generated(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def done(self) -> bool:
        return self.generated >= self.request.max_tokens

    @property
    def reserved_tokens(self) -> int:
        return self.slot_map.numel()


class Engine:
    """Model + KV cache + prefix cache for one worker.

    model: config name (see workers.model.CONFIGS) or a ModelConfig
    seed: weights seed; every process with the same (model, seed) has the same weights
    capacity_tokens: KV slots of this worker (tokens)
    block_size: tokens per KV block, also the prefix cache's granularity (tokens)
    device: 'auto' (cuda where present), 'cpu' or 'cuda'
    prefix_cache: keep finished requests' blocks in a radix cache
    weights_dir: where weights files live (default workers.model.default_weights_dir())
    """

    def __init__(
        self,
        model: str | ModelConfig = "tiny",
        seed: int = 0,
        capacity_tokens: int = 8192,
        block_size: int = 16,
        device: str = "auto",
        prefix_cache: bool = True,
        weights_dir: Path | None = None,
    ):
        self.config = get_config(model) if isinstance(model, str) else model
        self.device = resolve_device(device)
        self.model, weights = build_model(self.config, seed, str(self.device), weights_dir)
        self.weights_sha256 = weights.sha256
        self.fingerprint = model_fingerprint(self.config, weights.sha256)
        self.kv = KVCache(self.config, capacity_tokens, block_size, self.device, self.fingerprint)
        self.radix = RadixCache(block_size) if prefix_cache else None
        self._requests: dict[str, _Request] = {}
        log.info(
            "engine %s seed %d on %s: %d KV blocks of %d tokens, %d B/token, prefix cache %s",
            self.config.name,
            seed,
            self.device,
            self.kv.num_blocks,
            block_size,
            self.config.kv_bytes_per_token,
            prefix_cache,
        )

    # ------------------------------------------------------------ queries

    @property
    def block_size(self) -> int:
        return self.kv.block_size

    @property
    def kv_bytes_per_token(self) -> int:
        return self.config.kv_bytes_per_token

    @property
    def open_requests(self) -> list[str]:
        return list(self._requests)

    def available_blocks(self) -> int:
        """Blocks a new request could get now: free plus evictable cached ones."""
        return self.kv.free_blocks + (self.radix.evictable_blocks if self.radix else 0)

    def prefix_stats(self) -> RadixStats | None:
        return self.radix.stats() if self.radix else None

    def cached_prefix(self, prompt: Sequence[int]) -> int:
        """Tokens of prompt the prefix cache would give a request opened now (whole blocks, at least one
        prompt token left to compute, as open() matches), without pinning or counting a lookup."""
        if self.radix is None or len(prompt) < 2:
            return 0
        return self.radix.match_prefix(list(prompt), max_match_tokens=len(prompt) - 1, record=False).matched_tokens

    def tokens(self, request_id: str) -> tuple[int, ...]:
        """Prompt + generated tokens of an open request."""
        return tuple(self._get(request_id).tokens)

    def slots(self, request_id: str, start: int, end: int) -> torch.Tensor:
        """Cache slots of an open request's positions start..end-1 (to read KV it already holds), (n,) int64."""
        return self._get(request_id).slot_map[start:end]

    def kv_len(self, request_id: str) -> int:
        """Positions of an open request whose KV is in the cache."""
        return self._get(request_id).kv_len

    def is_done(self, request_id: str) -> bool:
        return self._get(request_id).done

    def check_decodable(self, request_id: str) -> None:
        """Raise as decode_step would unless the request can take a decode step (open, not done, exactly one
        token without KV): for callers that decode through step()."""
        self._check_decodable(self._get(request_id))

    def _get(self, request_id: str) -> _Request:
        try:
            return self._requests[request_id]
        except KeyError:
            raise UnknownRequest(request_id) from None

    # ------------------------------------------------------------ validation

    def validate(self, request: GenerationRequest) -> None:
        """Raise the BadRequest subclass that describes what is wrong with request, if anything."""
        rid, prompt, ctx = request.request_id, request.prompt_tokens, self.config.max_seq_len
        if len(prompt) == 0:
            raise EmptyPrompt(rid)
        if len(prompt) >= ctx:
            raise PromptTooLong(rid, len(prompt), ctx)
        self._check_vocab(rid, prompt)
        if not isinstance(request.max_tokens, int) or not 1 <= request.max_tokens <= ctx - len(prompt):
            raise BadMaxTokens(rid, request.max_tokens, len(prompt), ctx)
        s = request.sampling
        if not (s.temperature >= 0 and math.isfinite(s.temperature)):
            raise BadSampling(rid, "temperature", s.temperature, "0 (greedy) or a finite value > 0")
        if not isinstance(s.top_k, int) or s.top_k < 0:
            raise BadSampling(rid, "top_k", s.top_k, "an integer >= 0 (0 = all tokens)")

    def _check_vocab(self, request_id: str, token_ids: Iterable[int], offset: int = 0) -> None:
        vocab = self.config.vocab_size
        for i, t in enumerate(token_ids):
            if not isinstance(t, int) or not 0 <= t < vocab:
                raise TokenOutOfVocab(request_id, offset + i, t, vocab)

    def _check_room(self, req: _Request, n_more: int, operation: str) -> None:
        if req.generated + n_more > req.request.max_tokens:
            raise BadRequestState(
                req.request.request_id,
                operation,
                f"{n_more} more tokens would exceed max_tokens={req.request.max_tokens} ({req.generated} generated)",
            )

    # ------------------------------------------------------------ open / finish

    def open(self, request: GenerationRequest) -> OpenResult:
        """Validate, match the prefix cache, reserve KV blocks; raise (holding nothing) on failure."""
        self.validate(request)
        rid, prompt = request.request_id, list(request.prompt_tokens)
        if rid in self._requests:
            raise DuplicateRequest(rid)
        node, shared = self._match(request)
        reserved_tokens = len(prompt) + request.max_tokens
        try:
            private = self._reserve(rid, self.kv.blocks_for(reserved_tokens) - len(shared), len(shared))
        except CapacityExceeded:
            if node is not None:
                self.radix.unpin(node)
            raise
        blocks = shared + private
        self._requests[rid] = _Request(
            request=request,
            tokens=prompt,
            kv_len=len(shared) * self.block_size,
            block_ids=blocks,
            shared_blocks=len(shared),
            node=node,
            slot_map=self.kv.slot_map(blocks, reserved_tokens),
            cached_tokens=len(shared) * self.block_size,
            generator=make_generator(request.sampling),
        )
        return OpenResult(rid, len(shared) * self.block_size, reserved_tokens)

    def _match(self, request: GenerationRequest) -> tuple[RadixNode | None, list[int]]:
        """Pinned longest cached prefix, leaving at least one prompt token to compute."""
        if self.radix is None or not request.use_prefix_cache:
            return None, []
        prompt = request.prompt_tokens
        match = self.radix.match_prefix(prompt, max_match_tokens=len(prompt) - 1)
        self.radix.pin(match.node)
        return match.node, list(match.block_ids)

    def _reserve(self, request_id: str, n_blocks: int, shared_blocks: int) -> list[int]:
        """n_blocks private blocks, evicting cached prefixes if needed; raise before evicting if impossible."""
        available = self.available_blocks()
        if n_blocks > available:
            raise CapacityExceeded(
                request_id, n_blocks + shared_blocks, available + shared_blocks, self.kv.num_blocks, self.block_size
            )
        if n_blocks > self.kv.free_blocks:
            self.kv.free(self.radix.evict(n_blocks - self.kv.free_blocks))
        return self.kv.alloc(n_blocks, request_id)

    def finish(self, request_id: str) -> GenerationResult:
        """Close a request: cache its whole blocks (if prefix caching), free the rest."""
        req = self._get(request_id)
        self._release(req, cache=True)
        return self._result(req, "length" if req.done else "stopped")

    def abort(self, request_id: str) -> GenerationResult:
        """Close a request without caching anything it computed."""
        req = self._get(request_id)
        self._release(req, cache=False)
        return self._result(req, "aborted")

    def _release(self, req: _Request, cache: bool) -> None:
        del self._requests[req.request.request_id]
        private = req.block_ids[req.shared_blocks :]
        if self.radix is not None and cache and req.request.use_prefix_cache:
            n_full = req.kv_len // self.block_size
            result = self.radix.insert(req.tokens, req.block_ids[:n_full])
            self.kv.free(list(result.duplicate_block_ids) + list(result.evicted_block_ids))
            private = req.block_ids[max(n_full, req.shared_blocks) :]
        self.kv.free(private)
        if req.node is not None:
            self.radix.unpin(req.node)

    @staticmethod
    def _result(req: _Request, reason: str) -> GenerationResult:
        return GenerationResult(
            req.request.request_id,
            req.request.prompt_tokens,
            tuple(req.tokens[req.prompt_len :]),
            req.cached_tokens,
            reason,
        )

    # ------------------------------------------------------------ compute

    def prefill(self, request_id: str) -> PrefillResult:
        """Compute the prompt's KV beyond the cached prefix; sample and append the first token."""
        req = self._get(request_id)
        if req.generated > 0 or req.kv_len >= req.prompt_len:
            raise BadRequestState(
                request_id,
                "prefill",
                f"prompt KV already present ({req.kv_len} of {req.prompt_len} positions, {req.generated} generated)",
            )
        start, n = req.kv_len, req.prompt_len - req.kv_len
        logits = self._forward([(req, n)], logits_at=[n - 1])  # (1, V)
        token = self._sample_append(req, logits[-1])
        return PrefillResult(request_id, token, req.cached_tokens, req.prompt_len - start)

    def extend(self, request_id: str, token_ids: Sequence[int], all_logits: bool = True) -> ExtendResult:
        """Append token_ids, run one forward pass over every token without KV, return their logits
        (all_logits=False: the last row only, which skips most of the LM head: the MD's handoff needs no more)."""
        req = self._get(request_id)
        ids = list(token_ids)
        if not ids:
            raise BadRequestState(request_id, "extend", "no token IDs given")
        if req.kv_len < req.prompt_len:
            raise BadRequestState(request_id, "extend", f"prompt KV incomplete ({req.kv_len} of {req.prompt_len})")
        self._check_vocab(request_id, ids, offset=len(req.tokens))
        self._check_room(req, len(ids), "extend")
        req.tokens.extend(ids)
        start, n = req.kv_len, len(req.tokens) - req.kv_len
        logits = self._forward([(req, n)], logits_at=None if all_logits else [n - 1])  # (k or 1, V)
        return ExtendResult(request_id, start, logits.cpu(), self._next_token(req, logits[-1]))

    def append_tokens(self, request_id: str, token_ids: Sequence[int]) -> None:
        """Append tokens without computing them (e.g. the first token P sampled, received with the KV)."""
        req = self._get(request_id)
        ids = list(token_ids)
        self._check_vocab(request_id, ids, offset=len(req.tokens))
        self._check_room(req, len(ids), "append tokens")
        req.tokens.extend(ids)

    def decode_step(self, request_ids: Sequence[str] | None = None) -> dict[str, int]:
        """One batched decode step over the given (default: all decodable) requests; {request_id: new token}."""
        if request_ids is None:
            reqs = [r for r in self._requests.values() if not r.done and len(r.tokens) - r.kv_len == 1]
        else:
            self._check_unique(request_ids, "decode_step")
            reqs = [self._get(rid) for rid in request_ids]
            for r in reqs:
                self._check_decodable(r)
        if not reqs:
            return {}
        logits = self._forward([(r, 1) for r in reqs])  # (B, V)
        return {r.request.request_id: self._sample_append(r, logits[i]) for i, r in enumerate(reqs)}

    def step(
        self, parts: Sequence[tuple[str, int]], on_layer: Callable[[LayerWrite], None] | None = None
    ) -> StepResult:
        """One forward pass over several requests. A part (request_id, n) computes the KV of the next n of the
        request's tokens that have none: a prefill chunk, a decode token, a chunk of appended token IDs. A part
        after which all the request's tokens have KV samples its next token (appended unless the request is
        done, as extend). on_layer runs for each part and layer once that layer's KV is stored. Every part is
        checked before anything is computed: an error leaves the engine as it was."""
        self._check_unique([rid for rid, _ in parts], "step")
        reqs = [(self._get(rid), n) for rid, n in parts]
        for req, n in reqs:
            pending = len(req.tokens) - req.kv_len
            if not (isinstance(n, int) and 1 <= n <= pending):
                raise BadRequestState(req.request.request_id, "step", f"{n} tokens asked, {pending} have no KV")
        if not reqs:
            return StepResult((), {})
        done = [req.kv_len + n == len(req.tokens) for req, n in reqs]
        ends = list(itertools.accumulate(n for _, n in reqs))
        out = tuple(StepPart(r.request.request_id, r.kv_len, n, d) for (r, n), d in zip(reqs, done))
        listener = None if on_layer is None else self._layer_listener(out, on_layer)
        logits = self._forward(reqs, [end - 1 for end, d in zip(ends, done) if d], listener)  # (completed, V)
        completed = [req for (req, _), d in zip(reqs, done) if d]
        return StepResult(out, {r.request.request_id: self._next_token(r, logits[i]) for i, r in enumerate(completed)})

    def _layer_listener(self, parts: tuple[StepPart, ...], on_layer: Callable[[LayerWrite], None]):
        slots = [self._requests[p.request_id].slot_map[p.start : p.start + p.n_tokens] for p in parts]

        def listener(layer: int) -> None:
            for part, s in zip(parts, slots):
                on_layer(LayerWrite(part.request_id, layer, part.start, s))

        return listener

    @staticmethod
    def _check_unique(request_ids: Sequence[str], operation: str) -> None:
        if len(set(request_ids)) != len(request_ids):
            raise ValueError(f"{operation}: request ids repeat in {list(request_ids)}")

    @staticmethod
    def _check_decodable(req: _Request) -> None:
        rid, pending = req.request.request_id, len(req.tokens) - req.kv_len
        if req.done:
            raise BadRequestState(rid, "decode", f"already generated max_tokens={req.request.max_tokens}")
        if pending != 1:
            raise BadRequestState(
                rid, "decode", f"needs exactly 1 token without KV, has {pending} (prefill, import or extend first)"
            )

    def _sample_append(self, req: _Request, logits: torch.Tensor) -> int:
        token = sample_token(logits, req.request.sampling, req.generator)
        req.tokens.append(token)
        return token

    def _next_token(self, req: _Request, logits: torch.Tensor) -> int:
        """The next token; appended unless the request has generated max_tokens (then only reported)."""
        if req.done:
            return sample_token(logits, req.request.sampling, req.generator)
        return self._sample_append(req, logits)

    @torch.inference_mode()
    def _forward(
        self,
        parts: Sequence[tuple[_Request, int]],
        logits_at: Sequence[int] | None = None,
        listener: Callable[[int], None] | None = None,
    ) -> torch.Tensor:
        """One forward pass, its rows each part's next n tokens without KV, one part after another.
        Returns logits (R, V) at the rows logits_at (default: every row); listener(layer) once a layer is stored."""
        ids: list[int] = []
        positions: list[int] = []
        spans = []
        for req, n in parts:
            start = req.kv_len
            ids.extend(req.tokens[start : start + n])
            positions.extend(range(start, start + n))
            spans.append(Span(req.block_ids, start, n))
        binding = self.kv.bind(spans)
        if listener is not None:
            binding.listeners.append(listener)
        idx = torch.tensor([ids], dtype=torch.int64, device=self.device)  # (1, N)
        pos = torch.tensor([positions], dtype=torch.int64, device=self.device)  # (1, N)
        at = None if logits_at is None else torch.tensor(logits_at, dtype=torch.int64, device=self.device)  # (R,)
        logits = self.model(idx, pos, binding, logits_at=at)  # (1, R, V)
        for req, n in parts:
            req.kv_len += n
        return logits[0]

    # ------------------------------------------------------------ KV transfer

    def export_kv(self, request_id: str, start: int = 0, end: int | None = None) -> bytes:
        """The KV of positions start..end (default: all computed) of a request, as a blob."""
        req = self._get(request_id)
        end = req.kv_len if end is None else end
        if not 0 <= start <= end <= req.kv_len:
            raise BadRequestState(
                request_id, "export KV", f"range [{start}, {end}) not within the {req.kv_len} positions that have KV"
            )
        return self.kv.export_blob(req.slot_map[start:end], req.tokens[start:end], start)

    def import_kv(self, request_id: str, blob: bytes) -> ImportResult:
        """Write a blob's KV into an open request. Positions already present are skipped; the blob's
        token IDs must agree with the request's, and IDs past the request's end are appended."""
        req = self._get(request_id)
        parsed = self.kv.parse_blob(blob)
        appended = self._check_import(req, parsed)
        self._check_room(req, len(appended), "import KV")
        first = max(parsed.start, req.kv_len)
        if parsed.end > first:
            offset = first - parsed.start
            self.kv.write_kv(req.slot_map[first : parsed.end], parsed.kv[:, :, offset:])
        req.tokens.extend(appended)
        written = max(0, parsed.end - first)
        req.kv_len = max(req.kv_len, parsed.end)
        return ImportResult(request_id, parsed.start, parsed.end, written, len(appended))

    def _check_import(self, req: _Request, blob: KVBlob) -> list[int]:
        """Raise KVRangeError unless the blob continues the request's KV; return token IDs to append."""
        rid = req.request.request_id
        if blob.start > req.kv_len:
            raise KVRangeError(rid, f"blob starts at position {blob.start} but KV exists only up to {req.kv_len}")
        known = req.tokens[blob.start : blob.end]
        if list(blob.token_ids[: len(known)]) != known:
            raise KVRangeError(rid, f"token IDs of positions [{blob.start}, {blob.end}) differ from the request's")
        if blob.end > req.reserved_tokens:
            raise KVRangeError(rid, f"blob ends at {blob.end}, beyond the {req.reserved_tokens} reserved positions")
        appended = list(blob.token_ids[len(known) :])
        self._check_vocab(rid, appended, offset=len(req.tokens))
        return appended

    # ------------------------------------------------------------ convenience

    @torch.inference_mode()
    def reference_logits(self, token_ids: Sequence[int]) -> torch.Tensor:
        """Logits (T, V) of a plain full-sequence forward pass, no KV cache: the correctness reference."""
        idx = torch.tensor([list(token_ids)], dtype=torch.int64, device=self.device)  # (1, T)
        return self.model(idx)[0].cpu()

    def generate(self, request: GenerationRequest) -> GenerationResult:
        """Run one request to completion on its own (open, prefill, decode, finish)."""
        self.open(request)
        rid = request.request_id
        try:
            self.prefill(rid)
            while not self.is_done(rid):
                self.decode_step([rid])
        except BaseException:
            self.abort(rid)
            raise
        return self.finish(rid)
