"""report.md: the report where users already look. Written beside report.json by every report, it
holds every verdict with its evidence, the speedup table, the capture's top GEMMs, working links to
the figures this report drew (and to trace.json where one was written), the notes and the commands
that make it again; it never replaces a report.md of the user's, and a report removes the figures
an earlier report left that its own inputs no longer produce. Hand-made captures, as in
analysis/test_analysis.py: no GPU."""

import logging
import re
import sys
import types
from pathlib import Path
from urllib.parse import unquote

import pytest
from helpers.one_layer import K, M, N

import te_gemm_callback
from te_gemm_callback.capture.capture_file import GemmCapture, GemmRecord, StepTime
from te_gemm_callback.cli import main
from te_gemm_callback.files import png
from te_gemm_callback.microbench.cells import BenchResult
from te_gemm_callback.microbench.results import BenchResults
from te_gemm_callback.reporting import figures
from te_gemm_callback.reporting.markdown import MD_MARKER, code_block, md_escape, md_table

PASSES = (("fprop", (M, K, N)), ("dgrad", (M, N, K)), ("wgrad", (K, M, N)))
GPU = {"device": "NVIDIA H200", "timing": "cuda_events", "gemm_time_source": "cuda_events", "run_id": "r1"}
TRACE = "te_gemm_callback.reporting.trace"


def swept(gemm_ms, steps, precision="bf16", recipe=None, module="layer"):
    """A one-layer capture with an instrumented step (the GEMM times) and clean steps, one per sweep
    round: a sweep's observed runs give the speedup its 95% interval and rerun range."""
    recs = [GemmRecord(module=module, gemm="", op=op, m=m, k=k, n=n, batch=1, precision=precision, operands=[],
                       source="te", kernel="general_gemm", recompute=False, module_type="Linear", calls=1,
                       calls_per_step=1.0, flops=2 * M * K * N, times_ms=[gemm_ms / 3]) for op, (m, k, n) in PASSES]
    st = [StepTime(0, wall_ms=steps[0], gpu_ms=steps[0], gemm_ms=gemm_ms, kind="instrumented")]
    st += [StepTime(i + 1, wall_ms=t, gpu_ms=t, kind="clean", round=i) for i, t in enumerate(steps)]
    return GemmCapture(recs, st, {**GPU, **({"recipe": recipe, "sweep": True} if recipe else {})})


def bench(modes=("autocast", "prequantized")):
    per_pass = {"BF16": 20.0, "DelayedScaling": 10.5, "Float8CurrentScaling": 10.0}
    res = [BenchResult(m, k, n, op, prec, mode, median_ms=ms * (0.9 if mode == "prequantized" else 1.0),
                       q1_ms=ms, q3_ms=ms, iters=5)
           for mode in modes for prec, ms in per_pass.items() for op, (m, k, n) in PASSES]
    return BenchResults(res, {"NVFP4BlockScaling": "needs sm_100"},
                        {"modes": list(modes), "device": "NVIDIA H200", "precisions": [*per_pass, "NVFP4BlockScaling"]})


def run_folder(tmp_path, modes=("autocast", "prequantized"), module="layer"):
    """The callback's output folder after a sweep: the job's capture, the sweep's (8 rounds each)
    and bench.json."""
    run = tmp_path / "run"
    rounds = [100.0, 101, 99, 100, 102, 98, 100, 101]
    swept(60.0, rounds, module=module).save(run / "gemm_capture.json")
    swept(60.0, rounds, recipe="BF16", module=module).save(run / "sweep" / "BF16" / "gemm_capture.json")
    swept(32.0, [t * 0.76 for t in rounds[::-1]], "fp8_delayed", "DelayedScaling",
          module=module).save(run / "sweep" / "DelayedScaling" / "gemm_capture.json")
    swept(30.0, [t * 0.9 for t in rounds], "fp8_current", "Float8CurrentScaling",
          module=module).save(run / "sweep" / "Float8CurrentScaling" / "gemm_capture.json")
    bench(modes).save(run / "bench.json")
    return run


