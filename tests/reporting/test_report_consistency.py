"""A report never contradicts itself: no GEMM share above 100%, no negative instrument cost, no
verdict inside the steps' own noise, the clocks named for the device they ran on, and the job's
precision named from what ran. Synthetic captures, built the way a CPU or GPU capture stores them."""

import json
import re
from dataclasses import replace

import pytest
from helpers.one_layer import bench_of, replayable
from rich.console import Console

from te_gemm_callback.analysis.checks import _too_noisy, share_check
from te_gemm_callback.analysis.notes import instrument_note, instrument_problem
from te_gemm_callback.analysis.prediction import precision_ran
from te_gemm_callback.analysis.verdicts import GEMM_BOUND_TOL, Verdict, analyze, capture_recipe, observe
from te_gemm_callback.capture.capture_file import GemmCapture, GemmRecord, StepTime
from te_gemm_callback.microbench.cells import BenchResult
from te_gemm_callback.microbench.results import BenchResults
from te_gemm_callback.reporting.capture_tables import capture_table, summary_metrics
from te_gemm_callback.reporting.run import render_run
from te_gemm_callback.reporting.run import report as render_report
from te_gemm_callback.reporting.speedups import (
    report_table,
    speedup_figure,
    step_split_figure,
    step_split_title,
    verdict_panel,
)

M, K, N = 1024, 512, 2048
CPU = {"device": "CPU (x86_64)", "timing": "host_clock", "gemm_time_source": "host_clock"}
GPU = {"device": "NVIDIA H200", "timing": "cuda_events", "gemm_time_source": "cuda_events"}


def cap(steps, precision="bf16", meta=GPU, recipe=None):
    """A one-layer capture. ``steps``: (kind, ms, gemm ms or None, dispatch); on a CPU (host clock)
    the steps carry no GPU time, as GemmProfiler stores them there."""
    gpu = meta.get("timing") == "cuda_events"
    gemm = next((g for _, _, g, _ in steps if g is not None), 1.0)
    recs = [GemmRecord(module="layer", gemm="", op=op, m=m, k=k, n=n, batch=1, precision=precision, operands=[],
                       source="te", kernel="general_gemm", recompute=False, module_type="Linear", calls=1,
                       calls_per_step=1.0, flops=2 * M * K * N, times_ms=[gemm / 3])
            for op, (m, k, n) in (("fprop", (M, K, N)), ("dgrad", (M, N, K)), ("wgrad", (K, M, N)))]
    st = [StepTime(i, wall_ms=ms, gpu_ms=ms if gpu else None, gemm_ms=g, kind=kind, dispatch=d)
          for i, (kind, ms, g, d) in enumerate(steps)]
    return GemmCapture(recs, st, {**meta, **({"recipe": recipe} if recipe else {})})


def bench(per_pass_ms):
    res = [BenchResult(m, k, n, op, prec, "autocast", median_ms=ms, q1_ms=ms, q3_ms=ms, iters=5)
           for prec, ms in per_pass_ms.items()
           for op, (m, k, n) in (("fprop", (M, K, N)), ("dgrad", (M, N, K)), ("wgrad", (K, M, N)))]
    return BenchResults(res, {}, {"modes": ["autocast"], "device": "test"})


def text(renderable) -> str:
    con = Console(width=400, record=True)
    con.print(renderable)
    return " ".join(con.export_text().split())  # rich wraps titles and captions: one line to search


def shares_over_100(s: str) -> list[str]:
    return [m for m in re.findall(r"(\d+(?:\.\d+)?)% of", s) if float(m) > 100]


# --- GEMM share above 100% ---------------------------------------------------------------------

