"""The tc backend's rate trace: one thread per direction changing netem's rate every window, looping.

Responsible for: playing topology.rate_trace.rate_schedule on a live netem qdisc (`tc qdisc change ... rate R`
at each window's start, on the monotonic clock, the period looping), with the queue limit held at what
the trace's mean rate derives, so only the rate moves.
Not responsible for: the trace's format or its exact delivery (topology.rate_trace), which qdisc is where
(topology.shaping). The approximation's error is RateSchedule.max_window_error_pct, logged at start.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from topology import tc
from topology.profiles import LinkParams
from topology.rate_trace import RateSchedule, load_trace, rate_schedule

log = logging.getLogger(__name__)
Runner = Callable[[list[str]], object]


def window_params(params: LinkParams, schedule: RateSchedule | None = None) -> list[tuple[int, LinkParams]]:
    """(at_ms within the period, the LinkParams tc applies from then): the trace replaced by each window's rate.
    schedule: the trace's rate_schedule, when the caller has it already."""
    limit = params.effective_limit_pkts  # by the trace's mean rate, held while the rate moves
    schedule = schedule or rate_schedule(load_trace(params.rate_trace))
    return [(at, params.replace(rate_trace="", rate_mbit=bit / 1e6, limit_pkts=limit)) for at, bit in schedule.steps]


class TracePlayer:
    """Plays a trace's rate schedule on one device until stopped."""

    def __init__(self, dev: str, params: LinkParams, run: Runner):
        """dev: the netem qdisc's device; params: a direction with rate_trace; run: runs one argv in its host."""
        self.dev, self.run = dev, run
        schedule = rate_schedule(load_trace(params.rate_trace))
        self.steps = window_params(params, schedule)
        self.period_ns = schedule.period_ms * 1_000_000
        log.info("%s: rate trace %s as %d netem rates per period, max window error %.3g%% of its mean",
                 dev, params.rate_trace, len(self.steps), schedule.max_window_error_pct)  # fmt: skip
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"trace-{dev}", daemon=True)

    def install_cmd(self, verb: str = "replace") -> list[str]:
        """The argv that installs netem with the first window's rate."""
        return tc.netem_cmd(self.dev, self.steps[0][1], verb)

    def start(self) -> "TracePlayer":
        """Begin changing the rate (the first window's is the installed one)."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop changing the rate; the qdisc keeps the last one."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        start = time.monotonic_ns()
        period = 0
        while not self._stop.is_set():
            for i, (at_ms, params) in enumerate(self.steps):
                if period == 0 and i == 0:
                    continue
                due = start + period * self.period_ns + at_ms * 1_000_000
                if self._stop.wait(max(0.0, (due - time.monotonic_ns()) / 1e9)):
                    return
                self.run(tc.netem_cmd(self.dev, params, "change"))
            period += 1
