"""The interval code of experiments.analysis.confidence against cases whose truth is known (coverage by
simulation: test_coverage.py)."""

import math

import numpy as np
import pytest
from scipy import stats

from experiments.analysis import confidence
from experiments.analysis.confidence import (
    Sample,
    mean_interval,
    proportion_interval,
    quantile_interval,
    quantile_supported,
    ratio_interval,
    repeats_mean_interval,
    repeats_ratio_interval,
    verdict,
)

SEEDS = 300  # samples drawn per coverage test of the previous estimator: its coverage known to about +-2.5%


def coverage(hits: list[bool]) -> float:
    return sum(hits) / len(hits)


def sessions(seed: int, sessions: int = 5, scale: float = 1.0) -> Sample:
    """A small clustered sample: sessions of 6-9 lognormal values sharing a session level, plus two singletons."""
    rng = np.random.default_rng(seed)
    lens = [*rng.integers(6, 10, sessions), 1, 1]
    clusters = np.repeat([f"s{i:02d}" for i in range(len(lens))], lens)
    levels = np.repeat(rng.normal(0, 0.4, len(lens)), lens)
    values = scale * np.exp(levels + rng.normal(0, 0.4, len(clusters)))
    return Sample(values, clusters, np.array([f"r{i:04d}" for i in range(len(clusters))]))


# --- t, Wilson: scipy's, checked against textbook values --------------------------------------------------------


def test_the_t_quantiles_are_scipys_for_every_degree_of_freedom():
    t975 = confidence.t_quantile
    for df in range(1, 201):
        assert t975(df) == pytest.approx(stats.t.ppf(0.975, df), rel=1e-12)
    # Textbook two-sided 95% values.
    assert t975(1) == pytest.approx(12.706, abs=5e-4) and t975(9) == pytest.approx(2.262, abs=5e-4)
    assert t975(30) == pytest.approx(2.042, abs=5e-4) and t975(100) == pytest.approx(1.984, abs=5e-4)
    assert t975(1000) > 1.96  # no normal fallback past a table's end
    assert confidence.t_quantile(3.5) == pytest.approx(stats.t.ppf(0.975, 3.5))  # fractional df (effective clusters)
    with pytest.raises(ValueError):
        t975(0)


def test_wilson_matches_newcombes_worked_examples():
    # Newcombe (1998), Statistics in Medicine 17:857, table I, method 3 (Wilson score without continuity correction).
    assert proportion_interval(81, 263) == pytest.approx((0.2553, 0.3662), abs=1e-4)
    assert proportion_interval(15, 148) == pytest.approx((0.0624, 0.1605), abs=1e-4)
    assert proportion_interval(0, 20) == pytest.approx((0.0, 0.1611), abs=1e-4)
    assert proportion_interval(1, 29) == pytest.approx((0.0061, 0.1718), abs=1e-4)
    with pytest.raises(ValueError):
        proportion_interval(3, 2)


def test_a_clustered_share_is_wilsons_when_every_request_is_its_own_cluster_and_wider_when_not():
    ok = np.array([1.0] * 30 + [0.0] * 10)
    lone = confidence.clustered_proportion_interval(Sample.independent(ok))
    assert lone[0] == pytest.approx(proportion_interval(30, 40)[0], abs=0.01)  # t(39) in place of 1.96
    grouped = confidence.clustered_proportion_interval(Sample(ok, np.repeat(np.arange(8), 5), np.arange(40)))
    assert grouped[0] < lone[0] and grouped[1] > lone[1]  # successes come five by five: fewer independent trials


# --- one variant -------------------------------------------------------------------------------------------------


def test_percentiles_interpolate_as_numpy_does_and_rank_failures_last():
    xs = np.random.default_rng(1).exponential(1, 37)
    for p in (0, 10, 50, 90, 99, 100):
        assert confidence._quantile(xs, p) == pytest.approx(np.percentile(xs, p))
    failed = np.array([1.0, 2.0, math.inf, math.inf])
    assert confidence._quantile(failed, 0) == 1.0 and confidence._quantile(failed, 50) == math.inf
    assert confidence._quantile(failed, 100) == math.inf  # numpy gives nan between two infs
    weights = np.array([[2, 1, 1, 0], [0, 1, 1, 1]])  # rows: 1, 1, 2, inf and 2, inf, inf
    assert confidence._weighted_quantiles(failed, weights, 50).tolist() == [1.5, math.inf]


