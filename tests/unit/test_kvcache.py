"""Paged KV cache: blocks, slot mapping, reading a layer, blob export/import and its refusals."""

import dataclasses

import pytest
import torch

from workers.errors import CapacityExceeded, KVChecksumError, KVHeaderError, KVImportError
from workers.kvcache import BLOB_HEADER, KVCache
from workers.model import TINY

torch.set_num_threads(1)
FP = bytes(range(16))


def make_cache(capacity_tokens=64, block_size=4, config=TINY, fingerprint=FP) -> KVCache:
    return KVCache(config, capacity_tokens, block_size, "cpu", fingerprint)


def fill_random(cache: KVCache, slots: torch.Tensor, seed: int = 0) -> torch.Tensor:
    c = cache.config
    kv = torch.randn(
        c.n_layer, 2, slots.numel(), c.n_kv_head, c.head_dim, generator=torch.Generator().manual_seed(seed)
    )
    cache.write_kv(slots, kv)
    return kv


def test_alloc_free_and_capacity():
    cache = make_cache(capacity_tokens=66, block_size=4)
    assert cache.num_blocks == 16 and cache.capacity_tokens == 64  # rounded down to whole blocks
    a = cache.alloc(10)
    assert len(set(a)) == 10 and cache.free_blocks == 6
    with pytest.raises(CapacityExceeded, match="needs 7 KV blocks"):
        cache.alloc(7, "r1")
    assert cache.free_blocks == 6  # a failed alloc takes nothing
    cache.free(a[:4])
    assert cache.free_blocks == 10
    with pytest.raises(ValueError, match="twice"):
        cache.free([a[0]])


def test_blocks_for_rounds_up():
    cache = make_cache(block_size=4)
    assert [cache.blocks_for(n) for n in (1, 4, 5, 8, 9)] == [1, 1, 2, 2, 3]


def test_slot_map_follows_the_block_table():
    cache = make_cache(block_size=4)
    slots = cache.slot_map([3, 0, 7], 10)
    assert slots.tolist() == [12, 13, 14, 15, 0, 1, 2, 3, 28, 29]
    with pytest.raises(ValueError):
        cache.slot_map([3], 5)


def test_blob_layout_and_size():
    cache = make_cache()
    slots = cache.slot_map(cache.alloc(3), 10)
    fill_random(cache, slots)
    blob = cache.export_blob(slots[2:9], list(range(50, 57)), start=2)
    assert len(blob) == BLOB_HEADER.size + 7 * 4 + 7 * TINY.kv_bytes_per_token
    magic, version, *_ = BLOB_HEADER.unpack_from(blob)
    assert magic == b"PDKV" and version == 2


def test_roundtrip_into_other_blocks_of_another_cache():
    src, dst = make_cache(), make_cache()
    src_slots = src.slot_map(src.alloc(3), 10)
    kv = fill_random(src, src_slots)
    blob = src.export_blob(src_slots[3:10], list(range(7)), start=3)
    dst.alloc(5)  # so the destination uses different block ids
    dst_slots = dst.slot_map(dst.alloc(3), 10)
    parsed = dst.parse_blob(blob)
    assert (parsed.start, parsed.end, parsed.token_ids) == (3, 10, tuple(range(7)))
    dst.write_kv(dst_slots[3:10], parsed.kv)
    torch.testing.assert_close(dst.read_kv(dst_slots[3:10]), kv[:, :, 3:10], rtol=0, atol=0)
    assert dst.export_blob(dst_slots[3:10], list(range(7)), start=3) == blob


def _blob(cache: KVCache) -> bytes:
    slots = cache.slot_map(cache.alloc(2), 6)
    fill_random(cache, slots)
    return cache.export_blob(slots, [1, 2, 3, 4, 5, 6], start=0)


def _patch_header(blob: bytes, index: int, value) -> bytes:
    fields = list(BLOB_HEADER.unpack_from(blob))
    fields[index] = value
    return BLOB_HEADER.pack(*fields) + blob[BLOB_HEADER.size :]


@pytest.mark.parametrize(
    "index, value, field",
    [
        (0, b"XXXX", "magic"),
        (1, 1, "version"),  # version 1 (zlib crc32) blobs are refused
        (2, 1, "dtype"),
        (3, bytes(16), "fingerprint"),
        (4, 3, "n_layer"),
        (5, 4, "n_kv_head"),
        (6, 8, "head_dim"),
        (8, 5, "kv bytes"),  # end moved: token count no longer matches the payload
    ],
)
def test_header_mismatch_is_refused(index, value, field):
    cache = make_cache()
    with pytest.raises(KVHeaderError, match=field) as err:
        cache.parse_blob(_patch_header(_blob(cache), index, value))
    assert isinstance(err.value, KVImportError)


def test_truncated_blob_is_refused():
    cache = make_cache()
    blob = _blob(cache)
    with pytest.raises(KVHeaderError, match="length"):
        cache.parse_blob(blob[:-1])
    with pytest.raises(KVHeaderError, match="length"):
        cache.parse_blob(blob[:10])


@pytest.mark.parametrize("where", ["token", "kv"])
def test_corrupted_payload_fails_the_checksum(where):
    cache = make_cache()
    blob = bytearray(_blob(cache))
    pos = BLOB_HEADER.size + (1 if where == "token" else 6 * 4 + 100)
    blob[pos] ^= 0x01
    with pytest.raises(KVChecksumError):
        cache.parse_blob(bytes(blob))


def test_blob_from_another_model_shape_is_refused():
    other = make_cache(config=dataclasses.replace(TINY, name="tiny3", n_layer=3))
    with pytest.raises(KVHeaderError, match="n_layer"):
        make_cache().parse_blob(_blob(other))


def test_bf16_blob_roundtrip():
    cfg = dataclasses.replace(TINY, name="tiny-bf16", dtype="bfloat16")
    cache = make_cache(config=cfg)
    blob = _blob(cache)
    assert len(blob) == BLOB_HEADER.size + 6 * 4 + 6 * cfg.kv_bytes_per_token
    parsed = cache.parse_blob(blob)
    assert parsed.kv.dtype == torch.bfloat16
    with pytest.raises(KVHeaderError, match="dtype"):
        make_cache().parse_blob(blob)


def test_alloc_prefers_consecutive_blocks_and_falls_back_to_any():
    cache = make_cache(capacity_tokens=40, block_size=4)  # 10 blocks
    a, b, c = cache.alloc(3), cache.alloc(3), cache.alloc(2)
    assert (a, b, c) == ([0, 1, 2], [3, 4, 5], [6, 7])
    cache.free(a + c)  # free: 0 1 2, 6 7 8 9
    assert cache.alloc(4) == [6, 7, 8, 9]  # the first run long enough, not the lowest ids
    assert cache.alloc(2) == [0, 1]
    cache.free(b)  # free: 2 3 4 5
    assert cache.alloc(4) == [2, 3, 4, 5]
    cache.free([0, 3, 5, 8])
    assert cache.alloc(3) == [0, 3, 5]  # no run of 3: the lowest free ones
    with pytest.raises(ValueError, match="twice"):
        cache.free([8, 8])
    assert cache.free_blocks == 1


def test_read_layer_is_token_major_like_blobs():
    cache = make_cache()
    slots = cache.slot_map(cache.alloc(3), 10)
    kv = fill_random(cache, slots)
    torch.testing.assert_close(cache.read_layer(1, slots[3:8]), kv[1, :, 3:8], rtol=0, atol=0)
