"""Where the job's step cannot be replayed, the predicted column stays empty and says why; GEMMs alone
stands beside it, labelled, and no verdict is judged against it (helpers/one_layer.py)."""

from helpers.one_layer import bench_of, capture, replayable

from te_gemm_callback.analysis.findings import Verdict
from te_gemm_callback.analysis.runs import analyze_run
from te_gemm_callback.reporting.report_tables import replay_own_line, speedup_rows


def _run(tmp_path, with_bench):
    run = tmp_path / ("benched" if with_bench else "unbenched")
    replayable(capture(100, 60)).save(run / "BF16" / "gemm_capture.json")
    capture(80, 32, "fp8_delayed").save(run / "DelayedScaling" / "gemm_capture.json")
    if with_bench:
        b = bench_of(BF16=60, DelayedScaling=32)
        b.meta["module_costs"] = {"modules": {}, "kinds": {}, "cupti_call_tax_us": 0.0, "profiler_op_tax_us": 0.0}
        b.save(run / "bench.json")
    return analyze_run(run).report


def test_without_a_bench_the_predicted_column_is_empty_and_says_why(tmp_path):
    rep = _run(tmp_path, with_bench=False)
    a = next(a for a in rep.recipes if a.recipe == "DelayedScaling")
    assert a.predicted_step_speedup is None and a.predicted_step_ms is None and a.predicted_by is None
    assert a.predicted_na.startswith("no bench.json: te-gemm bench --capture")
    assert rep.meta["no_replay"] == a.predicted_na
    # GEMMs alone from the runs' own GEMM times: shown and labelled, not judged against.
    assert a.predicted_gemms_alone is not None and abs(a.predicted_gemms_alone - 100 / 72) < 1e-9
    assert a.verdict_kind is Verdict.OBSERVED_ONLY
    assert a.verdict == "observed only: faster than BF16 (no prediction to judge against: no bench.json)"
    assert "GEMM speedup 1.88x (the runs' own GEMM times, no microbenchmark)" in a.evidence
    assert any(e.startswith("observed step speedup 1.25x") and "GEMMs alone 1.39x" in e
               and "no prediction: no bench.json" in e for e in a.evidence), a.evidence
    rows = speedup_rows(rep)
    assert "GEMM speedup (in job)" in rows.columns and "GEMMs alone" in rows.columns
    row = dict(zip(rows.columns, next(r for r in rows.rows if r[0] == "DelayedScaling")))
    assert row["predicted step"] == "-" and row["GEMMs alone"] == "1.39x"
    assert "predicted step: none, no replay: no bench.json" in rows.explained


def test_the_own_step_replay_is_not_checked_where_the_recording_taxes_were_not_measured(tmp_path):
    unbenched = _run(tmp_path, with_bench=False)
    assert replay_own_line(unbenched) is None and unbenched.meta["replay_own"] is None  # no replay: no line of one
    untaxed = tmp_path / "untaxed"
    replayable(capture(100, 60)).save(untaxed / "BF16" / "gemm_capture.json")
    b = bench_of(BF16=60, DelayedScaling=32)
    b.meta["module_costs"] = {"modules": {}, "kinds": {}}  # module costs, but no recording taxes measured
    b.save(untaxed / "bench.json")
    line = replay_own_line(analyze_run(untaxed).report)
    assert line is not None and "not checked against its clean step 100.00 ms" in line and "%" not in line
    benched = _run(tmp_path, with_bench=True)
    assert replay_own_line(benched).startswith("replay of the job's own step: 100.00 ms against its clean step")
    a = next(a for a in benched.recipes if a.recipe == "DelayedScaling")
    assert a.predicted_by == "replay" and a.predicted_bound == "gpu" and a.predicted_na is None
    assert a.verdict_kind is Verdict.OVERHEAD_EATS_GAIN  # 1.25x against the replay's 1.39x


def _committed(tmp_path, folder, drop=()):
    import shutil
    from pathlib import Path

    run = tmp_path / folder.replace("/", "_")
    shutil.copytree(Path(__file__).parents[2] / "docs" / "results" / folder, run)
    for name in drop:
        (run / name).unlink()
    return analyze_run(run).report


def test_verdicts_without_a_replay_say_what_they_rest_on(tmp_path):
    """Runs made before host calls were recorded: the reason names that (it named "no kernel records" beside a
    kernels step of kernel records), every verdict's parentheses close (the reason was cut inside one), a
    no-gain verdict does not say it rests on the observed speedup (it rests on the GEMMs'), and a recipe with
    neither a prediction nor an observed run is not judged (it was "predicted only")."""
    rep = _committed(tmp_path, "h200/dense")
    assert "kernel records but no host calls" in rep.meta["no_replay"] and rep.meta["replay_own"] is None
    unbenched = _committed(tmp_path, "h200/replay/dense_host", drop=["bench.json"])
    for a in rep.recipes + unbenched.recipes:
        assert a.verdict.count("(") == a.verdict.count(")"), a.verdict
        rests = any("rests on the observed speedup" in e for e in a.evidence)
        assert rests == (a.verdict_kind is Verdict.OBSERVED_ONLY), (a.verdict, a.evidence)
    kinds = {a.verdict_kind for a in rep.recipes + unbenched.recipes}
    assert {Verdict.OBSERVED_ONLY, Verdict.NO_GAIN} <= kinds, kinds
    five = _committed(tmp_path, "h200/5b")
    a = next(a for a in five.recipes if a.recipe == "DelayedScaling")
    assert a.predicted_step_speedup is None and a.observed_step_speedup is None
    assert a.verdict_kind is Verdict.NOT_JUDGED and a.verdict.startswith("not judged: no observed run"), a.verdict
