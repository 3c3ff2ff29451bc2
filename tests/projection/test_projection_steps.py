"""A projection's step columns (projection/steps.py) on the committed H200 run folders and on a made-up
one: GEMMs alone as the report computes it, a band that carries the replay's own miss, the observed
speedups as the report makes them, and notes that never contradict the replayed step."""

import json
import shutil
from pathlib import Path

import pytest
from helpers.big_gemm import run_folder

from te_gemm_callback.analysis.runs import analyze_run
from te_gemm_callback.projection import project_run

REPLAY = Path(__file__).resolve().parents[2] / "docs" / "results" / "h200" / "replay"


def test_gemms_alone_on_the_measuring_gpu_is_the_reports():
    # The report's GEMMs alone takes the pre-quantized GEMM speedups; the projection took autocast's.
    rep = analyze_run(REPLAY / "main").report
    want = {a.recipe: a.predicted_gemms_alone for a in rep.recipes if a.predicted_gemms_alone}
    rp = project_run(REPLAY / "main", "H200")
    got = {s.recipe: s.gemms_alone_speedup for s in rp.steps}
    assert rp.measured and set(got) == set(want) and len(want) == 4
    for recipe, v in want.items():
        assert got[recipe] == pytest.approx(v, rel=1e-9), recipe
    assert rp.gemms_alone.mode == rep.meta["mode"] == "prequantized"


def test_a_host_bound_projection_says_what_the_bandwidth_scaled_time_is(tmp_path):
    # The note gave a non-GEMM time (73.54 ms) longer than the replayed step (53.26 ms) as the target's,
    # and the JSON a GEMMs-alone "step" of a step the host bounds.
    rp = project_run(REPLAY / "dense_host", "H100")
    assert all(s.bound == "host" and s.step_by == "replay" for s in rp.steps)
    scaled = [n for n in rp.notes if "TB/s" in n]
    assert scaled and all(n.startswith("GEMMs alone:") and "not the replayed step" in n for n in scaled), scaled
    d = rp.to_dict()
    assert all("gemms_alone_step_ms" not in s for s in d["steps"]) and "non_gemm_ms" not in d
    alone = d["gemms_alone"]
    assert alone["non_gemm_ms_on_target"] == pytest.approx((alone["step_ms"] - alone["gemm_ms"]) * 4.8 / 3.35)


def test_a_delayed_scaling_job_gets_gemms_alone_and_a_band_with_its_replays_miss():
    rp = project_run(REPLAY / "phi3_host_2", "B300")
    assert rp.job_recipe == "DelayedScaling"
    # GEMMs alone as the report's: a GEMM DelayedScaling does not run counts at its BF16 time.
    assert all(s.gemms_alone_speedup is not None for s in rp.steps), [s.recipe for s in rp.steps]
    own = next(s for s in rp.steps if s.recipe == "DelayedScaling")
    # The replay missed the job's own step by -15.8% before its host was calibrated to it.
    assert own.step_high_ms / own.step_ms - 1 > 0.15 and 1 - own.step_low_ms / own.step_ms > 0.15
    assert any(n.startswith("band:") and "-15.8%" in n for n in rp.notes), rp.notes


def test_observed_speedups_come_from_the_sweep_as_the_reports_do(tmp_path):
    # report.json missing (never committed with these folders): the sweep still holds what was observed.
    run = tmp_path / "run"
    shutil.copytree(REPLAY / "main", run)
    assert not (run / "report.json").exists()
    want = {a.recipe: a.observed_step_speedup for a in analyze_run(run).report.recipes if a.observed_step_speedup}
    got = {s.recipe: s.observed_speedup for s in project_run(run, "B300").steps if s.observed_speedup}
    assert got == want and len(want) == 4
    (run / "report.json").write_text("{not json")  # a corrupt one is not read where the sweep is there
    assert {s.recipe: s.observed_speedup for s in project_run(run, "B300").steps if s.observed_speedup} == want


def test_an_empty_observed_column_says_why(tmp_path):
    run = run_folder(tmp_path, gap_us=20.0)  # no sweep/
    rp = project_run(run, "B300")
    assert not any(s.observed_speedup for s in rp.steps if s.recipe != "BF16")
    assert "source: observed: empty: no sweep/ captures, and no report.json" in rp.notes
    (run / "report.json").write_text("{not json")
    assert any(n.startswith("source: observed: empty: no sweep/ captures, and report.json unreadable")
               for n in project_run(run, "B300").notes)
    # What an earlier report kept of a sweep since removed: shown, and said where it came from.
    (run / "report.json").write_text(json.dumps({"recipes": [{"recipe": "Float8CurrentScaling",
                                                              "observed_step_speedup": 1.7}]}))
    rp = project_run(run, "B300")
    assert next(s for s in rp.steps if s.recipe == "Float8CurrentScaling").observed_speedup == 1.7
    assert "source: observed: from report.json (no sweep/ captures to make them again)" in rp.notes


@pytest.mark.parametrize(("folder", "step"), [("dense", "GEMMs alone from it (no replay"),
                                              ("replay/main", "the job's step replayed with it")])
def test_the_title_says_what_the_step_is(tmp_path, folder, step):
    """An old folder (no host calls to replay) was titled "the step predicted from it" over a note saying
    its step is GEMMs alone."""
    from te_gemm_callback.reporting.projection_tables import title

    run = tmp_path / "run"
    shutil.copytree(REPLAY.parent / folder, run)
    text = title(project_run(run, "B300"))
    assert step in text and "predicted from it" not in text, text
