"""The simulated WAN: one line per direction, concurrent KV transfers sharing it fairly, each capped by TCP.

Responsible for: a direction's parameters (`LineParams`: rate, RTT, loss, jitter, from a netem profile), the
throughput one TCP connection can reach on it (`mathis_bps`: MSS/RTT x 1.22/sqrt(p), Mathis et al. 1997), the
rounds slow start takes before a transfer reaches that rate (`slow_start`), max-min fair sharing of the rate
among concurrent transfers (`fair_share`: processor sharing, each capped), and `Line`, which carries transfers
on timers of the event loop (`Line.transfer(nbytes)` -> an event that fires when the last byte arrived). An optional
calibration table (`Calibration`, experiments/sim/calibration.yaml's format) corrects the formula's per-flow
throughput by what the emulator measured.
Not responsible for: what is sent or when (experiments.sim.pipeline); queue build-up, packet-level loss
recovery, reordering, loss bursts (a Gilbert-Elliott or 4-state model counts by its stationary mean loss), cross
traffic (not modelled: docs/simulator.md). A schedule's changes (`Line.set_params`) take effect from their time on:
the rate's shares at once, a new TCP cap for the transfers that start after.

A transfer's time: one-way delay (+ a seeded draw of the largest of its frames' jitter: LineParams.max_jitter_s)
+ its slow-start rounds + the rest of its bytes at its fair share of the line, recomputed each time a transfer
joins or leaves (fluid processor sharing).
A slow-start round sends one window at min(the window's rate, window / RTT, and its fair share of the line),
counted among the line's sharers, so the line never carries more than its rate: a round takes an RTT on a free
line, longer on a busy one; the window doubles each round (each byte acked adds one), from where its
connections' window starts until it carries the flow's cap per RTT; the last round's bytes (those that fit in
the window) go at the flow's cap, as a burst. On an unlimited line (no rate) no transfer takes from another:
the rounds are counted in closed form (`slow_start`).

Kept connections (a transfer with a `peer`, as the emulated KV sender's ConnectionPool, workers/kvwire/
sockets.py): a transfer takes its peer's idle connections when any are back (the end-to-end ACK: a one-way
delay after the last byte arrived), else new ones at the initial window. A kept window is what the last
transfer left (slow start adds each byte acked, up to the cap's window) and restarts as Linux's does after an
idle RTO (tcp_slow_start_after_idle, on by default: `restart_window`); bbr keeps it (the kernel exempts a
congestion control that paces itself). The handshake of a new connection is not counted.
"""

from __future__ import annotations

import bisect
import heapq
import math
import operator
import random
import statistics
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from experiments.sim import clock
from topology.netem_model import NETEM_DIST_SCALE, load_dist_table

MSS_BYTES = 1448  # TCP payload of a 1500-byte Ethernet frame with timestamps
INITIAL_WINDOW_SEGMENTS = 10  # Linux's initial congestion window (RFC 6928)
RTO_MIN_S = 0.2  # Linux's TCP_RTO_MIN: an RTO is the smoothed RTT + max(4 x its deviation, 200 ms)
KEPT_CONNECTIONS = 8  # ConnectionPool.max_idle: idle connections kept per peer
MATHIS_C = 1.22  # sqrt(3/2): periodic loss, delayed ACKs off (Mathis, Semke, Mahdavi, Ott 1997)
CALIBRATION_FILE = Path(__file__).resolve().parent / "calibration.yaml"
# The frames of a control message (a gRPC call or its reply: the router's open, the DRC answer, a token) as it
# crosses a jittered line: the modelled default's runs (docs/runs/modelled-default-20261206f, pdd's P->MD requests)
# took 3.7-7.7 ms past the 30 ms delay on wan-cross-country (jitter 5 ms), 0.6-1.2 past 5 on wan-regional (0.5):
# what netem's queue gives a burst of 3 frames (+4.5, +0.5; topology.netem_model), not 1 (+0.7, +0.1).
CONTROL_FRAMES = 3
_DONE_BYTES = 1e-3  # a flow with fewer bytes left than this has arrived (float rounding)


class CalibrationError(ValueError):
    """The calibration table is malformed; the message names the file and the field."""


