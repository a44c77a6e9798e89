"""The simulator's engines (experiments/sim/workers.py): a decode step's time from its batch and context sum
equals the roofline's, and continuous batching shares a worker's steps among its sessions."""

import random

import pytest
import simpy

from experiments.sim.config import WorkerModel
from experiments.sim.workers import DecodeCost, DecodeWorker, Session
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


def test_sessions_on_one_worker_share_its_steps():
    cat = load_catalogue()
    roof = Roofline(cat.accelerator("h20"), cat.model("kimi-k2"), 16)
    env = simpy.Environment()
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
