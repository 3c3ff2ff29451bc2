"""Importing the reporting package, and drawing with it, leaves the user's matplotlib backend as they
chose it and never loads pyplot. Run in a fresh interpreter: other tests in this process load pyplot."""

import os
import subprocess
import sys

CODE = r"""
import sys

import matplotlib
from matplotlib import rcsetup

def backend():  # the setting itself: reading rcParams["backend"] would resolve it, loading pyplot
    return dict.__getitem__(matplotlib.rcParams, "backend")

before = backend()
import te_gemm_callback
import te_gemm_callback.reporting
import te_gemm_callback.reporting.bench_tables
import te_gemm_callback.reporting.figures
import te_gemm_callback.reporting.run
import te_gemm_callback.reporting.speedups
import te_gemm_callback.reporting.capture_tables
import te_gemm_callback.reporting.console
import te_gemm_callback.reporting.report_tables
assert "matplotlib.pyplot" not in sys.modules, "pyplot loaded at import"
assert backend() is before or backend() == before, (before, backend())

from te_gemm_callback.analysis.verdicts import RecipeAnalysis, Report
from te_gemm_callback.reporting.figures import speedup_figure, step_split_figure

rep = Report("BF16", 10.0, 6.0, [RecipeAnalysis("BF16", observed_step_ms=10.0, observed_gemm_ms=6.0),
                                 RecipeAnalysis("DelayedScaling", gemm_speedup=1.8, predicted_step_speedup=1.36,
                                                observed_step_speedup=1.2, observed_step_ms=8.3,
                                                observed_gemm_ms=3.3)], {})
out = sys.argv[1]
assert speedup_figure(rep, out + "/speedups.png").stat().st_size > 0
assert step_split_figure(rep, out + "/step_split.png").stat().st_size > 0
assert "matplotlib.pyplot" not in sys.modules, "pyplot loaded to draw"
assert backend() is before or backend() == before, (before, backend())
print("auto" if before is rcsetup._auto_backend_sentinel else before)
"""


def _run(tmp_path, mplbackend):
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}
    if mplbackend:
        env["MPLBACKEND"] = mplbackend
    return subprocess.run([sys.executable, "-c", CODE, str(tmp_path)], env=env, capture_output=True, text=True,
                          timeout=300)


def test_reporting_leaves_an_unset_backend_unset(tmp_path):
    res = _run(tmp_path, None)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "auto"  # still matplotlib's own choice to make, when pyplot first loads


def test_reporting_leaves_a_chosen_backend_chosen(tmp_path):
    res = _run(tmp_path, "svg")
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "svg"


def test_a_figure_with_nothing_labelled_warns_nothing_into_the_job(tmp_path):
    """Every recipe skipped: the figure is drawn without a legend, and matplotlib says nothing on the
    job's stderr ("No artists with labels found")."""
    import warnings

    from te_gemm_callback.microbench.items import WorkItem
    from te_gemm_callback.microbench.results import BenchResults
    from te_gemm_callback.reporting.figures import stacked_gemm_figure
    from te_gemm_callback.shapes import GemmShape

    items = [WorkItem("fc1", GemmShape(8, 8, 8))]
    res = BenchResults([], {"DelayedScaling": "no TE here"}, {})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        stacked_gemm_figure(res, items, "autocast", tmp_path / "g.png")
    assert (tmp_path / "g.png").stat().st_size > 0


def test_a_table_printed_to_a_closed_pipe_raises_what_a_hook_guard_catches():
    # rich's own answer is SystemExit(1), which passes a guard that catches exceptions and would end the job.
    script = ("import os, sys\n"
              "r, w = os.pipe(); os.close(r); os.dup2(w, 1)  # a reader that already left\n"
              "from te_gemm_callback.reporting.console import console, make_table\n"
              "try:\n"
              "    console().print(make_table('t', ['a'], rows=[['x']] * 50))\n"
              "except Exception as err:\n"
              "    sys.exit(7 if isinstance(err, BrokenPipeError) else 8)\n"
              "except BaseException:\n"
              "    sys.exit(9)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 7, (out.returncode, out.stderr)
