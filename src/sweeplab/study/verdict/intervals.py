"""Intervals: Student-t intervals of means and medians, paired ratios and differences, Bonferroni's level."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from sweeplab.study.selection import t_quantile
from sweeplab.study.verdict.records import CONFIDENCE, Estimate, Interval


def mean_interval(values: np.ndarray, level: float = CONFIDENCE) -> tuple[np.ndarray, np.ndarray]:
    """Student-t interval for the mean along the last axis (vectorised: one interval per row). Fewer than two values:
    (-inf, inf). Identical values give a zero-width interval: nothing in the data says they could differ."""
    values = np.asarray(values, dtype=float)
    n = values.shape[-1]
    if n < 2:
        shape = values.shape[:-1]
        return np.full(shape, -np.inf), np.full(shape, np.inf)
    mean = values.mean(axis=-1)
    # Squared deviations summed directly: np.std's generality costs more than the rest of a sweep's summary.
    standard_error = np.sqrt(((values - mean[..., None]) ** 2).sum(axis=-1) / (n - 1) / n)
    half_width = t_quantile(0.5 + level / 2.0, n - 1) * standard_error
    return mean - half_width, mean + half_width


def median_of_positive(values: Sequence[float], level: float = CONFIDENCE) -> Estimate:
    """Median of positive values (samples/s, samples or time to target) with the t interval on their logs: the
    interval of a log-symmetric spread's median. Infinite values (never reached the target) count in the median;
    the interval then comes from the finite ones and reaches up to inf, and with fewer than two finite values it is
    (0, inf)."""
    values = np.asarray(values, dtype=float)
    if values.size == 0:
        return Estimate(math.nan, Interval(0.0, math.inf, level), 0)
    finite = values[np.isfinite(values)]
    low, high = 0.0, math.inf
    if finite.size >= 2:
        log_low, log_high = mean_interval(np.log(finite), level)
        low, high = float(np.exp(log_low)), float(np.exp(log_high))
    if finite.size < values.size:
        high = math.inf
    return Estimate(float(np.median(values)), Interval(low, high, level), int(values.size))


def median_of_values(values: Sequence[float], level: float = CONFIDENCE) -> Estimate:
    """Median of a metric's values (any sign) with the t interval of their mean."""
    values = np.asarray(values, dtype=float)
    if values.size == 0:
        return Estimate(math.nan, Interval(-math.inf, math.inf, level), 0)
    low, high = mean_interval(values, level)
    return Estimate(float(np.median(values)), Interval(float(low), float(high), level), int(values.size))


def ratio_from_log_ratios(log_ratios: Sequence[float], level: float) -> Estimate:
    """A ratio from paired log-ratios: the geometric mean (exp of their mean) inside the exp of their t interval.

    ±inf log-ratios (one side of a pair never reached the target) open that side of the interval (0 or inf) and the
    interval of the rest is used for the other side (that rest leaves out the pairs that pulled that way, so the
    side it gives is wider than it would be: conservative); the point is then the median ratio. NaN (neither side
    reached) pairs are left out: they say nothing about the ratio."""
    log_ratios = np.asarray(log_ratios, dtype=float)
    log_ratios = log_ratios[~np.isnan(log_ratios)]
    if log_ratios.size == 0:
        return Estimate(math.nan, Interval(0.0, math.inf, level), 0)
    finite = log_ratios[np.isfinite(log_ratios)]
    with np.errstate(invalid="ignore"):  # as many -inf as +inf in the middle: NaN, no ratio (the verdict says so)
        point = np.mean(finite) if finite.size == log_ratios.size else np.median(log_ratios)
    low, high = mean_interval(finite, level) if finite.size >= 2 else (-np.inf, np.inf)
    low = -np.inf if np.any(log_ratios == -np.inf) else low
    high = np.inf if np.any(log_ratios == np.inf) else high
    return Estimate(float(np.exp(point)), Interval(float(np.exp(low)), float(np.exp(high)), level), int(log_ratios.size))


def difference_from_pairs(differences: Sequence[float], level: float) -> Estimate:
    """A paired difference: the mean difference and its t interval."""
    differences = np.asarray(differences, dtype=float)
    if differences.size == 0:
        return Estimate(math.nan, Interval(-math.inf, math.inf, level), 0)
    low, high = mean_interval(differences, level)
    return Estimate(float(differences.mean()), Interval(float(low), float(high), level), int(differences.size))


def simultaneous_level(confidence: float, comparisons: int) -> float:
    """Each interval's level so that all `comparisons` of them cover together with at least `confidence`
    (Bonferroni)."""
    return 1.0 - (1.0 - confidence) / max(comparisons, 1)
