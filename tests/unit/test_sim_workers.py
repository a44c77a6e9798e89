"""The simulator's engines (experiments/sim/workers.py): a decode step's time from its batch and context sum
equals the roofline's, and continuous batching shares a worker's steps among its sessions."""

import random

import pytest

from experiments.sim import clock
from experiments.sim.config import WorkerModel
from experiments.sim.workers import DecodeCost, DecodeWorker, PrefillWorker, Session, StepSeconds
from workers.modelled.catalogue import load_catalogue
from workers.modelled.roofline import Part, Roofline


@pytest.mark.parametrize("arch, accel, devices", [("kimi-k2", "h20", 16), ("llama-3-70b", "h100-sxm", 4),
                                                  ("default", "this-machine", 1)])  # fmt: skip
def test_a_decode_step_costs_what_the_roofline_says(arch, accel, devices):
    cat = load_catalogue()
    roof = Roofline(cat.accelerator(accel), cat.model(arch), devices)
    cost, rng = DecodeCost(roof), random.Random(3)
    for batch in (1, 2, 7, 32, 128):
        contexts = [rng.randrange(0, 60_000) for _ in range(batch)]
        expected = roof.step([Part(1, c, 1) for c in contexts]).seconds
        assert cost.seconds(batch, sum(contexts)) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("arch, accel, devices", [("kimi-k2", "h20", 16), ("llama-3-70b", "h100-sxm", 4),
                                                  ("default", "this-machine", 1)])  # fmt: skip
def test_a_run_of_steps_ends_where_its_steps_summed_one_by_one_end(arch, accel, devices):
    # DecodeCost.ends inlines seconds() for a run of steps (one wait): the same floats, not close ones, whichever
    # roof the steps are under (compute, memory, or one then the other: the rng's contexts cross over)
    cat = load_catalogue()
    cost, rng = DecodeCost(Roofline(cat.accelerator(accel), cat.model(arch), devices)), random.Random(7)
    runs = [(rng.choice((1, 2, 3, 8, 32, 128)), rng.randrange(0, 3_000_000), rng.randint(1, 64)) for _ in range(200)]
    for batch in (1, 2, 3, 8, 32, 128):  # runs across the context sum where the roofs cross
        f0, df, b0, db, flops_per_s, _ = cost._line(batch)
        cross = (f0 / flops_per_s - b0 / cost._bytes_per_s) / (db / cost._bytes_per_s - df / flops_per_s)
        runs += [(batch, max(0, int(cross) - k * batch), 64) for k in (0, 1, 5, 30, 63)] if cross > 0 else []
    for batch, context_sum, steps in ((1, 0, 1), (3, 9_000, 64), (40, 1_234_567, 17), *runs):
        ends, t = [], 0.0
        for i in range(steps):
            t += cost.seconds(batch, context_sum + i * batch)
            ends.append(t)
        assert cost.ends(batch, context_sum, steps) == (ends, t)


@pytest.mark.parametrize("arch, accel, devices", [("kimi-k2", "h800", 16), ("llama-3-70b", "h100-sxm", 4),
                                                  ("default", "this-machine", 1)])  # fmt: skip
def test_a_prefill_step_costs_exactly_what_the_roofline_says(arch, accel, devices):
    # StepSeconds inlines Roofline.step for P's planned steps: the same floats, not close ones
    cat = load_catalogue()
    roof, rng = Roofline(cat.accelerator(accel), cat.model(arch), devices), random.Random(5)
    seconds = StepSeconds(roof)
    for _ in range(300):
        parts = [(rng.randint(1, 700), rng.randrange(0, 90_000), rng.choice((0, 1))) for _ in range(rng.randint(1, 4))]
        assert seconds(parts) == roof.step([Part(*p) for p in parts]).seconds


def test_sessions_on_one_worker_share_its_steps():
    cat = load_catalogue()
    roof = Roofline(cat.accelerator("h20"), cat.model("kimi-k2"), 16)
    env = clock.Environment()
    w = DecodeWorker(env, WorkerModel("md1", "md", roof, 32, 65536))
    a, b = w.join(Session(env, 10, 1000)), w.join(Session(env, 5, 3000))
    env.run()
    assert a.made == 10 and b.made == 5
    assert a.times[:5] == b.times  # the same steps while both were there ...
    first = roof.step([Part(1, 1000, 1), Part(1, 3000, 1)]).seconds
    assert a.times[0] == pytest.approx(first)  # ... each costing both sessions' step
    alone = roof.step([Part(1, 1005, 1)]).seconds
    assert a.times[5] - a.times[4] == pytest.approx(alone)  # then a's alone
    assert a.batch_sum == 5 * 2 + 5 * 1 and a.steps == 10


def p_worker(env, budget, roof=None):
    roof = roof or Roofline(load_catalogue().accelerator("h800"), load_catalogue().model("kimi-k2"), 16)
    return PrefillWorker(env, WorkerModel("p1", "p", roof, 32, 1 << 20), budget_tokens=budget)


