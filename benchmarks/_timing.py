"""Step timing shared by the benchmark scripts."""

from __future__ import annotations

from typing import Any, Callable

from te_gemm_callback.capture.instruments import boundary_times


def event_times(step: Callable[[], Any], n: int) -> list[float]:
    """GPU ms of each of ``n`` back-to-back calls of ``step``: a CUDA event at every boundary and no
    sync inside the block (what the profiler's step boundaries read); one sync after the last.
    Without CUDA, the host clock at the same boundaries."""
    return [gpu if gpu is not None else host for host, gpu in boundary_times(step, n)]


def median_ci(xs: list[float], level: float = 0.95, n: int = 4000, seed: int = 0) -> tuple[float, float, float]:
    """(median, low, high): the median of ``xs`` and a bootstrap percentile interval for it
    (Efron & Tibshirani, An Introduction to the Bootstrap, 1993, ch. 13), resampling the units
    given (windows, rounds): each already compares steps taken seconds apart, so the host's drift
    over a run does not enter the interval. Fixed seed: the same data gives the same interval."""
    import random
    import statistics

    if not xs:
        raise ValueError("median_ci needs at least one value")
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(n))
    tail = (1 - level) / 2
    return statistics.median(xs), meds[int(tail * n)], meds[min(n - 1, int((1 - tail) * n))]
