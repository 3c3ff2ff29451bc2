"""Classify GPU kernels by name (torch.profiler / CUPTI), for cross-checks and step breakdowns."""

from __future__ import annotations

# cuBLAS(Lt) and CUTLASS GEMM kernels on Hopper/Blackwell: "sm90_xmma_gemm_...", "nvjet_...",
# "cutlass3x_sm90_..._gemm...", and cuBLASLt's split-K reduction ("cublasLt::splitKreduce_kernel",
# which follows an "nvjet_..._splitK_..." GEMM and finishes it: docs/results/h200.md, facts the code
# relies on: split-K). Fused attention kernels also use tensor cores but are not GEMMs in our
# accounting (docs/design.md): they are matched first.
_ATTENTION = ("fmha", "flash", "sdpa", "attn", "attention")
_GEMM = ("gemm", "nvjet", "xmma", "cutlass", "gemv", "splitkreduce")


def is_attention_kernel(name: str) -> bool:
    low = name.lower()
    return any(s in low for s in _ATTENTION)


def is_gemm_kernel(name: str) -> bool:
    low = name.lower()
    return not is_attention_kernel(low) and any(s in low for s in _GEMM)


def kernel_times_us(prof) -> dict[str, float]:
    """Total device time per kernel name (µs) from a finished ``torch.profiler.profile``."""
    out: dict[str, float] = {}
    for evt in prof.key_averages():
        t = getattr(evt, "self_device_time_total", None)
        if t is None:
            t = getattr(evt, "self_cuda_time_total", 0.0)
        if t and getattr(evt, "device_type", None) is not None and "CUDA" in str(evt.device_type):
            out[evt.key] = out.get(evt.key, 0.0) + float(t)
    return out


# Where step time goes besides GEMMs: the "overhead eats the gain" verdict says where it went.
# TE's kernels are named after what they do: cast_transpose, (multi_)amax, compute_scale, quantize.
_QUANT = ("quantize", "cast", "amax", "compute_scale", "scale_inv", "fp8", "transpose")
_NORM = ("norm",)
_OPTIM = ("adam", "multi_tensor", "sgd", "optimizer")
_COMM = ("nccl",)
CATEGORIES = ("gemm", "attention", "quantization/cast", "norm", "communication", "optimizer", "other")


def classify_kernel(name: str) -> str:
    low = name.lower()
    if any(s in low for s in _COMM):
        return "communication"
    if is_attention_kernel(low):
        return "attention"
    if is_gemm_kernel(low):
        return "gemm"
    if any(s in low for s in _QUANT):
        return "quantization/cast"
    if any(s in low for s in _NORM):
        return "norm"
    if any(s in low for s in _OPTIM):
        return "optimizer"
    return "other"


def breakdown_ms(kernel_us: dict[str, float], steps: int) -> dict[str, float]:
    """Kernel time per category and step (ms), from ``kernel_times_us``. Kernel time, not stream
    time: idle gaps are not in it, so the parts can sum to less than the step."""
    out = {c: 0.0 for c in CATEGORIES}
    for name, us in kernel_us.items():
        out[classify_kernel(name)] += us / 1e3 / max(steps, 1)
    return out


def top_kernels_ms(kernel_us: dict[str, float], steps: int, n: int = 3) -> dict[str, list[tuple[str, float]]]:
    """The ``n`` longest kernels per category (name cut to 120 characters, ms per step): what a
    category holds, e.g. which casts fill "quantization/cast" in a BF16 step."""
    out: dict[str, list[tuple[str, float]]] = {}
    for name, us in sorted(kernel_us.items(), key=lambda kv: -kv[1]):
        lst = out.setdefault(classify_kernel(name), [])
        if len(lst) < n:
            lst.append((name[:120], us / 1e3 / max(steps, 1)))
    return out


def kernel_intervals(prof, device: str = "CUDA") -> list[tuple[str, float, float]]:
    """(name, start µs, end µs) of every GPU kernel (``device`` activity) in a finished
    ``torch.profiler.profile``, times from the trace's start.

    Read from Kineto's raw events: ``prof.events()`` first builds a FunctionEvent per record in
    Python, several times the time for the same tuples, and it runs between the kernels step and the
    next step of the job (docs/results/h200.md, facts the code relies on: kernel intervals). Same
    names and times (tests/capture/test_clean_steps.py)."""
    try:
        results = prof.profiler.kineto_results
        t0 = results.trace_start_ns()
        # The parser's own filter (names Kineto already demangled; hidden records skipped).
        return [(e.name(), (e.start_ns() - t0) / 1e3, (e.start_ns() - t0 + e.duration_ns()) / 1e3)
                for e in results.events() if device in str(e.device_type())
                and not getattr(e, "is_hidden_event", lambda: False)()]
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
    """Communication kernel time per step, and how much of it no compute kernel overlapped
    ("exposed": on the critical path unless the host was the bottleneck). Union of intervals, so
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


# Runtime calls after which the host waits for the GPU. cudaMemcpy without Async waits for its
# stream (a device-to-host copy: loss.item(), a norm for clipping); cudaStreamSynchronize for one
# stream; cudaDeviceSynchronize and cudaEventSynchronize for all the work launched before them
# (an event waits on one stream, but its stream is not in the record: all is the safe reading).
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
