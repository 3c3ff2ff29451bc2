"""te-gemm-callback: the GEMMs your training job really runs, and what each precision does to them.

Public API: capture (:class:`GemmSchedule` with :class:`JobStep` / :class:`SweepJob`,
:class:`GemmProfilerCallback` for Lightning, :class:`GemmProfiler`, :class:`GemmCapture` /
:class:`GemmRecord`, :class:`KernelProfile`, :func:`capture_steps`); measure (:func:`bench`,
:func:`run_sweep`); a run folder (:class:`Run`, :func:`report`, :func:`analyze_run`,
:func:`make_plan`, :func:`apply_precision_plan`, :func:`native_plan`, :func:`project_run`); shapes
(:class:`GemmShape`, :class:`GemmOp`, :class:`ModelConfig`, :func:`backward_shapes`,
:func:`config_gemms`). Everything else (``microbench.engine``, ``capture.scope``, ...) is internal.
"""

import importlib as _importlib

from te_gemm_callback.printable import stderr_until_configured
from te_gemm_callback.shapes import GemmOp, GemmShape, ModelConfig, backward_shapes, config_gemms

stderr_until_configured()

__version__ = "0.1.0"

__all__ = [
    "GemmProfiler", "GemmProfilerCallback", "GemmCapture", "GemmRecord", "KernelProfile",
    "capture_steps", "GemmSchedule", "JobStep", "SweepJob",
    "bench", "run_sweep",
    "Run", "report", "analyze_run", "make_plan", "apply_precision_plan", "native_plan", "project_run",
    "GemmOp", "GemmShape", "ModelConfig", "backward_shapes", "config_gemms",
]

# Imported on demand, by module: the Lightning adapter (the core never imports Lightning), and
# everything that needs torch (`te-gemm bench --devices N` starts its GPU workers before this
# process pays for it).
_LAZY = {
    "adapters.lightning": ("GemmProfilerCallback",),
    "capture": ("GemmCapture", "GemmProfiler", "GemmRecord"),
    "capture.kernel_profile": ("KernelProfile",),
    "capture.steps": ("capture_steps",),
    "schedule": ("GemmSchedule", "JobStep", "SweepJob"),
    "microbench": ("bench",),
    "sweep.engine": ("run_sweep",),
    "reporting.run": ("Run", "report"),
    "analysis.runs": ("analyze_run",),
    "analysis.plan": ("make_plan",),
    "sweep.plan": ("apply_precision_plan",),
    "sweep.native_plan": ("native_plan",),
    "projection": ("project_run",),
}
_MODULE_OF = {name: mod for mod, names in _LAZY.items() for name in names}


def __getattr__(name: str):
    if name in _MODULE_OF:
        return getattr(_importlib.import_module(f".{_MODULE_OF[name]}", __name__), name)
    raise AttributeError(name)
