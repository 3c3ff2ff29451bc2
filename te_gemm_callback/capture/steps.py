"""Run one training step function under a :class:`~te_gemm_callback.GemmProfiler` for its whole plan."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from te_gemm_callback.capture.capture_file import GemmCapture
from te_gemm_callback.capture.profiler import GemmProfiler

# The step kinds stay importable here for the callers of capture_steps.
from te_gemm_callback.capture.step_plan import (
    CLEAN,
    COMPILE,
    GRAPH_CAPTURE,
    INSTRUMENTED,
    KERNELS,
    OUTLIER,
    PARTIAL,
    RECOMPILE,
    SETTLE,
    WARMUP,
    StepPlan,
    count_arg,
)

__all__ = ["capture_steps", "StepPlan", "count_arg", "INSTRUMENTED", "WARMUP", "KERNELS", "SETTLE", "CLEAN",
           "COMPILE", "RECOMPILE", "GRAPH_CAPTURE", "OUTLIER", "PARTIAL"]


def capture_steps(model: Any, step_fn: Callable[[], Any], clean_steps: int = 1, **profiler_kwargs: Any) -> GemmCapture:
    """Run ``step_fn`` (one training step) under a profiler for its profiled steps and ``clean_steps`` more.

    Example:
        >>> import torch
        >>> lin = torch.nn.Linear(8, 8)
        >>> cap = capture_steps(lin, lambda: lin(torch.randn(4, 8, requires_grad=True)).sum().backward())
        >>> [s.kind for s in cap.steps], sorted(r.op for r in cap.records)
        (['instrumented', 'clean'], ['dgrad', 'fprop', 'wgrad'])
    """
    prof = GemmProfiler(model, **profiler_kwargs).start()
    n = prof.plan.profiled + clean_steps
    try:
        # Counts plan steps: compile steps come on top, and their wait is bounded (max_compile_steps).
        while prof.plan_index is None or prof.plan_index < n:
            step_fn()
            if prof.plan_index is not None and prof.plan_index >= n - 1:
                break
            prof.step()
    except BaseException as err:
        # Raised outside the model's forward (loss, optimizer, Ctrl-C): the forward's guard never saw it.
        prof.abandon(err, "the step")
        raise
    return prof.stop()
