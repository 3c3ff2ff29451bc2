"""Speedup accounting with hand-computed expectations, and the report/compare commands."""

import json

import pytest
from helpers.one_layer import K, M, N, bench, bench_of, capture, replayable

from te_gemm_callback.analysis.notes import clock_note, duty_note
from te_gemm_callback.analysis.verdicts import amdahl, analyze, capture_recipe
from te_gemm_callback.capture.capture_file import StepTime
from te_gemm_callback.cli import main
from te_gemm_callback.microbench.cells import BenchResult
from te_gemm_callback.microbench.results import BenchResults
from te_gemm_callback.reporting.run import render_run


def test_amdahl_by_hand():
    assert amdahl(100, 60, 2.0) == pytest.approx(100 / 70)
    assert amdahl(100, 0, 5.0) == 1.0
    with pytest.raises(ValueError):
        amdahl(100, 120, 2.0)


def test_recipe_read_from_operands():
    assert capture_recipe(capture(100, 60)) == "BF16"
    assert capture_recipe(capture(100, 60, "fp8_current")) == "Float8CurrentScaling"
    assert capture_recipe(capture(100, 60, "fp8_block+bf16")) == "Float8BlockScaling"


def test_overhead_eats_the_gain_from_two_runs():
    # BF16: 100 ms step, 60 ms GEMM. FP8: GEMMs 32 ms (1.875x) but the step is 80 ms.
    # Predicted 100 / (40 + 32) = 1.389x; observed 100 / 80 = 1.25x: 10% short, and non-GEMM time
    # grew from 40 to 48 ms.
    rep = analyze(replayable(capture(100, 60)), bench_of(BF16=60, DelayedScaling=32), [capture(80, 32, "fp8_delayed")])
    fp8 = next(a for a in rep.recipes if a.recipe == "DelayedScaling")
    assert fp8.predicted_step_speedup == pytest.approx(100 / 72)
    assert fp8.observed_step_speedup == pytest.approx(1.25)
    assert fp8.verdict == "overhead eats the gain"
    assert any("40.00 -> 48.00 ms (+8.00 ms" in e for e in fp8.evidence)


def test_gemm_bound_and_better_than_predicted():
    rep = analyze(replayable(capture(100, 60)), bench_of(BF16=60, DelayedScaling=32, Float8CurrentScaling=32),
                  [capture(73, 32, "fp8_delayed"), capture(60, 32, "fp8_current")])
    v = {a.recipe: a.verdict for a in rep.recipes}
    assert v["DelayedScaling"] == "GEMM-bound: working as expected"  # 1.370 vs 1.389 predicted
    assert v["Float8CurrentScaling"].startswith("better than")


def test_silent_fallback():
    # Ran under an FP8 recipe, but the GEMM operands were plain BF16 tensors: no speedup.
    rep = analyze(capture(100, 60), None, [capture(99, 59.5, "bf16", recipe="DelayedScaling")])
    fp8 = next(a for a in rep.recipes if a.recipe == "DelayedScaling")
    assert fp8.verdict == "no gain (silent fallback)"
    assert any("ran in high precision" in e and "layer" in e for e in fp8.evidence)


def test_prediction_from_microbenchmarks_with_job_in_fp8():
    # The job ran DelayedScaling: step 70, GEMM 30. Bench per layer: BF16 3 x 20 = 60 ms, FP8 3 x 10.
    # T_pred(BF16) = 70 - 30 + 30 * 60 / 30 = 100; T_pred(FP8) = 70 -> predicted 1.4286x.
    rep = analyze(replayable(capture(70, 30, "fp8_delayed")), bench({"BF16": 20.0, "DelayedScaling": 10.0}),
                  [capture(100, 60)])
    fp8 = next(a for a in rep.recipes if a.recipe == "DelayedScaling")
    assert rep.current_recipe == "DelayedScaling" and rep.gemm_share == pytest.approx(30 / 70)
    assert fp8.gemm_speedup == pytest.approx(2.0) and fp8.gemm_speedup_vs_current == pytest.approx(1.0)
    assert fp8.predicted_step_speedup == pytest.approx(100 / 70)
    assert fp8.observed_step_speedup == pytest.approx(100 / 70)
    assert fp8.verdict == "GEMM-bound: working as expected"
    assert rep.skipped == {"NVFP4BlockScaling": "needs sm_100"}


