"""What a fit leaves in the job's log: by default the report's summary, at most 25 lines; with
verbose=True the full tables, no cell of them cut when the output is a file (a job's log), where
rich cut them to 80 columns ("predicte…", "Float8CurrentS…")."""

import io
import json
import logging
import shutil
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from helpers.lightning import DemoTransformer
from rich.console import Console

from te_gemm_callback import GemmProfilerCallback
from te_gemm_callback.reporting.summary import MAX_LINES, summary_lines

MAIN = Path(__file__).resolve().parents[2] / "docs" / "results" / "h200" / "replay" / "main"


def _fit(out, **kw):
    torch.manual_seed(0)
    cb = GemmProfilerCallback(wait=1, warmup=1, active=3, output_dir=out, sweep=["BF16"], sweep_rounds=2, **kw)
    pl.Trainer(max_steps=7, accelerator="cpu", callbacks=[cb], logger=False, enable_checkpointing=False,
               enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0).fit(DemoTransformer())
    return cb


def test_by_default_the_log_gets_the_summary_and_no_table(tmp_path, caplog, capsys):
    with caplog.at_level(logging.INFO, logger="te_gemm_callback"):
        _fit(tmp_path / "gemm")
    out = capsys.readouterr().out
    assert "┃" not in out and "│" not in out, out[:500]  # no table printed
    ours = [r.getMessage() for r in caplog.records if r.name.startswith("te_gemm_callback")]
    start = next(i for i, m in enumerate(ours) if m.startswith("te-gemm: FP32 job"))
    summary = ours[start:start + MAX_LINES + 1]
    end = next(i for i, m in enumerate(summary) if m.startswith("te-gemm: the full report"))
    assert 2 <= end + 1 <= MAX_LINES and "report.md" in summary[end]
    assert any("on a CPU" in m for m in summary[:end])
    assert all(len(m) <= 140 for m in summary[:end]), summary  # the last names the file, however long
    # The caption says how many rounds the interval is from: it said "from 6 rounds" whatever ran.
    md = (tmp_path / "gemm" / "report.md").read_text()
    assert "from 6 rounds" not in md and "(no rounds: no interval)" in md  # BF16 alone: no recipe has rounds
    # Two footnotes of a bench table stay two lines (the line break between them was shown as "?").
    from te_gemm_callback.reporting.bench_tables import CACHED_MARK, _caption

    assert _caption(CACHED_MARK, "DelayedScaling not run: no CUDA").endswith(")\nDelayedScaling not run: no CUDA")


def test_verbose_tables_in_a_log_file_cut_no_cell(tmp_path, capsys):
    _fit(tmp_path / "gemm", verbose=True)
    out = capsys.readouterr().out
    assert "┃" in out and "model.transformer.encoder.layers.0.self_attn.in_proj" in out
    assert "…" not in out, [line for line in out.splitlines() if "…" in line][:5]


def test_the_summary_of_an_h200_run(tmp_path):
    from te_gemm_callback.reporting.run import render_run

    run = tmp_path / "run"
    shutil.copytree(MAIN, run)
    files = render_run(run)
    lines = summary_lines(files["report"], files["report_md"])
    assert lines[0].startswith("te-gemm: BF16 job, step ") and "GEMMs 7" in lines[0]
    body = "\n".join(lines)
    for recipe in ("DelayedScaling", "Float8CurrentScaling", "Float8BlockScaling"):
        line = next(line for line in lines if line.strip().startswith(recipe + ":"))
        assert "gpu-bound" in line and line.count("x") >= 3, line
    assert "not run here: MXFP8BlockScaling, NVFP4BlockScaling" in body and "on a CPU" not in body
    assert len(lines) <= MAX_LINES


def test_the_logs_step_and_share_are_the_logged_metrics(tmp_path):
    """The log's head said "step 146.2 ms, GEMMs 72%" (the sweep's BF16 run) where the logger's
    te_gemm/step_ms and te_gemm/gemm_share said 144.2 and 0.74 (the job's own capture): one
    figure under one name now, and the sweep's run named for what it is."""
    from te_gemm_callback.capture.capture_file import GemmCapture
    from te_gemm_callback.reporting.capture_tables import summary_metrics
    from te_gemm_callback.reporting.run import report
    from te_gemm_callback.reporting.summary import summary_lines

    run = tmp_path / "run"
    shutil.copytree(MAIN, run)
    report(run, Console(file=io.StringIO(), width=200))
    m = summary_metrics(GemmCapture.load(run / "gemm_capture.json"))
    lines = summary_lines(run / "report.json")
    assert f"step {m['te_gemm/step_ms']:.1f} ms, GEMMs {100 * m['te_gemm/gemm_share']:.0f}% of it" in lines[0], lines
    rep = json.loads((run / "report.json").read_text())
    assert f"over the sweep's BF16 run, step {rep['step_ms']:.1f} ms" in lines[1], lines


def test_a_delayed_scaling_jobs_summary_names_the_bf16_runs_step(tmp_path):
    """A DelayedScaling job's log said "over the sweep's BF16 run, step 104.1 ms": report.json's own
    step, the DelayedScaling run's; the BF16 run's is 80.9 ms."""
    from te_gemm_callback.reporting.run import report

    run = tmp_path / "run"
    shutil.copytree(MAIN.with_name("phi3_host_2"), run)
    report(run, Console(file=io.StringIO(), width=200))
    rep = json.loads((run / "report.json").read_text())
    bf16 = next(r["observed_step_ms"] for r in rep["recipes"] if r["recipe"] == "BF16")
    assert rep["current_recipe"] == "DelayedScaling" and abs(bf16 / rep["step_ms"] - 1) > 0.1
    lines = summary_lines(run / "report.json")
    assert lines[0].startswith("te-gemm: DelayedScaling job") and f"BF16 run, step {bf16:.1f} ms" in lines[1], lines
    # Without the job's capture, the head is the report's own run: its step beside its share.
    (run / "gemm_capture.json").unlink()
    head = summary_lines(run / "report.json")[0]
    assert f"step {rep['step_ms']:.1f} ms, GEMMs {100 * rep['gemm_share']:.0f}% of it" in head, head


@pytest.mark.parametrize("damage", ["missing", "not json", "another schema"])
def test_summary_falls_back_to_the_report_when_the_capture_is_unreadable(tmp_path, damage):
    """The log's head takes the job's own capture when it reads; a missing or damaged capture leaves the
    report's own step, never an exception in the job's last hook."""
    from te_gemm_callback.reporting.run import report
    from te_gemm_callback.reporting.summary import summary_lines

    run = tmp_path / "run"
    shutil.copytree(MAIN, run)
    report(run, Console(file=io.StringIO(), width=200))
    cap = run / "gemm_capture.json"
    if damage == "missing":
        cap.unlink()
    else:
        cap.write_text("{" if damage == "not json" else json.dumps({"schema": "something-else/1"}))
    rep = json.loads((run / "report.json").read_text())
    lines = summary_lines(run / "report.json")
    assert f"step {rep['step_ms']:.1f} ms" in lines[0], lines
