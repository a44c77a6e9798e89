"""Coverage of experiments.analysis.confidence's intervals, by simulation.

Each test draws DATASETS synthetic experiments (synthetic.py: sessions of correlated requests, two variants
replaying the same requests, population percentiles and means known in closed form), computes one interval
per dataset, and asserts that among the datasets where it is reported the interval holds the truth in BAND of
them. Seeds are fixed: the figures below come out the same on every run. With 1000 datasets a 95% interval's
coverage is measured to +-0.7% (one standard error), so BAND is three standard errors either side of 95%.

Figures these tests measure (1000 datasets; coverage where reported, and how often reported). The default
shape: 5 sessions of 6-9 turns + 2 one-turn requests, n = 32-47 in 7 clusters; "25 sessions": n ~190, 27:
    percentile p50 of one variant        95.1%, always reported
    percentile p90 of one variant        never reported at the default shape; 25 sessions: 93.5%
    mean of one variant                  95.2%, always reported
    paired ratio p50                     96.0%, always reported
    paired ratio p90                     never reported at the default shape; 25 sessions: 93.5%
    paired ratio mean, sum               95.7%, always reported
    unpaired ratio mean, sum (variants replaying other requests) 96.6% (p50: 97.0%, a little wide; not asserted)
    repeats: ratio (geometric mean of 3 repeats' p50 ratios) 94.3%, mean of 3 repeats' means 94.0%
    share under a threshold (SLO attainment): Wilson 73.9%; clustered_proportion_interval 96.5%;
        Wilson over independent trials (n = 40) 95.6%
    with 15% of variant x's requests failed (+inf): p50 95.1%, paired ratio p50 96.0%; a mean: None
    today's estimator (requests independent, percentile bootstrap): median 67.2%, p90 69.7%; its unpaired
        ratio of means (and sums) 79.9%, of medians 88.1%.
With other seeds (2000 datasets) p90's and its paired ratio's coverage at 25 sessions was 94.1-94.5%.
Other correlation structures at the default shape (a session level only, 80% of the variance; an AR(1)
only, phi 0.7; independent requests): every interval above covered 94-96%; at 25 sessions p90's and its
ratio's 93.7-94.7%.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
from synthetic import Workload, draw, lag1, true_mean, true_quantile

from experiments.analysis import confidence as ci
from experiments.analysis.confidence import Interval, Sample

DATASETS = 1000
BAND = (0.93, 0.97)
DEFAULT = Workload()
LARGE = Workload(sessions=25)  # ~190 requests: enough for p90 (quantile_supported)


@functools.cache
def datasets(w: Workload, count: int = DATASETS, first_seed: int = 0) -> tuple[list[Sample], ...]:
    return tuple(draw(w, np.random.default_rng(seed)) for seed in range(first_seed, first_seed + count))


def coverage(intervals: list[Interval | None], truths) -> tuple[float, float]:
    """(share of reported intervals that hold their truth, share reported); truths: one per interval or a number."""
    truths = truths if isinstance(truths, list) else [truths] * len(intervals)
    held = [lo <= t <= hi for c, t in zip(intervals, truths) if c is not None for lo, hi in [c]]
    return (sum(held) / len(held) if held else math.nan), len(held) / len(intervals)


def in_band(cov: float) -> bool:
    return BAND[0] <= cov <= BAND[1]


def iid_percentile_ci(xs: np.ndarray, p: float, resamples: int = 500, seed: int = 20261201) -> Interval:
    """Today's estimator (confidence.percentile_cis before this change): requests resampled as independent,
    the 2.5 and 97.5 percentiles of the resampled percentile. 500 resamples here (1000 in the summary)."""
    rng = np.random.default_rng(seed)
    boot = xs[rng.integers(0, len(xs), size=(resamples, len(xs)))]  # (resamples, n)
    lo, hi = np.percentile(np.percentile(boot, p, axis=1), [2.5, 97.5])
    return (float(lo), float(hi))


def iid_unpaired_ratio_ci(xs: np.ndarray, ys: np.ndarray, stat, resamples: int = 500, seed: int = 20261201):
    """Today's ratio estimator (confidence.ratio_ci): each variant resampled on its own, requests independent."""
    rng = np.random.default_rng(seed)
    num = stat(xs[rng.integers(0, len(xs), size=(resamples, len(xs)))])
    den = stat(ys[rng.integers(0, len(ys), size=(resamples, len(ys)))])
    lo, hi = np.percentile(num / den, [2.5, 97.5])
    return (float(lo), float(hi))


