"""Attention of one forward pass over the paged KV cache: several requests, each its own token range.

Responsible for: `PassKV`, the model's KV binding for one forward pass whose
rows are the new tokens of several requests one after another (a prefill
chunk, a decode token, an extend), each on top of the positions it already
has in the cache: writing each layer's K and V into the store, telling
listeners that a layer is written (the P role streams it from there), and
attending each request's queries to its own positions only (causal within
the pass). `slot_runs`: the runs of consecutive slots that a block table
maps a position range to.
Not responsible for: the storage, blocks or blobs (`workers.kvcache`), or
which requests run together (the engine and its callers).

Store layout (`KVCache`): one layer is (2, n_kv_head, slots, head_dim),
head-major, so a run of consecutive slots is, for each KV head, one
contiguous (run, head_dim) matrix that a matmul reads where it lies. A
request's positions are a few runs: its radix-shared prefix blocks, then its
own blocks, which the cache allocates consecutively where it can.

How a request attends, by its part of the pass (times: the default model, one
layer of a decode step of 32 requests x 257 positions, one CPU thread):
- fresh (start 0, a whole prompt or its first chunk): SDPA, causal, over this
  pass's own k and v; the store is only written.
- one query on top of KV (a decode step): scores q @ K^T per run, one softmax
  over all of them, p @ V summed over the runs: the KV is read once, in place
  (2.4 ms), where gathering every request's KV into one padded batch and
  running SDPA on it read it three times (5.6 ms). A table of more than
  MAX_RUNS runs is gathered first (one copy of that request's KV).
- several queries on top of KV (a later prefill chunk, an extend): the runs
  are joined into one (n_kv_head, L, head_dim) copy (none for a single run),
  paid once for all the chunk's queries, and SDPA runs with the causal mask
  shifted by start.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

MAX_RUNS = 8  # a single query reads at most this many runs in place (2 small matmuls each), else gathers


@dataclass(frozen=True)
class Span:
    """One request's part of a pass.

    block_ids: the request's block table (covering at least `end` positions)
    start: positions already in the cache, the first one computed now (tokens)
    n_new: positions computed now (tokens)
    """

    block_ids: Sequence[int]
    start: int
    n_new: int

    @property
    def end(self) -> int:
        return self.start + self.n_new


def slot_runs(block_ids: Sequence[int], block_size: int, begin: int, end: int) -> list[tuple[int, int]]:
    """(first slot, length) of each run of consecutive slots that holds positions begin..end-1."""
    runs: list[list[int]] = []
    pos = begin
    while pos < end:
        offset = pos % block_size
        slot = block_ids[pos // block_size] * block_size + offset
        take = min(block_size - offset, end - pos)
        if runs and runs[-1][0] + runs[-1][1] == slot:
            runs[-1][1] += take
        else:
            runs.append([slot, take])
        pos += take
    return [(a, n) for a, n in runs]


def _slots(runs: list[tuple[int, int]], device: torch.device) -> torch.Tensor:
    return torch.cat([torch.arange(a, a + n, device=device) for a, n in runs])  # (sum n,)


class _Part:
    """One span, prepared once for every layer: its rows, and where its keys are read from."""

    __slots__ = ("row", "n_new", "fresh", "runs", "gather", "mask")

    def __init__(self, span: Span, row: int, block_size: int, device: torch.device):
        self.row, self.n_new = row, span.n_new
        self.fresh = span.start == 0  # attends to this pass's k, v only
        self.runs = [] if self.fresh else slot_runs(span.block_ids, block_size, 0, span.end)
        self.gather = _slots(self.runs, device) if len(self.runs) > MAX_RUNS else None  # (L,): one index_select
        self.mask = None
        if not self.fresh and span.n_new > 1:
            q_pos = span.start + torch.arange(span.n_new, device=device)  # (T,)
            self.mask = torch.arange(span.end, device=device)[None, :] <= q_pos[:, None]  # (T, L)

    def keys(self, store: torch.Tensor) -> list[torch.Tensor]:
        """This part's positions 0..L-1 in one store (n_kv_head, S, head_dim): views of the runs, or one copy."""
        if self.gather is not None:
            return [store.index_select(1, self.gather)]  # (nkv, L, hs)
        return [store[:, a : a + n] for a, n in self.runs]  # (nkv, n, hs) each, no copy


