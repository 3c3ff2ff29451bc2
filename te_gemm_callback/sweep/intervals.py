"""A median over rounds and its distribution-free order-statistic 95% interval (Conover, Practical
Nonparametric Statistics, 1999, 3.2; a round on a stall is far off): 6 rounds needed. A rerun's median
falls within the CI widened by sqrt(2) (Cumming & Maillardet, 2006; docs/results/h200.md: rerun interval)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

LEVEL = 0.95
RERUN_WIDTH = math.sqrt(2)  # a rerun's estimate has its own error: the CI's sides times sqrt(2)


def _binom_cdf(k: int, n: int) -> float:
    """P(X <= k) for X ~ Binomial(n, 1/2)."""
    return sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n


def median_interval(xs: Sequence[float], level: float = LEVEL) -> tuple[float, float] | None:
    """The order-statistic interval for the median of ``xs`` at ``level`` or better; None with too few values.

    Example:
        >>> median_interval([1.0, 1.1, 1.2, 1.3, 1.4, 1.5])
        (1.0, 1.5)
        >>> median_interval([1.0, 1.1, 1.2]) is None
        True
    """
    n, s = len(xs), sorted(xs)
    # The largest k with P(X <= k - 1) <= (1 - level) / 2: (x_(k), x_(n-k+1)), 1-based, covers the median.
    k = 0
    while k + 1 <= n // 2 and _binom_cdf(k, n) <= (1 - level) / 2:
        k += 1
    return (s[k - 1], s[n - k]) if k else None


@dataclass(frozen=True)
class Estimate:
    """A median over rounds with its interval: ``low``/``high`` are None with too few rounds."""

    value: float
    rounds: int
    low: float | None = None
    high: float | None = None

    @property
    def rerun(self) -> tuple[float, float] | None:
        """Where a rerun's median (as many rounds, same job) should fall, 95%; None with too few rounds."""
        if self.low is None or self.high is None:
            return None
        return self.value - RERUN_WIDTH * (self.value - self.low), self.value + RERUN_WIDTH * (self.high - self.value)

    @property
    def half_width(self) -> float | None:
        """Half the interval's width relative to the median (0.02: +-2%)."""
        if self.low is None or self.high is None:
            return None
        return max(self.value - self.low, self.high - self.value) / self.value

    def text(self) -> str:
        if self.low is None:
            return f"{self.value:.2f}x ({self.rounds} round{'s' * (self.rounds != 1)}: too few for a 95% interval)"
        return f"{self.value:.2f}x (95% CI {self.low:.2f}-{self.high:.2f}x, {self.rounds} rounds)"


def estimate(xs: Sequence[float]) -> Estimate:
    """Median, with its 95% interval where there are enough values.

    Example:
        >>> estimate([1.2, 1.25, 1.3, 1.22, 1.27, 1.24]).text()
        '1.25x (95% CI 1.20-1.30x, 6 rounds)'
    """
    if not xs:
        raise ValueError("no values to estimate from")
    ci = median_interval(xs)
    return Estimate(statistics.median(xs), len(xs), *(ci or (None, None)))