@dataclass(frozen=True)
class LineParams:
    """One direction of the line.

    rate_bps: serialisation rate (bit/s); inf: unlimited
    rtt_s: round-trip time (s): both directions' delay
    loss: loss probability per packet (0..1), taken as random (a burst model's stationary mean)
    jitter_s: the one-way delay's jitter (s: netem's, the distribution's spread)
    jitter_table: the delay distribution's values in units of jitter_s, sorted (jitter_table(); (): uniform)
    """

    rate_bps: float
    rtt_s: float
    loss: float = 0.0
    jitter_s: float = 0.0
    jitter_table: tuple[float, ...] = ()

    @property
    def one_way_s(self) -> float:
        return self.rtt_s / 2

    def max_jitter_s(self, frames: int, u: float) -> float:
        """The latest of `frames` frames' jitter draws (s), at quantile u (0..1) of that maximum's distribution:
        what a message of that many frames waits past the one-way delay on a netem line. netem's queue sends no
        frame before the one ahead of it (tfifo with a rate), and a message is in when its last frame is, so a
        burst of frames takes the largest of their draws (topology.netem_model: 3 frames on wan-cross-country,
        +4.5 ms; 500, +15 ms). P(max <= x) = F(x)^frames, so the max is F's quantile u^(1/frames)."""
        if not self.jitter_s:
            return 0.0
        q = u ** (1.0 / frames)
        table = self.jitter_table
        if not table:  # uniform in [-jitter, +jitter)
            return self.jitter_s * (2 * q - 1)
        return self.jitter_s * table[min(len(table) - 1, int(q * len(table)))]

    def mean_max_jitter_s(self, frames: int) -> float:
        """The mean of max_jitter_s(frames, u) over u (s): E[max] = sum of each value x its probability as the
        largest ((k/m)^frames - ((k-1)/m)^frames for the k-th smallest of m equally likely)."""
        if not self.jitter_s:
            return 0.0
        table, m = self.jitter_table, len(self.jitter_table)
        if not table:
            return self.jitter_s * (frames - 1) / (frames + 1)
        return self.jitter_s * sum(x * (((k + 1) / m) ** frames - (k / m) ** frames) for k, x in enumerate(table))


@lru_cache(maxsize=None)
def jitter_table(distribution: str) -> tuple[float, ...]:
    """A netem delay distribution's values in units of its jitter, sorted (netem's tabledist: table value x
    jitter / NETEM_DIST_SCALE); (): uniform."""
    if distribution == "uniform":
        return ()
    return tuple(sorted(v / NETEM_DIST_SCALE for v in load_dist_table(distribution)))


def line_from_profile(profile, direction: str = "a_to_b") -> LineParams:
    """A direction of a topology.profiles.Profile as LineParams (rate 0 there: unlimited; a rate trace: its
    mean rate, its variation not modelled; loss: the direction's long-run loss rate, a Gilbert-Elliott or
    4-state model's stationary mean: its bursts are not modelled)."""
    d, back = profile.direction(direction), profile.direction("b_to_a" if direction == "a_to_b" else "a_to_b")
    rate = d.mean_rate_mbit * 1e6 or math.inf
    table = jitter_table(d.delay_distribution) if d.jitter_ms else ()
    return LineParams(rate, (d.delay_ms + back.delay_ms) / 1e3, d.expected_loss_pct / 100, d.jitter_ms / 1e3, table)


def mathis_bps(rtt_s: float, loss: float, mss_bytes: int = MSS_BYTES) -> float:
    """The loss-bound throughput of one TCP connection (bit/s): MSS/RTT x 1.22/sqrt(p); inf without loss or RTT."""
    if loss <= 0 or rtt_s <= 0:
        return math.inf
    return mss_bytes * 8 / rtt_s * MATHIS_C / math.sqrt(loss)


def slow_start(
    nbytes: float,
    cap_bps: float,
    rtt_s: float,
    iw_segments: int = INITIAL_WINDOW_SEGMENTS,
    window_bytes: float | None = None,
):
    """(seconds, bytes) a transfer of nbytes spends in slow start before its window carries cap_bps: rounds of
    one RTT, the window doubling from window_bytes (None: iw_segments x MSS, a new connection); a transfer that
    ends within them takes the rounds before its last (whose bytes arrive a one-way delay after they leave,
    counted apart). No RTT: (0, 0)."""
    if rtt_s <= 0:
        return 0.0, 0.0
    target = cap_bps / 8 * rtt_s if math.isfinite(cap_bps) else math.inf  # bytes per RTT at the cap
    window, sent, seconds = window_bytes or iw_segments * MSS_BYTES, 0.0, 0.0
    while window < target:
        if sent + window >= nbytes:
            return seconds, nbytes
        sent, seconds, window = sent + window, seconds + rtt_s, window * 2
    return seconds, sent