def links(md: str, image: bool) -> list[str]:
    return re.findall((r"!" if image else r"(?<!!)") + r"\[[^\]]*\]\(([^)\s]+)\)", md)


def table_line(md: str, first_cell: str) -> str:
    return next(ln for ln in md.splitlines() if ln.startswith(f"| {first_cell} |"))


def table_row(md: str, first_cell: str) -> list[str]:
    """The cells of the table row whose first cell is ``first_cell`` (split on unescaped pipes)."""
    return [c.strip() for c in re.split(r"(?<!\\)\|", table_line(md, first_cell))[1:-1]]


def test_report_md_holds_verdicts_table_figures_and_commands(tmp_path, capsys):
    run = run_folder(tmp_path)
    rr = te_gemm_callback.report(run)
    md_path = rr.files["report_md"]
    assert md_path == run / "report.md"
    md = md_path.read_text()
    assert md.splitlines()[0] == MD_MARKER
    rep = rr.report
    # Every recipe's verdict, with its evidence lines; the recipe the bench could not run, with why.
    for a in rep.recipes:
        if a.recipe != "BF16":
            assert f"- **{md_escape(a.recipe)}**: {md_escape(a.verdict)}" in md
            for e in a.evidence:
                assert f"  - {md_escape(e)}" in md
    assert "**NVFP4BlockScaling**: not available here — needs sm\\_100" in md
    # The table: one row per recipe, the numbers the terminal prints, the CI and the rerun range.
    header = table_row(md, "recipe")
    for col in ("GEMM speedup", "predicted step", "observed step", "95% CI", "a rerun", "verdict"):
        assert col in header
    fp8 = next(a for a in rep.recipes if a.recipe == "DelayedScaling")
    assert fp8.observed_ci and fp8.observed_rerun
    row = dict(zip(header, table_row(md, "DelayedScaling")))
    assert row["GEMM speedup"] == f"{fp8.gemm_speedup:.2f}x"
    # No kernels step with host calls here: no replay, so no predicted step, and the notes say why.
    assert row["predicted step"] == "-" and fp8.predicted_step_speedup is None
    assert "- No prediction: the capture holds no host calls of a kernels step" in md
    assert row["observed step"] == f"{fp8.observed_step_speedup:.2f}x"
    assert row["95% CI"] == f"{fp8.observed_ci[0]:.2f}-{fp8.observed_ci[1]:.2f}x"
    assert row["a rerun"] == f"{fp8.observed_rerun[0]:.2f}-{fp8.observed_rerun[1]:.2f}x"
    assert row["verdict"] == md_escape(fp8.verdict)
    assert table_row(md, "BF16")[-1] == "baseline" and table_row(md, "NVFP4BlockScaling")[1] == "not run"
    # The capture's top GEMMs, with their share of the GEMM time.
    assert table_row(md, "layer")[1:] == ["fprop", "1024x512x2048", "bf16", "20.000", "33.3%"]
    # Every figure this report wrote is linked, relative to report.md, and the links work.
    pngs = {k: p for k, p in rr.files.items() if p.suffix == ".png"}
    assert set(pngs) == {"speedups", "step_split", "gemm_autocast", "gemm_prequantized"}
    images = links(md, image=True)
    assert sorted(images) == sorted(p.name for p in pngs.values())
    for target in images:
        assert not Path(unquote(target)).is_absolute() and (run / unquote(target)).is_file()
    # The notes and the commands that make it again.
    assert "- Timing: step: median of clean steps" in md and "- No prediction: " in md
    assert f"te-gemm report {run}" in md and f"te_gemm_callback.report('{run}')" in md
    assert (f"te-gemm bench --capture {run / 'gemm_capture.json'} --precisions "
            "BF16,DelayedScaling,Float8CurrentScaling,NVFP4BlockScaling --modes autocast,prequantized "
            f"--no-cache --json {run / 'bench.json'}") in md
    assert "- run\\_id: r1" in md  # the capture's own provenance
    # Made again, our own report.md is replaced; the CLI writes and names it too.
    assert main(["report", str(run)]) == 0
    assert "report_md:" in capsys.readouterr().out and (run / "report.md").read_text().startswith(MD_MARKER)


