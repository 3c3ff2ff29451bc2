"""A hand-made capture and microbenchmark of one linear layer, for speedup accounting by hand."""

from te_gemm_callback.capture.capture_file import GemmCapture, GemmRecord, KernelTimeline, StepTime
from te_gemm_callback.microbench.cells import BenchResult
from te_gemm_callback.microbench.results import BenchResults

M, K, N = 1024, 512, 2048


def capture(step_ms, gemm_ms, precision="bf16", recipe=None):
    """A capture of one linear layer: fprop/dgrad/wgrad taking gemm_ms together per step."""
    recs = []
    for op, (m, k, n) in (("fprop", (M, K, N)), ("dgrad", (M, N, K)), ("wgrad", (K, M, N))):
        recs.append(GemmRecord(module="layer", gemm="", op=op, m=m, k=k, n=n, batch=1, precision=precision,
                               operands=[], source="te", kernel="general_gemm", recompute=False,
                               module_type="Linear", calls=3, calls_per_step=1.0, flops=2 * M * K * N,
                               times_ms=[gemm_ms / 3] * 3))
    steps = [StepTime(i, wall_ms=step_ms, gpu_ms=step_ms, gemm_ms=gemm_ms) for i in range(3)]
    meta = {"device": "test", "recipe": recipe} if recipe else {"device": "test"}
    return GemmCapture(recs, steps, meta)


def bench(per_pass_ms: dict[str, float]):
    res = []
    for prec, ms in per_pass_ms.items():
        for op, (m, k, n) in (("fprop", (M, K, N)), ("dgrad", (M, N, K)), ("wgrad", (K, M, N))):
            res.append(BenchResult(m, k, n, op, prec, "autocast", median_ms=ms, q1_ms=ms, q3_ms=ms, iters=5))
    return BenchResults(res, {"NVFP4BlockScaling": "needs sm_100"}, {"modes": ["autocast"]})


def replayable(cap):
    """``cap`` with a kernels step the replay can run: each GEMM's kernel and one kernel for the rest of the
    step, launched back to back with no host time, so its replay is GPU-bound and equals Amdahl's law."""
    step_ms = cap.step_ms()
    gemm = [r.times_ms[0] * r.calls_per_step * 1e3 for r in cap.records]
    kernels = [[0, 0.0, us, 7, j, j] for j, us in enumerate(gemm)]
    kernels.append([1, 0.0, step_ms * 1e3 - sum(gemm), 7, None, len(gemm)])
    calls = [[0.0, 0.0, "launch", [j]] for j in range(len(kernels))]
    tl = KernelTimeline(step=0, span_us=step_ms * 1e3, names=["nvjet_gemm", "elementwise_kernel"], kernels=kernels,
                        total=len(kernels), calls=calls, latency_us=5.0)
    return GemmCapture(cap.records, cap.steps, cap.meta, kernel_timeline=tl)


def bench_of(**gemm_ms):
    """A bench whose GEMMs take ``gemm_ms`` per step in each recipe (fprop, dgrad and wgrad a third each)."""
    return bench({r: ms / 3 for r, ms in gemm_ms.items()})
