"""The step replay (analysis/replay.py, analysis/whatif.py) on traces whose answer is known by
hand, and the host side of a kernels step as the capture keeps it. The GPU check against observed
speedups: benchmarks/replay_check.py and docs/results/h200.md."""

import pytest
import torch
from helpers.big_gemm import run_folder

from te_gemm_callback.analysis.replay import Call, Op, StepTrace, replay
from te_gemm_callback.analysis.whatif import calibrate_host, host_scaled, step_trace, transform
from te_gemm_callback.capture.capture_items import KernelTimeline
from te_gemm_callback.capture.kernel_profile import KernelStep, host_rows, split_at_marks
from te_gemm_callback.capture.kernels import call_kind
from te_gemm_callback.capture.module_specs import module_specs, spec_key


def launches(n, gap, cost, dur, stream=7, sync=True):
    """A step of ``n`` launches (host ``gap`` + ``cost`` µs each, kernels of ``dur`` µs), ending
    in a sync (loss.item()) where ``sync``."""
    calls = [Call(gap, cost, "launch", [Op(dur, stream, f"k{i}")]) for i in range(n)]
    if sync:
        calls.append(Call(gap, cost, "sync_stream"))
    return StepTrace(calls, latency=5.0)


def test_a_host_bound_step_takes_the_host_time():
    r = replay(launches(100, gap=20, cost=5, dur=2))
    assert r.bound == "host"
    assert r.step_us == pytest.approx(101 * 25, rel=1e-9)  # the host's calls, GPU idle between kernels
    assert r.gpu_busy_us == pytest.approx(200)


def test_a_gpu_bound_step_takes_the_kernels_and_the_exposed_host_after_the_sync():
    r = replay(launches(100, gap=2, cost=3, dur=50))
    assert r.bound == "gpu"
    # Once a step the host is exposed: the sync's own cost, then the next step's first gap and
    # the launch latency before its first kernel; the rest hides behind the GPU.
    assert r.step_us == pytest.approx(100 * 50 + 3 + 2 + 5, rel=1e-9)


def test_without_a_sync_the_host_runs_ahead_and_the_gpu_sets_the_pace():
    r = replay(launches(100, gap=2, cost=3, dur=50, sync=False))
    assert r.step_us == pytest.approx(100 * 50, rel=1e-9)


def test_two_streams_overlap():
    calls = [Call(1, 1, "launch", [Op(100, 7)]), Call(1, 1, "launch", [Op(100, 9)]), Call(1, 1, "sync_device")]
    r = replay(StepTrace(calls, latency=0.0))
    # The second launch leaves the host at 3 and its kernel runs beside the first: the sync
    # returns at 103 and costs 1.
    assert r.step_us == pytest.approx(3 + 100 + 1, rel=1e-9)


def test_faster_gemms_help_a_gpu_bound_step_and_not_a_host_bound_one():
    fast = lambda op: Op(op.dur / 2, op.stream)  # noqa: E731 - a recipe that halves every kernel
    gpu = launches(100, gap=2, cost=3, dur=50)
    host = launches(100, gap=20, cost=5, dur=10)
    assert replay(gpu).step_us / replay(gpu.with_ops(fast)).step_us == pytest.approx(2, rel=0.01)
    assert replay(host).step_us == pytest.approx(replay(host.with_ops(fast)).step_us)


def test_the_call_kinds():
    assert call_kind("cudaLaunchKernel") == call_kind("cuLaunchKernelEx") == "launch"
    assert call_kind("cudaMemcpyAsync") == call_kind("cudaMemsetAsync") == "launch"
    assert call_kind("cudaStreamSynchronize") == call_kind("cudaMemcpy") == "sync_stream"
    assert call_kind("cudaDeviceSynchronize") == call_kind("cudaEventSynchronize") == "sync_device"
    assert call_kind("cudaEventRecord") == call_kind("cudaGetDevice") == "other"


def test_replay_needs_two_copies():
    with pytest.raises(ValueError, match="at least 2"):
        replay(launches(3, 1, 1, 1), copies=1)


def test_calibration_scales_the_host_to_the_clean_step_only_where_the_host_bounds_it():
    host = launches(100, gap=20, cost=5, dur=2)
    f = calibrate_host(host, clean_ms=2.0)  # recorded 2.525 ms; the clean step 2.0 ms
    assert replay(host_scaled(host, f)).step_ms == pytest.approx(2.0, rel=1e-3)
    # The recording's taxes, taken off, took more than the recording cost: the host scales up.
    f = calibrate_host(host, clean_ms=3.0)
    assert f > 1 and replay(host_scaled(host, f)).step_ms == pytest.approx(3.0, rel=1e-3)
    assert calibrate_host(host, clean_ms=2.55) == 1.0  # within 3%: left as recorded
    gpu = launches(100, gap=2, cost=3, dur=50)
    assert calibrate_host(gpu, clean_ms=3.0) == 1.0  # the GPU bounds it: its host time is unknown


