"""The front door's bound on requests in flight (experiments.serve.admission.Gate): fixed, or following the roles'
TTFT by AIMD, with a bounded FIFO of requests waiting for a place."""

import asyncio

import pytest

from experiments.serve.admission import Gate


def run(coro):
    return asyncio.run(coro)


def test_a_fixed_gate_admits_its_ceiling_and_refuses_the_next_at_once():
    async def go():
        g = Gate(2)
        assert [await g.enter() for _ in range(3)] == [True, True, False]
        g.served(100.0, 0.0)  # no target: what the roles do changes nothing
        assert g.admits == 2
        g.leave()
        assert await g.enter()

    run(go())


def test_a_slow_first_token_cuts_the_limit_once_per_episode_and_never_below_one():
    g = Gate(64, start=10, target_s=1.0)
    g.served(3.0, now_s=100.0)
    assert g.admits == 7 and g.cuts == 1
    g.served(3.0, now_s=100.5)  # the same episode of overload (within target_s of the cut): no second cut
    assert g.admits == 7
    for i in range(20):
        g.overloaded(now_s=102.0 + 2 * i)
    assert g.admits == 1 and g.limit == 1.0


def test_fast_first_tokens_raise_the_limit_only_while_the_gate_is_full_and_never_past_the_ceiling():
    async def go():
        g = Gate(4, start=2, target_s=1.0)
        g.served(0.1, 0.0)
        assert g.admits == 2  # not full: the load, not the limit, held the requests
        assert await g.enter() and await g.enter()  # full now
        g.served(0.1, 0.0)
        assert g.admits == 2 and g.limit == 2.5  # +1/limit: one place per limit's worth of requests
        g.served(0.1, 0.0), g.served(0.1, 0.0)
        assert g.admits == 3
        limit = g.limit
        g.served(0.1, 0.0)
        assert g.limit == limit  # 2 in flight under a limit of 3: not full, no more
        assert await g.enter()  # 3 of 3: full again
        for _ in range(3):
            g.served(0.1, 0.0)
        assert g.admits == 4 and await g.enter()  # 4 of 4
        for _ in range(20):
            g.served(0.1, 0.0)
        assert g.admits == 4 and g.limit == 4.0  # the ceiling

    run(go())


def test_past_the_limit_a_request_waits_for_the_next_place_in_arrival_order():
    async def go():
        g = Gate(8, start=1, target_s=5.0, wait_s=5.0)
        assert await g.enter()
        waiting = asyncio.create_task(g.enter())
        await asyncio.sleep(0.01)
        assert not waiting.done() and g.in_flight == 1
        g.leave()  # its place passes to the waiting one
        assert await waiting and g.in_flight == 1

    run(go())


def test_a_request_waits_at_most_wait_s_and_the_queue_holds_at_most_the_limit():
    async def go():
        g = Gate(8, start=1, target_s=0.2, wait_s=0.2)
        assert await g.enter()
        first = asyncio.create_task(g.enter())
        await asyncio.sleep(0.01)
        assert not await g.enter()  # the one place in the queue is taken: refused at once
        assert not await first  # nobody left in time
        assert g.in_flight == 1 and not g._waiters

    run(go())


def test_a_waiting_request_cancelled_leaks_no_place():
    async def go():
        g = Gate(8, start=1, target_s=5.0, wait_s=5.0)
        assert await g.enter()
        waiting = asyncio.create_task(g.enter())
        await asyncio.sleep(0.01)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        g.leave()
        assert g.in_flight == 0 and await g.enter() and g.in_flight == 1

    run(go())


def test_a_cut_below_the_requests_in_flight_holds_new_ones_until_enough_have_left():
    async def go():
        g = Gate(8, start=4, target_s=1.0, wait_s=0.05)
        assert all([await g.enter() for _ in range(4)])
        g.overloaded(now_s=10.0)  # 4 * 0.7 -> 2
        assert g.admits == 2 and not await g.enter()
        g.leave(), g.leave()
        assert not await g.enter()  # 2 still in flight: at the limit
        g.leave()
        assert await g.enter()

    run(go())
