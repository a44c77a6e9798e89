"""Trace-driven link rates in Mahimahi's format: the trace file, its exact delivery, and tc's nearest rate schedule.

Responsible for: reading a Mahimahi packet-delivery trace (one integer millisecond timestamp per line, each
a delivery opportunity for MTU_BYTES bytes, the trace looping at its last timestamp), delivering frames by
it exactly (TraceClock, used by topology.netem_model), and the tc backend's approximation: one netem rate
per WINDOW_MS window over one period (window_rates_mbit) with the error that approximation makes.
Not responsible for: applying a schedule to a live qdisc (topology.shaping), the other netem options.

Delivery follows Mahimahi's link queue: each opportunity carries MTU_BYTES bytes from the head of the FIFO;
a frame longer than what is left spans opportunities and leaves at the one that completes it; bytes of an
opportunity with nothing queued are lost. A frame ready at an opportunity's millisecond may use it.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

MTU_BYTES = 1500  # Mahimahi: each line is one opportunity for one 1500-byte packet
WINDOW_MS = 100  # the tc approximation's step (and the calibration's window)
NS_PER_MS = 1_000_000
# netem's rate 0 means unlimited: a window without opportunities gets this (bit/s), counted in the error.
MIN_RATE_BIT = 8


class TraceError(ValueError):
    """A trace file that is not Mahimahi's format: the message names the file and the line."""


@dataclass(frozen=True)
class Trace:
    """One period of a trace: the opportunities' times (ms, non-decreasing) and the period (its last timestamp)."""

    times_ms: tuple[int, ...]
    source: str = "<trace>"

    @property
    def period_ms(self) -> int:
        """The trace loops at its last timestamp (Mahimahi)."""
        return self.times_ms[-1]

    def mean_rate_mbit(self) -> float:
        """Average capacity over one period (Mbit/s)."""
        return len(self.times_ms) * MTU_BYTES * 8 / (self.period_ms / 1000) / 1e6


def parse_trace(text: str, source: str = "<trace>") -> Trace:
    """A Mahimahi trace: one non-negative integer (ms) per line, non-decreasing, the last one > 0."""
    times: list[int] = []
    for number, line in enumerate(text.splitlines(), 1):
        word = line.strip()
        if not word:
            continue
        if not word.isdigit():
            raise TraceError(f"{source}:{number}: {word!r} is not a whole number of milliseconds")
        value = int(word)
        if times and value < times[-1]:
            raise TraceError(f"{source}:{number}: {value} ms goes back in time (previous {times[-1]} ms)")
        times.append(value)
    if not times or times[-1] <= 0:
        raise TraceError(f"{source}: a trace needs at least one opportunity and a last timestamp > 0 ms")
    return Trace(tuple(times), source)


@lru_cache(maxsize=32)
def load_trace(path: str) -> Trace:
    """A trace file, read once per process."""
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise TraceError(f"rate_trace {path}: {err.strerror or err}") from None
    return parse_trace(text, path)


class TraceClock:
    """Delivers frames by a trace, in FIFO order; time 0 of the trace is start_ns."""

    def __init__(self, trace: Trace, start_ns: int):
        """trace: the opportunities; start_ns: when the trace's time 0 is (caller's clock, ns)."""
        self.trace = trace
        self.start_ns = start_ns
        self._k = -1  # index of the current opportunity, counting across periods
        self._left = 0  # bytes left in it

    def _time_ns(self, k: int) -> int:
        n = len(self.trace.times_ms)
        period, i = divmod(k, n)
        return self.start_ns + (period * self.trace.period_ms + self.trace.times_ms[i]) * NS_PER_MS

    def _first_at_or_after(self, t_ns: int) -> int:
        n, times = len(self.trace.times_ms), self.trace.times_ms
        rel_ms = -(-(t_ns - self.start_ns) // NS_PER_MS)  # ceil: an opportunity at the ms the frame is ready
        period, within = divmod(max(0, rel_ms), self.trace.period_ms)
        k = period * n + bisect.bisect_left(times, within)
        while k > 0 and self._time_ns(k - 1) >= t_ns:  # an opportunity at the period's end is also the next's start
            k -= 1
        return k

    def depart_ns(self, ready_ns: int, frame_len: int) -> int:
        """When a frame ready at ready_ns and frame_len bytes long leaves (ns)."""
        if self._k < 0 or self._time_ns(self._k) < ready_ns:
            # Opportunities before the frame was ready went unused (nothing queued): lost.
            self._k, self._left = max(self._k + 1, self._first_at_or_after(ready_ns)), MTU_BYTES
        need = frame_len
        while need > self._left:
            need -= self._left
            self._k, self._left = self._k + 1, MTU_BYTES
        self._left -= need
        return self._time_ns(self._k)


def window_rates_mbit(trace: Trace, window_ms: int = WINDOW_MS) -> list[float]:
    """The trace's capacity per window over one period (Mbit/s): opportunities x MTU_BYTES per window."""
    count = -(-trace.period_ms // window_ms)
    bytes_per = [0] * count
    for t in trace.times_ms:
        # Opportunities at time P belong to the next period's start (the trace loops at P): window 0.
        bytes_per[(t % trace.period_ms) // window_ms] += MTU_BYTES
    lengths = [min(window_ms, trace.period_ms - i * window_ms) for i in range(count)]
    return [b * 8 / (ms / 1000) / 1e6 for b, ms in zip(bytes_per, lengths)]


@dataclass(frozen=True)
class RateSchedule:
    """The tc backend's stand-in for a trace: one netem rate per window, looping with the period.

    steps: (at_ms within the period, rate in whole bit/s)
    max_window_error_pct: the largest gap between a window's capacity under the schedule and under the trace,
        in % of the trace's mean rate (only windows without opportunities, held at MIN_RATE_BIT, and the
        rounding to whole bit/s make one: within a window tc spreads the bytes evenly, the trace bunches them)
    """

    steps: tuple[tuple[int, int], ...]
    period_ms: int
    max_window_error_pct: float


def rate_schedule(trace: Trace, window_ms: int = WINDOW_MS) -> RateSchedule:
    """The nearest netem rate schedule: each window's exact capacity as a whole bit/s rate (see RateSchedule)."""
    rates = window_rates_mbit(trace, window_ms)
    steps, worst = [], 0.0
    for i, mbit in enumerate(rates):
        bit = max(MIN_RATE_BIT, round(mbit * 1e6))
        worst = max(worst, abs(bit / 1e6 - mbit) / trace.mean_rate_mbit() * 100)
        steps.append((i * window_ms, bit))
    return RateSchedule(tuple(steps), trace.period_ms, worst)
