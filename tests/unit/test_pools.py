"""Which worker of a pool the router picks (pure policy), and the router's load accounting behind it."""

import pytest

from workers.roles.config import ConfigError, parse_config
from workers.roles.pools import DOWN_S, PICKED_S, Pools
from workers.roles.routing import WorkerLoad, pick_md, pick_p, pick_rld


def W(name, sessions=0, tokens=0, capacity=1000, healthy=True, hit=0):
    return WorkerLoad(name, sessions, tokens, capacity, healthy, hit)


def test_p_by_queued_prefill_tokens_then_in_turn():
    loads = [W("p1", 1, 900), W("p2", 3, 100)]
    assert pick_p(loads, "least_load", 0).worker == "p2"
    assert [pick_p(loads, "round_robin", t).worker for t in range(3)] == ["p1", "p2", "p1"]


def test_rld_by_free_kv_then_sessions():
    assert pick_rld([W("r1", 1, 500), W("r2", 4, 100)], "least_load", 0).worker == "r2"
    assert pick_rld([W("r1", 2, 100), W("r2", 1, 100)], "least_load", 0).worker == "r2"
    assert pick_rld([W("r1", 1, 0, capacity=100), W("r2", 1, 0, capacity=900)], "least_load", 0).worker == "r2"


def test_md_follows_the_prefix_unless_out_of_balance_or_at_its_cap():
    args = dict(load_cap=8, balance_abs=4, balance_rel=1.5)
    # affinity: the MD holding the longer prefix, though busier
    pick = pick_md([W("m1", 3, hit=512), W("m2", 0, hit=0)], "cache_aware", 0, **args)
    assert (pick.worker, pick.reason) == ("m1", "affinity")
    # no hit anywhere: the least loaded
    assert pick_md([W("m1", 3), W("m2", 1)], "cache_aware", 0, **args).worker == "m2"
    # out of balance (6 - 1 > 4 and 6 > 1.5 x 1): the least loaded, whatever it holds
    pick = pick_md([W("m1", 6, hit=512), W("m2", 1)], "cache_aware", 0, **args)
    assert (pick.worker, pick.reason) == ("m2", "balance")
    # the affine MD at its cap: the overflow goes to the best one below the cap
    pick = pick_md(
        [W("m1", 8, hit=512), W("m2", 5, hit=16), W("m3", 5)],
        "cache_aware",
        0,
        load_cap=8,
        balance_abs=99,
        balance_rel=99,
    )
    assert (pick.worker, pick.reason) == ("m2", "cap")
    # every MD at its cap: affinity again (the worker itself refuses what it cannot hold)
    assert (
        pick_md([W("m1", 8, hit=512), W("m2", 8)], "cache_aware", 0, load_cap=8, balance_abs=99, balance_rel=99).worker
        == "m1"
    )
    assert pick_md([W("m1", 3, hit=512), W("m2", 1)], "least_load", 0, **args).worker == "m2"


def test_a_failed_worker_gets_nothing_while_another_is_healthy():
    args = dict(load_cap=8, balance_abs=4, balance_rel=1.5)
    pick = pick_md([W("m1", 0, healthy=False, hit=512), W("m2", 5)], "cache_aware", 0, **args)
    assert (pick.worker, pick.reason) == ("m2", "only")
    pick = pick_md([W("m1", 2, healthy=False), W("m2", 1, healthy=False)], "cache_aware", 0, **args)
    assert (pick.worker, pick.reason) == ("m2", "unhealthy")
    assert pick_p([W("p1")], "least_load", 7).reason == "only"
    with pytest.raises(ValueError):
        pick_p([], "least_load", 0)


def _cfg(**policy):
    port = iter(range(1000, 2000))

    def pool(role, n, **kw):
        return [{"name": f"{role}{i + 1}", "grpc_port": next(port), **kw} for i in range(n)]

    return parse_config(
        {
            "router": {"name": "router", "grpc_port": 1},
            "p": pool("p", 2),
            "rld": pool("rld", 1, kv_port=3000),
            "md": [{**w, "kv_port": 3001 + i} for i, w in enumerate(pool("md", 2, capacity_tokens=2048))],
            "policy": policy,
        }
    )


def test_pools_count_what_is_in_flight_and_forget_failures_after_a_while():
    now = [100.0]
    pools = Pools(_cfg(), clock=lambda: now[0])
    md1, md2 = pools.cfg.md
    pools.take(md1, 300)
    idle = pools.choose("md")
    assert idle.worker == md2  # no hit anywhere: the idle one
    pools.release(idle)  # not used: it stops counting on md2
    prompt = list(range(40))
    pools.mirrors["md1"].insert(prompt)
    choice = pools.choose("md", pools.hits(prompt))
    assert choice.worker == md1 and choice.pick.reason == "affinity"
    assert choice.record()["loads"] == [["md1", 1, 300, 32], ["md2", 0, 0, 0]]
    pools.release(choice)
    pools.failed(md1)
    assert (c := pools.choose("md", pools.hits(prompt))).worker == md2 and pools.down() == ["md1"]
    pools.release(c)
    now[0] += DOWN_S + 0.1
    assert (c := pools.choose("md", pools.hits(prompt))).worker == md1 and pools.down() == []
    pools.release(c)
    pools.give_back(md1, 300)
    with pools.holding(pools.cfg.p[0], 500):
        assert (c := pools.choose("p")).worker.name == "p2"
        pools.release(c)
    assert pools.choose("p").worker.name == "p1"


