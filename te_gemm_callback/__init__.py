"""te-gemm-callback: the GEMMs your training job really runs, and what each precision does to them.

Public API: the names in ``__all__`` (capture, measure, a run folder, shapes); everything else
(``microbench.engine``, ``capture.scope``, ...) is internal.
"""

import importlib as _importlib

from te_gemm_callback.printable import stderr_until_configured
from te_gemm_callback.shapes import GemmOp, GemmShape, ModelConfig, backward_shapes, config_gemms

stderr_until_configured()

__version__ = "0.1.0"

__all__ = [
    # capture
    "GemmProfiler", "GemmProfilerCallback", "GemmCapture", "GemmRecord", "KernelProfile",
    "capture_steps", "GemmSchedule", "JobStep", "SweepJob",
    # measure
    "bench", "run_sweep",
    # a run folder
    "Run", "report", "analyze_run", "make_plan", "apply_precision_plan", "native_plan", "project_run",
    # shapes
    "GemmOp", "GemmShape", "ModelConfig", "backward_shapes", "config_gemms",
]

# Imported on demand: the Lightning adapter (the core never imports Lightning), and everything that
# needs torch (`te-gemm bench --devices N` starts its GPU workers before this process pays for it).
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