class PassKV:
    """The model's view of the cache for one forward pass (implements `workers.model.KVBinding`).

    store: the cache's KV (n_layer, 2, n_kv_head, slots, head_dim), written in place
    block_size: slots per block (tokens)
    spans: the requests of the pass, in the order of the pass's rows
    """

    def __init__(self, store: torch.Tensor, block_size: int, spans: Sequence[Span]):
        if not spans:
            raise ValueError("a pass needs at least one request")
        self.store, self.block_size, self.spans = store, block_size, tuple(spans)
        self.listeners: list[Callable[[int], None]] = []  # called with each layer once its K and V are stored
        device = store.device
        self._parts, write, row = [], [], 0
        for span in self.spans:
            if span.n_new < 1 or span.start < 0:
                raise ValueError(f"span computes {span.n_new} positions from {span.start}")
            for a, n in slot_runs(span.block_ids, block_size, span.start, span.end):
                write.extend(range(a, a + n))
            self._parts.append(_Part(span, row, block_size, device))
            row += span.n_new
        self.n_rows = row
        self.write_slots = torch.tensor(write, dtype=torch.int64, device=device)  # (N,)

    def slots(self, i: int) -> torch.Tensor:
        """Slots of positions 0..end-1 of the pass's i-th request, (end,) int64."""
        span = self.spans[i]
        return _slots(slot_runs(span.block_ids, self.block_size, 0, span.end), self.store.device)

    def attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        shape, (nh, hs), nkv = q.shape, q.shape[-2:], k.shape[-2]
        q, k, v = q.reshape(-1, nh, hs), k.reshape(-1, nkv, hs), v.reshape(-1, nkv, hs)  # (N, nh|nkv, hs)
        if q.shape[0] != self.n_rows:
            raise ValueError(f"pass bound for {self.n_rows} rows, got {q.shape[0]}")
        k_store, v_store = self.store[layer]  # (nkv, S, hs) each
        k_store.index_copy_(1, self.write_slots, k.transpose(0, 1))
        v_store.index_copy_(1, self.write_slots, v.transpose(0, 1))
        for listener in self.listeners:
            listener(layer)
        y = torch.empty_like(q)  # (N, nh, hs)
        scaled = None
        for part in self._parts:
            rows = slice(part.row, part.row + part.n_new)
            if part.fresh:
                y[rows] = _sdpa(q[rows], k[rows], v[rows], None)
            elif part.mask is not None:
                keys, values = part.keys(k_store), part.keys(v_store)
                y[rows] = _sdpa(q[rows], _joined(keys), _joined(values), part.mask)
            else:
                scaled = q * hs**-0.5 if scaled is None else scaled
                _attend_one(scaled[part.row].view(nkv, nh // nkv, hs), part, k_store, v_store, y[part.row])
        return y.view(shape)


def _joined(runs: list[torch.Tensor]) -> torch.Tensor:
    return runs[0] if len(runs) == 1 else torch.cat(runs, dim=1)  # (nkv, L, hs)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """q (T, nh, hs) over k, v (L, nkv, hs) rows, or (nkv, L, hs) when masked; causal when mask is None.
    Returns (T, nh, hs)."""
    if mask is None:
        k, v = k.transpose(0, 1), v.transpose(0, 1)  # (nkv, T, hs)
    y = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None],  # (1, nh, T, hs)
        k[None],
        v[None],  # (1, nkv, L, hs)
        attn_mask=mask,
        is_causal=mask is None,
        enable_gqa=q.shape[1] != k.shape[0],
    )  # (1, nh, T, hs)
    return y[0].transpose(0, 1)


def _attend_one(q: torch.Tensor, part: _Part, k_store: torch.Tensor, v_store: torch.Tensor, y: torch.Tensor) -> None:
    """One query q (nkv, g, hs), already scaled, over the part's runs in place; into y (nh, hs)."""
    keys, values = part.keys(k_store), part.keys(v_store)
    scores = [torch.bmm(q, k.transpose(1, 2)) for k in keys]  # (nkv, g, n) each
    p = (scores[0] if len(scores) == 1 else torch.cat(scores, dim=-1)).softmax(-1, dtype=torch.float32)
    p = p.to(q.dtype)  # (nkv, g, L)
    out = y.view(q.shape)  # (nkv, g, hs)
    offset = 0
    for i, v in enumerate(values):
        n = v.shape[1]
        if i == 0:
            torch.bmm(p[..., :n], v, out=out)
        else:
            out.baddbmm_(p[..., offset : offset + n], v)
        offset += n
