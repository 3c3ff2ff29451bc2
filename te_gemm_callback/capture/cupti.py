"""Whether another profiler owns CUPTI's activity records in this process.

Kernel records (:mod:`.kernel_profile`) are CUPTI activity records read through ``torch.profiler``.
CUPTI gives them to one subscriber: under Nsight Systems, Kineto's start fails
(``CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED``) and the session returns no kernel at all
(docs/results/h200.md, facts the code relies on: CUPTI owner). So the owner is found before a
kernels step is planned, from what each tool leaves in the process:

- Nsight Systems (``nsys profile``, ``nsys launch``) sets ``NSYS_PROFILING_SESSION_ID`` and loads
  its injection library through ``CUDA_INJECTION64_PATH`` (``.../libToolsInjection64.so``);
- Nsight Compute (``ncu``) sets ``NV_COMPUTE_PROFILER_PERFWORKS_DIR`` and ``NV_TPS_LAUNCH_TOKEN``
  (and no ``CUDA_INJECTION64_PATH``);
- any other CUPTI tool is loaded through ``CUDA_INJECTION64_PATH``;
- a ``torch.profiler`` session of the job's own is running in this process.

(The variables are those each tool set for the process it launched: docs/results/h200.md, facts
the code relies on: CUPTI owner.)

What the capture does then: under Nsight Systems, another injection or the job's torch.profiler,
each GEMM is timed by a CUDA-event pair on the instrumented steps (the steps that would have run
with kernel records, and the settle steps after them, run instrumented instead); under Nsight
Compute nothing is timed, since it replays and serializes the kernels it profiles, and only shapes
and precisions are kept.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

# What the capture does under each owner: "events" (CUDA-event pairs) or "none" (no GEMM time).
EVENTS, NONE = "events", "none"


@dataclass(frozen=True)
class CuptiOwner:
    """The profiler that holds CUPTI, how it was recognised, and the per-GEMM timing left to us."""

    name: str
    evidence: str
    timing: str  # EVENTS or NONE
    note: str = ""  # what else the user should know of this profiler's session (nsys_cpu_collectors)

    def line(self) -> str:
        """The one line the capture logs, naming the profiler and what it changes."""
        if self.timing == NONE:
            text = (f"te-gemm: {self.name} is profiling this process ({self.evidence}): it replays the kernels it "
                    "profiles, so GPU times taken inside it are not the job's; the capture keeps GEMM shapes and "
                    "precisions and times no GEMM")
        else:
            text = (f"te-gemm: {self.name} is profiling this process ({self.evidence}) and holds CUPTI's kernel "
                    "records: per-GEMM GPU times come from CUDA events around each GEMM on the instrumented steps "
                    "instead (the kernels steps run instrumented)")
        return f"{text}; {self.note}" if self.note else text

    def meta(self) -> str:
        """What the capture file keeps of it (``meta.cupti_owner``)."""
        return f"{self.name} ({self.evidence})"


def _injection_name(path: str) -> str:
    base = os.path.basename(path)
    if "ToolsInjection" in base:  # Nsight Systems' injection library, also bundled with Nsight Compute
        return "Nsight Systems"
    return f"a CUPTI tool ({base})"


def nsys_cpu_collectors(environ: Mapping[str, str]) -> str:
    """A note where nsys samples CPUs or traces context switches for this process, else "".

    With either collector on, nsys copies the process's shared libraries into the recording (large
    with torch's CUDA build, and the job held while it does), whatever the capture range. nsys says
    so nowhere in the process's environment; its session folder holds a ``linuxperf`` entry where one
    of the two is on (docs/results/h200.md, facts the code relies on: nsys CPU collectors).
    """
    folder = environ.get("NSYS_SESSION_TEMP_DIR", "")
    if not folder or not os.path.exists(os.path.join(folder, "linuxperf")):
        return ""
    return ("nsys is also sampling CPUs or tracing context switches (its session folder has linuxperf), so it "
            "copies this process's shared libraries into the recording (~2 GB with torch's CUDA build); "
            "`nsys profile -s none --cpuctxsw=none` keeps it to a few MB (docs/nsight-systems.md)")


def torch_profiler_running() -> bool:
    """Whether a torch.profiler (or autograd profiler) session records in this process now. A
    scheduled session in its wait phase is not recording yet, and reads False."""
    try:
        import torch

        return bool(torch._C._autograd._profiler_enabled())
    except (ImportError, AttributeError, RuntimeError):  # another torch: nothing to tell by
        return False


def cupti_owner(environ: Mapping[str, str] | None = None,
                profiler_running: Callable[[], bool] = torch_profiler_running) -> CuptiOwner | None:
    """The profiler that owns CUPTI's activity records in this process, or None when none does.

    Example:
        >>> cupti_owner({"NSYS_PROFILING_SESSION_ID": "10558"}, lambda: False).name
        'Nsight Systems'
        >>> cupti_owner({}, lambda: False) is None
        True
    """
    env = os.environ if environ is None else environ
    if env.get("NSYS_PROFILING_SESSION_ID"):
        return CuptiOwner("Nsight Systems", f"NSYS_PROFILING_SESSION_ID={env['NSYS_PROFILING_SESSION_ID']}", EVENTS,
                          nsys_cpu_collectors(env))
    for var in ("NV_COMPUTE_PROFILER_PERFWORKS_DIR", "NV_TPS_LAUNCH_TOKEN"):
        if env.get(var):
            return CuptiOwner("Nsight Compute", f"{var} set", NONE)
    for var in ("CUDA_INJECTION64_PATH", "CUDA_INJECTION32_PATH"):
        if env.get(var):
            return CuptiOwner(_injection_name(env[var]), f"{var}={env[var]}", EVENTS)
    if profiler_running():
        return CuptiOwner("torch.profiler", "a session of the job's own is recording", EVENTS)
    return None


__all__ = ["CuptiOwner", "cupti_owner", "nsys_cpu_collectors", "torch_profiler_running", "EVENTS", "NONE"]
