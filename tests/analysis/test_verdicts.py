"""Verdicts as data: a kind (Verdict) with its numbers (Evidence), rendered into sentences in one
place; report.json keeps the sentences and adds the kind. Hand-made captures (helpers/one_layer.py,
helpers/three_modules.py)."""

import json
from dataclasses import replace

import pytest
from helpers.one_layer import bench, bench_of, capture, replayable
from helpers.three_modules import bench as plan_bench
from helpers.three_modules import capture as plan_capture
from rich.console import Console

from te_gemm_callback.analysis import findings
from te_gemm_callback.analysis.findings import Evidence, Straddle, Verdict, render
from te_gemm_callback.analysis.runs import analyze_run
from te_gemm_callback.analysis.verdicts import RecipeAnalysis, analyze, judge, observe, verdict
from te_gemm_callback.capture.capture_file import GemmCapture, StepTime
from te_gemm_callback.reporting.run import report
from te_gemm_callback.reporting.speedups import write_run


def kinds_of(rep):
    return {a.recipe: a.verdict_kind for a in rep.recipes}


def test_each_verdict_is_a_kind_with_its_sentence():
    rep = analyze(replayable(capture(100, 60)),
                  bench_of(BF16=60, DelayedScaling=32, Float8CurrentScaling=32, Float8BlockScaling=32),
                  [capture(80, 32, "fp8_delayed"), capture(73, 32, "fp8_current"), capture(60, 32, "fp8_block")])
    got = kinds_of(rep)
    assert got == {"BF16": Verdict.BASELINE, "DelayedScaling": Verdict.OVERHEAD_EATS_GAIN,
                   "Float8CurrentScaling": Verdict.GEMM_BOUND, "Float8BlockScaling": Verdict.BETTER_THAN_PREDICTED}
    rows = {a.recipe: a for a in rep.recipes}
    assert rows["DelayedScaling"].verdict == "overhead eats the gain"
    assert rows["Float8CurrentScaling"].verdict == "GEMM-bound: working as expected"
    assert rows["BF16"].verdict == "baseline" and all(e.startswith("replayed:") for e in rows["BF16"].evidence)
    # The numbers the sentence is made from are on the row, not only in its text.
    ev = rows["DelayedScaling"].verdict_evidence
    assert ev.predicted == pytest.approx(100 / 72) and ev.observed == pytest.approx(1.25)
    assert ev.residual == pytest.approx(1.25 / (100 / 72) - 1) and ev.tolerance == 0.05
    assert ev.non_gemm_ms == (40.0, 48.0) and ev.overhead_ms == pytest.approx(8.0)


def test_no_gain_silent_fallback_and_predicted_only():
    rep = analyze(capture(100, 60), None, [capture(99, 59.5, "bf16", recipe="DelayedScaling")])
    a = next(a for a in rep.recipes if a.recipe == "DelayedScaling")
    assert a.verdict_kind is Verdict.SILENT_FALLBACK and a.verdict == "no gain (silent fallback)"
    assert a.verdict_evidence.no_gain_below == 1.05 and a.verdict_evidence.unquantized
    b = bench({"BF16": 20.0, "DelayedScaling": 19.8, "Float8CurrentScaling": 10.0})
    rows = {a.recipe: a for a in analyze(capture(100, 60), b, []).recipes}
    assert rows["DelayedScaling"].verdict_kind is Verdict.NO_GAIN  # 1.01x GEMM speedup, no run to blame
    # No kernels step to replay and no run: nothing predicted, nothing observed (it said "predicted only").
    assert rows["Float8CurrentScaling"].verdict_kind is Verdict.NOT_JUDGED
    assert rows["Float8CurrentScaling"].verdict == ("not judged: no observed run in this recipe and no prediction "
                                                    "(the capture holds no host calls of a kernels step)")


def swept(recipe, ms):
    """A sweep's run of ``recipe``: one clean step per round."""
    return GemmCapture([], [StepTime(k, wall_ms=t, kind="clean", round=k) for k, t in enumerate(ms)],
                       {"recipe": recipe})


def test_an_interval_across_the_line_is_undecided_with_the_interval_as_numbers():
    bf16 = observe(swept("BF16", [10.0] * 8))
    fp8 = observe(swept("Float8CurrentScaling", [10 / r for r in (1.10, 1.15, 1.2, 1.22, 1.24, 1.26, 1.28, 1.3)]))
    a = RecipeAnalysis("Float8CurrentScaling", predicted_step_speedup=1.25, observed_step_speedup=1.23)
    kind, ev = judge(a, fp8, bf16)
    assert kind is Verdict.UNDECIDED
    assert isinstance(ev.straddle, Straddle) and ev.straddle.edge == pytest.approx(0.95)
    assert not ev.straddle.rounds_range and ev.estimate.rounds == 8
    sentence, lines = verdict(a, fp8, bf16)  # the sentences are judge's, rendered
    assert (sentence, lines) == render(kind, ev)
    assert sentence.startswith("undecided") and any("95% interval" in e for e in lines)
    assert lines[-1].startswith("more rounds narrow it")