def test_report_and_compare_commands(tmp_path, capsys):
    run = tmp_path / "run"
    replayable(capture(100, 60)).save(run / "BF16" / "gemm_capture.json")
    capture(80, 32, "fp8_delayed").save(run / "DelayedScaling" / "gemm_capture.json")
    bench({"BF16": 20.0, "DelayedScaling": 10.5}).save(run / "bench.json")
    files = render_run(run)
    for f in files.values():
        assert f.exists() and f.stat().st_size > 0
    rep = json.loads((run / "report.json").read_text())
    assert rep["schema"] == "te-gemm-report/1" and rep["current_recipe"] == "BF16"
    assert rep["gemm_share"] == pytest.approx(0.6)
    assert main(["report", str(run)]) == 0
    out = capsys.readouterr().out
    assert "overhead eats the gain" in out and "1.25x" in out and "NVFP4BlockScaling" in out
    assert main(["compare", str(run / "BF16" / "gemm_capture.json"),
                 str(run / "DelayedScaling" / "gemm_capture.json"), "--json", str(tmp_path / "c.json")]) == 0
    out = capsys.readouterr().out  # no bench: GEMMs alone from the two runs' in-job GEMM times, no prediction
    assert "1.39x" in out and "GEMMs alone" in out and "observed only" in out
    assert main(["report", str(tmp_path / "empty")]) == 1


