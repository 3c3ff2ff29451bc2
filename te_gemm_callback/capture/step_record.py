"""What a :class:`~te_gemm_callback.GemmProfiler` keeps of each profiled step, for :mod:`.results`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from te_gemm_callback.capture.kernel_profile import KernelStep

Boundary = tuple[float, Any]  # (host clock in s, CUDA event or None) at a step boundary


@dataclass
class StepRecord:
    """One step: opened with it, completed when it closes, dropped whole if it never ran."""

    kind: str  # StepPlan's kind; results.py retags unsteady and partial steps once all are known
    dispatch: bool = False  # the torch dispatch mode ran on it
    start: Boundary = (0.0, None)
    end: Boundary | None = None
    # Autograd's next sequence number at the open: no forward with grad since -> the step never ran.
    seq_open: int = 0
    at_open: tuple[int, int] = (0, 0)  # steady.activity() at the open: (compile activity, graph captures)
    moved: tuple[int, int] = (0, 0)  # ... and how much each moved during the step
    micro_batches: int = 1
    by_order: bool = False  # its TE GEMM owners came by launch order from a hooked step
    order_failed: bool = False  # ... tried, but its calls did not match: its TE GEMMs are left out
    kernels: KernelStep | None = None  # a kernels step's kernel records, once the session returned them
    host_clock: Any = None  # a settle step's ModuleHostClock while it runs
    module_host_us: dict[str, dict[str, float]] | None = None  # ... and what it read
    paused_s: float = 0.0  # host time between the job's pause() and resume() (its evaluation, logging)