def test_bench_cells_far_above_the_jobs_whole_step_hold_every_prediction():
    # Cells timed on a loaded machine or cached from another run: 120 ms of GEMMs in a 10 ms step.
    ok = analyze(replayable(capture(10, 6)), bench({"BF16": 2.0, "DelayedScaling": 1.0}),
                 [capture(8, 3, "fp8_delayed")])
    assert ok.meta["warnings"] == [] and ok.recipes[1].predicted_step_speedup is not None
    rep = analyze(replayable(capture(10, 6)), bench({"BF16": 40.0, "DelayedScaling": 20.0}),
                  [capture(8, 3, "fp8_delayed")])
    assert [a.predicted_step_speedup for a in rep.recipes] == [None, None]
    assert rep.recipes[1].verdict_kind is Verdict.WITHHELD
    assert any("120.00 ms a step, over 2x the whole observed step (10.00 ms)" in w for w in rep.meta["warnings"])


def test_bench_cells_far_from_the_jobs_own_gemm_time_are_said():
    """On a loaded 2-core CPU the bench timed 168 ms of GEMMs a step where the job's own took 25.8 ms,
    and the report said nothing: predictions were made from cells that were not the job's."""
    for per_cell, said in ((0.7, None), (3.0, "4.5x their time in the job (2.00 ms)"),
                           (0.1, "0.15x their time in the job (2.00 ms)")):
        rep = analyze(replayable(capture(10, 2)), bench({"BF16": per_cell, "DelayedScaling": per_cell / 2}),
                      [capture(8, 1, "fp8_delayed")])
        found = [w for w in rep.meta["warnings"] if "their time in the job" in w]
        assert (found == []) if said is None else (len(found) == 1 and said in found[0]), found
        assert rep.recipes[1].predicted_step_speedup is not None  # said, not withheld
    # An FP32 job's BF16 cells stand in for a precision it did not run: not set against its own time.
    fp32 = analyze(capture(10, 6, precision="fp32"), bench({"BF16": 0.2, "DelayedScaling": 0.1}), [])
    assert not [w for w in fp32.meta["warnings"] if "their time in the job" in w], fp32.meta["warnings"]


def test_a_withheld_verdict_is_a_kind_and_its_lines_are_cleared_by_field():
    # GEMM time above the step: the prediction, its verdict and the lines from the non-GEMM time refused.
    rep = analyze(capture(10, 12), bench({"BF16": 2.0, "DelayedScaling": 1.0}), [capture(8, 6, "fp8_delayed")])
    a = next(a for a in rep.recipes if a.recipe == "DelayedScaling")
    assert a.verdict_kind is Verdict.WITHHELD and a.verdict.startswith("n/a (GEMM share n/a")
    assert a.evidence[-1] == a.verdict_evidence.withheld
    # Applying the checks again changes nothing: no line is matched by its words.
    before = list(a.evidence)
    from te_gemm_callback.analysis.checks import apply_withheld

    apply_withheld(rep.recipes, rep.meta["withheld"])
    assert a.evidence == before


def test_lines_from_the_non_gemm_time_go_with_the_field_not_with_their_words():
    ev = Evidence(recipe="DelayedScaling", predicted=1.4, observed=1.2, tolerance=0.05, non_gemm_ms=(40.0, 48.0),
                  idle_ms=9.0, host_wait_ms=9.0, withheld="GEMM share n/a: its non-GEMM time would be negative")
    _, lines = render(Verdict.OVERHEAD_EATS_GAIN, ev)
    assert any(e.startswith("non-GEMM time") for e in lines) and any("host-bound gaps" in e for e in lines)
    assert any(e.startswith("where it goes: mostly host time: the GPU waits 9.00 ms") for e in lines)
    ev.non_gemm_withheld = True
    _, lines = render(Verdict.OVERHEAD_EATS_GAIN, ev)
    assert lines[-1] == "GEMM share n/a: its non-GEMM time would be negative"  # kept, though it names that time
    assert not any(e.startswith(("non-GEMM time", "where it goes")) or "host-bound gaps" in e for e in lines)


def test_every_kind_renders_a_sentence():
    for kind in Verdict:
        assert findings.verdict_text(kind, Evidence(withheld="why: because")), kind
    assert findings.verdict_text(None, Evidence()) == ""


def test_report_json_keeps_the_sentence_and_adds_the_kind(tmp_path):
    run = tmp_path / "run"
    replayable(capture(100, 60)).save(run / "BF16" / "gemm_capture.json")
    capture(80, 32, "fp8_delayed").save(run / "DelayedScaling" / "gemm_capture.json")
    bench_of(BF16=60, DelayedScaling=32).save(run / "bench.json")
    report(run)
    d = json.loads((run / "report.json").read_text())
    rows = {r["recipe"]: r for r in d["recipes"]}
    assert rows["DelayedScaling"]["verdict"] == "overhead eats the gain"
    assert rows["DelayedScaling"]["verdict_kind"] == "overhead_eats_gain" == Verdict.OVERHEAD_EATS_GAIN.value
    assert rows["BF16"]["verdict_kind"] == "baseline"
    assert all(isinstance(e, str) for e in rows["DelayedScaling"]["evidence"])
    assert rows["DelayedScaling"]["verdict_evidence"]["predicted"] == pytest.approx(100 / 72)