def test_a_report_md_of_the_users_is_refused_before_anything_is_written(tmp_path):
    run = run_folder(tmp_path)
    mine = "# My notes on this run\n\nFP8 looked slow.\n"
    (run / "report.md").write_text(mine)
    with pytest.raises(ValueError, match=r"refusing to overwrite .*report\.md: it is not a te-gemm report\.md"):
        te_gemm_callback.report(run)
    assert (run / "report.md").read_text() == mine
    assert not (run / "report.json").exists() and not (run / "speedups.png").exists()  # refused up front
    # A file that merely mentions our marker further down is not ours either.
    (run / "report.md").write_text("notes\n" + MD_MARKER + "\n")
    with pytest.raises(ValueError, match="refusing to overwrite"):
        te_gemm_callback.report(run)
    # A link named report.md is never written through.
    (run / "report.md").unlink()
    (run / "elsewhere.md").write_text(mine)
    (run / "report.md").symlink_to(run / "elsewhere.md")
    with pytest.raises(ValueError, match="symbolic link"):
        te_gemm_callback.report(run)
    assert (run / "elsewhere.md").read_text() == mine


def test_a_stale_figure_of_ours_is_removed_and_a_foreign_one_kept(tmp_path, capsys):
    run = run_folder(tmp_path)
    first = te_gemm_callback.report(run).files
    stale = run / "gemm_prequantized.png"
    assert first["gemm_prequantized"] == stale and png.png_software(stale) == png.FIGURE_MARKER
    # A bench of the autocast mode alone: the prequantized figure of the first report would stay
    # beside this one as if it were of this bench.
    bench(("autocast",)).save(run / "bench.json")
    files = te_gemm_callback.report(run).files
    assert "gemm_prequantized" not in files and not stale.exists()
    md = files["report_md"].read_text()
    assert "gemm_prequantized.png" not in md and "gemm_autocast.png" in links(md, image=True)
    # A PNG of the user's under that name (no marker of ours) is kept, byte for byte; so is a link.
    foreign = png.PNG_SIGNATURE + bytes(range(256))
    stale.write_bytes(foreign)
    elsewhere = tmp_path / "fig.png"
    elsewhere.write_bytes((run / "speedups.png").read_bytes())  # ours, but outside the run folder
    (run / "ranks.png").symlink_to(elsewhere)
    assert main(["report", str(run)]) == 0
    assert stale.read_bytes() == foreign
    assert (run / "ranks.png").is_symlink() and elsewhere.exists()
    # Only the report's own figure names: a figure of ours the user asked for by name stays.
    (run / "bench_fig.png").write_bytes((run / "speedups.png").read_bytes())
    te_gemm_callback.report(run)
    assert (run / "bench_fig.png").exists()


def test_figure_footnotes_wrap_on_word_boundaries():
    why = ("TE cannot run this recipe here: MXFP8BlockScaling needs compute capability 10.0 (Blackwell) and "
           "cuBLASLt 12.8; this device is compute capability 9.0 (Hopper) with cuBLASLt 12.6, and the "
           "reason goes on for longer than any figure is wide /a/very/long/path/that/is/one/word.so")
    text = f"not run: MXFP8BlockScaling: {why}"
    for width in (40, 60, 100):
        lines = figures.footnote_lines(text, width, max_lines=50)
        words = " ".join(lines).split()
        assert words == text.split()  # every word whole, in order, none cut or dropped
        assert all(len(ln) <= width or " " not in ln.strip() for ln in lines)
        assert all(ln.startswith("  ") for ln in lines[1:])
    # Past the line limit the note ends after a whole word.
    short = figures.footnote_lines(text, 40, max_lines=2)
    assert len(short) == 2 and short[-1].endswith(" ...")
    kept = " ".join(short).split()[:-1]
    assert kept == text.split()[:len(kept)]
    # A dollar sign is text, not matplotlib math.
    assert figures.footnote_lines("costs $5 and $6", 80) == [r"costs \$5 and \$6"]


