"""The capture's options (:mod:`te_gemm_callback.options`): :class:`ProfilerConfig` (step plan,
instruments, time sources) and :class:`CaptureConfig` (the window over the job's optimizer steps)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from te_gemm_callback.capture.step_plan import count_arg
from te_gemm_callback.options import Check, Options, function_or_none, integer, one_of, option, same_as, switch


def _adapters(v: Any, name: str) -> tuple[str, ...]:
    if not isinstance(v, (list, tuple, set, frozenset)) or not v or set(v) - {"te", "torch"}:
        raise ValueError(f"{name} must be a list of 'te' and/or 'torch', got {v!r}")
    return tuple(v)


def _clock(v: Any, name: str) -> Callable[[], float]:
    if not callable(v):
        raise ValueError(f"{name} must be a function returning seconds, got {v!r}")
    return v


def _count(allow_all: bool = False, allow_none: bool = False) -> Check:
    """A step count as :func:`~.step_plan.count_arg` takes it; None where the profiler picks it."""
    def check(v: Any, name: str) -> Any:
        return v if v is None and allow_none else count_arg(name, v, allow_all)
    return check


def _timing(v: Any, name: str) -> str:
    v = {True: "auto", False: "none"}.get(v, v) if isinstance(v, bool) else v
    if v not in ("auto", "events", "none"):
        raise ValueError(f"{name} must be 'auto', 'events' or 'none', got {v!r}")
    return v


@dataclass(frozen=True)
class ProfilerConfig(Options):
    """How a :class:`~te_gemm_callback.GemmProfiler` profiles its steps."""

    adapters: Sequence[str] = option(("te", "torch"), "'te' (intercept TE's general_gemm), 'torch' (aten "
                                                      "dispatch), or both.", _adapters)
    instrumented_steps: int | Literal["all"] = option(
        1, "how many steps run instrumented ('all': every step, no clean one).", _count(allow_all=True))
    kernel_steps: int | None = option(None, "steps with kernel records after them; default 1 on a CUDA host, else 0.",
                                      _count(allow_none=True))
    kernel_warmup_steps: int = option(1, "discarded steps before the kernel steps, with records already on, so the "
                                         "kernel steps don't follow CUPTI's start-up idle gap, when the GPU clock "
                                         "runs higher.", _count())
    settle_steps: int = option(1, "untimed steps after the kernel steps, nothing attached: the session's stop syncs, "
                                  "so the next step starts with an empty GPU queue and runs long "
                                  "(docs/step-plan.md, settle).", _count())
    dispatch_steps: int | Literal["all"] | None = option(
        None, "instrumented steps that run the torch dispatch mode (Python time on every aten op): "
              "'all' or the first N. Default: all for plain torch models, the first for models with TE modules.",
        _count(allow_all=True, allow_none=True))
    reuse_owners: bool = option(True, "after the first hooked step, run instrumented steps without module hooks: each "
                                      "TE GEMM takes the owner of the call at the same launch position, layout and "
                                      "shapes checked; a mismatched step is dropped and hooks return. Hooks were most "
                                      "of an instrumented step's host cost (benchmarks/instrument_cost.py parts).",
                                switch)
    nvtx: bool | str = option("auto", "NVTX ranges per GEMM (domain te_gemm) and per step: True, False, or 'auto': "
                                      "on when an NVTX tool listens (nsys sets NVTX_INJECTION64_PATH), with "
                                      "nsys_capture, or with an nvtx_backend.", one_of(True, False, "auto"))
    timing: bool | str = option("auto", "per-GEMM time source. 'auto' (True): kernel records if kernel steps run, else "
                                        "CUDA-event pairs on instrumented steps (host clock on CPU); 'events': event "
                                        "pairs on instrumented steps too; 'none' (False): no per-GEMM time.", _timing)
    nsys_capture: bool | str = option(False, "cudaProfilerStart at the first profiled step, cudaProfilerStop at the "
                                             "end of stop(), so nsys profile -c cudaProfilerApi records only the "
                                             "profiled steps (docs/nsight-systems.md). 'held': the caller calls "
                                             "end_nsys_range() (the callbacks do, after writing the capture file, "
                                             "since nsys's default "
                                             "--capture-range-end=stop-shutdown ends the job there).",
                                      one_of(True, False, "held"))
    nvtx_backend: Any = option(None, "what opens and closes NVTX ranges (default: the nvtx package).")
    clock_reader: Callable[[], tuple[float, float]] | None = option(
        None, "reads (SM clock MHz, board power W) on a background thread during the timed steps "
              "(default: NVML on a CUDA host, else nothing). The summary goes to meta['clocks_during_capture'] "
              "to compare the job's clock with the microbenchmark's.",
        function_or_none("a function returning (SM clock MHz, power W)"))
    max_compile_steps: int = option(10, "most compile steps a compiled model runs before the plan; if dynamo still "
                                        "compiles, the plan runs anyway and the capture says steady state was not "
                                        "reached.", _count())
    kernel_profile: Any = option(None, "a stand-in for the kernel recorder (tests: kernel steps without CUDA).")
    clock: Callable[[], float] = option(time.perf_counter, "a stand-in for the host clock (tests).",
                                        _clock)


@dataclass(frozen=True)
class CaptureConfig(Options):
    """Which optimizer steps are captured, and how (:class:`~te_gemm_callback.schedule.GemmSchedule`)."""

    wait: int = option(1, "untouched optimizer steps before the window (a step includes all its "
                          "gradient-accumulation micro-batches).", integer(0))
    warmup: int = option(1, "instrumented steps before the captured ones, discarded.", integer(0))
    active: int = option(6, "the captured steps.", integer(1, " (at least one step has to be captured)"))
    instrumented_steps: int = option(1, "active steps that run instrumented (shapes, owners, precisions); the "
                                        "others follow the step plan (docs/step-plan.md).",
                                     integer(1))
    # The profiler's own options, handed to it by name: one definition, there.
    adapters: Sequence[str] = same_as(ProfilerConfig, "adapters", to="profiler")
    dispatch_steps: int | Literal["all"] | None = same_as(ProfilerConfig, "dispatch_steps", to="profiler")
    nvtx: bool | str = same_as(ProfilerConfig, "nvtx", to="profiler")
    max_compile_steps: int = same_as(ProfilerConfig, "max_compile_steps", to="profiler")
    nsys_capture: bool = option(False, "cudaProfilerStart at the first active step, cudaProfilerStop after the "
                                       "capture file is written. Run under nsys profile -t cuda,nvtx -c "
                                       "cudaProfilerApi --capture-range-end=stop -s none; nsys's default range "
                                       "end stops the job at the Stop (docs/nsight-systems.md).", switch)
    kernel_breakdown: bool = option(True, "on CUDA, run a kernels step among the active ones and one per swept "
                                          "recipe (for the replay's trace and kernel-time breakdown).", switch)

    def check_together(self, labels: dict[str, str]) -> None:
        if self.instrumented_steps > self.active:
            name = labels.get("instrumented_steps", "instrumented_steps")
            raise ValueError(f"{name} ({self.instrumented_steps}) must not exceed "
                             f"{labels.get('active', 'active')} ({self.active})")