def ratio_truth(w: Workload, stat: str) -> float:
    if stat in ("mean", "sum"):  # paired: the same requests, so a ratio of sums is a ratio of means
        return true_mean(w, 0) / true_mean(w, 1)
    p = float(stat[1:])
    return true_quantile(w, 0, p) / true_quantile(w, 1, p)


def test_synthetic_sessions_are_as_correlated_as_the_measured_runs():
    # The stored run: lag-1 autocorrelation of TTFT in request order 0.46; the brief's runs 0.43-0.47.
    data = datasets(DEFAULT)
    assert 0.42 <= np.mean([lag1(x.values) for x, _ in data]) <= 0.48
    assert 0.55 <= np.mean([np.corrcoef(np.log(x.values), np.log(y.values))[0, 1] for x, y in data]) <= 0.67
    assert all(32 <= x.n <= 47 and x.codes()[1] == 7 for x, _ in data)


def test_todays_iid_bootstrap_misses_a_clustered_median_and_ratio():
    data = datasets(DEFAULT)
    cov, _ = coverage([iid_percentile_ci(x.values, 50) for x, _ in data], true_quantile(DEFAULT, 0, 50))
    assert cov < BAND[0]  # 67%: the sessions make 40 requests worth far fewer
    means = [iid_unpaired_ratio_ci(x.values, y.values, lambda a: a.mean(axis=1)) for x, y in data]
    assert coverage(means, ratio_truth(DEFAULT, "mean"))[0] < BAND[0]  # 80%


def test_a_median_interval_covers_and_is_always_reported_at_the_default_shape():
    cov, reported = coverage([ci.quantile_interval(x, 50) for x, _ in datasets(DEFAULT)], true_quantile(DEFAULT, 0, 50))
    assert in_band(cov) and reported == 1.0


def test_p90_is_not_reported_at_the_default_shape_and_covers_where_it_is():
    assert all(ci.quantile_interval(x, 90) is None for x, _ in datasets(DEFAULT))
    cov, reported = coverage([ci.quantile_interval(x, 90) for x, _ in datasets(LARGE)], true_quantile(LARGE, 0, 90))
    assert in_band(cov) and reported == 1.0


def test_a_mean_interval_covers():
    cov, reported = coverage([ci.mean_interval(x) for x, _ in datasets(DEFAULT)], true_mean(DEFAULT, 0))
    assert in_band(cov) and reported == 1.0


@pytest.mark.parametrize("stat", ["p50", "mean", "sum"])
def test_a_paired_ratio_interval_covers_at_the_default_shape(stat):
    data = datasets(DEFAULT)
    cov, reported = coverage([ci.ratio_interval(x, y, stat) for x, y in data], ratio_truth(DEFAULT, stat))
    assert in_band(cov) and reported == 1.0


def test_a_paired_p90_ratio_is_not_judged_at_the_default_shape_and_covers_with_25_sessions():
    assert all(ci.ratio_interval(x, y, "p90") is None for x, y in datasets(DEFAULT))
    data = datasets(LARGE)
    cov, reported = coverage([ci.ratio_interval(x, y, "p90") for x, y in data], ratio_truth(LARGE, "p90"))
    assert in_band(cov) and reported == 1.0


