"""A simulated worker's KV memory (experiments/sim/kvroom.py): its size from the roofline, first come first served
admission, deadlines, the MD's DRC evicted least recently used, and the engine's refusal of what never fits."""

import random

import pytest

from experiments.sim import clock
from experiments.sim.config import WorkerModel
from experiments.sim.kvroom import Deadlines, KVRoom, kv_capacity_tokens
from workers.modelled.catalogue import load_catalogue
from workers.modelled.roofline import Roofline


def test_a_modelled_workers_kv_is_its_devices_memory_beside_the_weights():
    cat = load_catalogue()
    roof = Roofline(cat.accelerator("h20"), cat.model("kimi-k2"), 16)
    room = kv_capacity_tokens(WorkerModel("md1", "md", roof, 32, capacity_tokens=4096))
    expected = (96e9 * 16 * 0.9 - cat.model("kimi-k2").weights_bytes) // 70_272
    assert room == roof.kv_capacity_tokens() == expected > 4096  # not the spec's capacity_tokens


def test_a_request_waits_first_come_first_served_and_a_later_small_one_does_not_overtake():
    env = clock.Environment()
    room = KVRoom(env, capacity_tokens=100 * 16, block_size=16)
    assert room.open(80)
    big, small = room.wait(50, deadline_s=10), room.wait(5, deadline_s=10)
    assert not room.open(1)  # others wait: no one jumps the queue
    assert not big.triggered and not small.triggered  # 5 blocks would fit, but the head waits for 50
    room.release(80)
    assert big.value is True and small.value is True and room.reserved == 55


def test_a_waiting_request_gives_up_at_its_deadline_and_the_next_one_moves_up():
    env = clock.Environment()
    room = KVRoom(env, capacity_tokens=10 * 16, block_size=16)
    room.open(8)
    late, small = room.wait(20, deadline_s=2.0), room.wait(2, deadline_s=5.0)
    env.run(until=3)
    assert late.value is False  # 20 blocks never come back in time
    assert small.value is True and room.reserved == 10  # then the next in line took what was free


def test_the_drc_evicts_the_least_recently_used_session_when_room_is_needed():
    env = clock.Environment()
    room = KVRoom(env, capacity_tokens=100 * 16, block_size=16)
    for s in ("a", "b", "c"):
        assert room.open(30)
    for s in ("a", "b", "c"):
        room.release(30, keep=(s, 30 * 16, 30))
    assert room.open(20, session="a")  # a's turn pins a's blocks (a is now the most recent)
    assert room.open(30)  # 50 reserved + b, c cached (60) > 100: b, the least recently used, goes
    assert room.held("b") is None and room.held("c") == 480 and room.evictions == 1


def test_what_can_never_fit_is_refused_with_the_engines_message():
    room = KVRoom(clock.Environment(), capacity_tokens=64, block_size=16)
    assert room.refusal("r1", 64) is None
    msg = room.refusal("r1", 65)
    assert (
        msg
        == "request 'r1': needs 5 KV blocks (80 tokens), only 4 of 4 can be freed ever (larger than the whole cache)"
    )


def test_a_wait_past_its_deadline_is_interrupted_at_the_deadline_and_one_in_time_is_not():
    env = clock.Environment()
    deadlines, ends = Deadlines(env), {}

    def waiter(name, lands_s, deadline_s):
        event = env.event()  # as the line's: fires when the last byte lands
        env.timeout(lands_s).callbacks.append(lambda _e: event.succeed())
        deadlines.interrupt_unless(event, deadline_s)
        try:
            yield event
            ends[name] = ("landed", env.now)
        except clock.Interrupt:
            ends[name] = ("gave up", env.now)

    env.process(waiter("early", 1.0, 3.0))
    env.process(waiter("late", 5.0, 4.0))
    env.run()
    assert ends == {"early": ("landed", 1.0), "late": ("gave up", 4.0)}


@pytest.mark.parametrize("watches, in_time", [(300, 0.5), (3000, 0.97)])
def test_deadlines_watched_in_and_out_of_order_are_told_at_their_deadline_in_deadline_then_watch_order(
    watches, in_time
):
    # most are watched in deadline order (a FIFO), some not (a heap): the late ones come out merged, ties in the
    # order they were watched, the ones done in time never (3000: long runs of them, dropped at once)
    env, rng = clock.Environment(), random.Random(11)
    deadlines, told, expected = Deadlines(env), [], []
    finished: set[int] = set()

    def watcher(i: int, at_s: float, deadline_s: float, done_s: float):
        yield env.timeout(at_s)
        deadlines.watch(env.now + deadline_s, lambda: i in finished, lambda: told.append((env.now, i)))
        env.call_in(done_s, finished.add, i)

    for i in range(watches):
        at_s, deadline_s = rng.choice((0.0, 1.0, 2.0)), rng.choice((3.0, 3.0, 4.0, 1.0, 9.0))
        done_s = rng.choice((0.1, deadline_s - 0.5)) if rng.random() < in_time else deadline_s + 0.5
        env.process(watcher(i, at_s, deadline_s, done_s))
        if done_s > deadline_s:
            expected.append((at_s + deadline_s, at_s, i))
    env.run()
    assert told == [(t, i) for t, _at, i in sorted(expected)]
    assert deadlines.heap == [] and not deadlines.fifo
