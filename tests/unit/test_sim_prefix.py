"""P's own prefix cache in the simulator (experiments/sim/kvroom.py's PrefixCache, fed by the pipeline): each P holds
the prompts it prefilled (whole blocks), never their outputs, which P does not decode, and not the prompts another P
prefilled; the warm-up's system prompt is on every P; least recently used blocks go first, a prompt's tail before
its head; the picks are the router's (round_robin by the pool's own turn, least_load by prompt tokens in flight)."""

import pytest

from experiments.sim.config import load_for_simulation, sim_config
from experiments.sim.kvroom import PrefixCache, extend_chain, prompt_chain
from experiments.sim.pipeline import Simulation
from experiments.sim.simulate import workload_of

BLOCK = 16


def test_a_prompt_matches_its_longest_cached_prefix_in_whole_blocks_and_never_its_last_token():
    cache = PrefixCache(BLOCK)
    first = list(range(100))  # 6 whole blocks
    cache.insert(prompt_chain(first, BLOCK), 1000)
    longer = first + [7] * 60
    assert cache.match(prompt_chain(longer, BLOCK), len(longer)) == 96
    other = first[:40] + [9] * 60  # diverges inside the third block: two blocks in common
    assert cache.match(prompt_chain(other, BLOCK), len(other)) == 32
    assert cache.match(prompt_chain(first[:96], BLOCK), 96) == 80  # at most len - 1 tokens: one block to compute


def test_a_later_turn_keeps_its_previous_prompts_blocks_and_nothing_of_the_reply():
    cache = PrefixCache(BLOCK)
    turn1 = list(range(100))
    chain1 = prompt_chain(turn1, BLOCK)
    cache.insert(chain1, 1000)
    # turn 2: turn 1's 100 tokens, a 40-token reply, 30 new: its names past block 6 are its own
    chain2 = extend_chain(list(chain1), 170, BLOCK, salt=2)
    assert chain2[:6] == chain1 and len(chain2) == 10
    assert cache.match(chain2, 170) == 96  # the reply's KV is never P's: 96, not the 128 a decode worker holds
    stranger = extend_chain(list(chain1), 170, BLOCK, salt=3)
    assert set(stranger[6:]).isdisjoint(chain2[6:])


def test_eviction_takes_the_least_recent_prompt_tail_first_and_keeps_the_shared_head_and_pinned_prefixes():
    cache = PrefixCache(BLOCK)
    system = list(range(64))  # 4 blocks every prompt shares
    a, b = system + [1] * 64, system + [2] * 64
    chain_a, chain_b = prompt_chain(a, BLOCK), prompt_chain(b, BLOCK)
    cache.insert(chain_a, 100)
    cache.insert(chain_b, 100)  # 4 shared + 4 + 4 blocks
    cache.trim(10)  # two must go: a's last two (the least recent, tail first)
    assert cache.evictions == 2
    assert cache.match(chain_a, len(a) + 1) == 6 * BLOCK
    assert cache.match(chain_b, len(b) + 1) == 8 * BLOCK
    assert cache.match(chain_b, len(b) + 1, pin="rb") == 8 * BLOCK  # b's prefill pins its 8 blocks
    cache.trim(4)  # a's tail goes; b's blocks are pinned
    assert cache.match(chain_a, len(a) + 1) == 4 * BLOCK and cache.match(chain_b, len(b) + 1) == 8 * BLOCK
    cache.unpin("rb")
    cache.trim(4)
    assert cache.match(chain_b, len(b) + 1) == 4 * BLOCK  # the system prompt, in both, was the most recent


class EagerStamps(PrefixCache):
    """The cache as it stamped before its stamps were deferred: every block of a prompt at its insert."""

    def insert(self, chain, room_blocks):
        n = len(chain)
        clock = self._clock + n
        self.stamps.update(zip(chain, range(clock, clock - n, -1)))
        self._clock = clock
        self.trim(room_blocks)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_deferred_stamps_evict_what_stamping_every_insert_evicts(seed, monkeypatch):
    """Sessions of growing turns over a shared system prompt, in a room that evicts often, some prefills pinned:
    the same hits, evictions and blocks held after every step as the cache that stamps at once, and the same
    stamps once the deferred are written (a small bound on the deferred, so that path runs too)."""
    import random

    import experiments.sim.kvroom as kvroom

    monkeypatch.setattr(kvroom, "RESTAMP_AT_MOST", 5)
    rng = random.Random(seed)
    system = prompt_chain(list(range(64)), BLOCK)
    sessions = [list(system) for _ in range(6)]
    deferred, eager = PrefixCache(BLOCK), EagerStamps(BLOCK)
    for step in range(400):
        s = rng.randrange(len(sessions))
        chain = sessions[s]
        if rng.random() < 0.3 and len(chain) > 12:  # a new session over the system prompt
            chain = sessions[s] = list(system)
        extend_chain(chain, (len(chain) + rng.randint(1, 5)) * BLOCK, BLOCK, salt=step)
        prompt_len, room = len(chain) * BLOCK + 1, rng.randint(10, 40)
        pin = f"r{step}" if rng.random() < 0.5 else ""
        unpin = pin and rng.random() < 0.7  # its prefill ended before the insert (else it stays pinned)
        hits = [c.match(chain, prompt_len, pin) for c in (deferred, eager)]
        assert hits[0] == hits[1]
        for c in (deferred, eager):
            c.trim(room)
            if unpin:
                c.unpin(pin)
            c.insert(chain, room)
        assert deferred.evictions == eager.evictions and deferred.stamps.keys() == eager.stamps.keys()
    assert deferred.evictions > 50  # the room was short: eviction read the stamps again and again
    deferred._write_stamps()
    assert deferred.stamps == eager.stamps


