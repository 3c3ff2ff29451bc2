"""One Run per run folder: what the job's publish step, the CLI and the Python API make from it
(analysis, report, plan, projection) comes from one analysis, made once; a new bench makes it again.
On the committed H200 run, without a GPU."""

import shutil
from pathlib import Path

import te_gemm_callback
from te_gemm_callback.reporting.run import Run

MAIN = Path(__file__).resolve().parents[2] / "docs" / "results" / "h200" / "replay" / "main"


def test_one_analysis_serves_the_report_the_plan_and_the_projection(tmp_path, monkeypatch):
    run_dir = tmp_path / "main"
    shutil.copytree(MAIN, run_dir)
    import te_gemm_callback.analysis.runs as runs

    calls = []
    real = runs.analyze_run
    monkeypatch.setattr(runs, "analyze_run", lambda p: calls.append(p) or real(p))
    run = te_gemm_callback.Run(run_dir)
    rr = run.report()
    assert (run_dir / "report.json").is_file() and rr.files["report"] == run_dir / "report.json"
    plan = run.plan()
    assert plan.recipe in {"DelayedScaling", "Float8CurrentScaling", "Float8BlockScaling"}
    assert run.analysis() is rr and len(calls) == 1  # made once for all three
    proj = run.project("B300")
    assert proj.target.key == "B300" and proj.steps
    run._analysis = None  # as a new bench leaves it (Run.bench): the next use analyses again
    run.analysis()
    assert len(calls) == 2


def test_run_is_the_report_functions_front_door(tmp_path):
    run_dir = tmp_path / "main"
    shutil.copytree(MAIN, run_dir)
    assert te_gemm_callback.report(run_dir).files.keys() == Run(run_dir).report().files.keys()
