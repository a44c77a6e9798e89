"""How long a thread waits for the engine lock while another thread steps in a loop: threading.Lock vs FairLock.

Responsible for: one or more "stepper" threads looping acquire, hold hold_ms (time.sleep, or a busy torch matmul with
--busy), release, as P's ChunkScheduler and a decode role's step batcher do, and one "opener" thread taking the
same lock every period_ms for a short critical section (a KV session open); printing the opener's wait for the
lock (p50 / p99 / max) with each lock class.
Not responsible for: the roles themselves (tests/roles), or fairness among many openers.

    .venv/bin/python benchmarks/bench_fairlock.py [--hold-ms 30] [--period-ms 100] [--opens 40] [--steppers 1] [--busy]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from typing import Callable

import torch

from workers.fairlock import FairLock


def busy_hold(seconds: float) -> None:
    """Hold the CPU (and release the GIL inside torch) for about seconds, as an engine step does."""
    a = torch.randn(256, 256)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        a @ a


def measure(
    lock, hold: Callable[[float], None], hold_s: float, period_s: float, opens: int, steppers: int
) -> list[float]:
    """The opener's waits for lock (s), one per open, while steppers loop on it."""
    stop = threading.Event()

    def stepper():
        while not stop.is_set():
            with lock:
                hold(hold_s)

    threads = [threading.Thread(target=stepper, daemon=True) for _ in range(steppers)]
    for thread in threads:
        thread.start()
    waits = []
    try:
        for _ in range(opens):
            time.sleep(period_s)
            t0 = time.monotonic()
            with lock:
                waits.append(time.monotonic() - t0)
                time.sleep(0.001)  # the open's own work
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    return waits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hold-ms", type=float, default=30, help="the stepper's hold per step (ms)")
    parser.add_argument("--period-ms", type=float, default=100, help="the opener's pause between opens (ms)")
    parser.add_argument("--opens", type=int, default=40, help="opens measured per lock class")
    parser.add_argument("--steppers", type=int, default=1, help="threads stepping in a loop")
    parser.add_argument("--busy", action="store_true", help="hold with a busy matmul instead of time.sleep")
    args = parser.parse_args()
    torch.set_num_threads(1)
    hold = busy_hold if args.busy else time.sleep
    how = "busy matmul" if args.busy else "time.sleep"
    print(f"{args.steppers} stepper(s) hold {args.hold_ms:g} ms ({how}) per step;", end=" ")
    print(f"opener every {args.period_ms:g} ms, {args.opens} opens")
    for name, make in (("threading.Lock", threading.Lock), ("FairLock", FairLock)):
        waits = measure(make(), hold, args.hold_ms / 1000, args.period_ms / 1000, args.opens, args.steppers)
        p50, p99 = statistics.median(waits), statistics.quantiles(waits, n=100, method="inclusive")[98]
        ms = [f"{s * 1000:8.1f} ms" for s in (p50, p99, max(waits))]
        print(f"{name:>15}: opener's wait p50 {ms[0]}  p99 {ms[1]}  max {ms[2]}")


if __name__ == "__main__":
    main()
