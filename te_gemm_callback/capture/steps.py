"""Which instrument each profiled step runs under (see :class:`StepPlan`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

INSTRUMENTED, KERNELS, CLEAN = "instrumented", "kernels", "clean"


@dataclass(frozen=True)
class StepPlan:
    """Which instrument a profiled step runs under, by its index.

    - ``instrumented``: module hooks, TE GEMM interception, the torch dispatch mode on the first
      ``dispatch`` of them, NVTX: shapes, owners and precisions. Never timed for a speedup.
    - ``kernels`` (CUDA only): nothing of ours but kernel activity records (torch.profiler, CUDA
      kernels only): per-GEMM GPU time, joined to the instrumented step's GEMMs by launch order.
    - ``clean``: nothing attached at all; the step times every speedup, share and verdict uses.

    Example:
        >>> [StepPlan(instrumented=1, kernels=1).kind(i) for i in range(4)]
        ['instrumented', 'kernels', 'clean', 'clean']
    """

    instrumented: int | str = 1  # or "all": every step instrumented (no clean step)
    kernels: int = 0
    dispatch: int | str = 1  # instrumented steps that also run the torch dispatch mode, or "all"

    def kind(self, i: int) -> str:
        if self.instrumented == "all" or i < self.instrumented:
            return INSTRUMENTED
        return KERNELS if i < self.instrumented + self.kernels else CLEAN

    def dispatches(self, i: int) -> bool:
        return self.kind(i) == INSTRUMENTED and (self.dispatch == "all" or i < self.dispatch)


def count_arg(name: str, v: Any, allow_all: bool = False) -> int | str:
    if allow_all and v == "all":
        return v
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"{name} must be {'all or ' if allow_all else ''}a non-negative integer, got {v!r}")
    return v