def test_cpu_gemm_time_of_the_instrumented_step_is_not_set_against_a_clean_step(tmp_path):
    # The user's CPU report: 16 ms of host-clock GEMM time on the instrumented step (40 ms, the
    # dispatch mode on), clean steps of 10 ms: "GEMMs 160% of the step". The share is taken within
    # the step the GEMMs were timed in: 16 of 40 ms.
    c = cap([("instrumented", 40.0, 16.0, True), ("clean", 10.0, None, False), ("clean", 10.0, None, False)], meta=CPU)
    rep = analyze(c)
    assert rep.gemm_share == pytest.approx(0.4) and rep.meta["gemm_share_basis"] == "timed steps"
    assert any("160% of the clean step" in w for w in rep.warnings), rep.warnings
    title = text(report_table(rep))
    assert "40.0% of the instrumented step they were timed in" in title and not shares_over_100(title), title
    assert "check:" in text(verdict_panel(rep))
    d = json.loads(json.dumps(rep.to_dict()))
    assert d["gemm_share"] == pytest.approx(0.4) and d["meta"]["warnings"] == rep.warnings
    # The capture's own table and metrics state the same share, never 160%.
    caption = text(capture_table(c))
    assert "40.0% of the instrumented step" in caption and not shares_over_100(caption), caption
    assert summary_metrics(c)["te_gemm/gemm_share"] == pytest.approx(0.4)


def test_gpu_gemm_time_above_the_step_is_refused_not_printed(tmp_path):
    # Event pairs on the instrumented step of a host-bound job: 12 ms of GEMM against a 10 ms clean
    # step. Nothing to take it within that fixes it: the share is n/a and says why, and the
    # predictions and verdicts made from it are refused too.
    job = cap([("instrumented", 14.0, 12.0, False), ("clean", 10.0, None, False), ("clean", 10.0, None, False)])
    fp8 = cap([("instrumented", 12.0, 6.0, False), ("clean", 8.0, None, False), ("clean", 8.0, None, False)],
              precision="fp8_delayed")
    rep = analyze(job, bench({"BF16": 2.0, "DelayedScaling": 1.0}), [fp8])
    assert rep.gemm_share is None and "exceeds the 10.00 ms step" in rep.meta["gemm_share_na"]
    assert any("GEMM share n/a" in w and "CUDA-event pair" in w for w in rep.warnings), rep.warnings
    a = next(a for a in rep.recipes if a.recipe == "DelayedScaling")
    assert a.predicted_step_speedup is None and a.verdict.startswith("n/a (GEMM share n/a")
    assert a.observed_step_speedup == pytest.approx(1.25)  # measured on clean steps alike: kept
    assert not any(e.startswith("non-GEMM time") for e in a.evidence), a.evidence  # it would read -2.00 ms
    assert a.evidence[-1].startswith("GEMM share n/a: BF16's GEMM time exceeds its step")
    table = text(report_table(rep))
    assert "GEMM share n/a" in table and not shares_over_100(table) and "n/a" in table.split("DelayedScaling")[1]
    d = rep.to_dict()
    assert d["gemm_share"] is None and d["meta"]["withheld"]["DelayedScaling"]["predicted_step_speedup"]
    for draw in (speedup_figure, step_split_figure):  # drawn with the refused share, not from it
        assert draw(rep, tmp_path / f"{draw.__name__}.png").stat().st_size > 0
    assert next(r for r in d["recipes"] if r["recipe"] == "DelayedScaling")["predicted_step_speedup"] is None


def test_a_share_below_100_is_stated_as_measured():
    # The check must let a sound share through unchanged (so the tests above can fail).
    c = cap([("instrumented", 14.0, 6.0, False), ("clean", 10.0, None, False)])
    assert share_check(c, 10.0, 6.0) == {"share": 0.6, "basis": "step", "of_ms": 10.0, "clock": "cuda_events"}
    rep = analyze(c)
    assert rep.gemm_share == pytest.approx(0.6) and not rep.warnings and not rep.meta["withheld"]
    assert "GEMMs 6.00 ms (60.0% of the step)" in text(report_table(rep))


# --- negative instrument cost --------------------------------------------------------------------

def test_an_instrumented_step_faster_than_the_clean_ones_states_no_cost():
    # The user's sweep: the dispatch step 149 ms, clean steps 306-380 ms ("-53%" beside "+392%").
    c = cap([("instrumented", 148.9, 86.0, True), ("clean", 306.5, None, False), ("clean", 319.9, None, False),
             ("clean", 379.8, None, False)], meta=CPU)
    note = instrument_note(c)
    assert not re.search(r"-\d", note), note
    assert "no cost stated" in note and "too noisy to state an instrument cost" in note and "vary ±11%" in note
    assert instrument_problem(c) is not None
    # Two clean steps that agree, and an instrumented one far below them: conditions moved.
    c = cap([("instrumented", 50.0, 1.0, False), ("clean", 100.0, None, False), ("clean", 100.5, None, False)])
    assert "only 2 clean steps" in instrument_problem(c) and not re.search(r"-\d", instrument_note(c))


