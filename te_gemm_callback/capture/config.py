"""The capture's options (:class:`CaptureConfig`): the window over the job's optimizer steps and
the instruments, each defined once (:mod:`te_gemm_callback.options`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from te_gemm_callback.options import Options, integer, option, switch


def _adapters(v: Any, name: str) -> tuple[str, ...]:
    if isinstance(v, str) or not v or set(v) - {"te", "torch"}:
        raise ValueError(f"{name} must be a list of 'te' and/or 'torch', got {v!r}")
    return tuple(v)


def _dispatch_steps(v: Any, name: str) -> Any:
    return v if v is None or v == "all" else integer(0)(v, name)


def _nvtx(v: Any, name: str) -> Any:
    if not isinstance(v, bool) and v != "auto":
        raise ValueError(f"{name} must be True, False or 'auto', got {v!r}")
    return v


@dataclass(frozen=True)
class CaptureConfig(Options):
    """Which optimizer steps are captured, and how (:class:`~te_gemm_callback.schedule.GemmSchedule`)."""

    wait: int = option(1, "untouched optimizer steps before the window (all micro-batches of gradient "
                          "accumulation are one step).", integer(0))
    warmup: int = option(1, "instrumented steps before the captured ones, discarded.", integer(0))
    active: int = option(6, "the captured steps.", integer(1, " (at least one step has to be captured)"))
    instrumented_steps: int = option(1, "how many of the active steps run instrumented (shapes, owners, "
                                        "precisions); the others follow the step plan (docs/step-plan.md).",
                                     integer(1))
    adapters: Sequence[str] = option(("te", "torch"), "'te' (TE's general_gemm), 'torch' (aten dispatch), or "
                                                      "both (:class:`~te_gemm_callback.GemmProfiler`).",
                                     _adapters, to="profiler")
    dispatch_steps: int | str | None = option(
        None, "instrumented steps on which the torch dispatch mode runs: 'all' or the first N (default: all for "
              "plain torch models, the first for models with TE modules).", _dispatch_steps, to="profiler")
    nvtx: bool | str = option("auto", "NVTX range per GEMM and per step (domain te_gemm): True, False, or 'auto' "
                                      "(only when an NVTX tool such as nsys profile is listening).",
                              _nvtx, to="profiler")
    nsys_capture: bool = option(False, "cudaProfilerStart at the first active step, cudaProfilerStop once the "
                                       "capture file is written; run the job under nsys profile -t cuda,nvtx -c "
                                       "cudaProfilerApi --capture-range-end=stop -s none (nsys's default range "
                                       "end stops the job at the Stop: docs/nsight-systems.md).", switch)
    kernel_breakdown: bool = option(True, "on CUDA, the kernels step among the active ones and one per swept "
                                          "recipe (the replay's trace, the kernel-time breakdown).", switch)

    def check_together(self, labels: dict[str, str]) -> None:
        if self.instrumented_steps > self.active:
            name = labels.get("instrumented_steps", "instrumented_steps")
            raise ValueError(f"{name} ({self.instrumented_steps}) must not exceed "
                             f"{labels.get('active', 'active')} ({self.active})")