def kernels_step():
    """A kernels step as KernelProfile splits it: kernels (name, start, end) with streams and
    correlation ids, and the host's calls: the start boundary's event record, two launches
    (a GEMM, then a cast), the sync of loss.item(), the end boundary's event record, the stop's sync."""
    kernels = [("nvjet_gemm", 20.0, 70.0), ("cast_kernel", 70.0, 75.0), ("Memcpy DtoH", 80.0, 81.0)]
    calls = [("cudaEventRecord", 0.0, 2.0, 1), ("cuLaunchKernelEx", 10.0, 14.0, 2),
             ("cudaLaunchKernel", 30.0, 33.0, 3), ("cudaMemcpyAsync", 40.0, 43.0, 4),
             ("cudaStreamSynchronize", 43.0, 82.0, 5), ("cudaEventRecord", 90.0, 91.0, 6),
             ("cudaDeviceSynchronize", 95.0, 96.0, 7)]
    return KernelStep(kernels, [7, 7, 7], 0.0, calls, [2, 3, 4])


def test_the_host_rows_of_a_kernels_step():
    rows, latency = host_rows(kernels_step())
    assert [r[2] for r in rows] == ["other", "launch", "launch", "launch", "sync_stream", "other"]  # stop's sync cut
    assert rows[1] == [8.0, 4.0, "launch", [0]] and rows[4][3] == [] and rows[2][3] == [1]
    assert latency == 10.0  # the GEMM: launched at 10 on an idle stream, started at 20


def test_split_at_marks_gives_each_step_its_calls():
    kernels = [("spin_kernel", 0.0, 1.0), ("gemm", 5.0, 6.0), ("spin_kernel", 10.0, 11.0), ("gemm", 15.0, 16.0)]
    calls = [("cudaLaunchKernel", 0.0, 1.0, 10), ("cuLaunchKernel", 2.0, 3.0, 11),
             ("cudaLaunchKernel", 8.0, 9.0, 12), ("cuLaunchKernel", 12.0, 13.0, 13)]
    a, b = split_at_marks(kernels, 2, [7] * 4, [10, 11, 12, 13], calls)
    assert [c[3] for c in a.calls] == [11] and [c[3] for c in b.calls] == [13]
    assert a.corrs == [11] and b.corrs == [13]


class _Record:
    def __init__(self, module, op):
        self.module, self.op, self.source, self.gemm = module, op, "te", ""


class _Cap:
    """What the replay reads of a capture: its timeline and records."""

    def __init__(self, timeline, records):
        self.kernel_timeline, self.records = timeline, records


def test_a_recipe_changes_gemms_and_each_module_pass_once():
    step = kernels_step()
    rows, latency = host_rows(step)
    kernels = [[0, 20.0, 50.0, 7, 0, 0], [1, 70.0, 5.0, 7, None, None], [2, 80.0, 1.0, 7, None, None]]
    tl = KernelTimeline(step=0, span_us=81.0, names=["nvjet_gemm", "cast_kernel", "Memcpy DtoH"], kernels=kernels,
                        total=3, calls=rows, latency_us=latency)
    assert tl.problem(records=1, steps=1) is None
    cap = _Cap(tl, [_Record("blocks.0.fc1", "fprop")])
    trace = step_trace(cap)
    assert [c.kind for c in trace.calls][:2] == ["other", "launch"] and trace.calls[0].gap == 0.0
    assert trace.calls[4].cost == 3.0  # the sync's 39 us record is its wait: capped at a launch's cost
    deltas = {"blocks.0.fc1": {"host_fwd": 30.0, "host_bwd": 0.0, "gpu_fwd": 12.0, "gpu_bwd": 0.0}}
    new = transform(trace, cap, {0: 0.5}, deltas)
    gemm_call = new.calls[1]
    assert gemm_call.gap == trace.calls[1].gap + 30.0
    assert [o.dur for o in gemm_call.ops] == [12.0, 25.0]  # the module's extra GPU time, then the GEMM halved
    bad = KernelTimeline(step=0, span_us=81.0, names=["g"], kernels=[[0, 0.0, 1.0, 7, None, None]], total=1,
                         calls=[[1.0, 1.0, "launch", [5]]], latency_us=5.0)
    assert "host call 0" in bad.problem(records=0, steps=1)