def prefill_at(env, worker, at_s, new, cached, ends, key):
    def go():
        yield env.timeout(at_s)
        assert (yield from worker.prefill(new, cached)) == ""
        ends[key] = env.now

    env.process(go())


def test_a_prompts_tail_chunk_shares_its_step_with_the_next_prompts_first_chunk():
    # budget 256: a (300 new on 100 cached) then b (300 new): [a 256] [a 44 + b 212] [b 88], three steps, each the
    # roofline's time of its chunks together (logits at a prompt's last chunk only), as workers/chunked.py plans them
    env, ends = clock.Environment(), {}
    p = p_worker(env, 256)
    prefill_at(env, p, 0, 300, 100, ends, "a")
    prefill_at(env, p, 0, 300, 0, ends, "b")
    env.run()
    roof = p.model.roofline
    t1 = roof.step([Part(256, 100, 0)]).seconds
    t2 = roof.step([Part(44, 356, 1), Part(212, 0, 0)]).seconds
    t3 = roof.step([Part(88, 212, 1)]).seconds
    assert p.steps == 3 and p.lone_tail_steps == 1  # b's last chunk ran alone
    assert ends["a"] == pytest.approx(t1 + t2) and ends["b"] == pytest.approx(t1 + t2 + t3)
    assert p.busy_s == pytest.approx(t1 + t2 + t3)
    # one prompt at a time, each tail chunk alone in its step: four steps, and both done later
    alone = (
        roof.step([Part(256, 100, 0)]).seconds
        + roof.step([Part(44, 356, 1)]).seconds
        + roof.step([Part(256, 0, 0)]).seconds
        + roof.step([Part(44, 256, 1)]).seconds
    )
    assert ends["b"] < alone


def test_a_prompt_alone_within_the_budget_is_one_step_of_the_roofline_s_time():
    env, ends = clock.Environment(), {}
    p = p_worker(env, 256)
    roof = p.model.roofline
    prefill_at(env, p, 0, 256, 100, ends, "a")  # the whole budget
    prefill_at(env, p, 5.0, 17, 900, ends, "b")  # P idle again
    env.run()
    assert ends == {"a": roof.step([Part(256, 100, 1)]).seconds, "b": 5.0 + roof.step([Part(17, 900, 1)]).seconds}
    assert (p.steps, p.lone_tail_steps) == (2, 1)  # b: its only chunk, shorter than the budget


def test_a_prompt_arriving_mid_step_joins_from_the_next_step():
    env, ends = clock.Environment(), {}
    p = p_worker(env, 256)
    roof = p.model.roofline
    t1 = roof.step([Part(256, 0, 0)]).seconds
    prefill_at(env, p, 0, 600, 0, ends, "a")  # [a 256] [a 256] [a 88 + b 168] [b 32]
    prefill_at(env, p, t1 / 2, 200, 0, ends, "b")  # arrives during a's first step
    env.run()
    t2 = roof.step([Part(256, 256, 0)]).seconds
    t3 = roof.step([Part(88, 512, 1), Part(168, 0, 0)]).seconds
    t4 = roof.step([Part(32, 168, 1)]).seconds
    assert p.steps == 4
    assert ends["a"] == pytest.approx(t1 + t2 + t3) and ends["b"] == pytest.approx(t1 + t2 + t3 + t4)


def test_a_budget_of_0_prefills_whole_prompts_one_at_a_time():
    env, ends = clock.Environment(), {}
    p = p_worker(env, 0)
    prefill_at(env, p, 0, 300, 100, ends, "a")
    prefill_at(env, p, 0, 300, 0, ends, "b")
    env.run()
    roof = p.model.roofline
    assert p.steps == 2
    assert ends["a"] == pytest.approx(roof.prefill_s(300, 100))
    assert ends["b"] == pytest.approx(roof.prefill_s(300, 100) + roof.prefill_s(300, 0))


def test_to_step_end_is_the_step_under_way_and_none_when_idle():
    """A KV import takes the emulated engine between two steps: what it waits for, at any moment."""
    cat = load_catalogue()
    roof = Roofline(cat.accelerator("h20"), cat.model("kimi-k2"), 16)
    env = clock.Environment()
    w = DecodeWorker(env, WorkerModel("md1", "md", roof, 32, 65536))
    assert w.to_step_end() == 0.0  # idle
    s = w.join(Session(env, 10, 1000))
    step, seen = roof.decode_s([1000]), []

    def probe():
        yield 0.0  # the worker's first step has begun
        seen.append((env.now, w.to_step_end()))
        yield step * 2.5  # inside the third step
        seen.append((env.now, w.to_step_end()))
        yield 1.0  # long after the session's end
        seen.append((env.now, w.to_step_end()))

    env.start(probe())
    env.run()
    (t0, first), (t1, mid), (t2, late) = seen
    assert t0 == 0.0 and first == pytest.approx(step, rel=1e-3)
    end = next(t for t in s.times if t > t1 + 1e-12)  # the step under way at t1 ends at its token's time
    assert mid == pytest.approx(end - t1) and 0 < mid < step * 1.01
    assert late == 0.0 and s.made == 10