def restart_window(window_bytes: float, idle_s: float, rto_s: float, iw_bytes: float) -> float:
    """A kept connection's window after idle_s without sending: Linux's tcp_cwnd_restart halves it for each
    RTO the idle time exceeds (none up to one RTO), not below the initial window."""
    delta = idle_s - rto_s
    while delta > 0 and window_bytes > iw_bytes:
        window_bytes, delta = window_bytes / 2, delta - rto_s
    return max(window_bytes, iw_bytes) if idle_s > rto_s else window_bytes


@dataclass
class _Kept:
    """A transfer's connections, idle in their peer's pool: window (bytes per RTT they carried at the end),
    sent_s (when their last byte left), back_s (when the sender has them back: the receiver's ACK)."""

    window: float
    sent_s: float
    back_s: float


def fair_share(caps: list[float], rate_bps: float) -> list[float]:
    """Max-min fair rates (bit/s) of flows with these caps on a line of rate_bps (inf: each gets its cap)."""
    out, left = [0.0] * len(caps), rate_bps
    for k, i in enumerate(sorted(range(len(caps)), key=caps.__getitem__)):
        out[i] = min(caps[i], left / (len(caps) - k))
        left -= out[i]
    return out


@dataclass(frozen=True)
class CalibrationPoint:
    """What the emulator measured on one line: rate_mbit, rtt_ms, loss_pct (the profile's, as LineParams reads it),
    flows (transfers sharing the line, a power of two: the runs' time-averaged concurrency, binned), congestion
    (the senders' TCP congestion control), kv_bytes (the transfers' median size), transfers (how many were
    measured), per_flow_mbit (their median goodput: bytes x 8 / the sender's time) and factor (what the simulator's
    rates are multiplied by on such a line for the same transfers to take that goodput: solved by `solve_factor`
    when the table was made)."""

    rate_mbit: float
    rtt_ms: float
    loss_pct: float
    flows: int
    congestion: str
    kv_bytes: int
    transfers: int
    per_flow_mbit: float
    factor: float


class Calibration:
    """The emulator's measured per-flow goodput against the formula's, by the nearest measured point.

    status: "uncalibrated: formula only" while the table has no points (factor 1 everywhere); share_spread: the
    log-spread of the weights by which transfers share a full line it covers (share_weights; 0: equal shares)"""

    def __init__(self, points: list[CalibrationPoint], status: str, share_spread: float = 0.0):
        self.points, self.status, self.share_spread = points, status, share_spread

    def near(self, line: LineParams, congestion: str) -> list[CalibrationPoint]:
        """The points measured with this congestion control on a line like this one (rate, RTT and loss each within
        about 2x: NEAR_LINE); a point is not carried to a line far from where it was measured."""
        return [p for p in self.points if p.congestion == congestion and _line_distance(p, line) <= NEAR_LINE]

    def covers(self, line: LineParams, congestion: str) -> bool:
        """Whether any point applies to this line (else its factor is 1 everywhere: the formula alone)."""
        return bool(self.near(line, congestion))

    def factor(self, line: LineParams, flows: int, congestion: str) -> float:
        """The factor of the point nearest to (rate, RTT, loss, flows) in log distance among those near this line
        (`near`); 1 without one."""
        mine = self.near(line, congestion)
        if not mine or flows == 0:
            return 1.0
        return min(mine, key=lambda q: _line_distance(q, line) + math.log(q.flows / flows) ** 2).factor

    def describe(self, line: LineParams, congestion: str) -> str:
        """What the table does on this line, for a summary's words."""
        mine = self.near(line, congestion)
        if not mine:
            return f"{self.status}; no point near this line ({congestion}): the formula alone"
        factors = sorted(p.factor for p in mine)
        return (
            f"{self.status}; on this line ({congestion}) {len(mine)} point(s), the formula's rates x "
            f"{factors[0]:.3g}-{factors[-1]:.3g} by the transfers sharing it"
        )


NEAR_LINE = 3 * math.log(2) ** 2  # rate, RTT and loss each 2x off: the farthest line a point applies to


