"""Across-seed statistics: means with Student-t 95% confidence intervals (used by reports and reproductions)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# Two-sided 95% Student-t quantiles t_{0.975, df} for df = 1..30 (standard tables, 3 decimals).
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
_Z975 = 1.959964


def t975(df: int) -> float:
    """t_{0.975, df}; past the table, the Cornish-Fisher expansion (within 1e-3 of the exact value at df > 30)."""
    if df < 1:
        raise ValueError("a confidence interval needs at least two seeds")
    if df <= len(_T975):
        return _T975[df - 1]
    z = _Z975
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


@dataclass(frozen=True)
class Estimate:
    """A mean over seeds with its 95% interval; ``low``/``high`` are None with a single seed."""
    mean: float
    low: float | None
    high: float | None
    n: int

    @property
    def half_width(self) -> float | None:
        if self.low is None or self.high is None:  # one seed: mean_ci sets neither
            return None
        return (self.high - self.low) / 2


def mean_ci(values: list[float]) -> Estimate:
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        raise ValueError("mean_ci needs at least one value")
    mean = float(arr.mean())
    if arr.size == 1:
        return Estimate(mean, None, None, 1)
    half = t975(arr.size - 1) * float(arr.std(ddof=1)) / math.sqrt(arr.size)
    return Estimate(mean, mean - half, mean + half, int(arr.size))


def paired_p_value(differences: list[float]) -> float:
    """Two-sided p-value of Student's t-test that paired differences have mean 0. One difference has no spread to
    test against: 1.0. Differences that do not vary (scipy's t is undefined there) are the limit of a vanishing spread:
    0.0 where they are all the same non-zero value, 1.0 where all are 0."""
    from scipy import stats

    arr = np.asarray(differences, dtype=np.float64)
    if arr.size < 2:
        return 1.0
    if float(arr.std(ddof=1)) == 0.0:
        return 1.0 if float(arr[0]) == 0.0 else 0.0
    return float(stats.ttest_1samp(arr, 0.0).pvalue)


def holm(p_values: dict[str, float]) -> dict[str, float]:
    """Holm's step-down adjusted p-values (family-wise error over the given tests): the i-th smallest of m is
    multiplied by m - i, made monotone, capped at 1."""
    order = sorted(p_values, key=lambda key: p_values[key])
    adjusted: dict[str, float] = {}
    running = 0.0
    for i, key in enumerate(order):
        running = max(running, min(1.0, (len(order) - i) * p_values[key]))
        adjusted[key] = running
    return adjusted


def simultaneous_ci(values: list[float], comparisons: int) -> Estimate:
    """A mean with its Bonferroni interval: 95% jointly over ``comparisons`` intervals (each at 1 - 0.05 /
    comparisons). Student-t's quantile comes from scipy there: the table above holds only the 95% one."""
    from scipy import stats

    arr = np.asarray(values, dtype=np.float64)
    mean = float(arr.mean())
    if arr.size < 2:
        return Estimate(mean, None, None, int(arr.size))
    quantile = float(stats.t.ppf(1 - 0.025 / max(1, comparisons), arr.size - 1))
    half = quantile * float(arr.std(ddof=1)) / math.sqrt(arr.size)
    return Estimate(mean, mean - half, mean + half, int(arr.size))
