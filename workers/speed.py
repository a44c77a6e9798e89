"""The machine's reference speed: a fixed piece of the real-compute workers' own work, timed where a run measures.

Responsible for: `measure`, the default small model's forward pass timed on one torch thread, as each role's
engine runs it: a 256-token prefill (compute-bound, P's step) and a one-token pass (memory-bound: every weight
streamed once, a decode step's floor); the median of a few rounds after a warm-up, in wall time and in this
thread's CPU time. `python -m workers.speed` prints it as JSON (the runner calls it in a process of its own before
and after a run: metadata.json's provenance.machine.speed and speed_at_end).
Not responsible for: what the simulator or the validation make of it (experiments.sim.realcompute, scripts/
validate_sim.py), the roofline's peaks (benchmarks/bench_roofline.py measures those, with the engine).

Why: the emulated runs' step times moved 1.5-3x from night to night on this machine with the same code
(docs/simulator.md, "Validation"), and a load average does not say why. Timed the same way each time, this says
how fast the machine was at the start and the end of a run: CPU time longer than before is a slower core (clock,
caches, a neighbour on the memory bus); wall time longer than CPU time is a core shared. The weights are torch's
default initialisation, not the seeded ones: the work is the same for any values, and it skips the 2 s of loading
and verifying 300 MB of weights.
"""

from __future__ import annotations

import json
import statistics
import time

PREFILL_TOKENS = 256  # the engine's default prefill.step_budget_tokens: one full chunk, P's usual step
ROUNDS = 3  # timed rounds after one warm-up: ~1 s in all with the default model on this machine
MODEL = "default"  # the model of the real-compute experiments (pdd-vs-baselines)


def measure(model: str = MODEL, rounds: int = ROUNDS) -> dict:
    """{work, prefill_wall_ms, prefill_cpu_ms, decode_wall_ms, decode_cpu_ms, rounds}: medians over rounds."""
    import torch

    from workers.model import CONFIGS, Transformer

    torch.set_num_threads(1)  # as every role's engine (one torch thread a process)
    with torch.inference_mode():
        net = Transformer(CONFIGS[model]).eval()
        prompt = torch.randint(0, CONFIGS[model].vocab_size, (1, PREFILL_TOKENS), generator=torch.Generator())
        times: dict[str, list[tuple[float, float]]] = {"prefill": [], "decode": []}
        for round_ in range(rounds + 1):
            for kind, idx in (("prefill", prompt), ("decode", prompt[:, :1])):
                wall, cpu = time.perf_counter(), time.thread_time()
                net(idx, last_only=True)
                if round_:  # the first round warms the allocator and the caches
                    times[kind].append((time.perf_counter() - wall, time.thread_time() - cpu))
    work = f"model {model}, one torch thread: prefill {PREFILL_TOKENS} tokens, decode 1"
    out: dict = {"work": work, "rounds": rounds}
    for kind, pairs in times.items():
        out[f"{kind}_wall_ms"] = round(statistics.median(w for w, _ in pairs) * 1e3, 2)
        out[f"{kind}_cpu_ms"] = round(statistics.median(c for _, c in pairs) * 1e3, 2)
    return out


if __name__ == "__main__":
    print(json.dumps(measure()))
