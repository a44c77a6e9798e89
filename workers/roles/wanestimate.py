"""What the WAN delivers now, measured from the KV connections' own TCP_INFO (policy.wan_estimate: measured).

Responsible for: folding TCP_INFO samples of P's WAN KV connections into one
estimate — path delivery rate, smoothed and minimum RTT, the share of
segments retransmitted — and saying whether the line looks congested (a
queue building up: RTT well above its minimum; or loss). Pure logic, fed by
P's senders; P returns the estimate with every PrefillReply and the router
routes on the latest one (workers/roles/router.py decide_route).
Not responsible for: reading TCP_INFO (kvwire/tcpinfo.py) or the route itself.

Rate: a connection's delivery_rate (bytes/s) times the connections its
transfer uses, from samples the kernel did not mark application-limited
(those only bound the rate from below), smoothed with weight ALPHA. Loss: the
segments retransmitted per segment sent over each completed transfer,
smoothed likewise. Congested: smoothed RTT > QUEUE_RTT_FACTOR x min RTT +
QUEUE_RTT_SLACK_MS (PrfaaS, arXiv 2604.15039, backs off on queue build-up or
loss the same way), or loss above CONGESTED_RETRANS_PCT.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

ALPHA = 0.3  # weight of a new sample: a few transfers follow a change of the line
QUEUE_RTT_FACTOR = 1.5  # RTT this far above its minimum: a queue is building on the line
QUEUE_RTT_SLACK_MS = 5.0  # ... beyond the jitter a quiet WAN shows
CONGESTED_RETRANS_PCT = 2.0  # or this share of segments retransmitted


@dataclass(frozen=True)
class WanEstimate:
    """rate_mbit: path delivery rate (0 = none measured yet); rtt_ms, min_rtt_ms; retrans_pct; samples"""

    rate_mbit: float = 0.0
    rtt_ms: float = 0.0
    min_rtt_ms: float = 0.0
    retrans_pct: float = 0.0
    samples: int = 0

    @property
    def measured(self) -> bool:
        return self.samples > 0 and self.rate_mbit > 0

    @property
    def congested(self) -> bool:
        queue = self.min_rtt_ms > 0 and self.rtt_ms > QUEUE_RTT_FACTOR * self.min_rtt_ms + QUEUE_RTT_SLACK_MS
        return self.measured and (queue or self.retrans_pct > CONGESTED_RETRANS_PCT)

    def transfer_ms(self, kv_bytes: int) -> float:
        """Time until kv_bytes are at the far end, as measured: serialisation at the rate plus the one-way
        delay (half the RTT; the receiver imports before its ACK is back)."""
        return kv_bytes * 8 / (self.rate_mbit * 1e3) + self.rtt_ms / 2


def _ewma(old: float, new: float, first: bool) -> float:
    return new if first else (1 - ALPHA) * old + ALPHA * new


class WanEstimator:
    """Thread-safe: P's sender threads feed it, its Prefill handler reads it."""

    def __init__(self):
        self._lock = threading.Lock()
        self._e = WanEstimate()
        self._rate_samples = 0
        self._loss_samples = 0

    def observe(self, info, connections: int) -> None:
        """One TCP_INFO sample (kvwire.tcpinfo.TcpInfo) of a WAN connection whose transfer uses
        `connections` connections."""
        if info.rtt_us <= 0:
            return
        with self._lock:
            e = self._e
            rate = e.rate_mbit
            if not info.app_limited and info.delivery_rate > 0:
                rate = _ewma(rate, info.delivery_rate * 8 / 1e6 * connections, self._rate_samples == 0)
                self._rate_samples += 1
            rtt = _ewma(e.rtt_ms, info.rtt_us / 1000, e.samples == 0)
            mins = [m for m in (e.min_rtt_ms, info.min_rtt_us / 1000) if m > 0]
            self._e = WanEstimate(rate, rtt, min(mins) if mins else 0.0, e.retrans_pct, e.samples + 1)

    def observe_transfer(self, segments_sent: int, segments_retransmitted: int) -> None:
        """A completed transfer's segment counts (its loss share)."""
        if segments_sent <= 0:
            return
        with self._lock:
            e = self._e
            pct = 100.0 * segments_retransmitted / segments_sent
            self._e = WanEstimate(
                e.rate_mbit, e.rtt_ms, e.min_rtt_ms, _ewma(e.retrans_pct, pct, self._loss_samples == 0), e.samples
            )
            self._loss_samples += 1

    def estimate(self) -> WanEstimate:
        with self._lock:
            return self._e
