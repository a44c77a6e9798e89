"""The modelled-compute catalogues (sources, validation, KV bytes per token) and the roofline's shape."""

import dataclasses

import pytest

from workers.model import CONFIGS
from workers.modelled.calibrate import Measured, fit_efficiency
from workers.modelled.catalogue import CatalogueError, Efficiency, load_catalogue, wire_config
from workers.modelled.roofline import Part, Roofline

CAT = load_catalogue()
ACCELERATORS = ("h100-sxm", "h800", "h20", "a100-80gb", "l40s", "this-machine")


def roof(model: str, accel: str = "h800", devices: int = 8) -> Roofline:
    return Roofline(CAT.accelerator(accel), CAT.model(model), devices)


# ------------------------------------------------------------ catalogues


def test_every_shipped_accelerator_is_there_with_a_source_per_number():
    for name in ACCELERATORS:
        a = CAT.accelerator(name)
        assert a.dense_flops > 0 and a.memory_bandwidth > 0 and a.memory_bytes > 0
        for field in ("dense_flops", "memory_bandwidth", "memory_bytes", "host_link_bandwidth", "price_per_hour"):
            assert a.source[field].strip()
    assert CAT.accelerator("h100-sxm").dense_flops == pytest.approx(989.4e12)  # dense, not the sparsity figure


def test_kv_bytes_per_token_match_the_published_figures():
    assert CAT.model("llama-3-70b").kv_bytes_per_token == 2 * 80 * 8 * 128 * 2 == 320 * 1024  # ~320 KB
    for mla in ("kimi-k2", "deepseek-v3"):
        assert CAT.model(mla).kv_bytes_per_token == 61 * (512 + 64) * 2  # 70,272 B: ~70 KB
    for m in CAT.models.values():  # the blob's wire shape carries exactly those bytes
        assert wire_config(m).kv_bytes_per_token == m.kv_bytes_per_token


@pytest.mark.parametrize("name", ["small", "default"])
def test_the_projects_own_models_match_workers_model(name):
    c, m = CONFIGS[name], CAT.model(name)
    block = c.d_model * c.n_head * c.head_dim * 2 + 2 * c.d_model * c.n_kv_head * c.head_dim + 3 * c.d_model * c.d_ff
    params = c.n_layer * (block + 2 * c.d_model) + 2 * c.vocab_size * c.d_model + c.d_model  # + norms
    assert m.params == params
    assert m.kv_bytes_per_token == c.kv_bytes_per_token
    assert (m.layers, m.heads, m.kv_heads, m.head_dim, m.vocab_size) == (
        c.n_layer,
        c.n_head,
        c.n_kv_head,
        c.head_dim,
        c.vocab_size,
    )


def test_an_unknown_accelerator_is_one_error_listing_the_valid_names():
    with pytest.raises(CatalogueError, match=r"accelerator='h900'; allowed: \[.*'h800'"):
        CAT.accelerator("h900")


def _write(tmp_path, text: str):
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    return path


GQA = """models:
  - name: mine
    attention: gqa
    layers: 4
    hidden_size: 64
    heads: 4
{extra}    vocab_size: 100
    params: 1.0e+6
    max_seq_len: 512
    source: {{layers: a, hidden_size: b, heads: c, vocab_size: d, params: e}}
"""


def test_a_users_model_is_added(tmp_path):
    cat = load_catalogue(_write(tmp_path, GQA.format(extra="    kv_heads: 2\n    head_dim: 16\n")))
    assert cat.model("mine").kv_bytes_per_token == 4 * 2 * 2 * 16 * 2
    assert "llama-3-70b" in cat.models


@pytest.mark.parametrize(
    "extra, field",
    [
        ("    head_dim: 16\n", "kv_heads: required for attention gqa"),
        ("    kv_heads: 2\n", "head_dim: required for attention gqa"),
        ("    kv_heads: 2\n    head_dim: 16\n    layerz: 3\n", r"unknown key\(s\) \['layerz'\]"),
        ("    kv_heads: 2\n    head_dim: '16'\n", "head_dim: expected int"),
    ],
)
def test_a_model_missing_or_misspelling_a_field_is_one_error_naming_it(tmp_path, extra, field):
    with pytest.raises(
        CatalogueError, match=r"mine.yaml: models\[mine\]\." + field if "unknown" not in field else field
    ):
        load_catalogue(_write(tmp_path, GQA.format(extra=extra)))


def test_an_mla_model_needs_its_latent_fields(tmp_path):
    text = GQA.format(extra="    kv_lora_rank: 64\n").replace("attention: gqa", "attention: mla")
    with pytest.raises(CatalogueError, match=r"models\[mine\]\.qk_rope_head_dim: required for attention mla"):
        load_catalogue(_write(tmp_path, text))


def test_a_number_without_its_source_is_refused(tmp_path):
    text = GQA.format(extra="    kv_heads: 2\n    head_dim: 16\n").replace(", params: e", "")
    with pytest.raises(CatalogueError, match=r"models\[mine\]\.source\.params: required"):
        load_catalogue(_write(tmp_path, text))


def test_a_missing_required_accelerator_field_is_named(tmp_path):
    text = "accelerators:\n  - name: mychip\n    dense_flops: 1.0e+12\n    source: {}\n"
    with pytest.raises(CatalogueError, match=r"accelerators\[mychip\]\.memory_bandwidth: required"):
        load_catalogue(_write(tmp_path, text))


