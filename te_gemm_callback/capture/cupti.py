"""Whether another profiler owns CUPTI's activity records in this process, told by the variables each tool sets or
a running torch.profiler. CUPTI serves one subscriber: under another, kernel records (:mod:`.kernel_profile`) come
back empty (docs/results/h200.md: CUPTI owner)."""

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
    note: str = ""  # what else the user should know of this profiler's session

    def line(self) -> str:
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
        return f"{self.name} ({self.evidence})"


def nsys_cpu_collectors(environ: Mapping[str, str]) -> str:
    """A note if nsys samples CPUs or traces context switches, else "" (docs/results/h200.md, nsys CPU collectors)."""
    folder = environ.get("NSYS_SESSION_TEMP_DIR", "")
    if not folder or not os.path.exists(os.path.join(folder, "linuxperf")):
        return ""
    return ("nsys is also sampling CPUs or tracing context switches (its session folder has linuxperf), so it "
            "copies this process's shared libraries into the recording (~2 GB with torch's CUDA build); "
            "`nsys profile -s none --cpuctxsw=none` keeps it to a few MB (docs/nsight-systems.md)")


def torch_profiler_running() -> bool:
    """Whether a torch.profiler (or autograd profiler) session records in this process now."""
    try:
        import torch

        return bool(torch._C._autograd._profiler_enabled())
    except (ImportError, AttributeError, RuntimeError):  # another torch: nothing to tell by
        return False


def cupti_owner(environ: Mapping[str, str] | None = None,
                profiler_running: Callable[[], bool] = torch_profiler_running) -> CuptiOwner | None:
    """The profiler that owns CUPTI's activity records in this process, or None when none does.

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
            base = os.path.basename(env[var])  # ToolsInjection: Nsight Systems' (also bundled with ncu)
            name = "Nsight Systems" if "ToolsInjection" in base else f"a CUPTI tool ({base})"
            return CuptiOwner(name, f"{var}={env[var]}", EVENTS)
    if profiler_running():
        return CuptiOwner("torch.profiler", "a session of the job's own is recording", EVENTS)
    return None
