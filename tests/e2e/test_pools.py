"""Worker pools end to end on loopback: 2 P, 1 RLD, 2 MD as real processes, each MD's KV behind its own WAN proxy.

Every mode returns the colocated reference tokens with both Ps and both MDs in use; a session's next turn
lands on the MD that holds its prefix (cache-aware routing) and its measured DRC hit is at least what the
router expected; an MD at its load cap sends the overflow to the other; killing one MD leaves every request
completed, on the other MD or on the RLD.
"""

import threading

import pytest

from pdd_harness import Deployment
from test_roles import check_reference, check_stream, events_of, fresh_prompt, wait_for
from workers.roles.client import generate

POOLS = {"p": 2, "rld": 1, "md": 2}
MODES = ("colocated", "pd-intra", "pd-cross", "pdd")


@pytest.fixture(scope="module")
def pools(tmp_path_factory):
    # P in turn (both used without racing two prefills); MDs by prefix, at most one session each while the
    # other has fewer (the load cap), the balance rule out of the way.
    d = Deployment(
        tmp_path_factory.mktemp("pools"),
        POOLS,
        policy={"pick_p": "round_robin", "md_load_cap": 1, "md_balance_abs": 100},
    )
    try:
        yield d.start()
    finally:
        codes = d.stop()
        assert all(c in (0, -9) for c in codes.values()), f"exit codes {codes}; logs in {d.run_dir}"


def route_of(dep, rid):
    [route] = events_of(dep, "router", rid, "route")
    return route.fields


def test_every_mode_returns_the_reference_tokens_on_every_worker(pools, reference):
    used = set()
    for mode in MODES:
        results = {}

        def one(i, mode=mode):
            prompt = fresh_prompt(48)
            results[i] = (prompt, generate(pools.channel, prompt, 12, mode=mode, request_id=f"every-{mode}-{i}"))

        threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        for prompt, gen in results.values():
            check_stream(gen, 12)
            check_reference(reference, prompt, gen.ids, 12, mode)
            used |= set(route_of(pools, gen.done.request_id)["workers"].values())
    assert used == {"p1", "p2", "rld1", "md1", "md2"}, used


def test_a_next_turn_lands_on_the_md_holding_its_prefix_and_a_full_md_overflows(pools, reference):
    # md1 busy: a pd-cross request whose KV the blackholed WAN holds (its session waits out kv_wait_ms)
    md1_wan, md2_wan = pools.proxies
    md1_wan.faults.blackhole = True
    busy = threading.Thread(target=lambda: _quietly(pools, fresh_prompt(40), "pd-cross", "busy-md1"))
    busy.start()
    wait_for(lambda: events_of(pools, "md1", "busy-md1", "decode_open"), what="md1's busy session")
    first_prompt = fresh_prompt(64)
    first = generate(pools.channel, first_prompt, 8, mode="pdd", request_id="turn-1")
    check_stream(first, 8)
    assert route_of(pools, "turn-1")["workers"]["md"] == "md2"  # no prefix anywhere: the idle MD
    wait_for(lambda: events_of(pools, "router", "turn-1", "drc_learned"), what="the mirror to learn turn 1")
    busy.join(30)
    md1_wan.faults.blackhole = False
    # Both MDs idle now: without cache-aware routing the tie would go to md1.
    follow = first_prompt + first.ids + fresh_prompt(8)
    second, route = _turn(pools, reference, follow, "turn-2")
    assert route["workers"]["md"] == "md2" and route["picks"]["md"]["reason"] == "affinity", route
    assert route["md_cached_tokens"] >= 64
    assert second.done.md_cached_tokens >= route["md_cached_tokens"], (second.done, route)
    # md2 at its cap (one session, by affinity, held by its blackholed WAN: the RLD ends the request and the
    # MD's session waits for its copy): the next turn goes to md1 though md2 holds its prefix
    md2_wan.faults.blackhole = True
    try:
        held = threading.Thread(target=lambda: _quietly(pools, follow + fresh_prompt(8), "pdd", "busy-md2"))
        held.start()
        wait_for(lambda: events_of(pools, "md2", "busy-md2", "decode_open"), what="md2's held session")
        third = follow + second.ids + fresh_prompt(8)
        _, route = _turn(pools, reference, third, "turn-3")
        assert route["workers"]["md"] == "md1" and route["picks"]["md"]["reason"] == "cap", route
    finally:
        md2_wan.faults.blackhole = False
        held.join(30)


