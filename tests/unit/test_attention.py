"""Attention of one pass over several requests: each request's rows equal attention over its positions alone."""

import pytest
import torch
import torch.nn.functional as F

from workers.attention import MAX_RUNS, Span, slot_runs
from workers.kvcache import KVCache
from workers.model import TINY

torch.set_num_threads(1)
BS = 4  # block size (tokens)
C = TINY  # GQA: 4 query heads over 2 KV heads


def test_slot_runs_join_consecutive_blocks():
    assert slot_runs([3, 4, 0, 7], BS, 0, 15) == [(12, 8), (0, 4), (28, 3)]
    assert slot_runs([3, 4, 0, 7], BS, 6, 9) == [(18, 2), (0, 1)]
    assert slot_runs([3], BS, 2, 2) == []


def randn(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def reference(q, k_all, v_all, start):
    """q (T, nh, hs) at positions start.. over k_all, v_all (L, nkv, hs), causal: (T, nh, hs)."""
    T, L = q.shape[0], k_all.shape[0]
    mask = torch.arange(L)[None, :] <= (start + torch.arange(T))[:, None]
    y = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None],
        k_all.transpose(0, 1)[None],
        v_all.transpose(0, 1)[None],
        attn_mask=mask,
        enable_gqa=True,
    )
    return y[0].transpose(0, 1)


# (block table, start, n_new): a fresh chunk; a decode over 3 runs; a chunk on top of one run;
# a decode over more than MAX_RUNS runs (gathered); a chunk over 2 runs; a one-token prompt
SPANS = [
    ([0, 1], 0, 6),
    ([9, 2, 3, 12], 13, 1),
    ([20, 21, 22], 6, 5),
    ([30 + 2 * i for i in range(MAX_RUNS + 2)], 4 * MAX_RUNS + 5, 1),
    ([14, 16, 17], 3, 7),
    ([18], 0, 1),
]


@pytest.mark.parametrize("layer", [0, 1])
def test_a_mixed_pass_equals_attention_over_each_request_alone(layer):
    cache = KVCache(C, 64 * BS, BS, "cpu")
    spans = [Span(b, s, n) for b, s, n in SPANS]
    old = []  # what each request already had in the cache
    for i, sp in enumerate(spans):
        slots = cache.slot_map(list(sp.block_ids), sp.end)
        kv = randn(C.n_layer, 2, sp.start, C.n_kv_head, C.head_dim, seed=i)
        cache.write_kv(slots[: sp.start], kv)
        old.append(kv[layer])
    N = sum(sp.n_new for sp in spans)
    q = randn(1, N, C.n_head, C.head_dim, seed=100)
    k, v = randn(1, N, C.n_kv_head, C.head_dim, seed=101), randn(1, N, C.n_kv_head, C.head_dim, seed=102)
    binding = cache.bind(spans)
    seen = []
    binding.listeners.append(seen.append)
    y = binding.attention(layer, q, k, v)
    assert y.shape == q.shape and seen == [layer]
    row = 0
    for i, sp in enumerate(spans):
        rows = slice(row, row + sp.n_new)
        k_all = torch.cat([old[i][0], k[0, rows]])
        v_all = torch.cat([old[i][1], v[0, rows]])
        torch.testing.assert_close(y[0, rows], reference(q[0, rows], k_all, v_all, sp.start), atol=1e-5, rtol=1e-5)
        stored = cache.read_layer(layer, binding.slots(i))  # (2, end, nkv, hs): the new rows were written
        torch.testing.assert_close(stored, torch.stack([k_all, v_all]), rtol=0, atol=0)
        row += sp.n_new


def test_a_pass_refuses_bad_spans_and_rows():
    cache = KVCache(C, 16 * BS, BS, "cpu")
    with pytest.raises(ValueError, match="at least one"):
        cache.bind([])
    with pytest.raises(ValueError, match="computes 0"):
        cache.bind([Span([0], 0, 0)])
    binding = cache.bind([Span([0], 0, 3)])
    with pytest.raises(ValueError, match="3 rows, got 2"):
        binding.attention(0, *(torch.zeros(1, 2, h, C.head_dim) for h in (C.n_head, C.n_kv_head, C.n_kv_head)))
