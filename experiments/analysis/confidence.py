"""95% confidence intervals for the testbed's metrics (pure functions over numbers).

Responsible for: the interval of a percentile (bootstrap over the sample), of
a mean (Student's t), of a ratio of two variants' statistics (bootstrap of
each sample, independently, then the ratio), of the mean of repeat-level
values (t over the repeats), and the verdict a reader needs: whether a ratio's
interval excludes 1.
Not responsible for: which metrics get intervals (experiments.metrics,
experiments.sweep).

Why bootstrap, and why here rather than scipy.stats.bootstrap: scipy is not
among the project's packages (numpy is), and the percentile bootstrap is a few
lines of numpy. Resampling uses a fixed seed, so analysing the same run twice
gives the same intervals. Percentiles use numpy's default (linear)
interpolation, the same as `metrics.percentile`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

LEVEL = 0.95
RESAMPLES = 1000  # bootstrap resamples: the interval's ends move by ~1% of its width between seeds
SEED = 20261201  # fixed: the same records give the same intervals
# Two-sided 97.5% quantiles of Student's t by degrees of freedom (1..30); above 30 the normal's 1.96 is within 4%.
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
_Z975 = 1.96

Interval = tuple[float, float]


def t975(df: int) -> float:
    """Student's t two-sided 95% quantile for df degrees of freedom (normal beyond the table)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    return _T975[df - 1] if df <= len(_T975) else _Z975


def mean_ci(xs: Sequence[float]) -> Interval | None:
    """The t interval of the mean; None under two values (no spread to judge by)."""
    n = len(xs)
    if n < 2:
        return None
    a = np.asarray(xs, dtype=float)
    half = t975(n - 1) * a.std(ddof=1) / math.sqrt(n)
    m = float(a.mean())
    return (m - half, m + half)


def _resample(a: np.ndarray, rng: np.random.Generator, resamples: int) -> np.ndarray:
    return a[rng.integers(0, len(a), size=(resamples, len(a)))]


def _ends(values: np.ndarray) -> Interval:
    lo, hi = np.percentile(values, [50 * (1 - LEVEL), 50 * (1 + LEVEL)])
    return (float(lo), float(hi))


def percentile_cis(
    xs: Sequence[float], ps: Sequence[float], resamples: int = RESAMPLES, seed: int = SEED
) -> dict[float, Interval] | None:
    """Percentile-bootstrap intervals of the sample's percentiles ps (0..100), from one set of resamples;
    None under two values."""
    if len(xs) < 2:
        return None
    boot = _resample(np.asarray(xs, dtype=float), np.random.default_rng(seed), resamples)
    per = np.percentile(boot, list(ps), axis=1)  # shape (len(ps), resamples)
    return {p: _ends(row) for p, row in zip(ps, per)}


def ratio_ci(
    xs: Sequence[float],
    ys: Sequence[float],
    stat: Callable[[np.ndarray], np.ndarray],
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> Interval | None:
    """Interval of stat(xs) / stat(ys), the two samples resampled independently (two variants' requests);
    stat maps a (resamples, n) array to (resamples,) values. None under two values on either side, or when
    the denominator's resamples touch zero."""
    if len(xs) < 2 or len(ys) < 2:
        return None
    rng = np.random.default_rng(seed)
    num = stat(_resample(np.asarray(xs, dtype=float), rng, resamples))
    den = stat(_resample(np.asarray(ys, dtype=float), rng, resamples))
    if np.any(den == 0):
        return None
    return _ends(num / den)


def median_of_rows(a: np.ndarray) -> np.ndarray:
    return np.percentile(a, 50, axis=1)


def p90_of_rows(a: np.ndarray) -> np.ndarray:
    return np.percentile(a, 90, axis=1)


def sum_of_rows(a: np.ndarray) -> np.ndarray:
    return a.sum(axis=1)


def verdict(ci: Interval | None) -> str:
    """'lower' or 'higher' where a ratio's interval excludes 1, else 'no significant difference'
    ('not judged' without an interval)."""
    if ci is None:
        return "not judged"
    if ci[1] < 1:
        return "lower"
    if ci[0] > 1:
        return "higher"
    return "no significant difference"


def overlap(a: Interval | None, b: Interval | None) -> bool | None:
    """Whether two intervals overlap (None if either is missing)."""
    if a is None or b is None:
        return None
    return a[0] <= b[1] and b[0] <= a[1]
