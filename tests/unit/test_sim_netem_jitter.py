"""A jittered line in the simulator (experiments/sim/wan.py, LineParams.max_jitter_s): a message of several frames
arrives when its latest frame does, as netem's queue (topology.netem_model: no frame leaves before the one ahead of
it) gives it, so a burst waits out the largest of its frames' delay draws, not one draw."""

import random
import statistics

import pytest

from experiments.sim import clock
from experiments.sim.wan import MSS_BYTES, Line, LineParams, jitter_table, line_from_profile
from topology.netem_model import periodic_delays_ns
from topology.profiles import FRAME_BYTES, load_profile


def netem_burst_excess_ms(params, frames: int, seeds: int) -> float:
    """The mean delay past delay_ms of the last of `frames` frames sent back to back at the line's rate through
    the emulator's own netem model (loss off), over `seeds` seeds."""
    gap = int(FRAME_BYTES * 8 / (params.rate_mbit * 1e6) * 1e9)
    last = [periodic_delays_ns(params, frames, gap, FRAME_BYTES, seed)[-1] for seed in range(seeds)]
    return statistics.mean(last) / 1e6 - params.delay_ms


@pytest.mark.parametrize(
    ("profile", "frames", "seeds"),
    [("wan-cross-country", 3, 400), ("wan-cross-country", 100, 60), ("wan-lossy", 3, 400), ("wan-lossy", 100, 60)],
)
def test_a_burst_of_frames_waits_out_its_largest_draw_as_netems_queue_gives_it(profile, frames, seeds):
    """normal (cross-country, 5 ms) and paretonormal (lossy, 8 ms): the simulator's mean excess for a burst is the
    netem model's, within 10%; one draw's mean (the simulator before: a normal draw per transfer) is ~0."""
    link = load_profile(profile).direction("a_to_b")
    link = link.replace(loss_pct=0.0, loss_ge=None, duplicate_pct=0.0, corrupt_pct=0.0, reorder_pct=0.0,
                        reorder_gap=0, limit_pkts=100_000)  # fmt: skip
    emulated = netem_burst_excess_ms(link, frames, seeds)
    simulated = line_from_profile(load_profile(profile)).mean_max_jitter_s(frames) * 1e3
    assert emulated > 2.0
    assert simulated == pytest.approx(emulated, rel=0.10)


@pytest.mark.parametrize("table", [(), jitter_table("normal"), jitter_table("paretonormal")])
@pytest.mark.parametrize("frames", [1, 3, 40])
def test_the_largest_draws_average_to_their_mean(table, frames):
    """max_jitter_s over evenly spread quantiles averages to mean_max_jitter_s (uniform: (n - 1) / (n + 1) x jitter)."""
    line = LineParams(1e9, 0.1, jitter_s=0.004, jitter_table=table)
    grid = [(i + 0.5) / 20_000 for i in range(20_000)]
    assert statistics.mean(line.max_jitter_s(frames, u) for u in grid) == pytest.approx(
        line.mean_max_jitter_s(frames), abs=2e-5
    )
    if not table:
        assert line.mean_max_jitter_s(frames) == pytest.approx(0.004 * (frames - 1) / (frames + 1))


def test_a_transfer_of_many_frames_arrives_later_on_average_than_one_of_a_frame():
    """The same jittered line, no rate to share: a 1-frame transfer's delay averages the one-way delay, a 1,000-frame
    one's the one-way delay and the largest of 1,000 draws."""
    line = LineParams(float("inf"), 0.06, jitter_s=0.005, jitter_table=jitter_table("normal"))

    def mean_arrival(nbytes: float) -> float:
        env, times = clock.Environment(), []
        carrier = Line(env, line, rng=random.Random(3), slow_start=False)
        for _ in range(400):
            carrier.transfer(nbytes).callbacks.append(lambda _e: times.append(env.now))
        env.run()
        return statistics.mean(times)

    assert mean_arrival(MSS_BYTES) == pytest.approx(0.03, abs=0.0005)
    assert mean_arrival(1000 * MSS_BYTES) == pytest.approx(0.03 + line.mean_max_jitter_s(1000), abs=0.0005)
