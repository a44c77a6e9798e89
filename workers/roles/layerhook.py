"""Tap an engine's forward pass so each layer's KV can leave while later layers compute.

Responsible for: a context manager that, for the duration of a prefill,
calls back after every layer has written its K and V into the cache, with the
slots of the request's positions; reading one layer's KV of a position range
as a private uint8 copy shaped for the data plane.
Not responsible for: sending (workers/roles/kvwire.py) or the engine itself.

How: the engine binds each forward pass through `KVCache.bind`; we wrap the
returned binding's `attend` (the model calls it once per layer, after which
that layer's KV of every position is in the cache). The wrapper is set on
the KVCache instance only and removed on exit, so nothing else changes.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

import numpy as np
import torch

from workers.kvcache import KVCache

LayerCallback = Callable[[int, torch.Tensor], None]  # (layer, slots of positions 0..L-1 (L,) int64)


@contextmanager
def layer_tap(kv: KVCache, on_layer: LayerCallback) -> Iterator[None]:
    """While active, on_layer(layer, slots) runs after each layer of a single-request forward pass."""
    original = kv.bind

    def bind(slot_maps, starts, n_new):
        binding = original(slot_maps, starts, n_new)
        attend = binding.attend
        slots = binding.gather_slots[0]  # (L,) slots of positions 0..start+n_new-1

        def tapped(layer, k, v):
            out = attend(layer, k, v)
            on_layer(layer, slots)
            return out

        binding.attend = tapped
        return binding

    kv.bind = bind
    try:
        yield
    finally:
        del kv.bind  # back to the class's method


def read_layer(kv: KVCache, layer: int, slots: torch.Tensor) -> np.ndarray:
    """K and V of one layer at these slots, a private copy (2, n, row_bytes) uint8."""
    k_store, v_store = kv.layer_kv(layer)  # (S, nkv, hs)
    both = torch.stack((k_store.index_select(0, slots), v_store.index_select(0, slots)))  # (2, n, nkv, hs)
    return both.cpu().contiguous().view(torch.uint8).reshape(2, slots.numel(), -1).numpy()
