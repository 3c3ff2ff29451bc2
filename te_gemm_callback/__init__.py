"""te-gemm-callback: the GEMMs your training job really runs, and what each precision does to them.

Public API, by what users touch:

- capture: :class:`GemmProfiler` (any training loop), :class:`GemmProfilerCallback` (Lightning),
  :class:`GemmCapture` / :class:`GemmRecord` (the capture file), :class:`KernelProfile` (kernel
  records of one step), :func:`capture_steps` (a step function run under the profiler);
- measure: :func:`bench` (microbenchmarks of the captured shapes), :func:`run_sweep` (observed step
  time per recipe on the live model);
- report: :func:`report` (a run folder's tables, figures, verdicts), :func:`analyze_run` (the same
  without drawing), :func:`make_plan` / :func:`apply_precision_plan` (which modules to keep in BF16);
- shapes: :class:`GemmShape`, :class:`GemmOp`, :class:`ModelConfig`, :func:`backward_shapes`,
  :func:`config_gemms`.

Everything else (``bench.engine``, ``capture.scope``, ...) is internal and may change.
"""

import logging as _logging

from .shapes import GemmOp, GemmShape, ModelConfig, backward_shapes, config_gemms

# What the tool says while a job runs (where the capture went, how long the sweep's rounds may take
# and why they stopped) is INFO: shown on stderr unless the application configured logging itself,
# as Lightning does for its own logger.
_log = _logging.getLogger(__name__)
if not _logging.getLogger().hasHandlers() and not _log.handlers:
    _log.setLevel(_logging.INFO)
    _log.addHandler(_logging.StreamHandler())
    _log.propagate = False

__version__ = "0.1.0"

__all__ = [
    # capture
    "GemmProfiler", "GemmProfilerCallback", "GemmCapture", "GemmRecord", "KernelProfile",
    "capture_steps",
    # measure
    "bench", "run_sweep",
    # report
    "report", "analyze_run", "make_plan", "apply_precision_plan",
    # shapes
    "GemmOp", "GemmShape", "ModelConfig", "backward_shapes", "config_gemms",
]

# Imported on demand: the Lightning adapter (the core never imports Lightning), and everything that
# needs torch (`te-gemm bench --devices N` starts its GPU workers before this process pays for it).
_LAZY = {
    "GemmProfilerCallback": ("callback", "GemmProfilerCallback"),
    "GemmCapture": ("capture", "GemmCapture"),
    "GemmProfiler": ("capture", "GemmProfiler"),
    "GemmRecord": ("capture", "GemmRecord"),
    "KernelProfile": ("capture.kernel_records", "KernelProfile"),
    "capture_steps": ("capture.steps", "capture_steps"),
    "bench": ("bench", None),  # the package, callable: bench(...) (see bench/__init__.py)
    "run_sweep": ("sweep", "run_sweep"),
    "report": ("render.report", "report"),
    "analyze_run": ("runs", "analyze_run"),
    "make_plan": ("plan", "make_plan"),
    "apply_precision_plan": ("plan", "apply_precision_plan"),
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        module = importlib.import_module(f".{mod}", __name__)
        return module if attr is None else getattr(module, attr)
    raise AttributeError(name)
