"""ModelledEngine: the real Engine's interface and bookkeeping, deterministic tokens, the roofline's waits, KV sizes."""

import inspect

import numpy as np
import pytest
from crc32c import crc32c

from workers.chunked import ChunkScheduler
from workers.engine import Engine, GenerationRequest
from workers.errors import CapacityExceeded, KVChecksumError, KVHeaderError
from workers.kvcache import BLOB_HEADER, blob_kv_offset
from workers.modelled.catalogue import load_catalogue
from workers.modelled.engine import ModelledEngine
from workers.modelled.kvstore import layer_row_bytes, row_bytes
from workers.modelled.roofline import Part
from workers.roles.layerhook import layer_tap, read_layer

CAT = load_catalogue()
PROMPT = tuple(range(3, 203))  # 200 tokens


class FakeTime:
    """A clock that moves only when slept on."""

    def __init__(self):
        self.now, self.slept = 0.0, []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def engine(model="llama-3-70b", accel="h800", devices=4, **kw) -> tuple[ModelledEngine, FakeTime]:
    t = FakeTime()
    return ModelledEngine(CAT.model(model), CAT.accelerator(accel), devices, clock=t.clock, sleep=t.sleep, **kw), t


def req(rid="a", prompt=PROMPT, max_tokens=20) -> GenerationRequest:
    return GenerationRequest(rid, prompt, max_tokens)


def public(cls) -> dict[str, object]:
    return {n: getattr(cls, n) for n in dir(cls) if not n.startswith("_")}


def test_it_has_the_real_engines_public_interface_with_the_same_signatures():
    mine, real = public(ModelledEngine), public(Engine)
    assert set(real) <= set(mine)
    for name, member in real.items():
        if callable(member):
            assert inspect.signature(member).parameters.keys() == inspect.signature(mine[name]).parameters.keys()


def test_tokens_are_a_function_of_the_context_alone():
    a, _ = engine(accel="h800")
    b, _ = engine(accel="h20", devices=8)
    out_a, out_b = a.generate(req()).output_tokens, b.generate(req()).output_tokens
    assert out_a == out_b and len(out_a) == 20
    assert len(set(out_a)) > 10 and all(0 <= t < 128256 for t in out_a)
    assert b.generate(req("c", PROMPT[1:])).output_tokens != out_a


def test_tokens_survive_a_kv_handoff_and_a_recompute():
    p, _ = engine()
    whole = p.generate(req("ref")).output_tokens
    p.open(req())
    first = p.prefill("a").first_token
    md, _ = engine(accel="h20", devices=8)
    md.open(req())
    md.import_kv("a", p.export_kv("a"))  # the prompt's KV
    md.append_tokens("a", [first])
    while not md.is_done("a"):
        md.decode_step(["a"])
    assert md.finish("a").output_tokens == whole
    # handoff by token IDs: the prompt's KV, then the RLD's 5 tokens recomputed in one extend
    md.open(req("b"))
    md.import_kv("b", p.export_kv("a", 0, len(PROMPT)))
    nxt = md.extend("b", list(whole[:5]), all_logits=False).next_token
    assert nxt == whole[5]
    while not md.is_done("b"):
        md.decode_step(["b"])
    assert md.finish("b").output_tokens == whole


def test_each_pass_waits_the_rooflines_time():
    e, t = engine()
    r = e.roofline
    e.open(req())
    e.prefill("a")
    assert t.now == pytest.approx(r.prefill_s(200))
    e.open(req("b", PROMPT[:100]))
    e.prefill("b")
    before = t.now
    e.decode_step(["a", "b"])
    assert t.now - before == pytest.approx(r.step([Part(1, 200, 1), Part(1, 100, 1)]).seconds)
    before = t.now
    e.extend("a", [5, 6, 7])  # the token decode_step appended and the 3 given, on 201 positions of KV
    assert t.now - before == pytest.approx(r.extend_s(4, 201))
    assert e.busy_s == pytest.approx(t.now)


def test_a_cached_prefix_is_not_waited_for_again():
    e, t = engine()
    e.generate(req("first", max_tokens=1))
    before = t.now
    opened = e.open(req("second", PROMPT + (9, 9)))
    e.prefill("second")
    assert opened.cached_tokens == 192  # whole blocks of 16, as the real engine
    assert t.now - before == pytest.approx(e.roofline.prefill_s(10, 192))


def test_layers_are_reported_as_the_pass_advances():
    e, t = engine()
    e.open(req())
    seen = []
    with layer_tap(e.kv, lambda layer, slots: seen.append((layer, t.now, slots.numel()))):
        e.prefill("a")
    total = e.roofline.prefill_s(200)
    assert [s[0] for s in seen] == list(range(80))
    assert [s[1] for s in seen] == pytest.approx([total * (i + 1) / 80 for i in range(80)])
    rows = read_layer(e.kv, 3, e.slots("a", 0, 200))  # what a P role streams: K and V rows of the wire shape
    assert rows.shape == (2, 200, 8 * 128 * 2)


