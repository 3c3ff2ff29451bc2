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


def run_folder(tmp_path, gap_us, layers=50):
    """A run folder of a job of ``layers`` TE Linear layers of one BIG GEMM each (fprop only),
    measured on an H200 in BF16: its kernels step as the host issued it (``gap_us`` of host work
    before each launch) and the GPU ran it, its clean step that long, and a bench of the shape
    in BF16 and Float8CurrentScaling with module costs (FP8 costs the host 30 us more a forward)."""
    from te_gemm_callback.capture.capture_file import GemmCapture
    from te_gemm_callback.capture.capture_items import GemmRecord, KernelTimeline, StepTime

    recs = [GemmRecord(module=f"layers.{i}", gemm="", op="fprop", m=BIG.m, k=BIG.k, n=BIG.n, batch=1,
                       precision="bf16", operands=["bf16", "bf16"], source="te", kernel="", recompute=False,
                       module_type="Linear", calls=1, calls_per_step=1, flops=2 * BIG.m * BIG.k * BIG.n,
                       times_ms=[2.0]) for i in range(layers)]
    kernels = [[0, 10.0 + i * 2000.0, 2000.0, 7, i, i] for i in range(layers)]
    calls = [[0.0, 1.0, "other", []]] + [[gap_us, 4.0, "launch", [i]] for i in range(layers)]
    calls += [[gap_us, 4.0, "sync_stream", []], [1.0, 1.0, "other", []]]
    tl = KernelTimeline(step=1, span_us=layers * 2000.0, names=["nvjet_sm90_gemm"], kernels=kernels, total=layers,
                        calls=calls, latency_us=5.0)
    host = layers * (gap_us + 4.0) + gap_us + 4.0 + 2.0
    step_ms = max(host, layers * 2000.0) / 1e3
    steps = [StepTime(0, step_ms, kind="instrumented"), StepTime(1, step_ms, gemm_ms=2.0 * layers, kind="kernels")]
    steps += [StepTime(i, step_ms, kind="clean") for i in (2, 3, 4)]
    cap = GemmCapture(recs, steps, meta={"device": "NVIDIA H200"}, kernel_timeline=tl)
    cap.save(tmp_path / "gemm_capture.json")
    bench = made_up_bench()
    cost = {"host_fwd_us": 50.0, "host_bwd_us": 0.0, "gpu_gemm_us": 0.0, "gpu_other_us": 0.0}
    bench.meta["module_costs"] = {"modules": {f"layers.{i}": "k" for i in range(layers)}, "kinds": {"k": {
        "BF16": cost, "Float8CurrentScaling": {**cost, "host_fwd_us": 80.0}}}}
    bench.save(tmp_path / "bench.json")
    return tmp_path