def test_module_specs_read_class_features_and_shapes():
    class LayerNormMLP(torch.nn.Module):  # TE's class name: the spec is read by name
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(4, dtype=torch.bfloat16))
            self.normalization, self.activation, self.use_bias = "RMSNorm", "swiglu", False

    class R:
        def __init__(self, gemm, m, k, n, op="fprop"):
            self.module, self.gemm, self.m, self.k, self.n, self.op, self.source = "mlp", gemm, m, k, n, op, "te"

    model = torch.nn.Sequential()
    model.add_module("mlp", LayerNormMLP())
    specs = module_specs(model, [R("fc1", 64, 32, 256), R("fc2", 64, 128, 32), R("fc1", 64, 256, 32, "dgrad")])
    assert specs == {"mlp": {"class": "LayerNormMLP", "gemms": {"fc1": [64, 32, 256], "fc2": [64, 128, 32]},
                             "normalization": "RMSNorm", "activation": "swiglu", "use_bias": False,
                             "dtype": "bfloat16"}}
    assert "swiglu" in spec_key(specs["mlp"]) and "fc1:64x32x256" in spec_key(specs["mlp"])


def test_a_host_bound_job_stays_host_bound_on_a_faster_gpu(tmp_path):
    from te_gemm_callback.analysis.runs import analyze_run
    from te_gemm_callback.projection import project_run

    folder = run_folder(tmp_path, gap_us=5000.0)  # the host: 5 ms per layer; the GPU: 2 ms
    rep = analyze_run(folder).report
    cs = next(a for a in rep.recipes if a.recipe == "Float8CurrentScaling")
    # Its GEMMs run 2x faster, and Amdahl says so; the replay sees the host issue each layer 30 us later.
    assert cs.predicted_gemms_alone > 1.2 and cs.predicted_by == "replay" and cs.predicted_bound == "host"
    assert cs.predicted_step_speedup == pytest.approx(5004 / 5034, rel=2e-3)
    rp = project_run(folder, "B300")
    got = {s.recipe: s for s in rp.steps}
    for s in got.values():
        assert s.bound == "host" and s.step_by == "replay" and s.speedup <= 1.0 + 1e-6, s
    assert got["Float8CurrentScaling"].gemms_alone_speedup > 1.05  # the gain GEMMs alone would promise
    assert any("host-bound on the target" in n for n in rp.notes)
    faster = {s.recipe: s for s in project_run(folder, "B300", host_speed=4.0).steps}
    assert faster["BF16"].step_ms < got["BF16"].step_ms  # a faster host shortens a host-bound step


def test_a_gpu_bound_job_gains_what_its_gemms_gain(tmp_path):
    from te_gemm_callback.analysis.runs import analyze_run

    rep = analyze_run(run_folder(tmp_path, gap_us=20.0)).report
    cs = next(a for a in rep.recipes if a.recipe == "Float8CurrentScaling")
    assert cs.predicted_bound == "gpu"
    assert cs.predicted_step_speedup == pytest.approx(2.0, rel=0.02)  # 2 ms GEMMs at 1 ms, the host hidden


def test_a_cheaper_recipe_takes_its_whole_difference_off_the_host_and_the_casts():
    # Module a's forward in the job's recipe: a cast launched 100 us after the last GEMM, its GEMM
    # 20 us later, then 50 us of its own work and a cast before module b's GEMM. The replayed
    # recipe costs its host 150 us less and its casts 8 us less: more than the 20 us gap before
    # the GEMM holds, so the rest comes off the gaps before it and then after it.
    cast = lambda: Op(5.0, 7, "cast", "quantization/cast")  # noqa: E731
    calls = [Call(100.0, 1.0, "launch", [cast()]), Call(20.0, 1.0, "launch", [Op(50.0, 7, "g", "gemm", gemm=0)]),
             Call(50.0, 1.0, "launch", [cast()]), Call(10.0, 1.0, "launch", [Op(50.0, 7, "g", "gemm", gemm=1)])]
    trace = StepTrace(calls, latency=0.0)
    cap = _Cap(None, [_Record("a", "fprop"), _Record("b", "fprop")])
    deltas = {"a": {"host_fwd": -150.0, "host_bwd": 0.0, "gpu_fwd": -8.0, "gpu_bwd": 0.0}}
    new = transform(trace, cap, {}, deltas)
    assert [c.gap for c in new.calls] == [0.0, 0.0, 20.0, 10.0]
    assert [op.dur for c in new.calls for op in c.ops] == [0.0, 50.0, 2.0, 50.0]
    host = lambda t: sum(c.gap + c.cost for c in t.calls)  # noqa: E731
    assert host(trace) - host(new) == pytest.approx(150.0)