def sessions_of_four_turns(p_workers: int, pick_p: str = "round_robin", sessions: int = 1, *extra: str):
    """Sessions of four turns on pd-intra (P -> RLD), nothing else: their requests, records and the simulation."""
    loaded = load_for_simulation(
        "pdd-vs-baselines",
        [
            "variants=[pd-intra]",
            f"pools={{p: {{workers: {p_workers}}}}}",
            f"deployment.policy.pick_p={pick_p}",
            f"workload.synthetic.sessions={sessions}",
            "workload.synthetic.turns=[4, 4]",
            "workload.synthetic.fresh_requests=0",
            "workload.synthetic.singular_fraction=0",
            *extra,
        ],
    )
    reqs = workload_of(loaded)
    sim = Simulation(sim_config(loaded, "pd-intra"), reqs)
    records = sim.run()
    turns = [r for r in reqs if r.kind != "warmup"]
    assert len(turns) == 4 * sessions and all(r.ok for r in records)
    return turns, records, sim


def one_session(p_workers: int, pick_p: str = "round_robin"):
    turns, records, sim = sessions_of_four_turns(p_workers, pick_p)
    assert [r.turn for r in turns] == [1, 2, 3, 4]
    return turns, records, sim


def whole(tokens: int) -> int:
    return tokens // BLOCK * BLOCK


def test_turns_alternating_between_two_ps_hit_only_the_system_prompt_or_the_prompt_that_p_prefilled_before():
    turns, records, sim = one_session(p_workers=2)
    assert [r.workers["p"] for r in records] == ["p1", "p2", "p1", "p2"]  # the pool's own turn, from 0
    system = whole(512)  # workload.synthetic.system_prompt_tokens: the warm-up put it on every P
    hits = [sim.p_cached[r.request_id] for r in turns]
    assert hits[:2] == [system, system]  # turn 2's P never saw turn 1
    assert hits[2:] == [whole(turns[0].prompt_len), whole(turns[1].prompt_len)]  # two turns back, not one
    assert all(h < r.cached_tokens for h, r in zip(hits[1:], turns[1:], strict=True))  # below the expected hit


def test_one_p_holds_each_previous_prompt_but_never_the_output_the_decode_side_made():
    turns, records, sim = one_session(p_workers=1)
    hits = [sim.p_cached[r.request_id] for r in turns]
    assert hits[1:] == [whole(prev.prompt_len) for prev in turns[:-1]]
    # the workload's expected hit counts the previous reply too (16-32 tokens: a block boundary or more)
    assert all(h < r.cached_tokens for h, r in zip(hits[1:], turns[1:], strict=True))
    assert sim.p_prefix_hit()["p1"]["token_weighted"] == pytest.approx(sum(hits) / sum(r.prompt_len for r in turns))


def test_least_load_sends_a_turn_to_the_first_idle_p_so_a_closed_loop_session_stays_on_it():
    turns, records, sim = one_session(p_workers=2, pick_p="least_load")
    assert {r.workers["p"] for r in records} == {"p1"}  # no prompt in flight anywhere: the first of equals
    assert [sim.p_cached[r.request_id] for r in turns][1:] == [whole(prev.prompt_len) for prev in turns[:-1]]


def test_the_records_are_the_same_run_to_run():
    first = one_session(p_workers=2)[1]
    assert one_session(p_workers=2)[1] == first


def sessions_on_ps(pick_p: str):
    """Four sessions of four turns arriving together on pd-intra with three Ps (pick_p)."""
    return sessions_of_four_turns(3, pick_p, 4, "workload.synthetic.session_rate_per_s=50")


def test_cache_aware_keeps_each_sessions_turns_on_the_p_that_holds_its_context():
    turns, records, sim = sessions_on_ps("cache_aware")
    p_of = {r.request_id: r.workers["p"] for r in records}
    by_session: dict[str, list] = {}
    for r in turns:
        by_session.setdefault(r.session, []).append(r)
    for session in by_session.values():
        assert len({p_of[r.request_id] for r in session}) == 1, [p_of[r.request_id] for r in session]
        hits = [sim.p_cached[r.request_id] for r in session]
        assert hits[1:] == [whole(prev.prompt_len) for prev in session[:-1]]
    assert len(set(p_of.values())) > 1  # the first turns still spread by load


def test_least_load_moves_a_session_whose_p_is_busy_and_it_loses_its_context():
    turns, records, sim = sessions_on_ps("least_load")
    p_of = {r.request_id: r.workers["p"] for r in records}
    moved = [r for r in turns if r.after and p_of[r.request_id] != p_of[r.after]]
    assert moved  # what cache_aware prevents
    assert all(
        sim.p_cached[r.request_id] < whole(next(t for t in turns if t.request_id == r.after).prompt_len) for r in moved
    )