@pytest.mark.parametrize("stat", ["mean", "sum"])
def test_an_unpaired_ratio_covers_variants_that_replay_different_requests(stat):
    xs = [x for x, _ in datasets(DEFAULT)]
    ys = [y for _, y in datasets(DEFAULT, first_seed=10**6)]  # other workloads: values independent, other sizes
    # A sum grows with its requests: the ratio of two sums over n_x and n_y requests is n_x/n_y times the means'.
    truths = [ratio_truth(DEFAULT, "mean") * (x.n / y.n if stat == "sum" else 1) for x, y in zip(xs, ys)]
    cov, reported = coverage([ci.ratio_interval(x, y, stat, paired=False) for x, y in zip(xs, ys)], truths)
    assert in_band(cov) and reported == 1.0


def test_pairing_narrows_a_ratio_interval():
    # Two variants' values correlate 0.6 (shared request and session effects): pairing cancels that part.
    widths = [
        [math.log(c[1] / c[0]) for c in (ci.ratio_interval(x, y, "p50", paired=p) for p in (True, False))]
        for x, y in datasets(DEFAULT)
    ]
    paired, unpaired = np.mean(widths, axis=0)
    assert paired < 0.8 * unpaired


def test_wilson_covers_independent_trials():
    rng = np.random.default_rng(7)
    shares = rng.uniform(0.5, 0.95, DATASETS)  # Wilson's coverage wavers with the share: averaged over a range
    hits = rng.binomial(40, shares)
    cov, _ = coverage([ci.proportion_interval(int(k), 40) for k in hits], list(shares))
    assert in_band(cov)


def test_wilson_misses_a_clustered_share_and_the_clustered_interval_covers():
    # The share of a variant's requests under a threshold (an SLO's attainment), the true share drawn per dataset.
    rng = np.random.default_rng(11)
    shares = list(rng.uniform(0.5, 0.95, DATASETS))
    wilson, clustered = [], []
    for (x, _), share in zip(datasets(DEFAULT), shares):
        ok = x.values <= true_quantile(DEFAULT, 0, 100 * share)
        wilson.append(ci.proportion_interval(int(ok.sum()), x.n))
        clustered.append(ci.clustered_proportion_interval(Sample(ok.astype(float), x.clusters, x.keys)))
    assert coverage(wilson, shares)[0] < BAND[0]  # 74%
    assert in_band(coverage(clustered, shares)[0])


def test_a_repeats_ratio_interval_covers():
    # A sweep point repeated 3 times, each repeat reporting its paired p50 ratio.
    data = datasets(DEFAULT, 3 * DATASETS, first_seed=20_000)
    ratios = [ci._quantile(x.values, 50) / ci._quantile(y.values, 50) for x, y in data]
    intervals = [ci.repeats_ratio_interval(ratios[k : k + 3]) for k in range(0, len(ratios), 3)]
    assert in_band(coverage(intervals, ratio_truth(DEFAULT, "p50"))[0])


def test_a_repeats_mean_interval_covers():
    data = datasets(DEFAULT, 3 * DATASETS, first_seed=20_000)
    means = [float(x.values.mean()) for x, _ in data]
    intervals = [ci.repeats_mean_interval(means[k : k + 3]) for k in range(0, len(means), 3)]
    assert in_band(coverage(intervals, true_mean(DEFAULT, 0))[0])


def test_failed_requests_keep_percentile_intervals_covering_and_void_means():
    # A request of variant x slower than its population's p85 times out: recorded as +inf (15% fail).
    timeout = true_quantile(DEFAULT, 0, 85)
    failed = [
        (Sample(np.where(x.values > timeout, np.inf, x.values), x.clusters, x.keys), y) for x, y in datasets(DEFAULT)
    ]
    assert in_band(coverage([ci.quantile_interval(x, 50) for x, _ in failed], true_quantile(DEFAULT, 0, 50))[0])
    assert in_band(coverage([ci.ratio_interval(x, y, "p50") for x, y in failed], ratio_truth(DEFAULT, "p50"))[0])
    assert all(ci.mean_interval(x) is None for x, _ in failed if np.isinf(x.values).any())
