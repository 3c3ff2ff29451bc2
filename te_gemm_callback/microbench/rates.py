"""The rate model the microbenchmark plans with before it measures: one GEMM's expected time per recipe.

It sizes iteration counts, heat and the rest between timed calls, so it follows this GPU: fitted on an
H200 (docs/results/h200.md, facts the code relies on: rate model) and rescaled by the peaks
``timing.measure_peaks`` takes here; a peak within SAME_GPU of the H200's keeps the H200 model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from te_gemm_callback.microbench.cells import FP8_FAMILY

H200_BF16_FLOPS = 6.5e14
FP8_OVER_BF16 = 1.7
NVFP4_OVER_BF16 = 3.5
H200_PEAKS_TFLOPS = {"bf16": 693.0, "fp8": 1379.0}
SAME_GPU = 0.05

_RATES: dict[str, float] = {}


def _scale(peaks: Mapping[str, float], kind: str) -> float:
    """This GPU's measured peak over the H200's, 1.0 within SAME_GPU of it or where none was measured."""
    p = peaks.get(kind)
    if not isinstance(p, (int, float)) or not math.isfinite(p) or p <= 0:
        return 1.0
    r = p / H200_PEAKS_TFLOPS[kind]
    return 1.0 if abs(r - 1.0) <= SAME_GPU else r


def set_rate_model(peaks: Mapping[str, float] | None) -> dict[str, float]:
    """Rescale the model to this GPU's peaks (TFLOP/s of "bf16" and maybe "fp8"; None restores the
    H200 model) and return the rates now used (TFLOP/s)."""
    peaks = peaks or {}
    bf16 = H200_BF16_FLOPS * _scale(peaks, "bf16")
    fp8 = H200_BF16_FLOPS * FP8_OVER_BF16 * _scale(peaks, "fp8") if peaks.get("fp8") else bf16 * FP8_OVER_BF16
    _RATES.update(bf16=bf16, fp8=fp8, nvfp4=bf16 * NVFP4_OVER_BF16)
    return {k: v / 1e12 for k, v in _RATES.items()}


def gemm_seconds(flops: float, precision: str) -> float:
    """Model estimate of one GEMM's time (seconds)."""
    if precision == "NVFP4BlockScaling":
        return flops / _RATES["nvfp4"]
    return flops / _RATES["fp8" if precision in FP8_FAMILY else "bf16"]


set_rate_model(None)