def test_a_negative_cost_within_noise_and_a_positive_cost_are_stated():
    c = cap([("instrumented", 99.5, 1.0, False), ("clean", 100.0, None, False), ("clean", 101.0, None, False)])
    assert instrument_problem(c) is None
    assert "99.50 ms (-1.0%, within noise: no measurable cost)" in instrument_note(c)
    c = cap([("instrumented", 492.0, 1.0, True), ("clean", 100.0, None, False), ("clean", 100.0, None, False)],
            meta=CPU)
    assert instrument_problem(c) is None and "492.00 ms (+392.0%)" in instrument_note(c)


def test_a_run_folders_report_lists_the_refused_cost(tmp_path):
    run = tmp_path / "run"
    cap([("instrumented", 492.0, 20.0, True), ("clean", 100.0, None, False), ("clean", 100.0, None, False)],
        meta=CPU).save(run / "gemm_capture.json")
    cap([("instrumented", 42.0, 20.0, True), ("clean", 90.0, None, False), ("clean", 110.0, None, False)],
        meta=CPU, recipe="BF16").save(run / "sweep" / "BF16" / "gemm_capture.json")
    out = Console(width=300, record=True)
    render_run(run, out)
    printed = out.export_text()
    rep = json.loads((run / "report.json").read_text())
    assert any(w.startswith("BF16 run: too noisy to state an instrument cost") for w in rep["meta"]["warnings"])
    assert "+392.0%" in rep["meta"]["job_step_note"] and not re.search(r"-\d+(\.\d+)?%", printed), printed
    assert "CUDA" not in printed and "host clock" in printed


# --- too noisy for a verdict -------------------------------------------------------------------

def fp8_run(*ms):
    return cap([("instrumented", 60.0, 32.0, False)] + [("clean", x, None, False) for x in ms], precision="fp8_delayed")


def test_a_verdict_within_the_steps_noise_is_withheld():
    # BF16: 100 ms step, 60 ms GEMM; FP8 GEMMs 32 ms: predicted 100 / 72 = 1.389x. FP8 clean steps
    # at a median of 76 ms: 1.316x, -5.3% of the prediction, just past the 5% line. Steps that vary
    # +-10% cannot put it on either side.
    base = cap([("instrumented", 110.0, 60.0, False), ("clean", 90.0, None, False), ("clean", 100.0, None, False),
                ("clean", 110.0, None, False)])
    fp8 = fp8_run(70.0, 76.0, 82.0)
    rep = analyze(replayable(base), bench_of(BF16=60, DelayedScaling=32), [fp8])
    a = next(a for a in rep.recipes if a.recipe == "DelayedScaling")
    assert a.verdict == "n/a (too noisy to decide)" and "±18%" in a.verdict_evidence.withheld, a.evidence
    assert "line between GEMM-bound and not" in a.verdict_evidence.withheld  # the replay: GPU-bound
    # On a step the replay says the host bounds, the line is named for that verdict, not GEMM-bound.
    host = replace(a, predicted_bound="host", verdict_kind=Verdict.HOST_BOUND)
    why = _too_noisy(host, observe(fp8), observe(base), fp8, base, GEMM_BOUND_TOL)
    assert why is not None and "line between host-bound as predicted and not" in why and "GEMM-bound" not in why
    # The same medians from steady steps: the verdict stands.
    base = cap([("instrumented", 110.0, 60.0, False), ("clean", 100.0, None, False), ("clean", 100.0, None, False)])
    rep = analyze(replayable(base), bench_of(BF16=60, DelayedScaling=32), [fp8_run(76.0, 76.0)])
    assert next(a for a in rep.recipes if a.recipe == "DelayedScaling").verdict == "overhead eats the gain"


def test_clean_steps_are_not_set_against_instrumented_ones():
    base = cap([("instrumented", 110.0, 60.0, False), ("clean", 100.0, None, False)])
    run = cap([("instrumented", 80.0, 32.0, False)], precision="fp8_delayed")  # no clean step
    a = next(a for a in analyze(base, None, [run]).recipes if a.recipe == "DelayedScaling")
    assert a.observed_step_speedup is None and a.verdict == "n/a (steps not comparable)"


