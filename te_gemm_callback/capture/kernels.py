"""Classify GPU kernels by name (torch.profiler / CUPTI), for cross-checks and step breakdowns."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

# cuBLAS(Lt) and CUTLASS GEMM kernels ("sm90_xmma_gemm_...", "nvjet_...", "cutlass3x_..._gemm..."),
# and cuBLASLt's split-K reduction that finishes an nvjet GEMM (docs/results/h200.md: split-K).
# Fused attention kernels are no GEMMs here (docs/design.md): they are matched first.
_ATTENTION = ("fmha", "flash", "sdpa", "attn", "attention")
_GEMM = ("gemm", "nvjet", "xmma", "cutlass", "gemv", "splitkreduce")


def is_gemm_kernel(name: str) -> bool:
    low = name.lower()
    return not any(s in low for s in _ATTENTION) and any(s in low for s in _GEMM)


def kernel_key(name: str) -> str:
    """A kernel's name without its template and call arguments: the same kernel at every shape and stream."""
    name = name.replace("(anonymous namespace)::", "").removeprefix("void ")
    return re.split(r"[<(]", name, maxsplit=1)[0].strip()


def kernel_times_us(prof: Any) -> dict[str, float]:
    """Total device time per kernel name (µs) from a finished ``torch.profiler.profile``."""
    out: dict[str, float] = {}
    for evt in prof.key_averages():
        t = getattr(evt, "self_device_time_total", None)
        if t is None:
            t = getattr(evt, "self_cuda_time_total", 0.0)
        if t and getattr(evt, "device_type", None) is not None and "CUDA" in str(evt.device_type):
            out[evt.key] = out.get(evt.key, 0.0) + float(t)
    return out


# Where step time goes besides GEMMs, matched in this order. TE's kernels are named after what they
# do: cast_transpose, (multi_)amax, compute_scale, quantize.
_CLASSES = (
    ("communication", ("nccl",)),
    ("attention", _ATTENTION),
    ("gemm", _GEMM),
    ("quantization/cast", ("quantize", "cast", "amax", "compute_scale", "scale_inv", "fp8", "transpose")),
    ("norm", ("norm",)),
    ("optimizer", ("adam", "multi_tensor", "sgd", "optimizer")),
)
CATEGORIES = ("gemm", "attention", "quantization/cast", "norm", "communication", "optimizer", "other")


def classify_kernel(name: str) -> str:
    low = name.lower()
    return next((cat for cat, subs in _CLASSES if any(s in low for s in subs)), "other")


def breakdown_ms(kernel_us: dict[str, float], steps: int) -> dict[str, float]:
    """Kernel time per category and step (ms), from ``kernel_times_us``: idle gaps are not in it."""
    out = {c: 0.0 for c in CATEGORIES}
    for name, us in kernel_us.items():
        out[classify_kernel(name)] += us / 1e3 / max(steps, 1)
    return out


def top_kernels_ms(kernel_us: dict[str, float], steps: int, n: int = 3) -> dict[str, list[tuple[str, float]]]:
    """The ``n`` longest kernels per category (name cut to 120 characters, ms per step)."""
    out: dict[str, list[tuple[str, float]]] = {}
    for name, us in sorted(kernel_us.items(), key=lambda kv: -kv[1]):
        lst = out.setdefault(classify_kernel(name), [])
        if len(lst) < n:
            lst.append((name[:120], us / 1e3 / max(steps, 1)))
    return out


def raw_events(prof: Any, device: str | None = None) -> Iterator[tuple[Any, float, float]]:
    """(event, start µs, end µs) of a finished session's Kineto records (``device`` only: its visible ones),
    read without building a Python object per record; AttributeError on a torch without them."""
    results = prof.profiler.kineto_results
    t0 = results.trace_start_ns()
    for e in results.events():
        if device is None or (device in str(e.device_type()) and not getattr(e, "is_hidden_event", lambda: False)()):
            yield e, (e.start_ns() - t0) / 1e3, (e.start_ns() - t0 + e.duration_ns()) / 1e3


def kernel_intervals(prof: Any, device: str = "CUDA") -> list[tuple[str, float, float]]:
    """(name, start µs, end µs) of every ``device`` kernel of a finished ``torch.profiler.profile``, from the
    trace's start; raw records, as ``prof.events()`` is slower (docs/results/h200.md: kernel intervals)."""
    try:
        return [(e.name(), s, t) for e, s, t in raw_events(prof, device)]
    except AttributeError:  # another torch: the parsed events
        return [(evt.name, float(evt.time_range.start), float(evt.time_range.end)) for evt in prof.events()
                if device in str(getattr(evt, "device_type", ""))]


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for s, e in sorted(spans):
        if merged and s <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], e))
        else:
            merged.append((s, e))
    return merged


def comm_overlap_ms(intervals: list[tuple[str, float, float]], steps: int) -> dict[str, float]:
    """Communication kernel time per step, and the part no compute kernel overlapped ("exposed");
    concurrent NCCL kernels count once."""
    comm = _union([(s, e) for n, s, e in intervals if classify_kernel(n) == "communication"])
    compute = _union([(s, e) for n, s, e in intervals if classify_kernel(n) != "communication"])
    total = sum(e - s for s, e in comm)
    overlapped, j = 0.0, 0
    for s, e in comm:  # two sorted, disjoint lists: one sweep
        while j < len(compute) and compute[j][1] <= s:
            j += 1
        k = j
        while k < len(compute) and compute[k][0] < e:
            overlapped += min(e, compute[k][1]) - max(s, compute[k][0])
            k += 1
    n = max(steps, 1)
    return {"comm_ms": total / 1e3 / n, "comm_exposed_ms": (total - overlapped) / 1e3 / n}


# Runtime calls after which the host waits for the GPU: a copy without Async (loss.item()) or a stream
# sync for one stream; a device or event sync for all (an event's stream is not in the record).
_SYNC_STREAM = ("cudaMemcpy", "cudaStreamSynchronize", "cuMemcpyDtoH", "cuStreamSynchronize")
_SYNC_DEVICE = ("cudaDeviceSynchronize", "cudaEventSynchronize", "cuCtxSynchronize", "cuEventSynchronize")
# Calls that launch GPU work: their kernel (or copy, or memset) carries the same correlation id.
_LAUNCH = ("Launch", "Memcpy", "Memset", "cudaGraphLaunch")


def call_kind(name: str) -> str:
    """"sync_device", "sync_stream", "launch" or "other" for a CUDA runtime or driver call."""
    if any(name.startswith(s) for s in _SYNC_DEVICE):
        return "sync_device"
    if any(name.startswith(s) for s in _SYNC_STREAM) and "Async" not in name:
        return "sync_stream"
    if any(s in name for s in _LAUNCH):
        return "launch"
    return "other"