def _line_distance(p: CalibrationPoint, line: LineParams) -> float:
    """How far (log distance over rate, RTT and loss) the line a point was measured on is from this one."""
    rate = line.rate_bps / 1e6 if math.isfinite(line.rate_bps) else 1e6
    return (
        math.log((p.rate_mbit + 1) / (rate + 1)) ** 2
        + math.log((p.rtt_ms + 1) / (line.rtt_s * 1e3 + 1)) ** 2
        + math.log((p.loss_pct + 1e-3) / (line.loss * 100 + 1e-3)) ** 2
    )


POINT_KEYS = tuple(CalibrationPoint.__dataclass_fields__)


def load_calibration(path: Path = CALIBRATION_FILE) -> Calibration:
    """The calibration table (docs/simulator.md describes its format); CalibrationError naming the field."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as err:
        raise CalibrationError(f"{path}: {err}") from None
    if not isinstance(data, dict) or not isinstance(data.get("status"), str):
        raise CalibrationError(f"{path}: expected a mapping with status: <text> and points: [...]")
    points = []
    for i, raw in enumerate(data.get("points") or []):
        if not isinstance(raw, dict) or set(raw) != set(POINT_KEYS):
            raise CalibrationError(f"{path}: points[{i}]: expected exactly the keys {list(POINT_KEYS)}")
        numbers = [k for k in POINT_KEYS if k != "congestion"]
        bad = [k for k in numbers if not isinstance(raw[k], (int, float)) or raw[k] < 0]
        bad += [k for k in ("flows", "transfers", "per_flow_mbit", "factor") if not bad and raw[k] <= 0]
        if bad:
            raise CalibrationError(f"{path}: points[{i}].{bad[0]}: expected a number > 0 (rates, sizes: >= 0)")
        if raw["factor"] > 1:  # a line never carries more than its rate (solve_factor's bound)
            raise CalibrationError(f"{path}: points[{i}].factor: expected at most 1, got {raw['factor']}")
        if not isinstance(raw["congestion"], str) or not raw["congestion"]:
            raise CalibrationError(f"{path}: points[{i}].congestion: expected a congestion control's name")
        points.append(CalibrationPoint(**{k: raw[k] for k in POINT_KEYS}))
    spread = data.get("share_spread", 0.0)
    if isinstance(spread, bool) or not isinstance(spread, (int, float)) or not 0 <= spread <= 2:
        raise CalibrationError(f"{path}: share_spread: expected a number in [0, 2], got {spread!r}")
    return Calibration(points, data["status"], float(spread))


def transfers_goodput_mbit(
    params: LineParams, congestion: str, connections: int, flows: int, kv_bytes: float, factor: float,
    spread: float = 0.0,
) -> float:  # fmt: skip
    """The simulator's goodput (Mbit/s: bytes x 8 / time from the send to the last byte) of `flows` transfers of
    kv_bytes started together on new connections on a line of params, its rates x factor: their mean; with a
    share_spread, the median over SPREAD_DRAWS draws of their weights (as the runs' per-flow median)."""
    rate_mbit = params.rate_bps / 1e6 if math.isfinite(params.rate_bps) else 1e6
    point = CalibrationPoint(rate_mbit, params.rtt_s * 1e3, params.loss * 100, flows, congestion, 0, 1, 1.0, factor)
    goodputs = []
    for seed in range(SPREAD_DRAWS if spread else 1):
        env = clock.Environment()
        line = Line(env, params, Calibration([point], "solving", spread), random.Random(seed), congestion=congestion)
        times: list[float] = []
        landed = lambda _e, times=times, env=env: times.append(env.now)  # noqa: E731
        for _ in range(flows):
            line.transfer(kv_bytes, connections).callbacks.append(landed)
        env.run()
        goodputs += [kv_bytes * 8 / t / 1e6 for t in times]
    return statistics.median(goodputs) if spread else sum(goodputs) / len(goodputs)


SPREAD_DRAWS = 16  # transfers_goodput_mbit's draws of the weights, with a share_spread


def solve_factor(params: LineParams, congestion: str, connections: int, flows: int, kv_bytes: float,
                 goodput_mbit: float, spread: float = 0.0) -> float:  # fmt: skip
    """The factor of the simulator's rates on this line at which its transfers (as transfers_goodput_mbit, with the
    table's share_spread) take goodput_mbit: bisection on its logarithm in [1/1000, 1] (the goodput grows with it).
    At most 1: a line never carries more than its rate; transfers that measured faster than the formula's (fewer
    sharing the line than their time-averaged concurrency's bin) leave it as it is."""
    lo, hi = math.log(1e-3), 0.0
    args = (params, congestion, connections, flows, kv_bytes)
    for _ in range(40):
        mid = (lo + hi) / 2
        if transfers_goodput_mbit(*args, math.exp(mid), spread) < goodput_mbit:
            lo = mid
        else:
            hi = mid
    return round(math.exp((lo + hi) / 2), 4)


_ORDER = operator.attrgetter("order")
SHARE_LEVELS = 8  # a transfer's weight on the line: one of this many equally likely values (share_weights)


def share_weights(spread: float, levels: int = SHARE_LEVELS) -> tuple[float, ...]:
    """The weights a transfer's share of a full line takes, equally likely: the quantiles (k + 1/2) / levels of a
    lognormal of mean 1 and log-spread `spread` (0: (1.0,), every transfer its equal share). TCP flows sharing a
    bottleneck do not split it evenly (which flow's packets a full queue drops, who started first: the emulated
    runs' concurrent WAN copies took 0.7-1.9x their share, 10th-90th percentile; docs/simulator.md)."""
    if spread <= 0:
        return (1.0,)
    z = statistics.NormalDist()
    return tuple(math.exp(spread * z.inv_cdf((k + 0.5) / levels) - spread * spread / 2) for k in range(levels))


class _Group:
    """The flows of one cap and weight: they share one rate, so one virtual clock (bytes served to each since the
    group began) orders their ends in a heap of (virtual end, sequence, event): O(log n) per join or end. order:
    cap / weight, the weighted max-min order."""

    __slots__ = ("cap", "w", "order", "served", "rate", "heap")

    def __init__(self, cap: float, w: float):
        self.cap, self.w, self.order, self.served, self.rate, self.heap = cap, w, cap / w, 0.0, 0.0, []


class Line:
    """One direction of the WAN in the event loop: transfers share its rate fairly, each capped by TCP.

    env: the simulation; params: the direction; calibration: measured corrections (None: formula only);
    rng: draws the jitter; slow_start: model each transfer's slow-start rounds (a new or idle connection);
    congestion: the senders' TCP congestion control: bbr is not loss-bound (it paces at the bottleneck's rate
    whatever random loss of a few % does: its flows get their fair share, less the lost packets); every other
    (cubic, reno, the kernel's default) is capped by Mathis. Where the calibration covers the line, a full line is
    shared by weight: each transfer draws one of share_weights(calibration.share_spread) (weighted max-min)."""

    def __init__(
        self,
        env: clock.Environment,
        params: LineParams,
        calibration: Calibration | None = None,
        rng: random.Random | None = None,
        slow_start: bool = True,
        congestion: str = "cubic",
        schedule: tuple = (),
    ):
        self.env, self.params, self.calibration = env, params, calibration
        self.rng, self.slow_start, self.congestion = rng or random.Random(0), slow_start, congestion
        self.groups: dict[tuple, _Group] = {}  # by (cap, weight), in the order they began (their ends fire so)
        self._by_cap: list[_Group] = []  # the same groups, lowest cap / weight first (the max-min order)
        self.kept: dict[object, list[_Kept]] = {}  # peer -> its idle connections, the latest given back last
        self._t, self._gen, self._seq = 0.0, 0, 0
        self._n, self._demand, self._wsum = 0, 0.0, 0.0  # transfers on the line, their caps (bit/s), weights
        self.bytes_sent = 0
        self.log: list | None = None  # set to a list: each transfer's [sent (s), bytes, arrived (s)] (scripts)
        self._rate, self._line_bps = params.rate_bps, 2 * params.rate_bps  # an uncapped flow counts as twice the line
        self._cover(params)
        self._caps: dict[int, float] = {}  # connections -> cap_bps
        self._factors: dict[int, float] = {}  # transfers on the line -> the calibration's factor (until a change)
        for at_s, changed in schedule:  # a schedule's changes: (s from now, LineParams)
            env.call_in(at_s, self.set_params, changed)

    def set_params(self, params: LineParams) -> None:
        """The line from now on (a schedule's change): the shares of its rate and the calibration's factor change
        at once; transfers under way keep their TCP cap and slow-start rounds, those that start later take the
        new line's."""
        self._advance()
        self.params, self._rate, self._line_bps = params, params.rate_bps, 2 * params.rate_bps
        self._cover(params)
        self._caps.clear()
        self._factors.clear()
        lb = self._line_bps
        self._demand = sum((g.cap if g.cap < lb else lb) * len(g.heap) for g in self.groups.values())
        self._reschedule()

    def _cover(self, params: LineParams) -> None:
        """Whether the calibration covers this line (else factor 1 everywhere), and the weights transfers draw."""
        cal = self.calibration
        self._calibrated = cal is not None and cal.covers(params, self.congestion)
        self._weights = share_weights(cal.share_spread if self._calibrated else 0.0)

    def _factor(self, n: int) -> float:
        """The calibration's factor with n transfers on this line (looked up once per n)."""
        f = self._factors.get(n)
        if f is None:
            f = self._factors[n] = self.calibration.factor(self.params, n, self.congestion)
        return f

    @property
    def flows(self) -> int:
        """Transfers sharing the line now (in slow start or past it)."""
        return self._n

    def cap_bps(self, connections: int = 1) -> float:
        """The TCP bound of one transfer over `connections` parallel connections (bit/s)."""
        if self.congestion == "bbr":
            return self.params.rate_bps * (1 - self.params.loss)
        return mathis_bps(self.params.rtt_s, self.params.loss) * connections

    def transfer(self, nbytes: float, connections: int = 1, peer: object = None) -> clock.Event:
        """An event that fires when nbytes sent now have arrived at the far end. peer: whose kept connections
        it takes and gives back (None: new ones, not kept)."""
        p, done = self.params, self.env.event()
        self.bytes_sent += int(nbytes)
        if self.log is not None:
            rec = [self.env.now, nbytes]
            self.log.append(rec)
            done.callbacks.append(lambda _e: rec.append(self.env.now))
        cap = self._caps.get(connections) or self._caps.setdefault(connections, self.cap_bps(connections))
        frames = -(-int(nbytes) // MSS_BYTES) or 1
        delay = max(0.0, p.one_way_s + (p.max_jitter_s(frames, self.rng.random()) if p.jitter_s else 0.0))
        start = self._take(peer)
        full = min(cap, p.rate_bps) / 8 * p.rtt_s  # bytes per RTT at the cap: slow start ends there
        ws = self._weights
        w = ws[int(self.rng.random() * len(ws))] if len(ws) > 1 else 1.0
        if peer is not None:
            window = min(full, (start or INITIAL_WINDOW_SEGMENTS * MSS_BYTES) + nbytes)  # + each byte acked
            done.callbacks.append(lambda _e: self._give(peer, window, delay, connections))
        if math.isinf(p.rate_bps):  # nothing to share: the rounds in closed form
            ramp_s, ramp_bytes = slow_start(nbytes, cap, p.rtt_s, window_bytes=start) if self.slow_start else (0, 0)
            left = nbytes - ramp_bytes
            if left <= _DONE_BYTES or math.isinf(cap):  # within slow start, or no loss: with the ramp
                self.env.call_in(delay + ramp_s, done.succeed)
            else:
                self.env.call_in(delay + ramp_s, self._join, (left, math.inf, full, cap, w, done))
            return done
        first = (start or INITIAL_WINDOW_SEGMENTS * MSS_BYTES) if self.slow_start and p.rtt_s > 0 else math.inf
        self.env.call_in(delay, self._join, (nbytes, first, full, cap, w, done))
        return done

    def _take(self, peer: object) -> float | None:
        """The window of peer's latest idle connections back at the sender (restarted after an idle RTO, not
        under bbr), taken from its pool; None: none, new connections."""
        now, pool = self.env.now, self.kept.get(peer)
        back = [k for k in pool if k.back_s <= now] if pool else []
        if not back:
            return None
        kept = back[-1]
        pool.remove(kept)
        if self.congestion == "bbr":
            return kept.window
        rto = self.params.rtt_s + max(RTO_MIN_S, 4 * self.params.jitter_s)
        return restart_window(kept.window, now - kept.sent_s, rto, INITIAL_WINDOW_SEGMENTS * MSS_BYTES)

    def _give(self, peer: object, window: float, delay: float, connections: int) -> None:
        """A transfer's connections back to peer's pool (at most KEPT_CONNECTIONS connections are kept)."""
        pool = self.kept.setdefault(peer, [])
        if (len(pool) + 1) * connections <= KEPT_CONNECTIONS:
            pool.append(_Kept(window, self.env.now - delay, self.env.now + self.params.one_way_s))

    def _join(self, transfer: tuple[float, float, float, float, float, clock.Event]) -> None:
        """A transfer starts sharing the line now: (bytes left, its slow-start rounds from window (inf: none), the
        window at its cap, its cap, its weight, its event), then the rest."""
        left, window, full, cap, w, done = transfer
        self._advance()
        self._round(left, window, full, cap, w, done)
        self._reschedule()

    def _round(self, left: float, window: float, full: float, cap: float, w: float, done: clock.Event) -> None:
        """A transfer's next slow-start round (window bytes capped at window / RTT, then the next round at twice
        the window), or, past its slow start or within this window, the rest at its cap."""
        if window >= full or left <= window + _DONE_BYTES:
            self._push(left, cap, w, done.succeed)
        else:
            rtt = self.params.rtt_s
            then = lambda: self._round(left - window, 2 * window, full, cap, w, done)  # noqa: E731
            self._push(window, window * 8 / rtt, w, then)

    def _push(self, nbytes: float, cap: float, w: float, then) -> None:
        """nbytes at most cap (bit/s), of weight w, on the line from now; then() once they are across (no
        reschedule)."""
        key = (cap, w)
        g = self.groups.get(key)
        if g is None:
            g = self.groups[key] = _Group(cap, w)
            bisect.insort(self._by_cap, g, key=_ORDER)
        self._seq += 1
        heapq.heappush(g.heap, (g.served + nbytes, self._seq, then))
        self._n += 1
        self._wsum += w
        self._demand += cap if cap < self._line_bps else self._line_bps  # an uncapped flow: more than the line

    def _advance(self) -> None:
        now = self.env.now
        dt, self._t = now - self._t, now
        if dt:  # a join at the instant of an end serves nothing
            for g in self.groups.values():
                g.served += g.rate / 8 * dt

    def _reschedule(self) -> None:
        """Share the line among the groups (max-min over their caps, by weight), and time the next end."""
        self._gen += 1
        if not self.groups:
            self._n, self._demand, self._wsum = 0, 0.0, 0.0  # no float drift carried over
            return
        n, rate = self._wsum, self._rate
        factor = self._factor(self._n) if self._calibrated else 1.0
        wait = math.inf
        if self._demand <= rate:  # the line is not full: every flow at its cap
            for g in self.groups.values():
                g.rate = r = g.cap * factor
                w = (g.heap[0][0] - g.served) * 8 / r
                if w < wait:
                    wait = w
        else:
            left = rate
            for g in self._by_cap:  # weighted max-min: n is the weight left
                heap, cap, wt = g.heap, g.cap, g.w
                share, k = left * wt / n, len(heap)
                r = share if share < cap else cap
                left, n = left - r * k, n - wt * k
                if factor != 1.0:
                    r *= factor
                g.rate = r
                w = (heap[0][0] - g.served) * 8 / r
                if w < wait:
                    wait = w
        gen = self._gen
        self.env.call_in(wait if wait > 0.0 else 0.0, self._fire, gen)

    def _fire(self, gen: int) -> None:
        if gen != self._gen:
            return  # a transfer joined or left since: a newer timer stands
        now = self.env.now
        dt, self._t = now - self._t, now
        due, gone, line_bps = [], [], self._line_bps
        for key, g in self.groups.items():  # _advance and the ends due, in one pass
            cap, w = key
            served = g.served
            if dt:
                served = g.served = served + g.rate / 8 * dt
            heap, reach = g.heap, served + (_DONE_BYTES + served * 1e-12)  # float rounding of the virtual clock
            if heap[0][0] > reach:
                continue
            while heap and heap[0][0] <= reach:
                due.append(heapq.heappop(heap)[2])
                self._n -= 1
                self._wsum -= w
                self._demand -= cap if cap < line_bps else line_bps
            if not heap:
                gone.append(key)  # a slow-start round's cap may not come again
        for key in gone:
            self._by_cap.remove(self.groups.pop(key))
        for then in due:
            then()
        self._reschedule()
