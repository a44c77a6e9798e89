"""The interval code of experiments.analysis.confidence against cases whose truth is known."""

import math

import numpy as np
import pytest

from experiments.analysis import confidence
from experiments.analysis.confidence import mean_ci, percentile_cis, ratio_ci, t975, verdict

SEEDS = 300  # samples drawn per coverage test: a 95% interval's coverage is then known to about +-2.5%


def coverage(hits: list[bool]) -> float:
    return sum(hits) / len(hits)


def test_the_t_quantiles_are_students():
    assert t975(1) == pytest.approx(12.706) and t975(9) == pytest.approx(2.262) and t975(30) == pytest.approx(2.042)
    assert t975(1000) == 1.96
    with pytest.raises(ValueError):
        t975(0)


def test_a_bootstrap_median_interval_covers_the_true_median_about_95_percent_of_the_time():
    # Exponential(1): the true median is ln 2. n=60 requests, as in one variant of a run.
    hits = []
    for seed in range(SEEDS):
        xs = np.random.default_rng(seed).exponential(1.0, 60)
        lo, hi = percentile_cis(xs, [50], resamples=500, seed=seed)[50]
        hits.append(lo <= math.log(2) <= hi)
    assert 0.90 <= coverage(hits) <= 0.99


def test_the_t_interval_of_a_mean_covers_the_true_mean_about_95_percent_of_the_time():
    hits = []
    for seed in range(SEEDS):
        xs = np.random.default_rng(seed).normal(10.0, 3.0, 5)  # five repeats
        lo, hi = mean_ci(list(xs))
        hits.append(lo <= 10.0 <= hi)
    assert 0.91 <= coverage(hits) <= 0.99


def test_a_ratio_interval_contains_the_true_ratio_most_of_the_time_and_judges_it():
    # Medians of two lognormal samples: the true ratio of medians is exp(0.5 - 0) = 1.6487.
    truth = math.exp(0.5)
    hits, verdicts = [], []
    for seed in range(100):
        rng = np.random.default_rng(seed)
        xs, ys = rng.lognormal(0.5, 0.4, 80), rng.lognormal(0.0, 0.4, 80)
        ci = ratio_ci(xs, ys, confidence.median_of_rows, resamples=500, seed=seed)
        hits.append(ci[0] <= truth <= ci[1])
        verdicts.append(verdict(ci))
    assert coverage(hits) >= 0.88
    assert verdicts.count("higher") >= 95  # a 65% difference at n=80 is plain


def test_equal_distributions_are_mostly_no_significant_difference():
    verdicts = []
    for seed in range(100):
        rng = np.random.default_rng(seed)
        ci = ratio_ci(rng.exponential(1, 50), rng.exponential(1, 50), confidence.median_of_rows, 500, seed)
        verdicts.append(verdict(ci))
    assert verdicts.count("no significant difference") >= 88


def test_small_samples_and_zero_denominators_give_no_interval():
    assert mean_ci([1.0]) is None and percentile_cis([3.0], [50]) is None
    assert ratio_ci([1.0, 2.0], [5.0], confidence.median_of_rows) is None
    assert ratio_ci([1.0, 2.0], [0.0, 0.0], confidence.sum_of_rows) is None
    assert verdict(None) == "not judged"


def test_the_same_values_give_the_same_intervals():
    xs = list(np.random.default_rng(3).exponential(1, 40))
    assert percentile_cis(xs, [50, 90]) == percentile_cis(xs, [50, 90])


def test_verdicts_and_overlap():
    assert verdict((0.5, 0.9)) == "lower" and verdict((1.1, 2.0)) == "higher"
    assert verdict((0.9, 1.1)) == "no significant difference"
    assert confidence.overlap((1, 2), (2, 3)) is True and confidence.overlap((1, 2), (2.5, 3)) is False