def test_a_pass_on_time_is_not_late_and_one_whose_layers_take_longer_is():
    e, t = engine()
    e.open(req())
    e.prefill("a")
    assert e.pace() == {
        "modelled_s": pytest.approx(e.busy_s, abs=1e-3),
        "modelled_late_s": 0,
        "modelled_late_max_ms": 0,
    }
    total = e.roofline.prefill_s(200)
    e.open(req("b", tuple(range(500, 700))))

    def slow_layer(layer, slots):  # each layer's rows take 1/40 of the pass to read: twice the pass in all
        t.now += total / 40

    with layer_tap(e.kv, slow_layer):
        e.prefill("b")
    # layer 0 waits its share (1/80), then every layer's rows take two shares: the pass ends at 161/80 of its time
    assert e.late_s == pytest.approx(total * 81 / 80)
    assert e.pace()["modelled_late_max_ms"] == pytest.approx(total * 81 / 80 * 1000, abs=1e-3)


def test_the_chunk_scheduler_drives_it_with_per_layer_callbacks():
    e, _ = engine("kimi-k2", devices=16)
    e.open(req())
    writes = []
    result = ChunkScheduler(e, budget_tokens=64).prefill("a", writes.append)
    assert result.computed_tokens == 200 and result.steps == 4
    assert len(writes) == 4 * 61


@pytest.mark.parametrize("model, per_token", [("llama-3-70b", 327680), ("kimi-k2", 70272)])
def test_exported_kv_has_the_architectures_bytes_per_token(model, per_token):
    e, t = engine(model, devices=16)
    e.open(req())
    e.prefill("a")
    before = t.now
    blob = e.export_kv("a", 0, 100)
    assert len(blob) == blob_kv_offset(100) + 100 * per_token
    assert t.now - before == pytest.approx(e.roofline.kv_transfer_s(100))
    assert e.kv_bytes_per_token == per_token


@pytest.mark.parametrize(
    "model, s, per_token", [("llama-3-70b", 4, 81920), ("kimi-k2", 4, 17568), ("kimi-k2", 8, 8784)]
)
def test_kv_scale_shrinks_the_wire_bytes_alone(model, s, per_token):
    """compute.kv_scale s: a token's KV on the wire is the architecture's / s; the roofline's pass and host-link
    times and the KV capacity keep the real bytes; a scaled blob imports into an engine of the same scale."""
    (real, rt), (scaled, st) = engine(model, devices=16), engine(model, devices=16, kv_scale=s)
    for e in (real, scaled):
        e.open(req())
        e.prefill("a")
    assert st.now == pytest.approx(rt.now) and scaled.kv.num_blocks == real.kv.num_blocks
    before = st.now
    blob = scaled.export_kv("a", 0, 100)
    assert len(blob) == blob_kv_offset(100) + 100 * per_token and scaled.kv_bytes_per_token == per_token
    assert st.now - before == pytest.approx(real.roofline.kv_transfer_s(100))
    receiver, _ = engine(model, devices=16, kv_scale=s)
    receiver.open(req())
    assert receiver.import_kv("a", blob).written_tokens == 100
    with pytest.raises(ValueError, match="kv_scale"):
        engine(model, kv_scale=0.5)


def test_import_refuses_a_corrupt_or_misplaced_blob():
    p, _ = engine()
    p.open(req())
    p.prefill("a")
    blob = bytearray(p.export_kv("a", 0, 100))
    md, _ = engine()
    md.open(req())
    bad = bytearray(blob)
    bad[-1] ^= 0xFF
    with pytest.raises(KVChecksumError):
        md.import_kv("a", bytes(bad))
    with pytest.raises(KVHeaderError, match="length"):
        md.import_kv("a", bytes(blob[:-2]))
    # rows rewritten with a valid checksum but another position's KV: the filler check catches it
    forged = np.frombuffer(bytearray(blob), np.uint8).copy()
    forged[blob_kv_offset(100) : blob_kv_offset(100) + 10] += 1
    header = bytearray(forged[: BLOB_HEADER.size].tobytes())
    fields = list(BLOB_HEADER.unpack_from(header))
    fields[9] = crc32c(forged[BLOB_HEADER.size :])
    forged[: BLOB_HEADER.size] = np.frombuffer(BLOB_HEADER.pack(*fields), np.uint8)
    with pytest.raises(KVHeaderError, match="kv content"):
        md.import_kv("a", forged.tobytes())
    other, _ = engine("kimi-k2", devices=16)
    other.open(req())
    with pytest.raises(KVHeaderError, match="fingerprint"):
        other.import_kv("a", bytes(blob))
    assert md.import_kv("a", bytes(blob)).written_tokens == 100


def test_kv_capacity_comes_from_the_accelerators_memory():
    e, _ = engine(devices=2, block_size=16)  # 2 x 80 GB x 0.9 - 141.2 GB of weights: ~8.6K tokens of KV
    assert e.kv.num_blocks == e.roofline.kv_capacity_tokens() // 16
    assert 8000 < e.kv.capacity_tokens < 9000
    e.open(GenerationRequest("one", tuple(range(1, 5000)), 100))
    with pytest.raises(CapacityExceeded):
        e.open(GenerationRequest("two", tuple(range(2, 5000)), 100))
    with pytest.raises(ValueError, match="exceeds the .* KV tokens"):
        engine(devices=2, capacity_tokens=100_000)
    assert engine(devices=2, capacity_tokens=1024)[0].kv.capacity_tokens == 1024


def test_one_layers_rows_are_that_layer_of_every_layers_rows():
    """P streams a layer's rows (layer_row_bytes) that a receiver checks against every layer's (row_bytes)."""
    values = np.arange(300, dtype=np.int64) % 256
    every = row_bytes(values.astype(np.uint8), 61)
    for layer in range(61):
        np.testing.assert_array_equal(layer_row_bytes(values.astype(np.uint8), layer), every[layer])
