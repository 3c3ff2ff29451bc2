"""The microbenchmark's MXFP8 / NVFP4 paths, on a host that can run neither.

Transformer Engine only installs on CUDA hosts and these recipes need a Blackwell GPU, so each test
stands in for exactly what cannot run here and says so: TE's module or its availability checks,
the GPU's compute capability, a CUDA fault, CUDA events and streams. Everything else (the rules,
the cache keys, the rate model, the queue and the engine) is the package's own code, run as is.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import sys
import types
import warnings

import pytest
import torch

from te_gemm_callback import precisions
from te_gemm_callback.capture import te_adapter
from te_gemm_callback.microbench import engine, jobs, rates
from te_gemm_callback.microbench.cache import ResultCache
from te_gemm_callback.microbench.cells import FP8_FAMILY, BenchResult
from te_gemm_callback.microbench.engine import BenchRun, BenchStopped, run_bench
from te_gemm_callback.microbench.items import WorkItem
from te_gemm_callback.microbench.job_queue import JobQueue, JobVisits, PlannedJob, context_lost
from te_gemm_callback.shapes import GemmOp, GemmShape

cpu_only = pytest.mark.skipif(torch.cuda.is_available(),
                              reason="stands in for a GPU; tests/test_gpu.py has the real one")


@pytest.fixture(autouse=True)
def _h200_rate_model():
    rates.set_rate_model(None)
    yield
    rates.set_rate_model(None)  # a test's GPU must not size the next test's jobs


# --- which recipes run where ------------------------------------------------------------------


@pytest.fixture
def gpu_of(monkeypatch):
    """A CUDA host with TE, of the capability the test sets. Neither exists here: the GPU's
    capability is a stand-in, and so are TE's checks, which answer as TE's do (pytorch/
    quantization.py:149-186: FP8 from 8.9, block scaling from 9.0, MXFP8 on 10.x and 11.x only,
    NVFP4 on any SM >= 10.0)."""
    cap = {"cc": (9, 0)}

    def check(ok, why):
        return lambda return_reason=False: (True, "") if ok(cap["cc"]) else (False, why)

    fake_te = types.SimpleNamespace(
        is_fp8_available=check(lambda cc: cc >= (8, 9), "Device compute capability 8.9 or higher required"),
        is_fp8_block_scaling_available=check(lambda cc: cc >= (9, 0), "FP8 block scaled GEMM requires 9.0"),
        is_mxfp8_available=check(lambda cc: (10, 0) <= cc < (12, 0),
                                 "MXFP8 (for all gemm layouts) is not supported on 12.0+ architectures yet."),
        is_nvfp4_available=check(lambda cc: cc >= (10, 0),
                                 "Device compute capability 10.0 or higher required for NVFP4 execution."))
    monkeypatch.setattr(precisions, "te_available", lambda: (True, ""))
    monkeypatch.setattr(precisions, "import_te", lambda: fake_te)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: cap["cc"])
    return lambda cc: cap.update(cc=cc)


@pytest.mark.parametrize("cc, nvfp4, fp8_block", [
    ((10, 0), True, True), ((10, 3), True, True), ((11, 0), False, True), ((12, 0), False, False),
    ((12, 1), False, False)])
def test_nvfp4_runs_on_sm_100_and_103_only_and_fp8_block_scaling_not_on_sm_12(gpu_of, cc, nvfp4, fp8_block):
    gpu_of(cc)
    a, b = precisions.availability("NVFP4BlockScaling"), precisions.availability("Float8BlockScaling")
    assert (a.ok, b.ok) == (nvfp4, fp8_block)
    sm = f"SM {cc[0]}.{cc[1]}"
    if not nvfp4:
        assert a.reason == f"NVFP4 training is supported on SM 10.0 and 10.3 only (TE's nvfp4.rst); this GPU is {sm}"
    if not fp8_block:
        assert b.reason == ("Float8BlockScaling runs as MXFP8 on Blackwell, which TE does not support on SM 12.0+; "
                            f"this GPU is {sm}")
    assert precisions.availability("Float8CurrentScaling").ok


def test_te_refusals_keep_te_reason(gpu_of):
    gpu_of((9, 0))  # an H100/H200: TE says no first, in its own words
    assert precisions.availability("NVFP4BlockScaling").reason == (
        "Device compute capability 10.0 or higher required for NVFP4 execution.")
    assert precisions.availability("Float8BlockScaling").ok
    gpu_of((12, 0))
    assert precisions.availability("MXFP8BlockScaling").reason == (
        "MXFP8 (for all gemm layouts) is not supported on 12.0+ architectures yet.")


# --- shapes TE cannot quantize ----------------------------------------------------------------


def test_shape_rules_of_the_block_scaled_recipes():
    sp = precisions.shape_problem
    assert sp("MXFP8BlockScaling", 4096, 4096, 4096) is None
    assert sp("mxfp8", 48, 4096, 1000) == ("MXFP8BlockScaling needs M, K and N divisible by 32 (TE's quantization "
                                           "blocks): M=48, N=1000")
    assert sp("NVFP4BlockScaling", 64, 80, 64) == ("NVFP4BlockScaling needs M, K and N divisible by 32 (TE's "
                                                   "quantization blocks): K=80")
    for recipe in ("BF16", "DelayedScaling", "Float8CurrentScaling", "Float8BlockScaling"):
        assert sp(recipe, 48, 80, 1000) is None  # their rules are TE's own, checked where it runs them
    # Grouped: rows are padded per group (M not checked); NVFP4 split-quantize needs K, N % 128.
    assert sp("MXFP8BlockScaling", None, 2880, 2880, grouped=True) is None
    assert sp("NVFP4BlockScaling", None, 2880, 4096, grouped=True) == (
        "NVFP4 grouped GEMMs need K and N divisible by 128 (TE's split quantize): K=2880, N=4096")
    assert sp("NVFP4BlockScaling", 2880, 2880, 2880) is None  # one te.Linear: 32 is enough


def test_a_shape_te_cannot_run_is_a_one_line_cell_error_before_anything_is_built(monkeypatch):
    # TE is absent here; the job must refuse before it imports TE or builds anything, so reaching
    # import_te is a failure.
    from rich.progress import Progress

    from te_gemm_callback.capture.clocks import ClockSampler

    monkeypatch.setattr(jobs, "import_te", lambda: pytest.fail("built a job TE cannot run"))
    items = [WorkItem("head", GemmShape(48, 4096, 4096)),
             WorkItem("moe", GemmShape(12, 2880, 2880), m_splits=(5, 7))]

    def make(it, p):
        return jobs.TeJob(it, p, ["autocast"], None, tap=None)

    pending = [JobVisits(PlannedJob(it, p)) for it, p in zip(items, ["MXFP8BlockScaling", "NVFP4BlockScaling"])]
    with Progress(disable=True) as prog:
        queue = JobQueue(make, 1, ClockSampler(reader=None), prog, prog.add_task("x", total=2), {})
        queue.build(pending)
    assert [v.error for v in pending] == [
        "ValueError: MXFP8BlockScaling needs M, K and N divisible by 32 (TE's quantization blocks): M=48",
        "ValueError: NVFP4 grouped GEMMs need K and N divisible by 128 (TE's split quantize): K=2880, N=2880"]
    assert queue.stopped is None


# --- the recipe's configuration and environment in the cache key -------------------------------


def test_recipe_environment_and_config():
    env = {"NVTE_NVFP4_DISABLE_RHT": "1", "NVTE_BACKWARD_OVERRIDE": "high_precision", "NVTE_USE_FAST_MATH": "1",
           "NVTE_DEBUG": "1", "PATH": "/bin"}
    assert precisions.recipe_environment(env) == {"NVTE_BACKWARD_OVERRIDE": "high_precision",
                                                  "NVTE_NVFP4_DISABLE_RHT": "1", "NVTE_USE_FAST_MATH": "1"}
    assert precisions.recipe_fingerprint(None, {}) is None
    assert precisions.recipe_fingerprint("a", {}) != precisions.recipe_fingerprint("b", {})


def test_recipe_config_is_the_repr_of_the_recipe_te_builds(monkeypatch):
    # TE is not installed here: a stand-in recipe module with TE's class name and a repr that, like
    # TE's (common/recipe/__init__.py:611-626), names what the environment set.
    class NVFP4BlockScaling:
        def __repr__(self):
            return "recipe_type=NVFP4BlockScaling, backward_override=None, fp4_quant_fwd_inp=RHT"

    mod = types.ModuleType("transformer_engine.common.recipe")
    mod.NVFP4BlockScaling = NVFP4BlockScaling
    monkeypatch.setitem(sys.modules, "transformer_engine.common.recipe", mod)
    monkeypatch.setattr(precisions, "te_available", lambda: (True, ""))
    monkeypatch.setattr(precisions, "import_te", lambda: None)
    assert precisions.recipe_config("nvfp4") == repr(NVFP4BlockScaling())
    assert precisions.recipe_config("BF16") is None


def test_te_recipe_cells_key_on_recipe_and_environment_bf16_keys_unchanged(monkeypatch, tmp_path):
    # No TE here: the recipes this machine runs and the recipe TE would build are stood in for;
    # the run's conditions, plan and cache are the engine's own.
    monkeypatch.setattr(engine, "_runnable", lambda precisions, use_te: (["BF16", "NVFP4BlockScaling"], {}))
    monkeypatch.setattr(engine, "recipe_config", lambda p: f"recipe_type={p}, disable_rht=False")
    for k in [k for k in list(os.environ) if k.startswith("NVTE_")]:
        monkeypatch.delenv(k)
    items = [WorkItem("fc1", GemmShape(4096, 4096, 4096))]
    cache = ResultCache(tmp_path / "c.json")

    def plan():
        run = BenchRun(["BF16", "NVFP4BlockScaling"], ["autocast"], cache=cache)
        return run, {(j.precision, c): (k, j.cached[c]) for j in run.plan(items) for c, k in j.keys.items()}

    run, before = plan()
    assert run.cond["recipe_config"] == {"NVFP4BlockScaling": "recipe_type=NVFP4BlockScaling, disable_rht=False"}
    assert run.cond["recipe_env"] == {}
    bf16_key, _ = before[("BF16", (GemmOp.FPROP, "autocast"))]
    assert bf16_key.split("|")[1] == f"torch {torch.__version__}, TE None"  # as before: no recipe in it
    nvfp4_key, _ = before[("NVFP4BlockScaling", (GemmOp.FPROP, "autocast"))]
    assert ", recipe " in nvfp4_key.split("|")[1]
    cache.put(nvfp4_key, BenchResult(4096, 4096, 4096, "fprop", "NVFP4BlockScaling", "autocast", median_ms=0.1))

    monkeypatch.setenv("NVTE_NVFP4_DISABLE_RHT", "1")
    monkeypatch.setenv("NVTE_BACKWARD_OVERRIDE", "high_precision")
    run, after = plan()
    assert run.cond["recipe_env"] == {"NVTE_BACKWARD_OVERRIDE": "high_precision", "NVTE_NVFP4_DISABLE_RHT": "1"}
    assert after[("BF16", (GemmOp.FPROP, "autocast"))][0] == bf16_key
    key, cached = after[("NVFP4BlockScaling", (GemmOp.FPROP, "autocast"))]
    assert key != nvfp4_key and cached is None  # measured under another setting: not reused
    monkeypatch.delenv("NVTE_NVFP4_DISABLE_RHT")
    monkeypatch.delenv("NVTE_BACKWARD_OVERRIDE")
    assert plan()[1][("NVFP4BlockScaling", (GemmOp.FPROP, "autocast"))][1] is not None  # same setting: reused


# --- the rate model and the duty cycle ---------------------------------------------------------


def _old_seconds(flops, precision):
    return flops / (6.5e14 * (1.7 if precision in FP8_FAMILY else 1.0))


def _duty(actual_tflops, precision, duty=0.75):
    """The GPU share the timed calls get: a call at its real rate, then the rest the model sizes
    (timing.between_calls: model time * (1/duty - 1))."""
    flops = 2 * 8192**3
    call = flops / (actual_tflops * 1e12)
    return call / (call + rates.gemm_seconds(flops, precision) * (1 / duty - 1))


@pytest.mark.parametrize("peaks", [{"bf16": 702.08, "fp8": 1390.24}, {"bf16": 683.88, "fp8": 1367.23}, {}])
def test_rate_model_unchanged_on_the_h200(peaks):
    # measure_peaks of the two H200 runs in docs/results/h200/{5b,dense}/bench.json, and none.
    rates.set_rate_model(peaks)
    for p in precisions.RECIPES[:-1]:  # NVFP4 does not run on an H200
        assert rates.gemm_seconds(1e12, p) == pytest.approx(_old_seconds(1e12, p), rel=0.01)


def test_every_recipe_gets_about_the_same_duty_cycle_on_blackwell():
    # TE's B300 pre-quantized rates (TFLOP/s; docs/projection.md); no B300 measure_peaks exists, so
    # its peaks are taken at 70% of NVIDIA's dense 2.25 (BF16) and 4.5 (FP8) PFLOPS.
    b300 = {"BF16": 1463.0, "MXFP8BlockScaling": 2677.0, "NVFP4BlockScaling": 5094.0}
    model = rates.set_rate_model({"bf16": 1575.0, "fp8": 3150.0})
    assert model["nvfp4"] == pytest.approx(3.5 * model["bf16"])
    duties = {p: _duty(r, p) for p, r in b300.items()}
    assert max(duties.values()) - min(duties.values()) < 0.03, duties
    assert all(0.7 < d < 0.8 for d in duties.values()), duties  # about the 0.75 asked for
    old = {p: (2 * 8192**3 / (r * 1e12)) / (2 * 8192**3 / (r * 1e12) + _old_seconds(2 * 8192**3, p) / 3)
           for p, r in b300.items()}
    assert old["BF16"] - old["NVFP4BlockScaling"] > 0.25  # what the H200 model gave: 0.57 against 0.28


@cpu_only
def test_the_run_sizes_its_jobs_from_its_gpus_peaks(tmp_path):
    # This host has no GPU, so its peaks are not measured: a run takes them from the cache as it
    # does a GPU's measured earlier; the rate model then follows them.
    cache = ResultCache(tmp_path / "c.json")
    cond_device = engine.device_conditions()["device"]
    cache.data["peaks"][cond_device] = {"bf16": 1575.0, "fp8": 3150.0}
    res = run_bench([WorkItem("a", GemmShape(32, 32, 32))], ["BF16"], ["autocast"], cache=cache, progress=False)
    assert res.meta["rate_model_tflops"]["bf16"] == pytest.approx(650 * 1575 / 693)
    assert rates.gemm_seconds(1e15, "BF16") == pytest.approx(1e15 / (650e12 * 1575 / 693))


# --- a CUDA error that leaves the context unusable ----------------------------------------------


def test_which_errors_lose_the_context():
    assert context_lost("RuntimeError: CUDA error: an illegal memory access was encountered")
    assert context_lost("RuntimeError: CUDA Error: misaligned address")  # TE's NVTE_CHECK_CUDA
    assert not context_lost("RuntimeError: CUDA Error: out of memory")
    assert not context_lost("OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB")
    assert not context_lost("RuntimeError: cuBLAS Error: CUBLAS_STATUS_NOT_SUPPORTED")


@pytest.fixture
def faulting_jobs(monkeypatch):
    """The run's jobs as on the CPU (torch matmuls), except that one item's job faults the GPU as a
    device-side error would and another does not fit in memory at first (so that the run has two
    batches). Neither can happen on a CPU: both are raised by the stand-in."""
    made = []

    @contextlib.contextmanager
    def factory(use_te, modes, flush, share, gemm_duty=0.75):
        def make(item, precision):
            m = item.fprop.m
            made.append(m)
            if m == 96:
                raise RuntimeError("/te/common/util/logging.h:57 in function f: CUDA Error: an illegal memory access "
                                   "was encountered")
            if m == 64 and made.count(64) == 1:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory")
            return jobs.TorchJob(item, modes, share, gemm_duty)

        yield make

    monkeypatch.setattr(engine, "job_factory", factory)
    return [WorkItem(f"{m}x32x32", GemmShape(m, 32, 32)) for m in (32, 64, 96, 128)], made


@cpu_only
def test_a_cuda_error_stops_the_run_and_keeps_the_cells_before_it(faulting_jobs, tmp_path):
    items, made = faulting_jobs
    cache = ResultCache(tmp_path / "c.json")
    with pytest.raises(BenchStopped) as exc:
        run_bench(items, ["BF16"], ["autocast"], cache=cache, progress=False)
    msg = str(exc.value)
    assert msg.startswith("stopped after a CUDA error, which leaves this process's GPU context unusable: "
                          "BF16 96x32x32: RuntimeError: CUDA Error: an illegal memory access was encountered; ")
    assert "\n" not in msg
    assert made == [32, 64, 64, 96]  # nothing built after the fault
    kept = exc.value.results.results
    assert {r.m for r in kept} == {32} and all(r.ok for r in kept) and len(kept) == 3  # item a's three passes
    assert exc.value.results.meta["stopped"].startswith("BF16 96x32x32")
    again = ResultCache(tmp_path / "c.json")
    # The cells measured before the fault are cached (one the host disturbed is not: ResultCache.put).
    assert len(again.data["results"]) == sum(not r.noisy for r in kept)
    assert isinstance(exc.value, ValueError)  # the command line says it in one line


@cpu_only
def test_the_command_line_says_the_stop_in_one_line(faulting_jobs, tmp_path, capsys, monkeypatch):
    from te_gemm_callback.cli import main

    monkeypatch.setenv("TE_GEMM_CACHE", str(tmp_path / "cache.json"))
    code = main(["bench", "--shapes", "32x32x32,64x32x32,96x32x32,128x32x32"])
    err = capsys.readouterr().err.strip()
    assert code == 1 and err.startswith("te-gemm bench: error: stopped after a CUDA error") and "\n" not in err


def test_a_lost_context_met_at_the_wait_stops_the_queue(monkeypatch):
    # The one synchronize is where an asynchronous fault surfaces; no GPU here, so the wait is a
    # stand-in that raises it.
    from rich.progress import Progress

    from te_gemm_callback.capture.clocks import ClockSampler
    from te_gemm_callback.microbench import job_queue

    def fault(self):
        raise RuntimeError("CUDA error: unspecified launch failure")

    monkeypatch.setattr(job_queue.StreamClock, "wait", fault)

    class Job:
        setup_s = 0.0

        def queue(self):
            return dict

    with Progress(disable=True) as prog:
        queue = JobQueue(lambda it, p: Job(), 2, ClockSampler(reader=None), prog, prog.add_task("x", total=2),
                         {"jobs": []})
        out = queue.measure([PlannedJob(WorkItem("a", GemmShape(32, 32, 32)), "BF16")])
    assert out == [] and queue.stopped == "RuntimeError: CUDA error: unspecified launch failure"


# --- the GEMM tap, TeJob and GroupedLinear -------------------------------------------------------


def test_tap_mode_is_reset_when_a_job_raises(monkeypatch):
    # hold_gpu queues dense GEMMs on the GPU, absent here; the job's TE iteration is a stand-in that
    # fails as a kernel error would.
    monkeypatch.setattr(jobs, "hold_gpu", lambda *a, **k: None)
    job = object.__new__(jobs.TeJob)
    job.tap, job.modes, job.between_iters, job.between_repeats = jobs._GemmTap(), {"prequantized"}, None, None
    job.plan = jobs.plan_job(WorkItem("a", GemmShape(64, 64, 64)), "BF16", ["prequantized"])

    def fail():
        assert job.tap.mode == "repeat"
        raise RuntimeError("cuBLAS Error: CUBLAS_STATUS_NOT_SUPPORTED")

    job.iteration = fail
    with pytest.raises(RuntimeError, match="cuBLAS"):
        job.queue()
    assert job.tap.mode == "off"


def test_a_te_gemm_called_inside_another_is_neither_timed_nor_reissued_on_its_own(monkeypatch):
    # TE's general_grouped_gemm calls general_gemm per group on its row-scaled NVFP4 and debug paths
    # (cpp_extensions/gemm.py:428-496); both are stand-ins here. launch_timed records CUDA events,
    # absent here: the stand-in runs the call n + 1 times, as it does (one untimed, n timed).
    monkeypatch.setattr(jobs, "launch_timed", lambda fn, n, flush=None, burst_s=None: [fn() for _ in range(n + 1)])
    calls = {"inner": 0, "outer": 0}
    tap = jobs._GemmTap()

    def general_gemm(A, B, layout="TN"):
        calls["inner"] += 1

    inner = tap._wrap(general_gemm, False)

    def general_grouped_gemm(A, B, out, quantization_params, out_dtype, layout="TN", m_splits=None):
        calls["outer"] += 1
        for _ in m_splits:
            inner(None, None, layout=layout)

    outer = tap._wrap(general_grouped_gemm, True)
    tap.mode, tap.n = "repeat", 4
    outer([], [], [], [], None, layout="NT", m_splits=[1, 1])
    assert calls == {"outer": 4 + 2, "inner": 2 * (4 + 2)}  # n + 1 re-issues and the real call
    assert [lay for lay, _ in tap.repeats] == ["NT"]  # one burst: the grouped GEMM's
    assert tap._depth == 0


class _Built(Exception):
    pass


@pytest.mark.parametrize("takes_it", [True, False])
def test_grouped_linear_asks_for_the_per_expert_gemms_where_te_takes_the_argument(monkeypatch, takes_it):
    # TE is not installed: a stand-in te.GroupedLinear with TE 2.20's argument (or, as TE before
    # it, without) records what the job passes and stops the build there.
    seen = {}

    def grouped_linear(num_gemms, in_features, out_features, bias=True, params_dtype=None, device="cuda",
                       use_grouped_tensor=None):
        seen.update(num_gemms=num_gemms, use_grouped_tensor=use_grouped_tensor)
        raise _Built

    def old_grouped_linear(num_gemms, in_features, out_features, bias=True, params_dtype=None, device="cuda"):
        seen.update(num_gemms=num_gemms)
        raise _Built

    cls = grouped_linear if takes_it else old_grouped_linear
    monkeypatch.setattr(jobs, "import_te", lambda: types.SimpleNamespace(GroupedLinear=cls))
    with pytest.raises(_Built):
        jobs.TeJob(WorkItem("moe", GemmShape(256, 128, 128), m_splits=(128, 128)), "MXFP8BlockScaling", ["autocast"],
                   None, tap=None)
    assert seen == ({"num_gemms": 2, "use_grouped_tensor": False} if takes_it else {"num_gemms": 2})
    assert "use_grouped_tensor" in inspect.signature(cls).parameters or jobs.grouped_linear_options(cls) == {}


# --- capture: NVFP4 columnwise-only operands --------------------------------------------------


class NVFP4TensorStorage:
    """Stands in for TE's NVFP4 storage (TE cannot be installed here): the columnwise copy stored
    transposed, two FP4 values a byte, and a size() that warns when only that copy exists, as
    TE's does (tensor/storage/nvfp4_tensor_storage.py:245-256)."""

    def __init__(self, shape, rowwise):
        *lead, rows, cols = shape
        self._fp4_dtype = "kFloat4E2M1"
        self._rowwise_data = torch.empty(*lead, rows, cols // 2, dtype=torch.uint8) if rowwise else None
        self._columnwise_data = torch.empty(cols, *lead, rows // 2, dtype=torch.uint8)
        self._shape = torch.Size(shape)

    def size(self):
        if self._rowwise_data is None:
            warnings.warn("Attempting to get shape of NVFP4 tensor with only column-wise data.", stacklevel=2)
        return self._shape


@pytest.mark.parametrize("shape", [(256, 512), (4, 64, 512)])
def test_nvfp4_columnwise_only_shape_is_read_without_te_warning(shape):
    x = NVFP4TensorStorage(shape, rowwise=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tuple(te_adapter._size(x)) == shape
    assert tuple(te_adapter._size(NVFP4TensorStorage(shape, rowwise=True))) == shape
    dy = NVFP4TensorStorage((*shape[:-1], 1024), rowwise=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a wgrad GEMM ("NT") of the two, as the capture keys it
        assert te_adapter.gemm_mkn("NT", te_adapter._size(x), te_adapter._size(dy)) == (512, 256, 1024)
