"""Which instrument each profiled step runs under (:class:`StepPlan`), and the kinds a step can have."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, overload

INSTRUMENTED, WARMUP, KERNELS, SETTLE, CLEAN = "instrumented", "kernels-warmup", "kernels", "settle", "clean"
# Never clean (capture.steady): compile steps before the plan, and planned steps found unsteady afterwards.
COMPILE, RECOMPILE, GRAPH_CAPTURE, OUTLIER = "compile", "recompile", "graph-capture", "outlier"
# A clean step with fewer micro-batches than the fullest (an epoch gradient accumulation does not divide).
PARTIAL = "partial"
# Every kind a capture's step can have: a file naming another is damaged (GemmCapture.validate).
STEP_KINDS = (INSTRUMENTED, WARMUP, KERNELS, SETTLE, CLEAN, COMPILE, RECOMPILE, GRAPH_CAPTURE, OUTLIER, PARTIAL)


@dataclass(frozen=True)
class StepPlan:
    """Which instrument a profiled step runs under, by its index (docs/step-plan.md): ``instrumented`` steps record
    shapes, owners and precisions (the first ``dispatch`` with the torch dispatch mode); ``kernels-warmup`` steps run
    kernel records unkept; ``kernels`` steps only kernel records; ``settle`` steps nothing, untimed; then ``clean``
    steps time the job.

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
