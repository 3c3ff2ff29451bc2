"""Precision-aware MFU (projection/mfu.py): each GEMM's FLOPs at the peak of the format it ran in,
checked by hand against the public H200 peaks (989.5 dense BF16, 1979 dense FP8 TFLOP/s)."""

import pytest

from te_gemm_callback.capture.capture_file import GemmCapture, GemmRecord, StepTime
from te_gemm_callback.projection.mfu import precision_mfu, record_format


def cap(*precisions, device="NVIDIA H200", step_ms=10.0):
    recs = [GemmRecord(module=f"l{i}", gemm="", op="fprop", m=1000, k=1000, n=500_000, batch=1, precision=p,
                       operands=[], source="te", kernel="", recompute=False, module_type="Linear", calls=1,
                       calls_per_step=1.0, flops=1e12) for i, p in enumerate(precisions)]
    return GemmCapture(recs, [StepTime(0, wall_ms=step_ms, kind="clean")], {"device": device})


def test_each_gemm_counts_at_its_own_formats_peak():
    # 1 TFLOP in BF16 and 1 TFLOP in FP8 in a 10 ms step: 1.011 ms + 0.505 ms at peak, of 10 ms.
    assert precision_mfu(cap("bf16", "fp8_delayed")) == pytest.approx((1e12 / 989.5e12 + 1e12 / 1979e12) / 10e-3)
    # BF16's peak for both would read 20.2%, a third above the 15.2% the FP8 step uses of its GPU.
    assert precision_mfu(cap("bf16", "bf16")) == pytest.approx(2e12 / 989.5e12 / 10e-3)
    assert record_format("fp8_current+bf16") == "bf16" and record_format("nvfp4") == "fp4"


def test_no_mfu_where_no_peak_applies():
    assert precision_mfu(cap("bf16", device="CPU (x86_64)")) is None  # no public peak for a CPU
    assert precision_mfu(cap("fp32")) is None  # FP32 GEMMs: no tensor-core peak stated
    assert precision_mfu(cap("nvfp4")) is None  # Hopper has no FP4 rate
    assert precision_mfu(cap("nvfp4", device="NVIDIA B300")) == pytest.approx(1e12 / 13500e12 / 10e-3)
