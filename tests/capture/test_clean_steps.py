"""Step bookkeeping: which profiled steps are instrumented, kernels or clean, and which numbers
come from which. A fake host clock makes the instruments' cost exact; a fake kernel recorder
stands in for torch.profiler's CUDA activity, which cannot run without a GPU."""

import pytest
import torch
from helpers.fakes import Clock, FakeKernels
from helpers.models import MLP, hooks_on, run
from torch.utils._python_dispatch import _get_current_dispatch_mode

from te_gemm_callback import GemmCapture, GemmProfiler
from te_gemm_callback.capture.kernel_profile import KernelStep, join_by_order, split_at_marks
from te_gemm_callback.capture.step_plan import StepPlan


def test_plan_kinds():
    plan = StepPlan(instrumented=2, kernels=1, dispatch=1)
    assert [plan.kind(i) for i in range(5)] == ["instrumented", "instrumented", "kernels", "clean", "clean"]
    assert [plan.dispatches(i) for i in range(4)] == [True, False, False, False]
    assert StepPlan(instrumented="all").kind(7) == "instrumented"
    plan = StepPlan(instrumented=1, kernels=2, kernels_warmup=1)
    assert [plan.kind(i) for i in range(5)] == ["instrumented", "kernels-warmup", "kernels", "kernels", "clean"]
    assert plan.profiled == 4 and StepPlan(instrumented=1, kernels_warmup=1).profiled == 1


def test_clean_steps_carry_no_instrument_and_time_the_step():
    model, x, clock = MLP(), torch.randn(4, 16, requires_grad=True), Clock()
    kp = FakeKernels()
    prof = GemmProfiler(model, kernel_profile=kp, clock=clock)
    cap, seen = run(prof, model, x, clock, n=6)
    kinds = ["instrumented", "kernels-warmup", "kernels", "settle", "clean", "clean"]
    assert seen == [(k, k == "instrumented") for k in kinds]
    assert [s.kind for s in cap.steps] == kinds and cap.coverage["step_kinds"] == kinds
    assert cap.steps[0].dispatch and not any(s.dispatch for s in cap.steps[1:])
    assert cap.step_ms() == pytest.approx(10.0)  # the clean steps, not the 15 ms instrumented one
    cost = cap.instrument_cost()
    assert cost["clean_ms"] == pytest.approx(10.0) and cost["dispatch_pct"] == pytest.approx(50.0)
    assert "instrumented_ms" not in cost  # the only instrumented step ran the dispatch mode
    assert kp.started == 1 and hooks_on(model) == 0 and _get_current_dispatch_mode() is None
    # Shapes come from the instrumented step: one call per step each, 6 GEMMs.
    assert len(cap.records) == 6 and all(r.calls == 1 and r.calls_per_step == 1 for r in cap.records)


def test_kernel_times_join_the_captured_gemms_by_launch_order():
    model, x, clock = MLP(), torch.randn(4, 16, requires_grad=True), Clock()
    prof = GemmProfiler(model, kernel_profile=FakeKernels(), clock=clock)
    cap, _ = run(prof, model, x, clock, n=4)
    assert cap.meta["gemm_time_source"] == "kernel_records"
    assert cap.meta["kernel_join"] == "joined by launch order"
    # The warm-up step's kernels (1 µs GEMMs in the fake) stay out: only the marked step counts.
    by = {(r.module, r.op): r.times_ms for r in cap.records}
    # Launch order: up fprop, down fprop, then backward from the loss: down first.
    assert by[("up", "fprop")] == [pytest.approx(0.1)] and by[("down", "fprop")] == [pytest.approx(0.2)]
    assert sorted(round(by[("down", op)][0], 6) for op in ("dgrad", "wgrad")) == [0.3, 0.4]
    assert cap.gemm_ms_per_step() == pytest.approx(2.1)  # 0.1 + ... + 0.6: all GEMM kernels of the step
    assert cap.steps[2].gemm_ms == pytest.approx(2.1) and cap.steps[1].gemm_ms is None
    assert cap.steps[3].gemm_ms is None
    assert cap.meta["kernel_breakdown_ms"]["gemm"] == pytest.approx(2.1)


