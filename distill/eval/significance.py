"""Paired significance tests of two runs' per-query scores (two-sided).

Both tests compare the per-query values of a run with those of a baseline over the queries they share:
the paired t-test (:func:`paired_t_test`) and the paired randomisation test (:func:`randomization_test`,
Fisher's sign-flip permutation test of the mean difference).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np

Test = Literal["t", "randomization"]
TESTS: tuple[Test, ...] = ("t", "randomization")
ALPHA = 0.05
"""The significance level marked in reports."""
PERMUTATIONS = 10_000
"""Default number of random sign assignments of :func:`randomization_test`."""
SEED = 0
"""Default seed of :func:`randomization_test`."""


@dataclass(frozen=True)
class Comparison:
    """A run against a baseline on one metric, over the queries both have values for."""

    difference: float
    """Mean of run − baseline over the shared queries, in the values' units (e.g. nDCG@10 × 100)."""
    p_value: float
    """Two-sided p-value; NaN where fewer than two queries are shared."""
    queries: int
    """Number of shared queries."""

    @property
    def significant(self) -> bool:
        return bool(self.p_value < ALPHA)


def paired_t_test(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sided p-value of the paired t-test (:func:`scipy.stats.ttest_rel`) of ``a`` against ``b``.

    Args:
        a: per-query values, shape ``(n_queries,)``.
        b: the other run's values, paired with ``a`` by position.

    Returns 1.0 where all differences are zero (the t statistic is 0/0 there), 0.0 where they are all one other
    value (the statistic is infinite: no spread, for the t-test's normal model; see :func:`randomization_test` for a
    test without one), and NaN for fewer than two queries or where a value is not finite.
    """
    from scipy.stats import ttest_rel

    diff = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    if len(diff) < 2 or not np.isfinite(diff).all():
        return float("nan")
    if np.all(diff == diff[0]):
        return 1.0 if diff[0] == 0 else 0.0
    with warnings.catch_warnings():  # scipy's "precision loss" where the differences are nearly all one value
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(ttest_rel(a, b).pvalue)


def randomization_test(
    a: np.ndarray,
    b: np.ndarray,
    permutations: int = PERMUTATIONS,
    seed: int = SEED,
    chunk_elements: int = 1 << 22,
) -> float:
    """Two-sided p-value of the paired randomisation (sign-flip permutation) test of the mean difference.

    Under the null hypothesis each query's difference ``a - b`` is as likely to have the other sign; the
    p-value is the share of ``permutations`` random sign assignments whose |sum of differences| reaches the
    observed one, counting the observed assignment itself: ``(1 + hits) / (1 + permutations)``, so it is never 0.
    Deterministic for a given ``seed``.

    Args:
        a: per-query values, shape ``(n_queries,)``.
        b: the other run's values, paired with ``a`` by position.
        permutations: random sign assignments drawn.
        seed: seed of the numpy generator.
        chunk_elements: signs drawn at once (permutations × queries), bounding memory to 8 bytes each.

    Returns NaN for fewer than two queries, or where a value is not finite.
    """
    diff = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    if len(diff) < 2 or not np.isfinite(diff).all():
        return float("nan")
    observed = abs(diff.sum())
    tolerance = 1e-9 * max(1.0, observed)  # the identity assignment must count despite rounding
    rng = np.random.default_rng(seed)
    per_chunk = max(1, chunk_elements // len(diff))
    hits = 0
    for start in range(0, permutations, per_chunk):
        signs = rng.integers(0, 2, size=(min(per_chunk, permutations - start), len(diff))) * 2.0 - 1.0
        hits += int(np.count_nonzero(np.abs(signs @ diff) >= observed - tolerance))
    return (1 + hits) / (1 + permutations)


def compare(baseline: Mapping[str, float], run: Mapping[str, float], test: Test = "t") -> Comparison:
    """``run`` against ``baseline`` (qid -> value each) over their shared queries, with ``test``."""
    if test not in TESTS:
        raise ValueError(f"unknown test {test!r}; choose from {', '.join(TESTS)}")
    shared = sorted(baseline.keys() & run.keys())
    a = np.array([run[q] for q in shared], dtype=np.float64)
    b = np.array([baseline[q] for q in shared], dtype=np.float64)
    p = paired_t_test(a, b) if test == "t" else randomization_test(a, b)
    difference = float(np.mean(a - b)) if shared else float("nan")
    return Comparison(difference, p, len(shared))
