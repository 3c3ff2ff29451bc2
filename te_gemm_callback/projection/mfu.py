"""Precision-aware MFU, sum_i FLOPs_i / peak(format_i) / step time: each GEMM against the dense peak of the
format it ran in (PaLM, 2022, appendix B, with the peak per GEMM); one peak for every precision puts an
FP8 step's utilization off by up to 2x."""

from __future__ import annotations

from typing import Any

from te_gemm_callback.projection.gpus import gpu_of_device

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
    """Precision-aware MFU of ``cap``'s clean step on ``device`` (default the capture's); None without a
    public peak for the GPU or a GEMM's format (FP32), or without a step time."""
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
