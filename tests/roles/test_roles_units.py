"""Fast, in-process checks of the roles' pure parts: config validation, route decision, stubs up to date."""

import pytest

from workers.proto.compile import stubs_stale
from workers.roles.config import ConfigError, RouterPolicy, parse_config
from workers.roles.routing import decide_route

BASE = {
    "router": {"name": "router", "grpc_port": 1},
    "p": {"name": "p1", "grpc_port": 2},
    "rld": {"name": "rld1", "grpc_port": 3, "kv_port": 4},
    "md": {"name": "md1", "grpc_port": 5, "kv_port": 6},
}


def test_config_defaults_and_addresses():
    cfg = parse_config({**BASE, "md": {**BASE["md"], "kv_connect": "10.0.0.2:9000"}})
    assert cfg.md[0].kv_address == "10.0.0.2:9000" and cfg.rld[0].kv_address == "127.0.0.1:4"


@pytest.mark.parametrize(
    "patch,needle",
    [
        ({"p": {"name": "p1", "grpc_port": 2, "bogus": 1}}, "p: unknown key(s) ['bogus']"),
        ({"kv": {"wan": {"congestion": "vegas"}}}, "kv.wan.congestion='vegas'"),
        ({"kv": {"fast": {"connections": 0}}}, "kv.fast.connections=0 out of range"),
        ({"policy": {"mode": "pd"}}, "policy.mode='pd'"),
        ({"rld": {"name": "rld1", "grpc_port": 3}}, "rld.kv_port=0 out of range"),
        ({"seed": "zero"}, "seed: expected int"),
        ({"decode": {"handoff_min_tokens": -1}}, "decode.handoff_min_tokens=-1 out of range"),
    ],
)
def test_config_errors_name_the_field(patch, needle):
    with pytest.raises(ConfigError) as info:
        parse_config({**BASE, **patch})
    assert needle in str(info.value)


P = RouterPolicy(
    wan_rate_mbit=200, direct_max_transfer_ms=1.0, singular_min_uncached_tokens=48, singular_max_output_tokens=4
)


@pytest.mark.parametrize(
    "mode,prompt,max_tokens,hit,route",
    [
        ("colocated", 100, 10, 0, "colocated"),
        ("pd-intra", 100, 10, 0, "p-rld"),
        ("pd-cross", 100, 10, 96, "p-md"),
        ("pdd", 100, 10, 96, "p-md"),  # 4 tokens x 512 B at 200 Mbit/s = 0.08 ms
        ("pdd", 100, 10, 0, "p-rld-md"),  # 100 x 512 B = 2 ms > 1 ms
        ("pdd", 100, 3, 0, "p-rld-singular"),
        ("pdd", 100, 3, 96, "p-md"),  # short output but nearly all cached: not singular
    ],
)
def test_route_decision(mode, prompt, max_tokens, hit, route):
    assert decide_route(mode, prompt, max_tokens, hit, 512, P).route == route


def test_generated_stubs_are_up_to_date():
    assert not stubs_stale(), "run: python -m workers.proto.compile"


def test_drc_mirror_matches_whole_blocks_and_forgets_the_least_recent():
    from workers.roles.routing import DRCMirror

    m = DRCMirror(block_size=4, capacity_blocks=3)
    seq = list(range(100, 110))  # 2 whole blocks + 2 tokens
    assert m.match(seq) == 0
    m.insert(seq)
    assert m.match(seq + [7, 8, 9]) == 8  # the two whole blocks
    assert m.match(seq[:8]) == 4  # at most len - 1 tokens, whole blocks: as the MD matches
    assert m.match([1] + seq[1:]) == 0  # a prefix chain: a different first block matches nothing
    m.insert([1, 2, 3, 4, 5, 6, 7, 8])  # 2 more blocks: 4 > 3, the least recent goes
    assert m.match([1, 2, 3, 4, 5, 6, 7, 8, 9]) == 8
    assert m.match(seq + [0]) == 4  # its second block was the least recently used
