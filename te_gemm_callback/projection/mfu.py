"""Precision-aware MFU: each GEMM's FLOPs against the GPU's dense peak for the tensor format it
really ran in, over the step. One peak for every precision (Lightning's ThroughputMonitor takes
one per dtype) puts an FP8 step's utilization off by up to 2x; torchtitan turns MFU off under FP8.
The report puts it per observed run in ``meta.mfu`` (reporting/speedups.py).

    MFU = sum_i FLOPs_i / peak(format_i) / step time

which is the share of the step the GEMMs would take at the format's peak (Chowdhery et al., PaLM,
2022, appendix B, with the peak taken per GEMM). Public peaks: projection/gpus.py."""

from __future__ import annotations

from typing import Any

# A capture record's precision (the family it ran; "a+b" where operands differ) -> tensor format.
FORMAT_OF = {"bf16": "bf16", "fp16": "bf16", "fp8_delayed": "fp8", "fp8_current": "fp8", "fp8_block": "fp8",
             "mxfp8": "fp8", "nvfp4": "fp4"}
_SLOWER = ("bf16", "fp8", "fp4")  # a GEMM of mixed operands runs at its higher precision's rate


def record_format(precision: str) -> str | None:
    """The tensor format a GEMM of ``precision`` runs at; None where no peak applies (FP32)."""
    fmts = [FORMAT_OF.get(p) for p in str(precision).split("+")]
    if not fmts or any(f is None for f in fmts):
        return None
    return min(fmts, key=_SLOWER.index)


def precision_mfu(cap: Any, device: str | None = None) -> float | None:
    """Precision-aware MFU of ``cap``'s clean step on its GPU (``device``: its name, default the
    capture's); None on a GPU without public peaks here, with a GEMM in a format it has no peak
    for (FP32), or without a step time."""
    from te_gemm_callback.projection.gpus import gpu_of_device

    spec = gpu_of_device(device or str(cap.meta.get("device", "")))
    step = cap.step_ms()
    if spec is None or not step or not cap.records:
        return None
    seconds = 0.0
    for r in cap.records:
        fmt = record_format(r.precision)
        peak = spec.peak(fmt) if fmt else None
        if not peak:
            return None
        seconds += r.flops_per_step / (peak * 1e12)
    return seconds / (step * 1e-3)
