"""Paired comparisons over seeds: two models trained with the same seeds (same initial weights' stream, same
data order) differ by the mean of their per-seed differences, with a Student-t interval over those differences.

A difference is *resolved* only when its interval excludes 0; with one seed there is no interval and nothing is
resolved.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from scipy.stats import t as student_t


@dataclass(frozen=True)
class PairedDifference:
    """mean(values - reference) over the seeds both have, with its two-sided interval."""

    mean: float
    low: float  # nan with fewer than 2 seeds
    high: float
    seeds: int
    confidence: float

    @property
    def resolved(self) -> bool:
        return bool(self.seeds >= 2 and (self.low > 0 or self.high < 0))

    def verdict(self) -> str:
        return "resolved" if self.resolved else "not resolved"

    def format(self, digits: int = 3, signed: bool = True) -> str:
        """`+0.012 [-0.004, +0.028]`: the mean and its interval."""
        return format_interval(self.mean, self.low, self.high, digits, signed)


def format_interval(mean: float, low: float, high: float, digits: int = 3, signed: bool = True) -> str:
    """`+0.012 [-0.004, +0.028]` (signed) or `6.240 [6.113, 6.367]`; `... (1 seed, no interval)` when low is nan.
    Also for the numbers read back from a study's JSON."""
    sign = "+" if signed else ""
    if math.isnan(low):
        return f"{mean:{sign}.{digits}f} (1 seed, no interval)"
    return f"{mean:{sign}.{digits}f} [{low:{sign}.{digits}f}, {high:{sign}.{digits}f}]"


def paired_difference(values: Sequence[float], reference: Sequence[float],
                      confidence: float = 0.95) -> PairedDifference:
    """values[k] - reference[k] paired by position (the seed), mean +- t_{(1+c)/2, n-1} * sd / sqrt(n)."""
    if len(values) != len(reference) or not values:
        raise ValueError(f"paired_difference needs the same seeds on both sides, got {len(values)} values and "
                         f"{len(reference)} references; pass one value per seed, in the same seed order.")
    differences = [v - r for v, r in zip(values, reference)]
    mean = statistics.fmean(differences)
    if len(differences) < 2:
        return PairedDifference(mean, math.nan, math.nan, len(differences), confidence)
    # float(): scipy answers numpy scalars, which json cannot write
    half = float(student_t.ppf((1 + confidence) / 2, len(differences) - 1)) * statistics.stdev(differences)
    half /= math.sqrt(len(differences))
    return PairedDifference(mean, mean - half, mean + half, len(differences), confidence)


def mean_interval(values: Sequence[float], confidence: float = 0.95) -> PairedDifference:
    """One model's mean over seeds with its Student-t interval (a paired difference against 0)."""
    return paired_difference(values, [0.0] * len(values), confidence)
