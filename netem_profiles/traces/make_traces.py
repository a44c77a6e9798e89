"""Writes the two shipped Mahimahi traces (self-made, public domain): `python3 make_traces.py` in this folder.

const-12mbit.trace: one 1500-byte opportunity per millisecond for 1 s (12 Mbit/s, looping).
cellular-steps.trace: 10 s of a cellular-like link, rate held for 500 ms steps drawn by a seeded random walk
between 2 and 40 Mbit/s (seed 29), opportunities spread evenly inside each step.
"""

import random

MTU_BITS = 1500 * 8


def constant(mbit: float, period_ms: int) -> list[int]:
    per_ms = mbit * 1e6 / 1000 / MTU_BITS
    return [int(i / per_ms) + 1 for i in range(int(per_ms * period_ms))]


def steps(seed: int, period_ms: int, step_ms: int) -> list[int]:
    rng, rate, out = random.Random(seed), 12.0, []
    for start in range(0, period_ms, step_ms):
        rate = min(40.0, max(2.0, rate * rng.uniform(0.5, 1.8)))
        count = round(rate * 1e6 * step_ms / 1000 / MTU_BITS)
        out += [start + 1 + (i * step_ms) // count for i in range(count)]
    return out


if __name__ == "__main__":
    for name, times in (("const-12mbit", constant(12, 1000)), ("cellular-steps", steps(29, 10_000, 500))):
        with open(f"{name}.trace", "w") as f:
            f.write("".join(f"{t}\n" for t in times))