def test_the_gemm_figure_draws_its_footnote_in_whole_words(tmp_path, monkeypatch):
    drawn = []
    monkeypatch.setattr(figures, "save_figure", lambda fig, path: drawn.append(fig) or Path(path))
    res = bench(("autocast",))
    why = "needs compute capability 10.0 and a newer cuBLASLt than this host has installed " * 3
    res.skipped = {"NVFP4BlockScaling": why.strip()}
    from te_gemm_callback.microbench.items import items_from_capture

    figures.stacked_gemm_figure(res, items_from_capture(swept(60.0, [100.0])), "autocast", tmp_path / "f.png")
    note = next(t.get_text() for t in drawn[0].texts if t.get_text().startswith("NVFP4BlockScaling not run:"))
    assert len(note.splitlines()) > 1
    assert note.split() == f"NVFP4BlockScaling not run: {why}".split()


def test_names_from_the_model_are_escaped(tmp_path):
    evil = "blocks.0|fc1 <img src=x onerror=alert(1)> *x* [a](http://e)\n# heading"
    run = run_folder(tmp_path, modes=("autocast",), module=evil)
    md = te_gemm_callback.report(run).files["report_md"].read_text()
    assert not re.search(r"(?<!\\)<img", md) and "\n# heading" not in md and "[a](http://e)" not in md
    row = next(ln for ln in md.splitlines() if ln.startswith("| blocks"))
    assert len(re.split(r"(?<!\\)\|", row)) == len(re.split(r"(?<!\\)\|", table_line(md, "module")))
    assert md_escape(evil) in row


def test_markdown_helpers():
    assert md_escape("a|b\n<c> `d` *e* _f_ [g](h) & $i$") == r"a\|b \<c> \`d\` \*e\* \_f\_ \[g\](h) \& \$i\$"
    assert md_escape("# title", line_start=True) == r"\# title"
    assert md_escape("1. item", line_start=True) == r"1\. item"
    assert md_escape("- item", line_start=True) == r"\- item" and md_escape("- item") == "- item"
    assert md_escape("bell\x07 esc\x1b[31m") == "bell? esc?\\[31m"
    assert md_table(["a", "b"], [["x|y"]], right=[1]) == ["| a | b |", "| :--- | ---: |", r"| x\|y |  |"]
    assert code_block(["echo ```"], "sh") == ["````sh", "echo ```", "````"]


def test_the_captures_provenance_is_shown_where_its_meta_holds_it():
    from te_gemm_callback.reporting.markdown import _provenance

    lines = _provenance({"created": "2025-01-01T00:00:00+00:00", "torch": "2.13", "adapters": ["te", "torch"],
                         "argv": ["train.py", "--lr", "1e-3", "--name", "a b"], "device": None})
    assert lines[:3] == ["- created: 2025-01-01T00:00:00+00:00", "- torch: 2.13", "- adapters: te, torch"]
    assert "  train.py --lr 1e-3 --name 'a b'" in lines and "- command:" in lines
    assert _provenance({"provenance": "# from cron"}) == [r"- \# from cron"]  # text, not a heading
    assert _provenance({}) == []


def fake_trace(monkeypatch, write_trace):
    mod = types.ModuleType(TRACE)
    mod.write_trace = write_trace
    monkeypatch.setitem(sys.modules, TRACE, mod)


def test_trace_json_is_written_and_linked(tmp_path, monkeypatch):
    run = run_folder(tmp_path, modes=("autocast",))
    calls = []

    def write_trace(cap, path):
        calls.append(cap)
        Path(path).write_text('{"traceEvents": []}')
        return Path(path)

    fake_trace(monkeypatch, write_trace)
    rr = te_gemm_callback.report(run)
    assert rr.files["trace"] == run / "trace.json" and calls == [rr.job]
    md = rr.files["report_md"].read_text()
    assert "trace.json" in links(md, image=False) and "https://ui.perfetto.dev" in md and "chrome://tracing" in md