# --- the clocks named per device -----------------------------------------------------------------

def test_cpu_timing_is_named_host_clock_and_gpu_timing_cuda_events():
    cpu = analyze(cap([("instrumented", 40.0, 16.0, True), ("clean", 30.0, None, False)], meta=CPU))
    assert "host clock (time.perf_counter) between step boundaries" in cpu.meta["timing"]
    assert "GEMM: host clock (time.perf_counter)" in cpu.meta["timing"] and "CUDA" not in cpu.meta["timing"]
    assert step_split_title(cpu) == "Step time split (GEMM: host clock; the rest: the step minus GEMM)"
    assert "CUDA" not in text(report_table(cpu))
    gpu = analyze(cap([("instrumented", 14.0, 6.0, False), ("clean", 10.0, None, False)]))
    assert gpu.meta["timing"] == ("step: median of clean steps (nothing attached), CUDA events between step "
                                  "boundaries; GEMM: CUDA-event pair per GEMM")
    assert step_split_title(gpu, {"BF16": {"gemm": 6.0, "other": 1.0}}) == \
        "Step time split (GEMM: CUDA events; the rest: kernel time by category)"
    # A file written before the capture recorded its clocks: a CPU device means the host clock.
    old = cap([("instrumented", 40.0, 16.0, True), ("clean", 30.0, None, False)], meta={"device": "CPU (arm64)"})
    assert old.gemm_clock() == "host_clock" and "CUDA" not in analyze(old).meta["timing"]


# --- the job's precision from what ran -------------------------------------------------------------

def test_job_precision_is_named_from_its_gemms():
    steps = [("instrumented", 14.0, 6.0, False), ("clean", 10.0, None, False)]
    assert capture_recipe(cap(steps, "fp32")) == "FP32"
    assert capture_recipe(cap(steps, "fp16")) == "FP16"
    assert capture_recipe(cap(steps, "bf16")) == "BF16"
    assert capture_recipe(cap(steps, "fp8_current")) == "Float8CurrentScaling"
    # A sweep's "BF16" entry is FP8 off, the key its speedups are joined on: an fp32 model ran
    # FP32 there, which the report reads from its GEMMs.
    swept = cap(steps, "fp32", recipe="BF16")
    assert capture_recipe(swept) == "BF16" and precision_ran(swept) == "FP32"
    # An FP8 entry whose GEMMs fell back to BF16 keeps its name: the verdict calls the fallback.
    assert capture_recipe(cap(steps, "bf16", recipe="DelayedScaling")) == "DelayedScaling"


def test_an_fp32_job_is_reported_as_fp32_with_no_bf16_baseline_invented(tmp_path):
    job = cap([("instrumented", 140.0, 80.0, False), ("clean", 100.0, None, False)], "fp32")
    fp8 = cap([("instrumented", 80.0, 32.0, False), ("clean", 70.0, None, False)], "fp8_delayed")
    rep = analyze(job, bench({"BF16": 10.0, "DelayedScaling": 5.0}), [fp8])
    assert rep.current_recipe == "FP32"
    rows = {a.recipe: a for a in rep.recipes}
    assert rows["FP32"].gemm_ms_bench is None and rows["FP32"].verdict == "n/a (not an FP8 recipe)"
    assert rows["BF16"].gemm_ms_bench == pytest.approx(30.0)  # the BF16 microbenchmark stands as measured
    assert all(a.predicted_step_speedup is None for a in rep.recipes)  # no FP32 bench to scale from
    assert rows["DelayedScaling"].observed_step_speedup is None and \
        rows["DelayedScaling"].verdict == "n/a (no BF16 run)"
    assert any("no BF16 run was observed" in w for w in rep.warnings)
    table = text(report_table(rep))
    assert "job ran FP32" in table and "job ran BF16" not in table
    assert "silent fallback" not in text(verdict_panel(rep))
    # With a BF16 run beside it, the speedups over BF16 come back, FP32's among them.
    bf16 = cap([("instrumented", 90.0, 50.0, False), ("clean", 80.0, None, False)], "bf16")
    rows = {a.recipe: a for a in analyze(job, None, [bf16, fp8]).recipes}
    assert rows["FP32"].observed_step_speedup == pytest.approx(0.8)
    assert rows["DelayedScaling"].observed_step_speedup == pytest.approx(80 / 70)


