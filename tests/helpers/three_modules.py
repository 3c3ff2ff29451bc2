"""A hand-made capture and microbenchmark of three modules (TE cannot run on CPU, so the bench's
cells are written out: which module wins or loses in FP8 is then known exactly)."""

from te_gemm_callback.capture.capture_file import GemmCapture, GemmRecord, StepTime
from te_gemm_callback.microbench.cells import BenchResult
from te_gemm_callback.microbench.results import BenchResults

# Three modules: "big" where FP8 wins, "small" where it loses, "router" (8 wide) it cannot run.
SHAPES = {"big": (1024, 1024, 4096), "small": (64, 32, 32), "router": (1024, 1024, 8)}
# ms per pass (fprop, dgrad, wgrad each) per recipe; None: the cell failed (FP8 needs dims % 16).
TIMES = {"big": {"BF16": 1.0, "Float8CurrentScaling": 0.5, "DelayedScaling": 0.55},
         "small": {"BF16": 0.01, "Float8CurrentScaling": 0.03, "DelayedScaling": 0.04},
         "router": {"BF16": 0.02, "Float8CurrentScaling": None, "DelayedScaling": None}}


def capture(step_ms=10.0, gemm_ms=3.06):
    recs = []
    for mod, (m, k, n) in SHAPES.items():
        for op, (a, b, c) in (("fprop", (m, k, n)), ("dgrad", (m, n, k)), ("wgrad", (k, m, n))):
            recs.append(GemmRecord(module=mod, gemm="", op=op, m=a, k=b, n=c, batch=1, precision="bf16", operands=[],
                                   source="te", kernel="general_gemm", recompute=False, module_type="Linear", calls=1,
                                   calls_per_step=1.0, flops=2 * m * k * n))
    steps = [StepTime(0, wall_ms=15.0, kind="instrumented", dispatch=True),
             StepTime(1, wall_ms=step_ms, gpu_ms=step_ms, gemm_ms=gemm_ms, kind="kernels"),
             StepTime(2, wall_ms=step_ms, gpu_ms=step_ms, kind="clean")]
    return GemmCapture(recs, steps, {"device": "test"})


def bench():
    res = []
    for mod, (m, k, n) in SHAPES.items():
        for op, (a, b, c) in (("fprop", (m, k, n)), ("dgrad", (m, n, k)), ("wgrad", (k, m, n))):
            for recipe, ms in TIMES[mod].items():
                res.append(BenchResult(a, b, c, op, recipe, "autocast", median_ms=ms, iters=5,
                                       error=None if ms is not None else "Assertion failed: ret.lda % 16 == 0"))
    return BenchResults(res, {"NVFP4BlockScaling": "needs sm_100"}, {"modes": ["autocast"], "device": "test"})
