"""Link statistics from probe records, and the fidelity verdict against a profile.

Responsible for: turning probe results (`ProbeResult`) into delay/jitter/loss/reorder numbers,
computing what a profile should show for the same probe stream (by running
netem's own per-packet model, `topology.netem_model`, over it), and comparing
the two with the named tolerances below.
Not responsible for: running probes (`topology.udp_probe`) or the topology.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from topology.profiles import LinkParams
from topology.udp_probe import WIRE_OVERHEAD_BYTES, ProbeResult

# Tolerances (issue: "Mininet's own high-fidelity tests allow ±20%; we aim far tighter").
DELAY_MEAN_TOL_FRAC = 0.02  # one-way delay mean within max(2%, 0.3 ms) ...
DELAY_MEAN_TOL_MS = 0.3  # ... of the expected mean
# On a starved path (the machinery carries less than the rate with headroom: qemu TCG, see
# calibration._starved) the shaper paces late by an amount the baseline, measured minutes before,
# does not pin: one CI run read wan-cross-country's b->a mean 1.0 and, probed again, 1.3 ms above
# the model (200 Mbit/s rate, 129 Mbit/s capacity; a->b +0.8), past a 2% band of 0.6 + 0.27 ms.
# There the mean is judged within max(5%, 0.3 ms): still a wrong delay, but not the timer's drift.
STARVED_DELAY_MEAN_TOL_FRAC = 0.05
JITTER_STD_TOL_FRAC = 0.15  # delay standard deviation within 15%
LOSS_INTERVAL = 0.99  # measured loss inside the 99% interval of the configured rate
# TCP payload in a full 1514 B frame: 1448 B (MSS with timestamps). A perfect link's goodput ceiling.
TCP_PAYLOAD_SHARE = 1448 / 1514
GOODPUT_MIN_FRAC = 0.90  # TCP goodput on a lossless rated link: 90% of the configured rate ...
GOODPUT_MAX_FRAC = 1.01 * TCP_PAYLOAD_SHARE  # ... to 1% above the payload ceiling (96.6%)
# A goodput below the band is measured again, up to this many tests in all, and the best counts:
# a busy host (two cores, the forwarder and iperf3 sharing them) only ever takes goodput away, so
# the best of a few tests is the link's, and a link that passes more than its rate fails on any.
# One CI run measured 157 Mbit/s b->a on wan-flaky's 200 where three earlier runs had 190+.
GOODPUT_TRIES = 3
# A direction whose probe checks (delay mean and spread, loss, reordering) fail is probed again with a
# fresh run, up to this many runs in all, and the last is judged (the failed runs' checks are in the
# table). With ~20 loss checks in one `make test` (5 profiles x 2 directions x 2 backends), a single
# 99% interval fails a correct link in ~1 run of 10 by chance alone: one CI run read 9 of 2000 probes
# lost on wan-flaky's 0.1% (6 allowed) where two repeats in the same VM (both directions) lost 1, 1, 2
# and 4, and their delay-only baselines none. The machinery's mean delay drifts with host load after
# the baseline measured it: another CI run read wan-lossy's a->b mean 1.7 ms above the model under
# qemu TCG (b->a +0.6), 0.35 ms past its band. A link that really is off fails every run.
PROBE_TRIES = 2
MONTE_CARLO_RUNS = 200  # model runs that give correlated/bursty loss its 99% interval
MODEL_PROBES = 20_000  # probes in the model run giving the expected delay mean and spread
# Delay mean and spread are taken over the central 99% of samples, on both the
# measured and the model side: a host that deschedules a probe process now and
# then (tens of ms under qemu TCG) adds rare spikes that are not the link's.
TRIM_FRAC = 0.005  # dropped at each end
JITTER_MIN_SIGNAL_RATIO = 2.0  # the link's delay spread must be this many times the machinery's to be judged


@dataclass(frozen=True)
class DirectionStats:
    """What one direction of probes showed (delays in ms; mean and std over the central 99%)."""

    sent: int
    received: int  # distinct sequence numbers that arrived
    duplicates: int
    lost: int
    loss_pct: float
    reordered: int  # arrivals with a lower seq than one already seen
    delay_mean_ms: float
    delay_std_ms: float
    delay_min_ms: float
    delay_p50_ms: float
    delay_p99_ms: float
    delay_max_ms: float


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return math.nan
    k = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[k]


def trimmed_mean_std(sorted_values: list[float], frac: float = TRIM_FRAC) -> tuple[float, float]:
    """Mean and standard deviation of the central (1 - 2*frac) of sorted values."""
    if not sorted_values:
        return math.nan, math.nan
    k = int(len(sorted_values) * frac)
    core = sorted_values[k : len(sorted_values) - k] or sorted_values
    return statistics.fmean(core), statistics.pstdev(core) if len(core) > 1 else 0.0


def probe_stats(result: ProbeResult) -> DirectionStats:
    """Delay, jitter, loss, duplicates and reordering of one probe run (first arrivals only)."""
    first: dict[int, float] = {}
    for seq, delay_ns in zip(result.seqs, result.delays_ns):
        first.setdefault(seq, delay_ns / 1e6)
    delays = sorted(first.values())
    mean_ms, std_ms = trimmed_mean_std(delays)
    lost = result.sent_count - result.received
    return DirectionStats(
        sent=result.sent_count,
        received=result.received,
        duplicates=result.duplicates,
        lost=lost,
        loss_pct=100 * lost / result.sent_count if result.sent_count else math.nan,
        reordered=result.reordered,
        delay_mean_ms=mean_ms,
        delay_std_ms=std_ms,
        delay_min_ms=delays[0] if delays else math.nan,
        delay_p50_ms=_percentile(delays, 0.5),
        delay_p99_ms=_percentile(delays, 0.99),
        delay_max_ms=delays[-1] if delays else math.nan,
    )


@dataclass(frozen=True)
class ProbePlan:
    """A probe stream: how many, how far apart, how big."""

    count: int = 1000
    interval_ms: float = 20.0
    payload_bytes: int = 64

    @property
    def frame_bytes(self) -> int:
        """Bytes of one probe on the Ethernet wire (what netem's rate counts)."""
        return self.payload_bytes + WIRE_OVERHEAD_BYTES


@dataclass(frozen=True)
class Expected:
    """What a profile should show for a probe plan (delays in ms, loss in %)."""

    delay_mean_ms: float
    delay_std_ms: float
    loss_pct: float
    loss_lo_pct: float  # 99% interval of the measured loss
    loss_hi_pct: float
    reordering_expected: bool
    machinery_std_ms: float = 0.0  # the baseline's spread (see fidelity_checks)


def _simulate(params: LinkParams, plan: ProbePlan, seed: int) -> tuple[list[float], int]:
    """Run netem's model over the probe stream: (delays in ms, probes not delivered intact)."""
    from topology.netem_model import NetemQueue

    queue = NetemQueue(params, seed=seed)
    step_ns = int(plan.interval_ms * 1e6)
    frame = bytes(plan.frame_bytes)
    delays, missing = [], 0
    for seq in range(plan.count):
        now = seq * step_ns
        queue.pop_due(now)  # frames that left before this probe free their queue slots
        # A corrupted copy fails its checksum at the receiver; a duplicate adds no new sample.
        intact = [d for d in queue.enqueue(now, frame) if d.outcome == "queued" and d.corrupt_at is None]
        if intact:
            delays.append(min(d.time_to_send_ns for d in intact) / 1e6 - now / 1e6)
        else:
            missing += 1
    return delays, missing


def gilbert_elliott_loss_distribution(params: LinkParams, n: int) -> list[float]:
    """Exact distribution of probes lost out of n under netem's Gilbert-Elliott chain.

    Per probe, as sch_netem does it: in the good state, move to bad with p, then
    lose with 1-k; in the bad state, move to good with r, then lose with 1-h.
    Corruption (independent) also loses a probe (its checksum fails). A duplicate
    rescues a lost probe only at duplicate x loss rates, ignored here. The chain
    starts in the good state, as netem's does.
    """
    ge = params.loss_ge
    p, r = ge.p_pct / 100, ge.r_pct / 100
    drop_good, drop_bad = (_with_corruption(params, pct / 100) for pct in (ge.good_loss_pct, ge.bad_loss_pct))
    # The loss draw follows the transition but uses the probability of the state the probe
    # found (netem draws it inside that state's branch).
    return _chain_loss_distribution([[1 - p, p], [r, 1 - r]], [[drop_good] * 2, [drop_bad] * 2], n)


def four_state_loss_distribution(params: LinkParams, n: int) -> list[float]:
    """Exact distribution of probes lost out of n under netem's 4-state loss chain (loss_state).

    Per probe, as sch_netem's loss_4state() does it: the chain moves (FourStateLoss.transitions()),
    and the probe is lost where it lands in state 3 (a loss in a burst) or 4 (an isolated loss).
    A probe that passes the chain may still be corrupted. The chain starts in state 1, as netem's does.
    """
    corrupt = _with_corruption(params, 0.0)
    drop_on_landing = [corrupt, corrupt, 1.0, 1.0]  # states 1..4
    return _chain_loss_distribution(params.loss_state.transitions(), [drop_on_landing] * 4, n)


def _with_corruption(params: LinkParams, loss: float) -> float:
    """A probe's drop probability: lost (probability loss) or, if not, corrupted (its checksum fails)."""
    return 1 - (1 - loss) * (1 - params.corrupt_pct / 100)


def _chain_loss_distribution(transitions: list[list[float]], drop: list[list[float]], n: int) -> list[float]:
    """P(k of n packets lost) under a Markov chain starting in state 0: each packet moves it i -> j with
    transitions[i][j] and is lost with drop[i][j]."""
    import numpy as np

    move, lose = np.asarray(transitions, dtype=float), np.asarray(drop, dtype=float)
    mass = np.zeros((len(move), n + 1))  # (state, losses so far)
    mass[0, 0] = 1.0
    kept, lost = (move * (1 - lose)).T, (move * lose).T
    for _ in range(n):
        shifted = np.zeros_like(mass)
        shifted[:, 1:] = mass[:, :-1]  # one more loss
        mass = kept @ mass + lost @ shifted
    return list(mass.sum(axis=0))


def _interval_of(dist: list[float], level: float) -> tuple[int, int]:
    """Smallest [lo, hi] with P(X < lo) and P(X > hi) each at most (1-level)/2."""
    tail = (1 - level) / 2
    cdf, lo, hi = 0.0, None, len(dist) - 1
    for k, q in enumerate(dist):
        if lo is None and cdf + q > tail:
            lo = k
        cdf += q
        if cdf >= 1 - tail:
            hi = k
            break
    return lo or 0, hi


def _binomial_interval(n: int, p: float, level: float) -> tuple[int, int]:
    """Smallest [lo, hi] loss counts with P(X < lo) and P(X > hi) each at most (1-level)/2."""
    if p <= 0 or p >= 1:
        return (0, 0) if p <= 0 else (n, n)
    log_p, log_q = math.log(p), math.log1p(-p)
    pmf = [
        math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * log_p + (n - k) * log_q)
        for k in range(n + 1)
    ]  # in logs: the binomial coefficient alone overflows a float
    return _interval_of(pmf, level)