def test_a_sweeps_bf16_entry_that_ran_fp32_is_named_so(tmp_path):
    # The sweep's FP8-off entry on an fp32 model: keyed BF16, ran FP32. Its speedups are over FP32
    # and say so; predictions that would scale FP32 GEMM time by BF16 microbenchmarks are refused.
    base = cap([("instrumented", 140.0, 80.0, False), ("clean", 100.0, None, False)], "fp32", recipe="BF16")
    fp8 = cap([("instrumented", 80.0, 32.0, False), ("clean", 80.0, None, False)], "fp8_delayed",
              recipe="DelayedScaling")
    rep = analyze(replayable(base), bench({"BF16": 10.0, "DelayedScaling": 5.0}), [fp8])
    assert rep.meta["job_precision"] == "FP32" and rep.meta["baseline_ran"] == "FP32"
    a = next(a for a in rep.recipes if a.recipe == "DelayedScaling")
    assert a.observed_step_speedup == pytest.approx(1.25) and a.predicted_step_speedup is None
    assert a.verdict == "n/a (no FP32 microbenchmark)"
    table = text(report_table(rep))
    assert "job ran FP32" in table and "BF16 (ran FP32)" in table
    assert "speedups over the BF16 run, which ran FP32" in table
    assert any("every speedup over BF16 here is over FP32" in w for w in rep.warnings)
    # A BF16 run that ran BF16: none of it.
    bf = cap([("instrumented", 140.0, 80.0, False), ("clean", 100.0, None, False)], "bf16", recipe="BF16")
    rep = analyze(replayable(bf), bench({"BF16": 10.0, "DelayedScaling": 5.0}), [fp8])
    assert rep.meta["baseline_ran"] is None and not rep.warnings
    assert next(a for a in rep.recipes if a.recipe == "DelayedScaling").predicted_step_speedup is not None


def fp32_run(tmp_path):
    """A CPU fp32 job's run folder with its sweep's FP8-off entry, and a BF16-only microbenchmark."""
    run = tmp_path / "run"
    cap([("instrumented", 40.0, 6.0, True), ("clean", 10.0, None, False)], "fp32",
        meta=CPU).save(run / "gemm_capture.json")
    cap([("instrumented", 30.0, 5.0, True), ("clean", 9.0, None, False)], "fp32", meta=CPU,
        recipe="BF16").save(run / "sweep" / "BF16" / "gemm_capture.json")
    bench({"BF16": 1.0}).save(run / "bench.json")
    return run


def test_an_fp32_run_folder_renders(tmp_path):
    run = fp32_run(tmp_path)
    out = Console(width=300, record=True)
    rr = render_report(run, out)
    printed = " ".join(out.export_text().split())
    d = json.loads((run / "report.json").read_text())
    assert d["meta"]["job_precision"] == "FP32" and rr.report.step_ms == 9.0  # the sweep's run is the base
    assert "job ran FP32" in printed and "job ran BF16" not in printed
    assert any("ran FP32 GEMMs" in w for w in d["meta"]["warnings"])


def test_an_fp32_job_has_one_name_per_run_in_tables_figures_and_the_log(tmp_path, monkeypatch):
    """An FP32 job's FP8-off run was "BF16 (ran FP32)" in the table and speedups.png, "BF16" in
    step_split.png, and the log's summary called the job a "BF16 job (ran FP32)"; without a BF16
    run, a "BF16" row (the microbenchmark's alone) stood beside an "FP32" row (the job's)."""
    from matplotlib.axes import Axes

    from te_gemm_callback.reporting.summary import summary_lines

    ticks = []
    real = Axes.set_xticks
    monkeypatch.setattr(Axes, "set_xticks", lambda ax, t, labels=None, **k: (
        ticks.append(list(labels or [])), real(ax, t, labels, **k))[1])
    run = fp32_run(tmp_path)
    out = Console(width=300, record=True)
    render_report(run, out)
    assert "BF16 (ran FP32)" in out.export_text()
    # speedups.png and step_split.png alike (gemm_*.png show the microbenchmark's cells: BF16 ran BF16)
    assert ticks[:2] == [["BF16\n(ran FP32)"]] * 2, ticks
    head = summary_lines(run / "report.json")[:2]
    assert head[0].startswith("te-gemm: FP32 job,") and "ran FP32: every speedup here is over FP32" in head[1]
    # The head line names the base too (it said "speedups over BF16" above line 2's "over FP32").
    assert "; speedups over FP32:" in head[0] and "over BF16" not in head[0], head
    # No BF16 run: the bench's BF16 row and the job's FP32 row say which is which.
    (run / "sweep" / "BF16" / "gemm_capture.json").unlink()
    ticks.clear()
    out = Console(width=300, record=True)
    render_report(run, out)
    printed = out.export_text()
    assert "BF16 (microbenchmark only)" in printed and "FP32 (the job)" in printed
    lines = summary_lines(run / "report.json")
    assert lines[0].startswith("te-gemm: FP32 job,")
    # The report's checks reach the log too (they were in report.md alone).
    assert any(line.startswith("  check: the job ran FP32 and no BF16 run was observed") for line in lines), lines


