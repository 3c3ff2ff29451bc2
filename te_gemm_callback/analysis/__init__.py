"""Analysis: from captures and microbenchmarks to a report with a verdict per recipe (:func:`analyze`,
:func:`analyze_run` for a run folder), and a plan; drawing is :mod:`te_gemm_callback.reporting`'s."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from te_gemm_callback.analysis.findings import Evidence, Verdict
    from te_gemm_callback.analysis.runs import RunReport, analyze_run
    from te_gemm_callback.analysis.verdicts import (
        GEMM_BOUND_TOL,
        NO_GAIN,
        Observed,
        RecipeAnalysis,
        Report,
        amdahl,
        analyze,
        capture_recipe,
        judge,
        observe,
        observed_estimate,
        observed_speedup,
        round_speedups,
        verdict,
    )

__all__ = ["GEMM_BOUND_TOL", "NO_GAIN", "Evidence", "Observed", "RecipeAnalysis", "Report", "RunReport", "Verdict",
           "amdahl", "analyze", "analyze_run", "capture_recipe", "judge", "observe", "observed_estimate",
           "observed_speedup", "round_speedups", "verdict"]
_FROM = {"Evidence": "findings", "Verdict": "findings", "RunReport": "runs", "analyze_run": "runs"}


def __getattr__(name: str):
    # On demand: importing any analysis module runs this file first, and the verdicts load torch.
    if name in __all__:
        return getattr(importlib.import_module(f"{__name__}.{_FROM.get(name, 'verdicts')}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