@pytest.mark.parametrize("case", ["no timeline", "fails", "absent"])
def test_a_report_without_a_trace_stands(tmp_path, monkeypatch, caplog, case):
    run = run_folder(tmp_path, modes=("autocast",))
    if case == "absent":  # a tree without the trace writer
        monkeypatch.setitem(sys.modules, TRACE, None)
    else:
        def write_trace(cap, path):
            if case == "fails":
                raise RuntimeError("disk on fire")
            return None

        fake_trace(monkeypatch, write_trace)
    with caplog.at_level(logging.WARNING, logger="te_gemm_callback"):
        files = te_gemm_callback.report(run).files
    assert "trace" not in files and files["report_md"].is_file()
    assert "trace.json" not in files["report_md"].read_text()
    said = [r.getMessage() for r in caplog.records if "trace.json" in r.getMessage()]
    assert said == (["te-gemm: trace.json not written: disk on fire"] if case == "fails" else [])


def test_report_md_says_what_the_capture_ran_under():
    # A compiled model, no steady state, nsys holding CUPTI, no clean step: each a line beside the
    # capture's table, none for a plain capture.
    from te_gemm_callback.capture.capture_file import GemmCapture, StepTime
    from te_gemm_callback.reporting.markdown import _capture_conditions

    plain = GemmCapture([], [StepTime(0, 1.0, kind="instrumented"), StepTime(1, 1.0, kind="clean")],
                        {"steady_state": "reached: 1 clean step"})
    assert _capture_conditions(plain) == []
    odd = GemmCapture([], [StepTime(0, 1.0, kind="instrumented")],
                      {"compiled": True, "compiled_modules": ["model"], "steady_state": "not reached: compiling",
                       "cupti_owner": "Nsight Systems (NSYS_PROFILING_SESSION_ID=7)",
                       "gemm_time_source": "cuda_events"})
    text = "\n".join(_capture_conditions(odd))
    assert "- torch.compile: model;" in text and "- steady state not reached: compiling" in text
    assert "held CUPTI during the capture: GEMMs timed by CUDA events" in text
    assert "no clean step was captured (steps: instrumented)" in text


def test_a_gemm_far_slower_per_flop_than_its_neighbours_is_flagged():
    """On a CPU a noise cell (a 512x128x128 GEMM at 6.7 ms beside 0.05 ms for larger shapes) led
    the top-GEMM table unflagged."""
    from te_gemm_callback.capture.capture_file import GemmCapture, GemmRecord, StepTime
    from te_gemm_callback.reporting.capture_tables import top_gemm_rows

    def rec(name, m, ms):
        return GemmRecord(module=name, gemm="", op="fprop", m=m, k=128, n=128, batch=1, precision="fp32",
                          operands=[], source="torch", kernel="aten.mm", recompute=False, module_type="Linear",
                          calls=1, calls_per_step=1.0, flops=2 * m * 128 * 128, times_ms=[ms])

    recs = [rec("noisy", 512, 6.7)] + [rec(f"l{i}", 1024, 0.05) for i in range(4)]
    cap = GemmCapture(recs, [StepTime(0, wall_ms=20.0, gemm_ms=6.9, kind="instrumented")], {"device": "CPU"})
    _, rows, _ = top_gemm_rows(cap)
    assert rows[0][0] == "noisy" and "slow: 268x" in rows[0][5], rows[0]
    assert all("slow" not in r[5] for r in rows[1:])


def test_the_capture_share_names_the_steps_its_step_time_is_of():
    """A window too short for a clean step: the share line called the instrumented step's time "a clean
    step" beside a note saying no clean step was captured."""
    import torch
    from torch import nn

    from te_gemm_callback import GemmProfiler
    from te_gemm_callback.reporting.capture_tables import capture_share

    model = nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 16))

    def share(steps):
        with GemmProfiler(model) as prof:
            for _ in range(steps):
                model(torch.randn(8, 16)).sum().backward()
                prof.step()
        return capture_share(prof.capture)

    assert "ms instrumented step;" in share(1) and "clean" not in share(1)
    assert "ms clean step;" in share(3)