def test_a_count_mismatch_is_reported_not_guessed(caplog):
    model, x, clock = MLP(), torch.randn(4, 16, requires_grad=True), Clock()
    prof = GemmProfiler(model, kernel_profile=FakeKernels(gemms=7), clock=clock)
    cap, _ = run(prof, model, x, clock, n=3)  # instrumented, warm-up, kernels
    assert "7 GEMM kernels, 6 GEMM calls captured" in cap.meta["kernel_join"]
    # Left to the event pairs (host clock here) of the first step, the only one that has them
    # when kernel records were planned.
    assert cap.meta["gemm_time_source"] == "host_clock"
    assert all(len(r.times_ms) == 1 for r in cap.records)
    assert cap.gemm_ms_per_step() == pytest.approx(2.8)  # the step's GEMM kernels still count
    assert any("not joined" in r.message for r in caplog.records)


def test_kernel_session_start_and_stop_are_given_apart_not_in_any_step():
    # The session's start falls before the warm-up step opens and its stop (a sync, the records
    # read: 60-80 ms on the host-bound H200 stack) after the kernels step closes: no step time
    # carries them, so the capture gives them apart for the report to state.
    model, x, clock = MLP(), torch.randn(4, 16, requires_grad=True), Clock()
    kp = FakeKernels(clock=clock, start_s=0.004, stop_s=0.060)
    cap, _ = run(GemmProfiler(model, kernel_profile=kp, clock=clock), model, x, clock, n=5)
    assert [s.kind for s in cap.steps] == ["instrumented", "kernels-warmup", "kernels", "settle", "clean"]
    assert [round(s.wall_ms, 6) for s in cap.steps] == [15.0, 10.0, 10.0, 10.0, 10.0]
    assert cap.meta["kernel_session_ms"] == {"start": pytest.approx(4.0), "stop": pytest.approx(60.0),
                                             "stop_sync": pytest.approx(30.0)}
    # No kernels step, no session to report.
    cap, _ = run(GemmProfiler(model, kernel_profile=FakeKernels(clock=clock, stop_s=1.0), clock=clock,
                              kernel_steps=0), model, x, clock, n=3)
    assert "kernel_session_ms" not in cap.meta


def test_a_step_opened_but_never_run_leaves_nothing_behind():
    """A loop that calls step() after every iteration opens one step more than it runs; stop() drops
    that step whole: here a kernels step, whose kernel records, kind and micro-batches all go."""
    model, x, clock = MLP(), torch.randn(4, 16, requires_grad=True), Clock()
    prof = GemmProfiler(model, kernel_profile=FakeKernels(), clock=clock).start()
    for mb in (3, 3):
        model(x).sum().backward()
        clock.t += 0.01
        prof.step(mb)
    assert prof.step_kind == "kernels" and prof.micro_batches == [3, 3]
    cap = prof.stop(3)
    assert [s.kind for s in cap.steps] == ["instrumented", "kernels-warmup"] == cap.coverage["step_kinds"]
    assert [s.micro_batches for s in cap.steps] == [3, 3] and prof.micro_batches == [3, 3]
    assert cap.coverage["dispatch_steps"] == [0] and "kernel_breakdown_ms" not in cap.meta
    assert cap.meta["kernel_join"] == "no kernel records (no kernels step ran)"


@pytest.mark.parametrize("warmup", [0, 2])
def test_kernels_steps_share_one_session_split_at_step_markers(warmup):
    model, x, clock = MLP(), torch.randn(4, 16, requires_grad=True), Clock()
    kp = FakeKernels()
    prof = GemmProfiler(model, kernel_profile=kp, clock=clock, kernel_steps=2, kernel_warmup_steps=warmup)
    cap, seen = run(prof, model, x, clock, n=1 + warmup + 4)
    assert [k for k, _ in seen] == (["instrumented"] + ["kernels-warmup"] * warmup
                                    + ["kernels", "kernels", "settle", "clean"])
    assert kp.started == 1 and kp.marks == 2 and not kp.running  # stopped before the clean step
    assert all(len(r.times_ms) == 2 for r in cap.records) and cap.gemm_ms_per_step() == pytest.approx(2.1)


def test_split_at_marks():
    ks = [("warm_gemm", 0, 1), ("spin_kernel", 2, 3), ("a_gemm", 4, 5), ("spin_kernel", 6, 7), ("b_gemm", 8, 9)]
    assert [[k[0] for k in st.kernels] for st in split_at_marks(ks, 2)] == [["a_gemm"], ["b_gemm"]]
    assert len(split_at_marks(ks, 0)) == 1
    with pytest.raises(RuntimeError, match="3 step marker"):
        split_at_marks(ks, 3)


