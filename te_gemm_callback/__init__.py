"""te-gemm-callback: the GEMMs your training job really runs, and what each precision does to them.

Public API, by what users touch:

- capture: :class:`GemmSchedule` (the capture window, publishing and the sweep, driven by any
  training loop; :class:`JobStep` / :class:`SweepJob` say where the loop is and how to sweep it),
  :class:`GemmProfilerCallback` (Lightning's hooks onto it; ``adapters.hf`` for the HF Trainer),
  :class:`GemmProfiler` (the capture of a few steps, framework-free), :class:`GemmCapture` /
  :class:`GemmRecord` (the capture file), :class:`KernelProfile` (kernel records of one step),
  :func:`capture_steps` (a step function run under the profiler);
- measure: :func:`bench` (microbenchmarks of the captured shapes), :func:`run_sweep` (observed step
  time per recipe on the live model);
- a run folder: :class:`Run` (its bench, analysis, report, plan and projection, the files read
  once), :func:`report` (its tables, figures, verdicts), :func:`analyze_run` (the same without
  drawing), :func:`make_plan` / :func:`apply_precision_plan` / :func:`native_plan` (which
  modules to keep in BF16, and the plan applied by wrapping them or as TE's own per-module recipe);
- shapes: :class:`GemmShape`, :class:`GemmOp`, :class:`ModelConfig`, :func:`backward_shapes`,
  :func:`config_gemms`.

Everything else (``microbench.engine``, ``capture.scope``, ...) is internal and may change.
"""

import logging as _logging

from te_gemm_callback.shapes import GemmOp, GemmShape, ModelConfig, backward_shapes, config_gemms

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
    "capture_steps", "GemmSchedule", "JobStep", "SweepJob",
    # measure
    "bench", "run_sweep",
    # report
    "Run", "report", "analyze_run", "make_plan", "apply_precision_plan", "native_plan", "project_run",
    # shapes
    "GemmOp", "GemmShape", "ModelConfig", "backward_shapes", "config_gemms",
]

# Imported on demand: the Lightning adapter (the core never imports Lightning), and everything that
# needs torch (`te-gemm bench --devices N` starts its GPU workers before this process pays for it).
_LAZY = {
    "GemmProfilerCallback": ("adapters.lightning", "GemmProfilerCallback"),
    "GemmCapture": ("capture", "GemmCapture"),
    "GemmProfiler": ("capture", "GemmProfiler"),
    "GemmRecord": ("capture", "GemmRecord"),
    "KernelProfile": ("capture.kernel_profile", "KernelProfile"),
    "capture_steps": ("capture.steps", "capture_steps"),
    "GemmSchedule": ("schedule", "GemmSchedule"),
    "JobStep": ("schedule", "JobStep"),
    "SweepJob": ("schedule", "SweepJob"),
    "bench": ("microbench", "bench"),
    "run_sweep": ("sweep.engine", "run_sweep"),
    "Run": ("reporting.run", "Run"),
    "report": ("reporting.run", "report"),
    "analyze_run": ("analysis.runs", "analyze_run"),
    "make_plan": ("analysis.plan", "make_plan"),
    "apply_precision_plan": ("sweep.plan", "apply_precision_plan"),
    "native_plan": ("sweep.native_plan", "native_plan"),
    "project_run": ("projection", "project_run"),
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        module = importlib.import_module(f".{mod}", __name__)
        return getattr(module, attr)
    raise AttributeError(name)