# ------------------------------------------------------------ roofline


def test_prefill_time_grows_with_the_prompt_and_a_cached_prefix_saves_time():
    r = roof("llama-3-70b")
    times = [r.prefill_s(n) for n in (1, 16, 256, 1024, 4096)]
    assert times == sorted(times) and len(set(times)) == len(times)
    assert r.prefill_s(1000, cached_tokens=3000) < r.prefill_s(4000)
    assert r.prefill_s(1000, cached_tokens=3000) > r.prefill_s(1000)  # attention to the cached positions


def test_decode_is_memory_bound_at_small_batch_and_prefill_compute_bound_at_large_n():
    r = roof("llama-3-70b")
    assert r.step([Part(1, 4096, 1)]).bound == "memory"
    assert r.step([Part(1, 1024, 1)] * 8).bound == "memory"
    assert r.step([Part(8192, 0, 1)]).bound == "compute"
    # a batch of 8 costs far less than 8 single steps: the weights are read once
    assert r.decode_s([1024] * 8) < 2 * r.decode_s([1024])


def test_an_moe_model_computes_and_reads_its_active_params():
    kimi = CAT.model("kimi-k2")
    r = roof("kimi-k2", devices=16)
    one = r.step([Part(1, 0, 0)])
    assert one.flops == pytest.approx(2 * kimi.active_params - 2 * kimi.embedding_params, rel=0.05)
    assert one.bytes < 0.05 * kimi.weights_bytes  # one token touches ~k/E of the experts
    dense = dataclasses.replace(kimi, experts=0, experts_per_token=0, active_params=None)
    dense_roof = Roofline(CAT.accelerator("h800"), dense, 16)
    assert dense_roof.decode_s([1024]) > 10 * r.decode_s([1024])
    # more tokens touch more experts, up to all of them
    assert r.bytes([Part(8, 0, 1)]) > r.bytes([Part(1, 0, 1)])
    assert r.bytes([Part(100_000, 0, 1)]) == pytest.approx(kimi.weights_bytes, rel=0.02)


def test_extend_costs_more_than_a_decode_step_and_less_than_k_of_them():
    r = roof("llama-3-70b")
    k = 100
    assert r.decode_s([2000]) < r.extend_s(k, 2000) < k * r.decode_s([2000])
    assert r.extend_s(k, 2000, all_logits=False) <= r.extend_s(k, 2000)  # memory-bound here: equal
    assert r.flops([Part(k, 2000, 1)]) < r.flops([Part(k, 2000, k)])  # the LM head on one row, not k


def test_kv_export_is_linear_in_tokens_and_the_architectures_bytes():
    r = roof("llama-3-70b", "h100-sxm", 1)
    assert r.kv_transfer_s(2000) == pytest.approx(2 * r.kv_transfer_s(1000))
    link = 64e9 * r.efficiency.host_link
    assert r.kv_transfer_s(1000) == pytest.approx(1000 * 327680 / link)


def test_kv_capacity_is_memory_minus_weights_and_refuses_weights_that_do_not_fit():
    r = roof("llama-3-70b", "h100-sxm", 4)
    assert r.kv_capacity_tokens() == int((4 * 80e9 * 0.9 - 70.6e9 * 2) // 327680)
    with pytest.raises(ValueError, match="llama-3-70b: weights of 141.2 GB leave no room.*use more devices"):
        roof("llama-3-70b", "h100-sxm", 1).kv_capacity_tokens()


def test_a_stronger_accelerator_prefills_faster_and_bandwidth_decides_decode():
    assert roof("llama-3-70b", "h800").prefill_s(4096) < roof("llama-3-70b", "h20").prefill_s(4096)
    assert roof("llama-3-70b", "h20").decode_s([1024]) < roof("llama-3-70b", "a100-80gb").decode_s([1024])


def test_overheads_are_added_per_step_and_per_request():
    eff = Efficiency(compute=0.5, memory=0.5, step_overhead_s=0.01, part_overhead_s=0.002)
    r = Roofline(CAT.accelerator("h800"), CAT.model("small"), 1, eff)
    bare = Roofline(CAT.accelerator("h800"), CAT.model("small"), 1, dataclasses.replace(eff, step_overhead_s=0.0))
    four = [Part(1, 100, 1)] * 4
    assert r.step(four).seconds == pytest.approx(
        max(bare.step(four).compute_s, bare.step(four).memory_s) + 0.01 + 4 * 0.002
    )
    assert r.step([]).seconds == 0.0


def test_calibration_recovers_known_efficiencies():
    accel, model = CAT.accelerator("this-machine"), CAT.model("small")
    truth = Efficiency(compute=0.4, memory=0.8, step_overhead_s=0.004, part_overhead_s=0.001, ramp_tokens=10.0)
    true_roof = Roofline(accel, model, 1, truth)
    shapes = [(Part(n, 0, 1),) for n in (64, 512, 2048)] + [
        tuple(Part(1, 256, 1) for _ in range(b)) for b in (1, 8, 32)
    ]
    points = [Measured(str(i), s, true_roof.step(s).seconds) for i, s in enumerate(shapes)]
    fit = fit_efficiency(accel, model, points)
    fitted = Roofline(accel, model, 1, fit)
    for p in points:
        assert fitted.step(p.parts).seconds == pytest.approx(p.seconds, rel=0.02)
    assert fit.compute == pytest.approx(0.4, rel=0.05)
