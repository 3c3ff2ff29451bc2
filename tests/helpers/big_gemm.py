"""A made-up H200 bench of one compute-bound GEMM (every number traceable), for projections."""

from te_gemm_callback.microbench.cells import BenchResult
from te_gemm_callback.microbench.results import BenchResults
from te_gemm_callback.shapes import GemmOp, GemmShape


def cell(shape, precision, mode, ms, spread=0.0):
    return BenchResult(m=shape.m, k=shape.k, n=shape.n, op=str(shape.op), precision=precision, mode=mode,
                       median_ms=ms, q1_ms=ms * (1 - spread), q3_ms=ms * (1 + spread), iters=16, backend="te")


BIG = GemmShape(8192, 8192, 8192, GemmOp.FPROP)  # compute-bound everywhere: no memory floor


def made_up_bench():
    res = [cell(BIG, "BF16", "prequantized", 2.0, 0.02), cell(BIG, "BF16", "autocast", 2.1),
           cell(BIG, "Float8CurrentScaling", "prequantized", 1.0), cell(BIG, "Float8CurrentScaling", "autocast", 1.5)]
    meta = {"device": "NVIDIA H200", "sm_clock_max_mhz": "2000",
            "clocks_during_run": {"sm_clock_mhz_median": 1600.0}, "modes": ["autocast", "prequantized"]}
    return BenchResults(res, {}, meta)