def test_requests_that_arrive_together_see_each_others_picks():
    """CI once routed four simultaneous pd-cross requests all to md1 with md_load_cap 1: each pick saw both MDs
    idle, because a session counted only once the router opened it. A pick now counts from the moment it is
    made, until its session is taken (or PICKED_S, if the request never opens it)."""
    now = [100.0]
    pools = Pools(_cfg(md_load_cap=1), clock=lambda: now[0])
    md1, md2 = pools.cfg.md
    first, second = pools.choose("md"), pools.choose("md")
    assert (first.worker, second.worker) == (md1, md2)
    assert second.record()["loads"] == [["md1", 1, 0, 0], ["md2", 0, 0, 0]]
    pools.take(md1, 100)  # the first request opens its session: the pick becomes it, not a second session
    assert pools.choose("md").record()["loads"] == [["md1", 1, 100, 0], ["md2", 1, 0, 0]]
    now[0] += PICKED_S + 0.1  # the second and third never opened theirs
    assert pools.choose("md").record()["loads"] == [["md1", 1, 100, 0], ["md2", 0, 0, 0]]


def test_pool_config_errors_name_the_field():
    allowed = r"\['cache_aware', 'least_load', 'round_robin', 'line_measured'\]"
    with pytest.raises(ConfigError, match=rf"policy.pick_md='nearest'; allowed: {allowed}"):
        _cfg(pick_md="nearest")
    with pytest.raises(ConfigError, match=r"md\[1\].kv_port=0 out of range"):
        parse_config(
            {**_cfg_dict(), "md": [{"name": "md1", "grpc_port": 7, "kv_port": 8}, {"name": "md2", "grpc_port": 9}]}
        )
    with pytest.raises(ConfigError, match="worker names must differ"):
        parse_config({**_cfg_dict(), "p": [{"name": "p1", "grpc_port": 7}, {"name": "p1", "grpc_port": 8}]})


def _cfg_dict():
    return {
        "router": {"name": "router", "grpc_port": 1},
        "p": {"name": "p1", "grpc_port": 2},
        "rld": {"name": "rld1", "grpc_port": 3, "kv_port": 4},
        "md": {"name": "md1", "grpc_port": 5, "kv_port": 6},
    }


def test_every_pick_policy_of_the_config_has_its_function():
    from schema import literal_values
    from workers.roles.config import PickMD, PickP, PickRLD
    from workers.roles.routing import MD_PICKS, P_PICKS, RLD_PICKS

    assert set(P_PICKS) == set(literal_values(PickP)) and set(RLD_PICKS) == set(literal_values(PickRLD))
    assert set(MD_PICKS) == set(literal_values(PickMD))


def test_prompts_that_arrive_together_spread_over_p_by_their_tokens():
    """A burst of pdd-published's prompts all went to one P (11 of 11 bursts in a run, docs/simulator.md): P is
    picked by prompt tokens first, and a pick counted in sessions but not in tokens until its Prefill call began.
    A pick now carries its prompt's tokens into the worker's load from the moment it is made."""
    now = [100.0]
    pools = Pools(_cfg(), clock=lambda: now[0])
    p1, p2 = pools.cfg.p
    pools.take(p1, 7_322)  # one prompt prefilling on p1
    picks = [pools.choose("p", tokens=n) for n in (9_418, 6_059, 13_544, 15_172)]
    assert [c.worker.name for c in picks] == ["p2", "p1", "p2", "p1"]
    assert picks[3].record()["loads"] == [["p1", 2, 13_381, 0], ["p2", 2, 22_962, 0]]
    pools.take(p2, 13_544)  # the third's Prefill call begins: its pick becomes it, counted once
    assert pools.choose("p", tokens=1).record()["loads"] == [["p1", 3, 28_553, 0], ["p2", 2, 22_962, 0]]


def test_p_cache_aware_follows_the_prefix_then_the_load():
    # the P holding 512 tokens of the prompt, though 900 tokens are queued there
    pick = pick_p([W("p1", 2, 900, hit=512), W("p2", 0, 0, hit=0)], "cache_aware", 0)
    assert (pick.worker, pick.reason) == ("p1", "affinity")
    # equal hits (the shared system prompt on every P): the fewest tokens still to prefill, as least_load
    pick = pick_p([W("p1", 1, 900, hit=64), W("p2", 2, 100, hit=64)], "cache_aware", 0)
    assert (pick.worker, pick.reason) == ("p2", "least_load")
    pick = pick_p([W("p1", 1, 100, hit=64), W("p2", 0, 100, hit=64)], "cache_aware", 0)
    assert pick.worker == "p2"  # then the fewest prefills


def test_p_mirrors_learn_what_each_p_prefilled_and_only_under_cache_aware():
    prompt = list(range(40))
    plain = Pools(_cfg())
    plain.prefilled(plain.cfg.p[0], prompt)
    assert plain.p_hits(prompt) is None  # least_load: no mirror kept, no hits asked for
    pools = Pools(_cfg(pick_p="cache_aware"))
    p1, p2 = pools.cfg.p
    assert pools.p_hits(prompt) == {"p1": 0, "p2": 0}
    pools.prefilled(p2, prompt)
    assert pools.p_hits(prompt + [7] * 20) == {"p1": 0, "p2": 32}  # whole blocks of what p2 prefilled
    choice = pools.choose("p", pools.p_hits(prompt + [7] * 20), tokens=60)
    assert choice.worker == p2 and choice.pick.reason == "affinity"
