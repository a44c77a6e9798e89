"""Synthetic requests shaped like the default experiment's, for the coverage tests of analysis.confidence.

A workload is G sessions of 6-9 turns plus a few one-turn requests; every variant replays the same requests.
A request's log value = the variant's log median + a part every variant shares (the request's and its
session's own effect: prompt, prefix hit) + a part of the variant's own (its queue, its links). Each part is
a session effect (share `session_share` of its variance) plus an AR(1) over the session's turns (coefficient
`phi`), so within a variant the values are lognormal with sd sqrt(shared_sd^2 + variant_sd^2) on the log
scale, and their population percentiles and means are known in closed form (`true_quantile`, `true_mean`).

The defaults are set close to a stored pdd-vs-baselines run (colocated: log-sd of TTFT 0.67; lag-1
autocorrelation 0.46, 0.51 of the logs, in request-id order, where a session's turns follow one another): in
that order a dataset of the default shape has lag-1 autocorrelation 0.46 (0.49 of the logs) on average; two
variants' log values correlate 0.61 (so pairing narrows a ratio's interval, as it did on the real runs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

from experiments.analysis.confidence import Sample


@dataclass(frozen=True)
class Workload:
    """sessions: multi-turn sessions; turns: (fewest, most) turns of one, drawn uniformly per session;
    singles: one-turn requests (their own clusters); shared_sd: log-sd of the effect all variants share;
    variant_sd: log-sd of each variant's own effect; session_share: share of each effect's variance that is a
    per-session level (the rest moves along the turns); phi: AR(1) coefficient between consecutive turns;
    log_medians: each variant's population median, log scale."""

    sessions: int = 5
    turns: tuple[int, int] = (6, 9)
    singles: int = 2
    shared_sd: float = 0.45
    variant_sd: tuple[float, ...] = (0.40, 0.30)
    session_share: float = 0.4
    phi: float = 0.5
    log_medians: tuple[float, ...] = (0.26, 0.0)  # the first variant's median 30% above the second's

    def sigma(self, variant: int) -> float:
        """Log-scale sd of one variant's values."""
        return math.hypot(self.shared_sd, self.variant_sd[variant])


def true_quantile(w: Workload, variant: int, p: float) -> float:
    """The population's p-th percentile (0..100) of a variant."""
    return math.exp(w.log_medians[variant] + stats.norm.ppf(p / 100) * w.sigma(variant))


def true_mean(w: Workload, variant: int) -> float:
    return math.exp(w.log_medians[variant] + w.sigma(variant) ** 2 / 2)


def _effect(rng: np.random.Generator, sd: float, w: Workload, turns: np.ndarray) -> np.ndarray:
    """A session level plus a stationary AR(1) along each session's turns: (G, T) log-scale effects."""
    g, t = turns.shape
    level = rng.normal(0, sd * math.sqrt(w.session_share), (g, 1))
    z = rng.normal(0, sd * math.sqrt(1 - w.session_share), (g, t))
    walk = np.empty((g, t))
    walk[:, 0] = z[:, 0]
    for k in range(1, t):
        walk[:, k] = w.phi * walk[:, k - 1] + math.sqrt(1 - w.phi**2) * z[:, k]
    return level + walk


def draw(w: Workload, rng: np.random.Generator) -> list[Sample]:
    """One dataset: a Sample per variant over the same requests (keys 0..n-1 in request order, a session's turns
    together; clusters 0..G-1)."""
    lens = np.concatenate([rng.integers(w.turns[0], w.turns[1] + 1, w.sessions), np.ones(w.singles, dtype=int)])
    turns = np.arange(max(w.turns[1], 1))[None, :] < lens[:, None]  # (G, T) the turns each session has
    shared = _effect(rng, w.shared_sd, w, turns)
    clusters = np.repeat(np.arange(len(lens)), lens)
    keys = np.arange(len(clusters))
    out = []
    for v, mu in enumerate(w.log_medians):
        logs = mu + shared + _effect(rng, w.variant_sd[v], w, turns)
        out.append(Sample(np.exp(logs[turns]), clusters, keys))
    return out


def lag1(values: np.ndarray) -> float:
    """Lag-1 autocorrelation of a series."""
    d = values - values.mean()
    return float((d[1:] * d[:-1]).sum() / (d * d).sum())