def expected_stats(
    params: LinkParams, plan: ProbePlan, base_delay_ms: float = 0.0, base_std_ms: float = 0.0, seed: int = 1
) -> Expected:
    """What `params` should show for `plan`, on a path that itself adds base_delay_ms (mean)
    and base_std_ms (spread, independent of the link's) with the WAN unshaped."""
    # A long model run gives the expectation itself, not one more noisy sample of it.
    long_plan = ProbePlan(max(MODEL_PROBES, plan.count), plan.interval_ms, plan.payload_bytes)
    delays, _ = _simulate(params, long_plan, seed)
    model_mean_ms, model_std_ms = trimmed_mean_std(sorted(delays))
    # A loss model (Gilbert-Elliott, 4-state) loses in bursts: its count spreads far wider than a binomial's.
    chain = {"loss_ge": gilbert_elliott_loss_distribution, "loss_state": four_state_loss_distribution}
    model = next((f for name, f in chain.items() if getattr(params, name)), None)
    if not (model or params.loss_correlation_pct):
        p_drop = _with_corruption(params, params.loss_pct / 100)
        lo, hi = _binomial_interval(plan.count, p_drop, LOSS_INTERVAL)
        loss = 100 * p_drop
    elif model and not params.loss_correlation_pct:
        dist = model(params, plan.count)
        lo, hi = _interval_of(dist, LOSS_INTERVAL)
        loss = 100 * float(sum(k * q for k, q in enumerate(dist))) / plan.count
    else:
        runs = sorted(_simulate(params, plan, seed + k)[1] for k in range(MONTE_CARLO_RUNS))
        tail = (1 - LOSS_INTERVAL) / 2
        lo, hi = runs[int(tail * len(runs))], runs[min(len(runs) - 1, math.ceil((1 - tail) * len(runs)) - 1)]
        loss = 100 * statistics.fmean(runs) / plan.count
    return Expected(
        delay_mean_ms=model_mean_ms + base_delay_ms,
        delay_std_ms=math.hypot(model_std_ms, base_std_ms),
        loss_pct=loss,
        loss_lo_pct=100 * lo / plan.count,
        loss_hi_pct=100 * hi / plan.count,
        reordering_expected=bool(params.reorder_pct or (params.jitter_ms and not params.rate_mbit)),
        machinery_std_ms=base_std_ms,
    )