def test_join_by_order_skips_placeholders():
    step = KernelStep([("a_gemm", 0.0, 1000.0), ("x", 0, 1), ("b_gemm", 2000.0, 4000.0)])
    assert join_by_order(["k1", None], step) == [("k1", 1.0)]
    assert join_by_order(["k1"], step) is None


def test_a_grouped_gemm_joins_one_kernel_per_expert_and_takes_their_span():
    """TE's grouped GEMM launches one kernel per expert (H200: 60 GEMM kernels for 12 plain and 6
    grouped calls of 8 experts); the experts may overlap on several streams, so the call's time is
    their span, as an event pair around the call reads it."""
    step = KernelStep([("a_gemm", 0.0, 100.0),
                       ("e0_gemm", 200.0, 400.0), ("e1_gemm", 250.0, 500.0), ("e2_gemm", 500.0, 700.0),
                       ("b_gemm", 800.0, 900.0)])
    counts = [(1,), (3, 3), (1,)]
    assert join_by_order(["a", "grouped", "b"], step, counts) == [("a", 0.1), ("grouped", 0.5), ("b", 0.1)]
    assert join_by_order(["a", "grouped", "b"], step) is None  # one kernel per call: counts differ


def test_an_expert_without_rows_may_launch_no_kernel():
    step = KernelStep([("e0_gemm", 0.0, 100.0), ("e2_gemm", 100.0, 300.0), ("b_gemm", 400.0, 500.0)])
    # Three experts, one with no rows: every expert (3 + 1 kernels) does not match, experts with rows do.
    assert join_by_order(["grouped", "b"], step, [(3, 2), (1,)]) == [("grouped", 0.3), ("b", 0.1)]
    assert join_by_order(["grouped", "b"], step, [(4, 3), (1,)]) is None


def test_grouped_kernel_counts():
    from te_gemm_callback.capture.recorder import grouped_kernel_counts

    assert grouped_kernel_counts((3, 0, 7)) == (3, 2)
    assert grouped_kernel_counts(None) == (1,)


def test_without_kernel_steps_cpu_times_come_from_the_instrumented_steps():
    model, x, clock = MLP(), torch.randn(4, 16, requires_grad=True), Clock()
    prof = GemmProfiler(model, clock=clock, instrumented_steps=2)
    cap, seen = run(prof, model, x, clock, n=4)
    assert [k for k, _ in seen] == ["instrumented", "instrumented", "clean", "clean"]
    assert cap.meta["gemm_time_source"] == "host_clock" and all(len(r.times_ms) == 2 for r in cap.records)
    assert cap.step_ms() == pytest.approx(10.0)
    # A plain torch model runs the dispatch mode on every instrumented step: that is their cost.
    assert cap.coverage["dispatch_steps"] == [0, 1]
    assert cap.instrument_cost() == {"clean_ms": pytest.approx(10.0), "dispatch_ms": pytest.approx(15.0),
                                     "dispatch_pct": pytest.approx(50.0)}


def test_every_step_instrumented_says_so():
    model, x, clock = MLP(), torch.randn(4, 16, requires_grad=True), Clock()
    cap, _ = run(GemmProfiler(model, clock=clock, instrumented_steps="all"), model, x, clock, n=3)
    assert cap.step_ms() == pytest.approx(15.0) and cap.instrument_cost() is None
    assert cap.meta["step_time"].startswith("no clean step")


def test_te_only_steps_hook_only_te_gemm_modules():
    """Without the dispatch mode only TE modules that own GEMMs are hooked: here there are none."""
    model, x, clock = MLP(), torch.randn(4, 16, requires_grad=True), Clock()
    prof = GemmProfiler(model, clock=clock, adapters=("te", "torch"), instrumented_steps=2, dispatch_steps=1)
    prof.start()
    full = hooks_on(model)
    model(x).sum().backward()
    prof.step()
    assert full == 2 * len(list(model.modules())) and hooks_on(model) == 0
    model(x).sum().backward()
    prof.stop()


def test_restart_and_step_before_start():
    model, x, clock = MLP(), torch.randn(4, 16, requires_grad=True), Clock()
    prof = GemmProfiler(model, clock=clock)
    with pytest.raises(RuntimeError, match="before start"):
        prof.step()
    first, _ = run(prof, model, x, clock, n=3)
    second, _ = run(prof, model, x, clock, n=2)
    assert len(first.steps) == 3 and len(second.steps) == 2  # the second capture holds its own steps only
    assert all(r.calls == 1 for r in second.records)