def test_an_fp32_moe_job_analyses():
    job = cap([("instrumented", 14.0, 6.0, False), ("clean", 10.0, None, False)], "fp32")
    job.records.append(GemmRecord(module="moe", gemm="", op="fprop", m=64, k=32, n=32, batch=1, precision="fp32",
                                  operands=[], source="te", kernel="general_grouped_gemm", recompute=False,
                                  module_type="GroupedLinear", calls=1, calls_per_step=1.0, flops=2 * 64 * 32 * 32,
                                  times_ms=[1.0], m_splits=[[32, 32]]))
    assert analyze(job).current_recipe == "FP32"


def test_report_json_sets_no_gemm_time_beside_a_step_it_is_not_of(tmp_path):
    """On a CPU, report.json's top-level gemm_ms (the instrumented step's host-clock GEMM time)
    stood beside step_ms (the clean steps') and could exceed it. Where the share's basis is not
    the step, the GEMM time is named for what it is."""
    import json

    import torch

    from te_gemm_callback import GemmSchedule
    from te_gemm_callback.schedule import JobStep

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(128, 64)
    sched = GemmSchedule(wait=1, warmup=1, active=3, output_dir=tmp_path)
    sched.fit_start(8)
    for i in range(8):
        sched.step_begin(model)
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
        sched.step_end(JobStep(global_step=i + 1))
    sched.train_end()
    rep = json.loads((tmp_path / "report.json").read_text())
    assert rep["meta"]["gemm_share_basis"] == "timed steps"
    assert "gemm_ms" not in rep and rep["gemm_ms_timed_steps"] > 0
    assert rep["gemm_share"] <= 1


def test_a_job_resumed_inside_its_window_is_reported_from_its_own_capture(tmp_path):
    """A fit stopped inside the capture window and resumed into the same output_dir wrote its new
    capture beside the old one (gemm_capture.step12.json) and its sweep over the old sweep; the
    report read the old capture and threw the new sweep away as another run's (the observed
    column empty)."""
    from te_gemm_callback.analysis.runs import analyze_run

    run = tmp_path / "run"
    old = cap([("instrumented", 40.0, 6.0, True), ("clean", 30.0, None, False)], "bf16", meta=CPU)
    old.meta.update(run_id="first", created="2026-12-04T10:00:00+00:00")
    old.save(run / "gemm_capture.json")
    new = cap([("instrumented", 40.0, 6.0, True), ("clean", 10.0, None, False)], "bf16", meta=CPU)
    new.meta.update(run_id="resumed", created="2026-12-04T10:05:00+00:00")
    new.save(run / "gemm_capture.step12.json")
    for recipe, ms in (("BF16", 10.0), ("Float8CurrentScaling", 8.0)):
        c = cap([("instrumented", 40.0, 6.0, True), ("clean", ms, None, False)],
                "bf16" if recipe == "BF16" else "fp8_current", meta=CPU, recipe=recipe)
        c.meta.update(run_id="resumed", sweep=True)
        c.save(run / "sweep" / recipe / "gemm_capture.json")
    rr = analyze_run(run)
    assert rr.captures and all(c.meta.get("run_id") == "resumed" for c in rr.captures)
    fp8 = next(a for a in rr.report.recipes if a.recipe == "Float8CurrentScaling")
    assert fp8.observed_step_speedup == pytest.approx(10.0 / 8.0)