def test_deleted_cluster_quantiles_equal_the_weighted_ones_bit_for_bit():
    rng = np.random.default_rng(3)
    for n, g in ((40, 7), (300, 60), (500, 500)):
        values = np.round(rng.exponential(1, n), 1)  # ties
        values[rng.integers(0, n, n // 10)] = math.inf  # failed requests
        codes = np.unique(rng.integers(0, g, n), return_inverse=True)[1]  # clusters interleaved, as sessions
        g = int(codes.max()) + 1
        for p in (0, 1, 50, 90, 99, 99.9, 100):
            fast = confidence._deleted_quantiles(values, codes, g, p)
            slow = confidence._weighted_quantiles(values, confidence._deleted(codes, g), p)
            assert fast.tobytes() == slow.tobytes(), (n, g, p)


def test_which_percentiles_a_sample_supports():
    assert quantile_supported(30, 7, 50) and not quantile_supported(29, 7, 50)  # the median at the default shape
    assert not quantile_supported(42, 7, 90) and not quantile_supported(42, 7, 99)  # a p99 over 42 requests
    assert quantile_supported(178, 7, 90) and not quantile_supported(177, 7, 90)
    assert not quantile_supported(1000, 1, 50) and not quantile_supported(100, 7, 0)
    assert quantile_interval(sessions(0), 90) is None and quantile_interval(sessions(0), 99) is None


def test_a_median_interval_holds_the_sample_median_and_widens_with_clustering():
    s = sessions(2)
    lo, hi = quantile_interval(s, 50)
    assert lo < np.median(s.values) < hi
    lone = quantile_interval(Sample.independent(s.values), 50)
    assert hi - lo > lone[1] - lone[0]


def test_a_percentile_over_failed_requests_has_an_infinite_end():
    s = sessions(3)
    worst = np.argsort(s.values)[-int(0.45 * s.n) :]  # 45% fail: the median is finite, its upper end may not be
    failed = Sample(np.where(np.isin(np.arange(s.n), worst), math.inf, s.values), s.clusters, s.keys)
    lo, hi = quantile_interval(failed, 50)
    assert math.isfinite(lo) and hi == math.inf
    most = Sample(np.where(s.values > np.percentile(s.values, 20), math.inf, s.values), s.clusters, s.keys)
    assert quantile_interval(most, 50) == (math.inf, math.inf)  # 80% failed: the median is a failure


def test_a_mean_interval_is_none_over_a_failure_or_a_single_cluster():
    s = sessions(4)
    lo, hi = mean_interval(s)
    assert lo < s.values.mean() < hi and lo > 0
    assert mean_interval(Sample(np.append(s.values, math.inf), np.append(s.clusters, "x"), np.arange(s.n + 1))) is None
    assert mean_interval(Sample(s.values, np.zeros(s.n), s.keys)) is None
    assert mean_interval(Sample.independent([-1.0, 1.0, 0.5, -0.5]))[0] < 0  # a mean <= 0: on the plain scale


def test_a_sample_rejects_mismatched_lengths_and_nan():
    with pytest.raises(ValueError):
        Sample(np.ones(3), np.zeros(2), np.arange(3))
    with pytest.raises(ValueError):
        Sample(np.array([1.0, math.nan]), np.zeros(2), np.arange(2))


# --- two variants ------------------------------------------------------------------------------------------------


def test_a_ratio_interval_never_has_a_bound_at_or_below_zero():
    for seed in range(50):
        x, y = sessions(seed), sessions(seed + 1000, scale=0.01)  # tiny denominators, values near zero
        for stat in ("p50", "mean", "sum"):
            for paired in (True, False):
                ci = ratio_interval(x, y, stat, paired=paired)
                assert ci is not None and 0 < ci[0] <= ci[1] < math.inf


def test_a_paired_ratio_holds_its_estimate_and_is_symmetric_on_the_log_scale():
    x = sessions(5)
    y = Sample(x.values * np.exp(np.random.default_rng(6).normal(0, 0.2, x.n)) / 1.5, x.clusters, x.keys)
    for stat, point in (("p50", np.median(x.values) / np.median(y.values)), ("sum", x.values.sum() / y.values.sum())):
        lo, hi = ratio_interval(x, y, stat)
        assert lo < point < hi and math.log(hi / point) == pytest.approx(math.log(point / lo))
        back = ratio_interval(y, x, stat)
        assert back == pytest.approx((1 / hi, 1 / lo))
    assert verdict(ratio_interval(x, y, "mean")) == "higher"  # 50% higher, paired noise 20%


def test_pairing_follows_the_keys_not_the_order():
    x = sessions(7)
    y = Sample(x.values * 1.2, x.clusters, x.keys)
    order = np.random.default_rng(8).permutation(x.n)
    shuffled = Sample(y.values[order], y.clusters[order], y.keys[order])
    assert ratio_interval(x, shuffled, "p50") == pytest.approx(ratio_interval(x, y, "p50"))
    assert ratio_interval(x, y, "p50") == pytest.approx((1 / 1.2, 1 / 1.2))  # y's every request 20% slower
    other = Sample(y.values, y.clusters, np.char.add(y.keys.astype(str), "b"))  # other requests: not paired
    assert ratio_interval(x, other, "p50") == ratio_interval(x, y, "p50", paired=False)


def test_ratios_with_zeros_failures_or_too_few_clusters_are_not_judged():
    x = sessions(9)
    zeros = Sample(np.zeros(x.n), x.clusters, x.keys)
    assert ratio_interval(x, zeros, "sum") is None and ratio_interval(zeros, x, "mean") is None
    assert ratio_interval(x, zeros, "p50") is None
    failed = Sample(np.where(np.arange(x.n) == 0, math.inf, x.values), x.clusters, x.keys)
    assert ratio_interval(failed, x, "mean") is None and ratio_interval(failed, x, "p50") is not None
    one = Sample(x.values, np.zeros(x.n), x.keys)
    assert ratio_interval(one, one, "p50") is None
    assert ratio_interval(x, x, "p90") is None  # p90 unsupported at ~40 requests
    with pytest.raises(ValueError):
        ratio_interval(x, x, "p99")


def test_a_ratio_of_percentiles_over_failures_falls_back_to_both_variants_intervals():
    x = sessions(10)
    slow = np.argsort(x.values)[-int(0.45 * x.n) :]
    failed = Sample(np.where(np.isin(np.arange(x.n), slow), math.inf, x.values), x.clusters, x.keys)
    lo, hi = ratio_interval(failed, x, "p50")
    assert 0 < lo and hi == math.inf and verdict((lo, hi)) in ("higher", "no significant difference")


def test_the_same_values_give_the_same_intervals():
    x, y = sessions(11), sessions(12)
    assert ratio_interval(x, y, "p50") == ratio_interval(x, y, "p50") and mean_interval(x) == mean_interval(x)


# --- repeats -----------------------------------------------------------------------------------------------------


def test_repeats_intervals():
    assert repeats_mean_interval([110.0, 80.0, 140.0]) == pytest.approx((110 - 74.53, 110 + 74.53), abs=0.01)
    assert repeats_ratio_interval([2.0, 2.0, 2.0]) == pytest.approx((2.0, 2.0))
    lo, hi = repeats_ratio_interval([0.5, 2.0])
    assert lo * hi == pytest.approx(1.0) and 0 < lo  # geometric: symmetric about 1 on the log scale
    assert repeats_ratio_interval([1.0]) is None and repeats_ratio_interval([1.0, 0.0]) is None
    assert repeats_mean_interval([1.0, math.inf]) is None and repeats_mean_interval([1.0]) is None


def test_the_t_interval_of_a_mean_covers_the_true_mean_about_95_percent_of_the_time():
    hits = []
    for seed in range(SEEDS):
        xs = np.random.default_rng(seed).normal(10.0, 3.0, 5)  # five repeats
        lo, hi = repeats_mean_interval(list(xs))
        hits.append(lo <= 10.0 <= hi)
    assert 0.91 <= coverage(hits) <= 0.99


def test_verdicts_and_overlap():
    assert verdict((0.5, 0.9)) == "lower" and verdict((1.1, 2.0)) == "higher"
    assert verdict((0.9, 1.1)) == "no significant difference" and verdict(None) == "not judged"
    assert confidence.overlap((1, 2), (2, 3)) is True and confidence.overlap((1, 2), (2.5, 3)) is False


def test_the_std_intervals_cover_about_95_percent_for_normal_values():
    hits = ratio_hits = 0
    for seed in range(SEEDS):
        rng = np.random.default_rng(seed)
        a, b = rng.normal(100, 10, 30), rng.normal(100, 20, 30)
        lo, hi = confidence.std_interval(a)
        hits += lo <= 10 <= hi
        lo, hi = confidence.std_ratio_interval(a, b)
        ratio_hits += lo <= 0.5 <= hi
    assert 0.91 <= hits / SEEDS <= 0.98 and 0.91 <= ratio_hits / SEEDS <= 0.98
    assert confidence.std_interval([1.0] * 7) is None and confidence.std_ratio_interval([1.0] * 9, [2.0] * 9) is None


def test_a_std_whose_jackknife_deletes_all_the_spread_has_no_interval():
    # all but one value equal: leaving the odd one out has std 0, log(0) made the interval (nan, nan)
    one_apart = [1.0] * 9 + [5.0]
    assert confidence.std_interval(one_apart) is None
    assert confidence.std_ratio_interval(one_apart, list(range(10))) is None