def test_capture_roundtrip_keeps_step_kinds(tmp_path):
    model, x, clock = MLP(), torch.randn(4, 16, requires_grad=True), Clock()
    cap, _ = run(GemmProfiler(model, kernel_profile=FakeKernels(), clock=clock), model, x, clock, n=5)
    back = GemmCapture.load(cap.save(tmp_path / "c.json"))
    assert back.steps == cap.steps and back.step_ms() == cap.step_ms()
    assert back.to_dict()["summary"]["instrument_cost"]["dispatch_pct"] == pytest.approx(50.0)


def test_compiled_model_same_gemms_as_eager_no_recompile_and_no_launch_order_join():
    """torch.compile on CPU: the instrumented step runs the model's eager forward, so the capture
    holds eager's GEMMs and owners; the profiler causes no recompile or graph break; the kernels
    step (compiled kernels, possibly fused) is not joined by launch order to the eager capture.
    Compiled before profiling: one compile step (no compilation in it) comes before the plan."""
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    eager, x, clock = MLP(), torch.randn(4, 16, requires_grad=True), Clock()
    cm = torch.compile(eager)
    cm(x).sum().backward()  # compiled before profiling
    graphs, breaks = counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())
    cap, _ = run(GemmProfiler(cm, kernel_profile=FakeKernels(), clock=clock), cm, x, clock, n=4)
    assert [s.kind for s in cap.steps] == ["compile", "instrumented", "kernels-warmup", "kernels"]
    assert counters["stats"]["unique_graphs"] == graphs and sum(counters["graph_break"].values()) == breaks
    with GemmProfiler(eager) as ref:
        eager(x).sum().backward()
    key = lambda c: sorted((r.module.removeprefix("_orig_mod."), r.op, r.m, r.k, r.n) for r in c.records)  # noqa: E731
    assert key(cap) == key(ref.capture) and cap.meta["compiled"] is True
    assert cap.meta["kernel_join"].startswith("not joined: a torch.compile model")
    assert cap.gemm_ms_per_step() == pytest.approx(2.1)  # the kernels step's GEMM time still counts


def test_split_k_reduction_kernels_fold_into_their_gemm():
    # Names as cuBLAS launched them for one fp32 dgrad on the H200: main kernel, then its split-K reduce.
    main = "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize64x64x8_stage3_warpsize1x4x1_ffma_execute_kernel__5x_cublas"
    tail = ("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize64x64x8_stage3_warpsize1x4x1_ffma_execute_split_k_kernel"
            "__5x_cublas")
    step = KernelStep([(main, 0.0, 100.0), (tail, 101.0, 111.0), ("reduce_kernel", 120.0, 130.0), (main, 200.0, 300.0)])
    assert [(s, e) for _, s, e in step.gemm_kernels()] == [(0.0, 110.0), (200.0, 300.0)]
    assert step.gemm_ms() == pytest.approx(0.21)


def test_cublaslt_split_k_reductions_fold_into_their_gemm_and_count_as_gemm_time():
    # As the H200 ran the bf16 wgrad of a 4096 -> 128 nn.Linear over 15872 tokens (kernel records,
    # 2026-12-02): the split-K GEMM, cuBLASLt's reduction of its partial sums, a memset, the dgrad. The
    # reduction was left out of the wgrad's time (41.6 us where the GEMM took 45.2 us).
    from te_gemm_callback.capture.kernels import classify_kernel

    wgrad = "nvjet_sm90_tst_128x64_64x8_1x2_h_bz_splitK_NTT"
    reduce = ("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __nv_bfloat16, false, "
              "false>(cublasLt::cublasSplitKParams<float>, float const*, __nv_bfloat16 const*, __nv_bfloat16*)")
    dgrad = "nvjet_sm90_tst_192x192_64x3_2x1_v_bz_coopB_NNN"
    step = KernelStep([(wgrad, 0.0, 41.6), (reduce, 41.4, 45.0), ("Memset (Device)", 46.6, 47.6),
                       (dgrad, 49.2, 105.9)])
    assert [(s, e) for _, s, e in step.gemm_kernels()] == [(0.0, pytest.approx(45.2)), (49.2, 105.9)]
    assert classify_kernel(reduce) == "gemm" and classify_kernel("Memset (Device)") == "other"


