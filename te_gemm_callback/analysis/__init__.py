"""Analysis: from captures and microbenchmarks to a report with a verdict per recipe, and a plan.

- :mod:`~te_gemm_callback.analysis.prediction`: what each captured run measured, and the step time
  predicted per recipe (Amdahl over the measured GEMM share);
- :mod:`~te_gemm_callback.analysis.verdicts`: :func:`analyze` joins them into a
  :class:`~te_gemm_callback.analysis.verdicts.Report`, judging each recipe;
- :mod:`~te_gemm_callback.analysis.findings`: the verdict kinds (:class:`Verdict`), their evidence,
  and the one place both are rendered as sentences;
- :mod:`~te_gemm_callback.analysis.checks` and :mod:`~te_gemm_callback.analysis.notes`: what keeps a
  report from contradicting itself, and the notes printed beside it;
- :mod:`~te_gemm_callback.analysis.plan`: which modules to keep in BF16;
- :mod:`~te_gemm_callback.analysis.runs`: all of it for a run folder (:func:`analyze_run`).

Drawing and writing are :mod:`te_gemm_callback.reporting`'s.
"""

from __future__ import annotations

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
# The module each name comes from; the rest of __all__ from verdicts.
_FROM = {"Evidence": "findings", "Verdict": "findings", "RunReport": "runs", "analyze_run": "runs"}


def __getattr__(name: str):
    # On demand: importing any one analysis module runs this file first, and the verdicts load the
    # capture and microbenchmark modules (torch among them) that a table's note does not need.
    if name in __all__:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_FROM.get(name, 'verdicts')}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
