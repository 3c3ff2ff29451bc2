"""Which instrument each profiled step runs under (:class:`StepPlan`), and the kinds a step can have.

It imports nothing of the package: the profiler and each of its parts read it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, overload

INSTRUMENTED, WARMUP, KERNELS, SETTLE, CLEAN = "instrumented", "kernels-warmup", "kernels", "settle", "clean"
# Steps that are never clean (capture.steady): "compile" runs before the plan, nothing attached, while
# dynamo compiles a torch.compile model; the others are planned clean (or settle) steps found unsteady
# afterwards: dynamo compiled in them, a CUDA graph was captured in them, or they took far longer.
COMPILE, RECOMPILE, GRAPH_CAPTURE, OUTLIER = "compile", "recompile", "graph-capture", "outlier"
# A planned clean (or settle) step that ran fewer micro-batches than the capture's fullest step: the
# last step of an epoch that gradient accumulation does not divide (7 batches, accumulate 5: steps of
# 5 and 2). Its time is not the job's step time (capture.results).
PARTIAL = "partial"
# Every kind a capture's step can have: a file naming another is damaged (GemmCapture.validate).
STEP_KINDS = (INSTRUMENTED, WARMUP, KERNELS, SETTLE, CLEAN, COMPILE, RECOMPILE, GRAPH_CAPTURE, OUTLIER, PARTIAL)


@dataclass(frozen=True)
class StepPlan:
    """Which instrument a profiled step runs under, by its index.

    - ``instrumented``: module hooks, TE GEMM interception, the torch dispatch mode on the first
      ``dispatch`` of them, NVTX: shapes, owners and precisions. After the first, TE models run
      them without hooks (owners by launch order, ``GemmProfiler(reuse_owners=...)``). Never
      timed for a speedup.
    - ``kernels-warmup`` (before the kernels steps, ``kernels_warmup`` of them): kernel records
      already running but not kept, so the kernels steps run on a GPU in its usual state rather than
      right after CUPTI's start. Never timed.
    - ``kernels`` (CUDA only): nothing of ours but kernel activity records (torch.profiler, CUDA
      kernels only): per-GEMM GPU time, joined to the instrumented step's GEMMs by launch order.
    - ``settle`` (after the kernels steps, ``settle`` of them): nothing attached, never timed. The
      kernel-records session's stop synchronizes, so the next step starts on a drained GPU queue and
      its GPU span carries the lead over the GPU that the host lost: longer than a clean step's, it
      would pull the step time up (measured: docs/step-plan.md, settle).
    - ``clean``: nothing attached at all; the step times every speedup, share and verdict uses.

    A ``torch.compile`` model runs "compile" steps (nothing attached, never timed) before index 0
    of the plan, until dynamo is done with it (:mod:`.steady`); ``GemmProfiler.plan_index`` is the
    open step's index here.

    Example:
        >>> [StepPlan(instrumented=1, kernels=1, kernels_warmup=1, settle=1).kind(i) for i in range(6)]
        ['instrumented', 'kernels-warmup', 'kernels', 'settle', 'clean', 'clean']
    """

    instrumented: int | Literal["all"] = 1  # or "all": every step instrumented (no clean step)
    kernels: int = 0
    dispatch: int | Literal["all"] = 1  # instrumented steps that also run the torch dispatch mode, or "all"
    kernels_warmup: int = 0  # only planned when kernels > 0
    settle: int = 0  # likewise

    def kind(self, i: int) -> str:
        if self.instrumented == "all" or i < self.instrumented:
            return INSTRUMENTED
        i -= self.instrumented
        warm, settle = (self.kernels_warmup, self.settle) if self.kernels else (0, 0)
        if i < warm:
            return WARMUP
        if i < warm + self.kernels:
            return KERNELS
        return SETTLE if i < warm + self.kernels + settle else CLEAN

    @property
    def profiled(self) -> int:
        """Steps before the first clean one (instrumented, kernels warm-up, kernels, settle)."""
        if self.instrumented == "all":
            raise ValueError("every step is instrumented")
        return self.instrumented + (self.kernels_warmup + self.kernels + self.settle if self.kernels else 0)

    def dispatches(self, i: int) -> bool:
        return self.kind(i) == INSTRUMENTED and (self.dispatch == "all" or i < self.dispatch)


@overload
def count_arg(name: str, v: Any, allow_all: Literal[False] = False) -> int: ...
@overload
def count_arg(name: str, v: Any, allow_all: bool) -> int | Literal["all"]: ...
def count_arg(name: str, v: Any, allow_all: bool = False) -> int | Literal["all"]:
    if allow_all and v == "all":
        return v
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"{name} must be {'all or ' if allow_all else ''}a non-negative integer, got {v!r}")
    return v

