"""What a :class:`~te_gemm_callback.GemmProfiler` keeps while it runs: one :class:`StepRecord` per
profiled step, and the state its parts share (:mod:`.profiler`: the lifecycle; :mod:`.stepping`:
the step boundaries and the instruments each step runs under; :mod:`.results`: the capture built at
stop). Declared here once, so that each part types what it reads without importing the profiler
that is built from them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from te_gemm_callback.capture.clocks import ClockSampler
from te_gemm_callback.capture.cupti import CuptiOwner
from te_gemm_callback.capture.graphs import EagerForwards
from te_gemm_callback.capture.kernel_profile import KernelProfile, KernelStep
from te_gemm_callback.capture.recorder import Recorder
from te_gemm_callback.capture.scope import ModuleScope
from te_gemm_callback.capture.steady import EagerCompiled, SteadyWait
from te_gemm_callback.capture.step_plan import StepPlan
from te_gemm_callback.capture.te_adapter import TEInterceptor
from te_gemm_callback.capture.torch_adapter import GemmDispatchMode

Boundary = tuple[float, Any]  # (host clock in s, CUDA event or None) at a step boundary


@dataclass
class StepRecord:
    """Everything the profiler keeps of one step: opened with the step, completed when it closes,
    and dropped whole (a step opened but never run, at stop)."""

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


class ProfilerState:
    """The attributes a GemmProfiler's parts share (set by ``GemmProfiler.__init__`` and ``_reset``),
    and the per-step views the parts read."""

    model: nn.Module
    adapters: tuple[str, ...]
    plan: StepPlan
    _base_plan: StepPlan  # as asked; ``plan`` is it, or its form under a CUPTI owner
    cupti: CuptiOwner | None
    timing: str
    on_meta: bool  # the model is on the meta device: nothing runs, nothing is timed
    reuse_owners: bool
    recorder: Recorder
    scope: ModuleScope
    te: TEInterceptor | None
    kernel_profile: KernelProfile
    _steps: list[StepRecord]  # one per step opened, in step order: a step's index is its position
    _clock: Callable[[], float]
    _clock_reader: Callable[[], tuple[float, float]] | None
    _clocks: ClockSampler | None
    _sample_clocks: bool
    _wait: SteadyWait
    _eager: EagerForwards
    _eager_compiled: EagerCompiled
    _mode: GemmDispatchMode | None
    _paused_mode: bool
    _attached: str | None
    _order_off: bool
    _abandoned: bool
    _session_ms: dict[str, float]
    _range_open: bool
    _range_api: Any
    _more_dispatch: int  # instrumented steps past the plan's dispatch ones that may run it (stepping.py)

    def _step_ids(self, test: Callable[[StepRecord], bool]) -> list[int]:
        """Indices of the steps whose record passes ``test``."""
        return [i for i, s in enumerate(self._steps) if test(s)]

    def _kernel_steps(self) -> dict[int, KernelStep]:
        """The kernels steps' records, by step index."""
        return {i: s.kernels for i, s in enumerate(self._steps) if s.kernels is not None}
