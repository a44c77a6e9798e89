"""The KV data plane's receive buffers: the pool's reuse rules and blobs assembled in place.

A blob built by blob_buffer + seal_blob must be the very blob the engine exports for the same range
(the receiver writes frames straight into it), whether its checksum is read from the bytes or folded
from the chunks' checksums; chunks that do not tile every layer are refused; the pool must hand out a
buffer to one owner at a time.
"""

import numpy as np
import pytest

from workers.engine import Engine, GenerationRequest
from workers.errors import KVChecksumError
from crc32c import crc32c

from workers.kvwire import BufferPool, FrameError, blob_buffer, meta_for, seal_blob

MB = 1 << 20


def test_pool_reuses_a_given_back_buffer_of_fitting_size():
    pool = BufferPool(max_bytes=64 * MB, min_bytes=4 * MB)
    a = pool.take(10 * MB)
    base = a.base
    pool.give(a)
    assert pool.free_bytes == base.nbytes
    b = pool.take(9 * MB)  # fits and wastes less than half: the same memory
    assert b.base is base and b.nbytes == 9 * MB and pool.free_bytes == 0
    c = pool.take(9 * MB)  # in use by b: a new buffer
    assert c.base is not base


def test_pool_refuses_waste_duplicates_and_overflow():
    pool = BufferPool(max_bytes=24 * MB, min_bytes=4 * MB)
    big = pool.take(20 * MB)
    pool.give(big)
    pool.give(big)  # given back twice: kept once
    assert pool.free_bytes == 20 * MB
    small = pool.take(5 * MB)  # would waste 3/4 of the free 20 MB one
    assert small.base is not big.base and pool.free_bytes == 20 * MB
    pool.give(small)  # 20 + 8 > 24: not kept
    assert pool.free_bytes == 20 * MB
    tiny = pool.take(1000)  # below min_bytes: plain memory, never pooled
    pool.give(tiny)
    assert pool.free_bytes == 20 * MB


def _received(start, end, pool=None):
    """A prefilled tiny-model request "a", the engine's export of [start, end), and a blob_buffer whose KV
    region holds the same bytes (as the receiver leaves it): eng, prompt, want, meta, blob, kv."""
    eng = Engine("tiny", seed=0, capacity_tokens=256, block_size=8, prefix_cache=False)
    prompt = list(range(3, 40))
    eng.open(GenerationRequest("a", tuple(prompt), 4))
    eng.prefill("a")
    want = eng.export_kv("a", start, end)
    meta = meta_for(eng, "a", "prompt", start, end, prompt[start:end])
    blob, kv = blob_buffer(meta, pool)
    kv[...] = np.frombuffer(want, np.uint8, offset=len(want) - meta.kv_bytes).reshape(kv.shape)
    return eng, prompt, want, meta, blob, kv


def test_sealed_blob_equals_the_engines_export_and_imports():
    eng, prompt, want, meta, blob, kv = _received(5, 30, BufferPool(min_bytes=1))
    got = seal_blob(meta, blob)
    assert bytes(got) == bytes(want)
    eng.open(GenerationRequest("b", tuple(prompt), 4))
    eng.import_kv("b", eng.export_kv("a", 0, 5))
    assert eng.import_kv("b", got).written_tokens == 25
    kv[0, 0, 0, 0] ^= 0xFF  # a byte flipped after sealing: the engine refuses the blob
    eng.abort("b")
    eng.open(GenerationRequest("b", tuple(prompt), 4))
    eng.import_kv("b", eng.export_kv("a", 0, 5))
    with pytest.raises(KVChecksumError):
        eng.import_kv("b", got)


def _chunk_crcs(kv, cuts):
    """What the receiver records for chunks [cuts[i], cuts[i+1]) of every layer of kv (n_layer, 2, n, row)."""
    out = {}
    for layer in range(kv.shape[0]):
        for off, end in zip(cuts, cuts[1:]):
            out[layer, off] = (end - off, crc32c(kv[layer, 0, off:end]), crc32c(kv[layer, 1, off:end]))
    return out


def test_checksum_folded_from_chunks_equals_the_export_and_gaps_are_refused():
    _, _, want, meta, blob, kv = _received(2, 33)
    chunks = _chunk_crcs(kv, [0, 7, 8, 20, 31])
    assert bytes(seal_blob(meta, blob, dict(reversed(list(chunks.items()))))) == bytes(want)
    overlapping = _chunk_crcs(kv, [0, 7, 8, 20, 31])
    overlapping[1, 8] = (13, *overlapping[1, 8][1:])  # layer 1: [8, 21) overlaps [20, 31)
    with pytest.raises(FrameError, match="layer 1"):
        seal_blob(meta, blob, overlapping)
    short = _chunk_crcs(kv, [0, 7, 8, 20, 31])
    del short[0, 20]  # layer 0 ends at token 20
    with pytest.raises(FrameError, match="layer 0: chunks cover 20 of 31"):
        seal_blob(meta, blob, short)