def test_kernel_intervals_read_raw_records_like_the_parsed_events():
    # Kineto's raw records give the same (name, start, end) as torch.profiler's parsed events,
    # without building a FunctionEvent per record (CPU activity here: no GPU on this machine).
    from types import SimpleNamespace

    from torch.profiler import ProfilerActivity, profile

    from te_gemm_callback.capture.kernels import kernel_intervals

    x = torch.randn(32, 32)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(20):
            (x @ x).relu()
    parsed = sorted((e.name, float(e.time_range.start), float(e.time_range.end)) for e in prof.events()
                    if "CPU" in str(e.device_type))
    raw = sorted(kernel_intervals(prof, "CPU"))
    assert len(raw) == len(parsed) >= 40
    assert all(a[0] == b[0] and a[1:] == pytest.approx(b[1:], abs=0.01) for a, b in zip(raw, parsed))
    # A profiler object without Kineto's raw results: the parsed events.
    stand_in = SimpleNamespace(events=prof.events)
    assert sorted(kernel_intervals(stand_in, "CPU")) == parsed


def test_clock_sampling_covers_the_kernel_timed_steps_only():
    """The NVML sampling thread takes the GIL 20 times a second: it runs over the kernels steps,
    whose GEMM times the capture reports, and not over the instrumented or clean steps. Without a
    kernels step (the instrumented steps' event pairs time the GEMMs) it runs over those instead."""
    import time

    model = MLP()
    x = torch.randn(4, 16, requires_grad=True)
    kinds_at_read = []

    def run(**kw):
        kinds_at_read.clear()
        prof = GemmProfiler(model, clock_reader=lambda: (kinds_at_read.append(prof.step_kind), (1500.0, 600.0))[1],
                            **kw)
        prof.start()
        for i in range(6):
            model(x).sum().backward()
            time.sleep(0.12)  # two or three sampling periods per step
            if i < 5:
                prof.step()
        return prof.stop()

    cap = run(kernel_profile=FakeKernels(), instrumented_steps=2)
    assert [s.kind for s in cap.steps] == ["instrumented", "instrumented", "kernels-warmup", "kernels", "settle",
                                           "clean"]
    # The first read comes as the thread starts, while the warm-up step opens (before its kind is
    # set); every later one falls in the kernel-timed steps.
    assert kinds_at_read[0] in ("instrumented", "kernels-warmup"), kinds_at_read
    assert set(kinds_at_read[1:]) <= {"kernels-warmup", "kernels"} and "kernels" in kinds_at_read, kinds_at_read
    assert cap.meta["clocks_during_capture"]["samples"] >= 2
    cap = run(kernel_steps=0, instrumented_steps=2)
    assert [s.kind for s in cap.steps] == ["instrumented", "instrumented", "clean", "clean", "clean", "clean"]
    assert set(kinds_at_read[1:]) == {"instrumented"}, kinds_at_read  # the first: at start(), no step yet


@pytest.mark.parametrize("away_s, flagged", [(0.200, True), (0.004, False)])
def test_a_clean_step_the_job_was_away_in_is_no_clean_step(away_s, flagged):
    """The job pauses the capture between steps (evaluation, a checkpoint): the step's clock runs on,
    so a clean step holding a 200 ms evaluation is an outlier, not a 211 ms step; the usual few ms
    between steps (the next batch) are the step's own, and a stall under 50 ms is no evaluation."""
    model, x, clock = MLP(), torch.randn(4, 16, requires_grad=True), Clock()
    prof = GemmProfiler(model, instrumented_steps=1, clock=clock).start()
    for i in range(4):  # 3 clean steps: too few for the outlier rule on times alone
        model(x).sum().backward()
        clock.t += 0.010
        prof.step()
        prof.pause()  # what the schedule does once a step ended
        clock.t += 0.001 + (away_s if i == 1 else 0.0)  # the next batch; after step 1 an evaluation too
        prof.resume()
    cap = prof.stop()
    kinds = [s.kind for s in cap.steps]
    assert kinds == ["instrumented", "clean", "outlier" if flagged else "clean", "clean"]
    assert cap.step_ms() == pytest.approx(11.0)  # not the mean with a 211 ms step
    assert ("with the job away between steps (an evaluation, a checkpoint: 2)" in cap.meta["steady_state"]) == flagged
