"""Tap an engine's forward pass so each layer's KV can leave while later layers compute.

Responsible for: a context manager that, for the duration of a prefill,
calls back after every layer has written its K and V into the cache, with the
slots of the request's positions; reading one layer's KV of a position range
as a private uint8 copy shaped for the data plane.
Not responsible for: sending (workers/kvwire/) or the engine itself.

How: the engine binds each forward pass through `KVCache.bind`; we add a
listener to the returned binding (`PassKV.listeners`: called once per layer,
as soon as that layer's K and V of every position are in the cache). The
wrapper is set on the KVCache instance only and removed on exit, so nothing
else changes. A pass over several requests (`Engine.step`) takes its own
per-request callback (`on_layer`) instead.
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

    def bind(spans):
        binding = original(spans)
        slots = binding.slots(0)  # (L,) slots of positions 0..start+n_new-1
        binding.listeners.append(lambda layer: on_layer(layer, slots))
        return binding

    kv.bind = bind
    try:
        yield
    finally:
        del kv.bind  # back to the class's method


def read_layer(kv: KVCache, layer: int, slots: torch.Tensor) -> np.ndarray:
    """K and V of one layer at these slots, a private copy (2, n, row_bytes) uint8."""
    both = kv.read_layer(layer, slots)  # (2, n, nkv, hs)
    return both.cpu().view(torch.uint8).reshape(2, slots.numel(), -1).numpy()