def test_the_report_writes_and_prints_what_the_analysed_run_hands_it(tmp_path):
    run = tmp_path / "run"
    plan_capture().save(run / "gemm_capture.json")
    plan_bench().save(run / "bench.json")
    rr = analyze_run(run)  # the plan is analysed with the run, not by the report
    assert rr.plan is not None and sorted(rr.plan.keep_bf16) == ["router", "small"]
    rr.plan.keep_bf16 = ["small"]  # whatever the analysis hands over is what gets written
    files = write_run(rr, run)
    assert json.loads(files["plan"].read_text())["keep_bf16"] == ["small"]
    # A host-bound run is warned about from the analysis' flag, not from the note's words.
    rr.host_bound_notes = ["step_note"]
    rr.report.meta["step_note"] = "a note"
    out = Console(width=300, record=True)
    write_run(rr, run, out)
    assert "warning: a note" in out.export_text()


def _with_torch_head(cap, precision="bf16"):
    """``cap`` with a plain torch lm_head beside its TE layer: high precision under every recipe."""
    head = replace(cap.records[0], module="lm_head", source="torch", kernel="aten.mm", precision=precision)
    return GemmCapture([*cap.records, head], cap.steps, cap.meta)


def test_a_plain_torch_layer_left_high_precision_is_not_a_silent_fallback():
    """A TE job's lm_head (nn.Linear) is high precision under every recipe: with the TE GEMMs quantized and
    slower at small shapes, the verdict says slower GEMMs, not a fallback; a TE GEMM left BF16 still is one."""
    base = _with_torch_head(capture(100, 60))
    quantized = _with_torch_head(capture(110, 66, "fp8_block", recipe="Float8BlockScaling"))
    a = next(a for a in analyze(base, None, [quantized]).recipes if a.recipe == "Float8BlockScaling")
    assert a.verdict_kind is Verdict.NO_GAIN and "silent fallback" not in a.verdict
    assert a.verdict == "slower GEMMs at these shapes (0.91x GEMM speedup)"
    assert any(e.startswith("1 GEMM(s) ran in high precision") and "lm_head" in e for e in a.evidence)
    fell_back = _with_torch_head(capture(110, 66, "bf16", recipe="Float8BlockScaling"))
    a = next(a for a in analyze(base, None, [fell_back]).recipes if a.recipe == "Float8BlockScaling")
    assert a.verdict_kind is Verdict.SILENT_FALLBACK


def test_a_no_gain_verdict_keeps_predicted_against_observed():
    bf16 = observe(capture(100, 60))
    run = observe(capture(120, 66, "fp8_block", recipe="Float8BlockScaling"))
    a = RecipeAnalysis("Float8BlockScaling", gemm_ms_bench=6.6, gemm_speedup=0.90, predicted_step_speedup=0.75,
                       predicted_bound="host", observed_step_speedup=100 / 120)
    kind, ev = judge(a, run, bf16)
    _, lines = render(kind, ev)
    assert kind is Verdict.NO_GAIN
    assert any(e.startswith("predicted step speedup 0.75x, observed 0.83x") for e in lines), lines
    assert not any("undecided" in e for e in lines)  # no line between verdicts to straddle here


def test_a_host_bound_step_as_predicted_is_not_called_gemm_bound():
    bf16 = observe(swept("BF16", [10.0] * 8))
    tight = observe(swept("DelayedScaling", [10 / r for r in (0.83, 0.835, 0.84, 0.84, 0.845, 0.84, 0.84, 0.84)]))
    a = RecipeAnalysis("DelayedScaling", predicted_step_speedup=0.84, predicted_bound="host",
                       observed_step_speedup=0.84)
    kind, _ = judge(a, tight, bf16)
    assert kind is Verdict.HOST_BOUND and not findings.verdict_text(kind, Evidence()).startswith("GEMM-bound")
    a.predicted_bound = "gpu"
    assert judge(a, tight, bf16)[0] is Verdict.GEMM_BOUND
    wide = observe(swept("DelayedScaling", [10 / r for r in (0.80, 0.84, 0.86, 0.88, 0.9, 0.92, 0.94, 0.98)]))
    a = RecipeAnalysis("DelayedScaling", predicted_step_speedup=0.84, predicted_bound="host",
                       observed_step_speedup=0.89)
    sentence, lines = verdict(a, wide, bf16)
    assert sentence.startswith("undecided")
    assert any("the line between host-bound as predicted and better than predicted" in e for e in lines), lines
    assert not any("GEMM-bound" in e for e in lines)