def test_killing_one_md_leaves_every_request_completed(pools, reference):
    prompts = [fresh_prompt(48) for _ in range(8)]
    results, errors = {}, []

    def one(i):
        try:
            results[i] = generate(pools.channel, prompts[i], 40, mode="pdd", request_id=f"kill-{i}")
        except Exception as err:  # recorded: the assertion below names it
            errors.append(f"kill-{i}: {err}")

    # md1 held busy (a session whose KV its blackholed WAN holds), so the next requests go to md2, whose slow
    # WAN keeps them there; four at once, md2 killed while it holds them; then four more one by one
    md1_wan, md2_wan = pools.proxies
    md1_wan.faults.blackhole, md2_wan.faults.rate_mbit = True, 1.0
    busy = threading.Thread(target=lambda: _quietly(pools, fresh_prompt(40), "pd-cross", "kill-busy-md1"))
    busy.start()
    wait_for(lambda: events_of(pools, "md1", "kill-busy-md1", "decode_open"), what="md1's busy session")
    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    try:
        for t in threads:
            t.start()
        wait_for(lambda: any(events_of(pools, "md2", f"kill-{i}", "decode_open") for i in range(4)), what="md2 in use")
        pools.kill("md2")
    finally:
        md1_wan.faults.blackhole, md2_wan.faults.rate_mbit = False, 0.0
        for t in threads:
            t.join(60)
        busy.join(30)
    for i in range(4, 8):
        one(i)
    assert not errors, errors
    for i, gen in results.items():
        check_stream(gen, 40, repeats_allowed=True)
        check_reference(reference, prompts[i], gen.ids, 40, f"kill-{i}")
    later = [route_of(pools, f"kill-{i}")["workers"].get("md") for i in range(4, 8)]
    assert "md2" not in later[1:], later  # once one call to it failed, md2 gets no new request


def _turn(dep, reference, prompt, rid):
    """One pdd request of 8 tokens, its stream and reference tokens checked; (its Generation, its route)."""
    gen = generate(dep.channel, prompt, 8, mode="pdd", request_id=rid)
    check_stream(gen, 8)
    check_reference(reference, prompt, gen.ids, 8, rid)
    return gen, route_of(dep, rid)


def _quietly(dep, prompt, mode, rid):
    """A request whose outcome the test does not judge (it only holds a worker busy)."""
    try:
        generate(dep.channel, prompt, 8, mode=mode, request_id=rid)
    except Exception:
        pass


def test_colocated_reuses_the_prefix_the_rld_computed_before(pools, reference):
    """A fair colocated baseline: the RLD's prefix cache spares a prefill what an earlier one computed."""
    shared = fresh_prompt(64)
    first = generate(pools.channel, shared + fresh_prompt(8), 8, mode="colocated", request_id="colo-1")
    prompt = shared + fresh_prompt(8)
    second = generate(pools.channel, prompt, 8, mode="colocated", request_id="colo-2")
    check_stream(first, 8)
    check_stream(second, 8)
    check_reference(reference, prompt, second.ids, 8, "colocated on a cached prefix")
    [opened] = events_of(pools, "rld1", "colo-2", "decode_open")
    assert opened.fields["cached_tokens"] == 64


@pytest.fixture(scope="module")
def p_aware(tmp_path_factory):
    d = Deployment(tmp_path_factory.mktemp("p-aware"), {"p": 2, "rld": 1, "md": 1}, policy={"pick_p": "cache_aware"})
    try:
        yield d.start()
    finally:
        codes = d.stop()
        assert all(c == 0 for c in codes.values()), f"exit codes {codes}; logs in {d.run_dir}"


def test_cache_aware_p_sends_a_next_turn_to_the_p_that_prefilled_the_last(p_aware, reference):
    """policy.pick_p cache_aware: the router's mirror of what each P prefilled sends a session's next turn to the P
    holding its context, whose own prefix cache then spares the prefill that context."""
    first_prompt = fresh_prompt(64)
    first = generate(p_aware.channel, first_prompt, 8, mode="pd-intra", request_id="p-turn-1")
    check_stream(first, 8)
    p = route_of(p_aware, "p-turn-1")["workers"]["p"]
    follow = first_prompt + first.ids + fresh_prompt(8)
    second = generate(p_aware.channel, follow, 8, mode="pd-intra", request_id="p-turn-2")
    check_reference(reference, follow, second.ids, 8, "pd-intra on the P holding its context")
    route = route_of(p_aware, "p-turn-2")
    assert route["workers"]["p"] == p and route["picks"]["p"]["reason"] == "affinity", route
    [start] = events_of(p_aware, p, "p-turn-2", "prefill_start")
    assert start.fields["cached_tokens"] >= 64, start.fields