@dataclass(frozen=True)
class Check:
    """One fidelity check: name, configured/expected, measured, allowed range, verdict."""

    name: str
    expected: float
    measured: float
    lo: float
    hi: float

    @property
    def ok(self) -> bool:
        """Measured inside [lo, hi]."""
        return self.lo <= self.measured <= self.hi

    def describe(self) -> str:
        """'loss_pct 0.45 (allowed 0 .. 0.3)': a check in words, for logs and table rows."""
        return f"{self.name} {self.measured:.4g} (allowed {self.lo:.4g} .. {self.hi:.4g})"


def fidelity_checks(expected: Expected, measured: DirectionStats, starved: bool = False) -> list[Check]:
    """Delay mean, jitter, loss and reordering checks for one direction.

    starved: the path cannot carry the rate with headroom, so its timing is only coarsely judged:
    the mean within STARVED_DELAY_MEAN_TOL_FRAC, the spread not at all.
    """
    # The machinery's mean delay is measured before the run and drifts with host load;
    # its own spread (about 0.05 ms here, 0.2-0.8 ms under qemu TCG with the rate) is allowed on top.
    frac = STARVED_DELAY_MEAN_TOL_FRAC if starved else DELAY_MEAN_TOL_FRAC
    tol = max(frac * expected.delay_mean_ms, DELAY_MEAN_TOL_MS) + expected.machinery_std_ms
    checks = [
        Check(
            "delay_mean_ms",
            expected.delay_mean_ms,
            measured.delay_mean_ms,
            expected.delay_mean_ms - tol,
            expected.delay_mean_ms + tol,
        ),
        Check("loss_pct", expected.loss_pct, measured.loss_pct, expected.loss_lo_pct, expected.loss_hi_pct),
    ]
    link_std = math.sqrt(max(0.0, expected.delay_std_ms**2 - expected.machinery_std_ms**2))
    # A spread is judged only where the link's own is clearly above the machinery's
    # (wan-regional's 0.5 ms jitter is not, under qemu TCG) and above ~0.1 ms of host noise.
    measurable = link_std >= max(0.1, JITTER_MIN_SIGNAL_RATIO * expected.machinery_std_ms)
    if not starved and measurable:
        std_tol = JITTER_STD_TOL_FRAC * expected.delay_std_ms
        checks.append(
            Check(
                "delay_std_ms",
                expected.delay_std_ms,
                measured.delay_std_ms,
                expected.delay_std_ms - std_tol,
                expected.delay_std_ms + std_tol,
            )
        )
    if not expected.reordering_expected:
        checks.append(Check("reordered", 0, measured.reordered, 0, 0))
    return checks


def goodput_check(rate_mbit: float, goodput_mbit: float) -> Check:
    """TCP goodput on a lossless rated link against GOODPUT_MIN/MAX_FRAC of the rate.

    Goodput counts TCP payload; the rate counts Ethernet frames: a full frame of
    1514 B carries 1448 B of payload (with timestamps), so a perfect link gives
    95.6% of the rate and one that passes more than it should is caught above
    96.6% (read the goodput as the receiver counted it: `topology.iperf`).
    """
    return Check(
        "tcp_goodput_mbit", rate_mbit, goodput_mbit, GOODPUT_MIN_FRAC * rate_mbit, GOODPUT_MAX_FRAC * rate_mbit
    )