def test_readme_main_command_on_cpu_produces_every_output(tmp_path, monkeypatch, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("the GPU run takes minutes; run it by hand on the GPU host")
    monkeypatch.setenv("TE_GEMM_CACHE", str(tmp_path / "cache.json"))
    out = tmp_path / "demo"
    assert main(["run", "--out", str(out), "--steps", "4"]) == 0
    for f in ("gemm_capture.json", "sweep/BF16/gemm_capture.json", "bench.json", "report.json",
              "speedups.png", "step_split.png", "gemm_autocast.png", "gemm_prequantized.png"):
        assert (out / f).exists(), f
    rep = json.loads((out / "report.json").read_text())
    assert set(rep["skipped"]) == {"DelayedScaling", "Float8CurrentScaling", "Float8BlockScaling",
                                   "MXFP8BlockScaling", "NVFP4BlockScaling"}
    assert rep["recipes"][0]["recipe"] == "BF16" and rep["gemm_share"] > 0
    text = capsys.readouterr().out
    assert "not run:" in text  # the recipes this CPU cannot run, one line per cause


def test_kernel_classification_and_overhead_evidence():
    from te_gemm_callback.capture.kernels import breakdown_ms, classify_kernel

    assert classify_kernel("nvjet_sm90_qqtst_192x192_128x4_2x1_v_bz_coopB_TNN") == "gemm"
    assert classify_kernel("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma") == "attention"
    assert classify_kernel("void transformer_engine::detail::cast_transpose_kernel<...>") == "quantization/cast"
    assert classify_kernel("void transformer_engine::(anonymous namespace)::amax_kernel<...>") == "quantization/cast"
    assert classify_kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL") == "communication"
    assert classify_kernel("void rmsnorm_fwd_tuned_kernel<...>") == "norm"
    split = breakdown_ms({"nvjet_x_TNN": 4000.0, "cast_transpose_kernel": 1000.0, "elementwise_kernel": 500.0}, 2)
    assert split["gemm"] == 2.0 and split["quantization/cast"] == 0.5 and split["other"] == 0.25

    bf16, fp8 = replayable(capture(100, 60)), capture(80, 32, "fp8_delayed")
    bf16.meta["kernel_breakdown_ms"] = {"gemm": 60.0, "quantization/cast": 0.0, "attention": 20.0}
    fp8.meta["kernel_breakdown_ms"] = {"gemm": 32.0, "quantization/cast": 7.0, "attention": 20.0}
    rep = analyze(bf16, bench_of(BF16=60, DelayedScaling=32), [fp8])
    ev = next(a for a in rep.recipes if a.recipe == "DelayedScaling").evidence
    assert any("quantization/cast +7.00 ms" in e for e in ev)


def test_comm_overlap_hand_computed():
    from te_gemm_callback.capture.kernels import comm_overlap_ms

    # NCCL 0-100 µs overlapped by a GEMM 50-80 and another 90-150 (40 µs), NCCL 200-300 by an
    # elementwise kernel 250-260 (10 µs), and a second NCCL kernel 280-320 concurrent with the first
    # (counted once): 220 µs of communication, 50 overlapped, 170 exposed; over 2 steps.
    iv = [("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 0, 100), ("sm90_xmma_gemm_bf16", 50, 80),
          ("nvjet_sm90_tst", 90, 150), ("ncclDevKernel_AllReduce", 200, 300),
          ("vectorized_elementwise_kernel", 250, 260), ("ncclDevKernel_SendRecv", 280, 320)]
    got = comm_overlap_ms(iv, steps=2)
    assert got["comm_ms"] == pytest.approx(0.220 / 2)
    assert got["comm_exposed_ms"] == pytest.approx(0.170 / 2)
    assert comm_overlap_ms([("gemm", 0, 10)], 1) == {"comm_ms": 0.0, "comm_exposed_ms": 0.0}


def _cells(shape, per_pass: dict[tuple[str, str], float | str]):
    m, k, n = shape
    out = []
    for (prec, mode), v in per_pass.items():
        for op, (a, b, c) in (("fprop", (m, k, n)), ("dgrad", (m, n, k)), ("wgrad", (k, m, n))):
            if isinstance(v, str):
                out.append(BenchResult(a, b, c, op, prec, mode, error=v))
            else:
                out.append(BenchResult(a, b, c, op, prec, mode, median_ms=v, q1_ms=v, q3_ms=v, iters=5))
    return out


def test_prediction_uses_gemm_kernels_alone_and_reports_the_unfused_bound():
    # Job: BF16, step 100 ms, GEMM 60 ms. Pre-quantized (kernels alone): BF16 3 x 20, FP8 3 x 10 ms;
    # autocast (plus a standalone quantization): FP8 3 x 15 ms.
    # GEMMs alone: T(FP8) = 40 + 60 * 30/60 = 70 -> 100/70 = 1.4286x.
    # Unfused: T(FP8) = 40 + 60 * 45/60 = 85 -> 100/85 = 1.1765x.
    cells = _cells((M, K, N), {("BF16", "prequantized"): 20, ("DelayedScaling", "prequantized"): 10,
                               ("BF16", "autocast"): 20, ("DelayedScaling", "autocast"): 15})
    b = BenchResults(cells, {}, {"modes": ["autocast", "prequantized"]})
    rep = analyze(replayable(capture(100, 60)), b, [capture(71, 30, "fp8_delayed")])
    fp8 = next(a for a in rep.recipes if a.recipe == "DelayedScaling")
    assert rep.meta["mode"] == "prequantized"
    assert fp8.gemm_speedup == pytest.approx(2.0)
    assert fp8.predicted_step_speedup == pytest.approx(100 / 70)
    assert fp8.predicted_step_speedup_unfused == pytest.approx(100 / 85)
    assert fp8.verdict == "GEMM-bound: working as expected"  # observed 100/71 = 1.408x, -1.4%
    # The unfused figure is GEMMs alone's variant, a bound: its own line, not part of predicted against observed.
    assert any("residual -1.4%" in e for e in fp8.evidence) and not any("residual" in e and "unfused" in e
                                                                         for e in fp8.evidence)
    assert any(e.startswith("GEMMs alone 1.43x, with every quantization unfused 1.18x") for e in fp8.evidence)
    from te_gemm_callback.reporting.report_tables import speedup_rows

    table = speedup_rows(rep)
    assert "GEMMs alone, unfused" in table.columns and not any("pred." in c for c in table.columns)
    assert "GEMMs alone, unfused: the same bound with every quantization unfused" in table.explained


def test_gemm_a_recipe_cannot_run_counts_at_bf16_time():
    # An 8-wide router cannot run in FP8 (TE needs multiples of 16): its 3 x 1 ms stay BF16.
    # BF16 total 3 x 20 + 3 x 1 = 63 ms; FP8 3 x 10 + 3 x 1 = 33 ms -> GEMM speedup 63/33.
    from te_gemm_callback.microbench.items import WorkItem
    from te_gemm_callback.shapes import GemmShape

    router = (M, K, 8)
    cells = _cells((M, K, N), {("BF16", "autocast"): 20, ("DelayedScaling", "autocast"): 10})
    cells += _cells(router, {("BF16", "autocast"): 1, ("DelayedScaling", "autocast"): "RuntimeError: lda % 16"})
    b = BenchResults(cells, {}, {"modes": ["autocast"]})
    items = [WorkItem("layer", GemmShape(M, K, N), 1.0), WorkItem("router", GemmShape(*router), 1.0)]
    rep = analyze(capture(100, 60), b, [], items=items)
    fp8 = next(a for a in rep.recipes if a.recipe == "DelayedScaling")
    assert fp8.gemm_ms_bench == pytest.approx(33.0)
    assert fp8.gemm_speedup == pytest.approx(63 / 33)
    assert fp8.high_precision == [f"router ({M}x{K}x8): RuntimeError: lda % 16"]
    from te_gemm_callback.analysis.prediction import short_error

    assert short_error("RuntimeError: /TE/cublaslt_gemm.cu:161 in function X: Assertion failed: ret.lda % 16 == 0. "
                  "Leading dimension requirement") == "ret.lda % 16 == 0"
    # A long reason is cut at a word and says so ("... and the last dimen" was cut mid-word).
    long = ("ValueError: FP8 execution requires the product of all dimensions except the last to be divisible by 8 "
            "and the last dimension to be divisible by 16, got a tensor of shape (48, 1, 1024)")
    cut = short_error(long)
    assert cut.endswith(" ...") and long.startswith(cut[:-4]) and long[len(cut) - 4] == " ", cut
    assert any("1 GEMM(s) cannot run in DelayedScaling, counted at BF16 time" in e for e in fp8.evidence)


def test_better_than_predicted_names_the_kernels_that_shrank():
    bf16, fp8 = replayable(capture(100, 60)), capture(60, 32, "fp8_current")
    bf16.meta["kernel_breakdown_ms"] = {"gemm": 60.0, "other": 30.0, "norm": 4.0, "quantization/cast": 2.0}
    fp8.meta["kernel_breakdown_ms"] = {"gemm": 32.0, "other": 18.0, "norm": 3.0, "quantization/cast": 5.0}
    rep = analyze(bf16, bench_of(BF16=60, Float8CurrentScaling=32), [fp8])
    a = next(a for a in rep.recipes if a.recipe == "Float8CurrentScaling")
    assert a.verdict.startswith("better than")
    assert ("kernel time that moved (torch.profiler, per step): other -12.00 ms, quantization/cast +3.00 ms, "
            "norm -1.00 ms") in a.evidence
    # Idle: BF16 100 - 96 = 4 ms outside kernels, FP8 60 - 58 = 2 ms.
    assert "GPU time in no kernel (host-bound gaps) -2.00 ms per step" in a.evidence


def test_top_kernels_per_category():
    from te_gemm_callback.capture.kernels import top_kernels_ms

    us = {"nvjet_sm90_a": 3000.0, "nvjet_sm90_b": 1000.0, "cast_transpose_kernel": 500.0,
          "vectorized_elementwise_kernel": 200.0, "ncclDevKernel_AllReduce": 100.0}
    top = top_kernels_ms(us, steps=2, n=1)
    assert top == {"gemm": [("nvjet_sm90_a", 1.5)], "quantization/cast": [("cast_transpose_kernel", 0.25)],
                   "other": [("vectorized_elementwise_kernel", 0.1)],
                   "communication": [("ncclDevKernel_AllReduce", 0.05)]}


def test_moe_padding_rows_in_the_evidence():
    # Two experts with 10 and 20 rows: FP8 pads them to 16 and 32, 48 rows for 30 (+60%).
    from te_gemm_callback.microbench.items import WorkItem
    from te_gemm_callback.shapes import GemmShape

    items = [WorkItem("moe.fc1", GemmShape(30, K, N), 1.0, (10, 20))]
    cells = []
    for prec, ms in (("BF16", 2.0), ("DelayedScaling", 1.0)):
        for op, (m, k, n) in (("fprop", (30, K, N)), ("dgrad", (30, N, K)), ("wgrad", (K, 30, N))):
            cells.append(BenchResult(m, k, n, op, prec, "autocast", m_splits=[10, 20], median_ms=ms, q1_ms=ms,
                                     q3_ms=ms, iters=5))
    rep = analyze(capture(100, 60), BenchResults(cells, {}, {"modes": ["autocast"]}), [], items=items)
    fp8 = next(a for a in rep.recipes if a.recipe == "DelayedScaling")
    assert fp8.padded_rows_pct == pytest.approx(60.0)
    assert any("padded to a multiple of 16: +60.0% rows" in e for e in fp8.evidence)
    assert next(a for a in rep.recipes if a.recipe == "BF16").padded_rows_pct is None


def test_clock_note_sets_the_jobs_clock_against_the_benchs(tmp_path):
    ck = lambda mhz: {"sm_clock_mhz_median": mhz, "sm_clock_mhz_min": mhz - 100, "power_w_median": 650.0,  # noqa: E731
                      "power_w_max": 700.0, "samples": 40}
    job = capture(100, 60)
    job.meta["clocks_during_capture"] = ck(1545.0)
    at_boost = bench({"BF16": 20.0})
    at_boost.meta["clocks_during_run"] = ck(1740.0)  # a bench at the boost clock against its job on the H200
    note = clock_note(job, at_boost)
    assert note.startswith("SM clock median: job 1545 MHz over the captured steps, microbenchmark 1740 MHz (+13%)")
    at_boost.meta["clocks_during_run"] = ck(1485.0)  # at the sustained clock: within 5%, stated without a warning
    assert clock_note(job, at_boost).endswith("microbenchmark 1485 MHz")
    assert clock_note(capture(100, 60), at_boost) is None  # no NVML during the capture: nothing said
    run = tmp_path / "run"
    job.save(run / "gemm_capture.json")
    at_boost.meta["clocks_during_run"] = ck(1740.0)
    at_boost.save(run / "bench.json")
    render_run(run)
    assert "(+13%)" in json.loads((run / "report.json").read_text())["meta"]["clock_note"]


def test_capture_records_the_clock_it_ran_at():
    # No GPU here: a stand-in reader plays NVML; what is tested is that the profiler samples while
    # it captures and leaves the summary in the capture's meta.
    import torch
    from torch import nn

    from te_gemm_callback import GemmProfiler

    model = nn.Linear(8, 8)
    with GemmProfiler(model, clock_reader=lambda: (1500.0, 600.0)) as prof:
        model(torch.randn(4, 8)).sum().backward()
    ck = prof.capture.meta["clocks_during_capture"]
    assert ck["sm_clock_mhz_median"] == 1500.0 and ck["samples"] >= 1
    with GemmProfiler(model) as prof:  # CPU, no reader: none
        model(torch.randn(4, 8)).sum().backward()
    assert prof.capture.meta["clocks_during_capture"] is None


def kinds(cap, *spec):
    """Give the capture's steps kinds and times: spec items are (kind, ms, dispatch)."""
    cap.steps = [StepTime(i, wall_ms=ms, gpu_ms=ms, gemm_ms=cap.steps[0].gemm_ms if k != "clean" else None,
                          kind=k, dispatch=d) for i, (k, ms, d) in enumerate(spec)]
    return cap


def test_instrument_note_states_the_cost_and_warns_when_host_bound():
    from te_gemm_callback.analysis.notes import instrument_note

    assert instrument_note(capture(120, 60)).startswith("no clean step")  # all steps instrumented
    cap = kinds(capture(0, 6), ("instrumented", 90.0, True), ("instrumented", 62.7, False),
                ("kernels", 61.0, False), ("clean", 60.0, False), ("clean", 60.0, False))
    assert cap.step_ms() == 60.0
    note = instrument_note(cap)
    assert note == ("step times from clean steps (60.00 ms, nothing attached); instrumented steps 62.70 ms (+4.5%), "
                    "the shape-discovery step (torch dispatch mode) 90.00 ms (+50.0%), "
                    "the kernels steps (kernel records on) 61.00 ms (+1.7%)")
    cap.meta["kernel_session_ms"] = {"start": 3.2, "stop": 61.4}  # the job waits for it, between steps
    assert instrument_note(cap).endswith("the kernel-records session: 3 ms to start, 61 ms to stop and read "
                                         "(once, between steps)")
    cap.meta["kernel_session_ms"]["stop_sync"] = 40.2
    assert instrument_note(cap).endswith("61 ms to stop and read, 40 ms of it waiting for the GPU's queued "
                                         "kernels (once, between steps)")
    cap.steps[1].wall_ms = cap.steps[1].gpu_ms = 66.0  # +10%: host-bound, said so
    assert "66.00 ms (+10.0%)" in instrument_note(cap) and "the job is host-bound" in instrument_note(cap)
    # With only the dispatch step instrumented (the default plan), the kernels step tells: kernels
    # for 3 of 60 ms, the GPU waits on the host.
    cap = kinds(capture(0, 6), ("instrumented", 90.0, True), ("kernels", 61.0, False), ("clean", 60.0, False))
    assert "host-bound" not in instrument_note(cap)
    cap.meta["kernel_breakdown_ms"] = {"gemm": 2.0, "other": 1.0}
    note = instrument_note(cap)
    assert "the GPU ran kernels for 5% of a clean step: the job is host-bound" in note, note
    cap.meta["kernel_breakdown_ms"] = {"gemm": 50.0, "other": 8.0}
    note = instrument_note(cap)
    assert "the GPU ran kernels for 97% of a clean step" in note and "host-bound" not in note, note


def test_step_note_speaks_of_the_run_the_table_shows(tmp_path):
    # A plain torch job: its instrumented step ran the dispatch mode (21 ms), its clean steps 5 ms;
    # the sweep's baseline 5 ms. The table shows the sweep's step; the job's own cost is given apart.
    job = kinds(capture(0, 1.2), ("instrumented", 21.0, True), ("clean", 5.0, False), ("clean", 5.0, False))
    job.save(tmp_path / "run" / "gemm_capture.json")
    sweep = kinds(capture(0, 1.2), ("instrumented", 5.5, False), ("clean", 5.0, False))
    sweep.save(tmp_path / "run" / "sweep" / "BF16" / "gemm_capture.json")
    render_run(tmp_path / "run")
    rep = json.loads((tmp_path / "run" / "report.json").read_text())
    assert rep["step_ms"] == 5.0 and "instrumented steps 5.50 ms (+10.0%)" in rep["meta"]["step_note"]
    assert rep["meta"]["job_step_note"].startswith("training job: step times from clean steps (5.00 ms")
    job.save(tmp_path / "alone" / "gemm_capture.json")  # no sweep: the table shows the job's step
    render_run(tmp_path / "alone")
    rep = json.loads((tmp_path / "alone" / "report.json").read_text())
    assert rep["step_ms"] == 5.0 and "(torch dispatch mode) 21.00 ms (+320.0%)" in rep["meta"]["step_note"]
    assert "job_step_note" not in rep["meta"]


def test_overhead_that_is_host_time_is_named_so():
    # BF16: step 52, GEMM 22, kernels 40 ms (12 ms idle). FP8: step 55, GEMM 16.5, kernels 34 ms
    # (21 ms idle). Non-GEMM +8.5 ms of which idle +9: the GPU waits on the host.
    bf16, fp8 = replayable(capture(52, 22)), capture(55, 16.5, "fp8_delayed")
    bf16.meta["kernel_breakdown_ms"] = {"gemm": 22.0, "quantization/cast": 6.0, "other": 12.0}
    fp8.meta["kernel_breakdown_ms"] = {"gemm": 16.5, "quantization/cast": 8.5, "other": 9.0}
    rep = analyze(bf16, bench_of(BF16=22, DelayedScaling=16.5), [fp8])
    a = next(a for a in rep.recipes if a.recipe == "DelayedScaling")
    assert a.verdict == "overhead eats the gain"
    assert "GPU time in no kernel (host-bound gaps) +9.00 ms per step" in a.evidence
    assert any(e.startswith("where it goes: mostly host time: the GPU waits 9.00 ms more") for e in a.evidence)


def test_duty_note_sets_the_benchs_gemm_duty_against_the_jobs_gemm_share(tmp_path):
    res = bench({"BF16": 20.0})
    res.meta.update(backend="te", gemm_duty=0.75)
    # GEMMs 0.81 of the step: the CodonFM-layer stack in BF16 on the H200
    assert duty_note(0.81, res) == ("microbenchmark GEMMs ran at 0.75 of the GPU's time (--gemm-duty); "
                                    "this job's GEMMs are 0.81 of its step")
    # A job whose GEMMs are under a third of its step: told how to bench at its share.
    assert duty_note(0.3, res).endswith("te-gemm bench --capture gemm_capture.json --gemm-duty 0.30 "
                                        "--json bench.json in the run folder, then te-gemm report")
    res.meta["backend"] = "torch"  # CPU timings have no power limit: nothing to say
    assert duty_note(0.81, res) is None and duty_note(0.81, None) is None
    res.meta["backend"] = "te"
    # In a run folder the note states the share the report's table states: the sweep's baseline run
    # (40 of 160 ms), not the instrumented job capture's (30 of 100 ms). On the H200 the two read
    # 0.68 and 0.73 in one report before they were made one figure.
    run = tmp_path / "run"
    capture(100, 30).save(run / "gemm_capture.json")
    capture(160, 40).save(run / "sweep" / "BF16" / "gemm_capture.json")
    res.save(run / "bench.json")
    render_run(run)
    rep = json.loads((run / "report.json").read_text())
    assert rep["gemm_share"] == pytest.approx(0.25)
    # Whose share it is, in the note and the table alike: "this job's GEMMs are 0.72 of its step" stood
    # beside the log's "GEMMs 74%" of the job's own steps.
    note = rep["meta"]["duty_note"]
    assert "the GEMMs of the job's BF16 run in the sweep are 0.25 of that run's step" in note, note
    assert "this job's" not in note and "--gemm-duty 0.25" in note
    md = (run / "report.md").read_text()
    assert "its run in the sweep: step 160.00 ms, GEMMs 40.00 ms (25.0% of that run's step)" in md
