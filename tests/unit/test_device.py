"""GPU plumbing: a worker's device from its config, the half-precision model configs, KV through host memory.

The CPU side runs everywhere; the CUDA tests skip with the reason where torch sees no GPU and run where it does.
"""

import pytest
import torch
from engine_helpers import BS, assert_greedy_match, prompt, reference_greedy, req

from experiments.spec.deployment import roles_config
from workers.engine import Engine
from workers.errors import KVHeaderError
from workers.model import CONFIGS, DEFAULT, SMALL, TINY, get_config
from workers.roles.config import ConfigError, parse_config
from workers.roles.server import DeviceUnavailable, build_engine, check_device

torch.set_num_threads(1)
NO_CUDA = not torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(NO_CUDA, reason="needs a CUDA GPU and CUDA torch (torch.cuda.is_available() is False)")


def half_engine(name: str, weights_dir, capacity_tokens: int = 1024, device: str = "cpu") -> Engine:
    return Engine(name, capacity_tokens=capacity_tokens, block_size=BS, device=device, weights_dir=weights_dir)


# ---------------------------------------------------------------- configs


@pytest.mark.parametrize("base", [TINY, SMALL, DEFAULT])
def test_half_variants_keep_the_shape_and_halve_kv_per_token(base):
    for suffix, dtype in (("fp16", "float16"), ("bf16", "bfloat16")):
        half = get_config(f"{base.name}-{suffix}")
        assert half.dtype == dtype and half.kv_bytes_per_token * 2 == base.kv_bytes_per_token
        assert (half.n_layer, half.d_model, half.vocab_size) == (base.n_layer, base.d_model, base.vocab_size)
        assert half.fingerprint() != base.fingerprint()
    assert base.dtype == "float32" and CONFIGS[base.name] is base  # the fp32 configs are unchanged


@pytest.mark.parametrize("name", ["tiny-fp16", "tiny-bf16"])
def test_cpu_torch_runs_a_half_config_and_its_cache_agrees_with_a_plain_forward(name, weights_dir):
    engine = half_engine(name, weights_dir)
    assert engine.model.wte.weight.dtype == engine.config.torch_dtype == engine.kv._kv.dtype
    p = prompt(7, 40)
    got = engine.generate(req("h", p, max_tokens=12, use_prefix_cache=False)).output_tokens
    assert_greedy_match(engine, p, got, reference_greedy(engine, p, 12), f"{name} cached vs plain")


def test_half_kv_moves_between_workers_as_a_blob_and_is_half_the_bytes(weights_dir):
    p_side, md_side = half_engine("tiny-bf16", weights_dir), half_engine("tiny-bf16", weights_dir)
    p = prompt(8, 48)
    want = p_side.generate(req("w", p, max_tokens=10, use_prefix_cache=False)).output_tokens
    r = req("x", p, max_tokens=10, use_prefix_cache=False)
    p_side.open(r)
    first = p_side.prefill("x").first_token
    blob = p_side.export_kv("x")
    assert len(blob) - len(p_side.export_kv("x", 0, 0)) == 48 * (4 + TINY.kv_bytes_per_token // 2)
    md_side.open(r)
    md_side.import_kv("x", blob)
    md_side.append_tokens("x", [first])
    while not md_side.is_done("x"):
        md_side.decode_step(["x"])
    assert_greedy_match(md_side, p, md_side.tokens("x")[len(p) :], want, "bf16 KV continued elsewhere")


def test_a_blob_of_another_precision_is_refused(weights_dir):
    fp32, fp16 = half_engine("tiny", weights_dir), half_engine("tiny-fp16", weights_dir)
    r = req("y", prompt(9, 20), max_tokens=2)
    fp16.open(r)
    fp16.prefill("y")
    fp32.open(r)
    with pytest.raises(KVHeaderError, match="dtype"):
        fp32.import_kv("y", fp16.export_kv("y"))


# ---------------------------------------------------------------- a worker's device


def worker_config(device: str | None = None, **pools) -> dict:
    devices = {"md": device} if device else None
    return roles_config("/nonexistent", pools=pools or None, devices=devices)


def test_device_reaches_each_worker_of_its_pool_and_defaults_to_cpu():
    cfg = parse_config(worker_config("cuda", md=2))
    assert [w.device for w in cfg.md] == ["cuda", "cuda"]
    assert {w.device for w in (cfg.router, *cfg.p, *cfg.rld)} == {"cpu"}


def test_an_unknown_device_is_refused_with_the_allowed_ones():
    data = worker_config()
    data["p"][0]["device"] = "tpu"
    with pytest.raises(ConfigError, match=r"p\[0\]\.device='tpu'; allowed: \['cpu', 'cuda'\]"):
        parse_config(data)


@pytest.mark.skipif(not NO_CUDA, reason="checks the refusal where torch sees no GPU; this machine has one")
def test_a_cuda_worker_without_a_gpu_fails_before_building_its_engine(weights_dir):
    cfg = parse_config({**worker_config("cuda"), "weights_dir": str(weights_dir)})
    check_device(cfg.p[0])  # cpu: fine
    with pytest.raises(DeviceUnavailable, match=r"worker md1: device cuda, but torch.cuda.is_available\(\) is False"):
        build_engine(cfg, cfg.md[0], prefix_cache=True)


# ---------------------------------------------------------------- on a GPU


@needs_cuda
@pytest.mark.parametrize("name", ["tiny", "tiny-bf16"])
def test_a_cuda_worker_exports_through_host_memory_and_imports_back(name, weights_dir):
    gpu, cpu = half_engine(name, weights_dir, device="cuda"), half_engine(name, weights_dir)
    assert gpu.kv._kv.is_cuda and gpu.fingerprint == cpu.fingerprint
    p = prompt(10, 33)
    want = cpu.generate(req("c", p, max_tokens=8, use_prefix_cache=False)).output_tokens
    r = req("d", p, max_tokens=8, use_prefix_cache=False)
    gpu.open(r)
    first = gpu.prefill("d").first_token
    other = half_engine(name, weights_dir, device="cuda")
    other.open(r)
    other.import_kv("d", gpu.export_kv("d"))  # cuda -> bytes in host memory -> cuda
    other.append_tokens("d", [first])
    while not other.is_done("d"):
        other.decode_step(["d"])
    assert_greedy_match(cpu, p, other.tokens("d")[len(p) :], want, f"{name}: cuda KV imported on another cuda engine")


@needs_cuda
def test_build_engine_puts_a_cuda_worker_on_the_gpu(weights_dir):
    cfg = parse_config({**worker_config("cuda"), "weights_dir": str(weights_dir)})
    assert build_engine(cfg, cfg.md[0], prefix_cache=True).device.type == "cuda"