def test_queued_kernels_wait_the_gpus_gap_and_idle_streams_do_not():
    from te_gemm_callback.analysis.whatif import kernel_gap_us

    gpu = launches(100, gap=2, cost=3, dur=50)
    gpu.kernel_gap = 1.5
    # Back to back on one stream: each kernel after the first waits 1.5 us more.
    assert replay(gpu).step_us == pytest.approx(100 * 50 + 99 * 1.5 + 3 + 2 + 5, rel=1e-9)
    host = launches(100, gap=20, cost=5, dur=2)
    base = replay(host).step_us
    host.kernel_gap = 1.5
    assert replay(host).step_us == pytest.approx(base)  # each kernel found its stream idle
    # The gap is read from the timeline: back-to-back pairs only (under 3 us), per stream.
    rows = [[i, i * 11.4, 10.0, 7, None, None] for i in range(30)]  # 1.4 us apart
    rows += [[30 + i, 1000.0 + i * 60.0, 10.0, 9, None, None] for i in range(30)]  # launched late
    assert kernel_gap_us(rows) == pytest.approx(1.4)
    assert kernel_gap_us(rows[30:]) == 0.0 and kernel_gap_us(rows[:5]) == 0.0


def test_a_recipe_with_fewer_kernels_drops_the_emptied_ones():
    # Module a quantizes with three casts before its GEMM; the replayed recipe has none of them.
    cast = lambda: Op(4.0, 7, "cast", "quantization/cast")  # noqa: E731
    calls = [Call(1.0, 1.0, "launch", [cast()]) for _ in range(3)]
    calls.append(Call(1.0, 1.0, "launch", [Op(50.0, 7, "g", "gemm", gemm=0)]))
    trace = StepTrace(calls, latency=0.0, kernel_gap=1.5)
    cap = _Cap(None, [_Record("a", "fprop")])
    deltas = {"a": {"host_fwd": 0.0, "host_bwd": 0.0, "gpu_fwd": -12.0, "gpu_bwd": 0.0, "kernels": -3.0}}
    new = transform(trace, cap, {}, deltas)
    assert [len(c.ops) for c in new.calls] == [0, 0, 0, 1]
    # More kernels: one op for them, with the gaps of all but one.
    more = {"a": {**deltas["a"], "gpu_fwd": 12.0, "kernels": 3.0}}
    added = transform(trace, cap, {}, more).calls[3].ops[0]
    assert added.dur == pytest.approx(12.0 + 2 * 1.5)


def test_the_prediction_replays_the_jobs_capture_with_or_without_the_sweep(tmp_path):
    """A host-bound job whose sweep ran its own recipe slower (the host busier then): the sweep's
    runs are observations; the prediction replays the job's own capture either way."""
    import shutil

    from te_gemm_callback.analysis.runs import analyze_run
    from te_gemm_callback.capture.capture_file import GemmCapture

    job = run_folder(tmp_path / "job", gap_us=5000.0)
    for recipe, gap in (("BF16", 6500.0), ("Float8CurrentScaling", 6000.0)):
        other = run_folder(tmp_path / f"other_{recipe}", gap_us=gap)
        cap = GemmCapture.load(other / "gemm_capture.json")
        cap.meta["recipe"] = recipe
        (job / "sweep" / recipe).mkdir(parents=True)
        cap.save(job / "sweep" / recipe / "gemm_capture.json")
    alone = tmp_path / "alone"
    shutil.copytree(job, alone, ignore=shutil.ignore_patterns("sweep"))
    with_sweep = {a.recipe: a for a in analyze_run(job).report.recipes}
    without = {a.recipe: a for a in analyze_run(alone).report.recipes}
    cs = with_sweep["Float8CurrentScaling"]
    assert cs.observed_step_speedup == pytest.approx(6504 / 6004, rel=2e-3)  # the sweep's own runs
    assert cs.predicted_step_speedup == pytest.approx(without["Float8CurrentScaling"].predicted_step_speedup,
                                                      rel=1e-9)
    assert cs.predicted_step_speedup == pytest.approx(5004 / 5034, rel=2e-3)  # the job's host: 5 ms a layer


def test_a_folder_without_the_jobs_capture_says_which_capture_stands_in(tmp_path, caplog):
    import logging

    from te_gemm_callback.analysis.runs import analyze_run

    folder = run_folder(tmp_path, gap_us=20.0)
    (folder / "sweep" / "BF16").mkdir(parents=True)
    (folder / "gemm_capture.json").rename(folder / "sweep" / "BF16" / "gemm_capture.json")
    with caplog.at_level(logging.WARNING, logger="te_gemm_callback"):
        analyze_run(folder)
    said = [r.getMessage() for r in caplog.records if "stands in" in r.getMessage()]
    assert len(said) == 1 and "sweep/BF16/gemm_capture.json stands in for it" in said[0], said
