"""The per-item GEMM table's full-step total counts a GEMM that failed in a recipe at its BF16 time,
as the speedup table, gemm_*.png and te-gemm bench's estimate do, and says so."""

from rich.console import Console

from te_gemm_callback.cli.bench import _print_tables
from te_gemm_callback.microbench.cells import BenchResult
from te_gemm_callback.microbench.items import WorkItem
from te_gemm_callback.microbench.results import BenchResults
from te_gemm_callback.reporting.bench_tables import speedup_summary, totals_table
from te_gemm_callback.shapes import GemmShape, gemm_passes

# A layer FP8 halves, and a 48x1x1024 rotary GEMM whose FP8 cells failed.
LAYER, ROTARY = WorkItem("layers.0.fc1", GemmShape(1024, 512, 2048)), WorkItem("rotary_emb", GemmShape(48, 1, 1024))


def _bench(failed_bf16=False):
    cells = []
    for it, bf16_ms, fp8_ms in ((LAYER, 1.0, 0.5), (ROTARY, 0.1, None)):
        for s in gemm_passes(it.fprop):
            for prec, ms in (("BF16", None if failed_bf16 and it is ROTARY else bf16_ms), ("DelayedScaling", fp8_ms)):
                cells.append(BenchResult(s.m, s.k, s.n, str(s.op), prec, "autocast", median_ms=ms, iters=5,
                                         error=None if ms else "ValueError: refused"))
    return BenchResults(cells, {}, {"modes": ["autocast"]})


def _text(*renderables):
    c = Console(width=300, record=True)
    for r in renderables:
        c.print(r)
    return c.export_text()


def test_a_gemm_that_failed_in_a_recipe_counts_at_bf16_time_in_the_full_step():
    # phi3 on an H200: the full step read "failed" for every FP8 recipe over one 48x1x1024 GEMM.
    out = _text(totals_table(_bench(), [LAYER, ROTARY], "autocast"))
    step = next(line for line in out.splitlines() if "full step" in line)
    # BF16: 3 x 1.0 + 3 x 0.1; DelayedScaling: 3 x 0.5 + the rotary GEMM's BF16 3 x 0.1.
    assert "3.300 (1.00x)" in step and "1.800 (1.83x)†" in step and "failed" not in step, step
    caption = " ".join(out.split())  # rich wraps the caption to the table's width
    assert "† the GEMMs that failed in that recipe counted at their BF16 time" in caption
    assert "† DelayedScaling: rotary_emb (48x1x1024)" in caption
    # Its own row still says it failed: the total is marked, the cell is not made up.
    assert "failed" in next(line for line in out.splitlines() if "rotary_emb" in line and "│" in line)
    assert speedup_summary(_bench(), [LAYER, ROTARY], "autocast")["DelayedScaling"] == 3.3 / 1.8


def test_te_gemm_bench_gives_the_same_estimate_and_says_what_it_counted():
    c = Console(width=300, record=True)
    _print_tables(_bench(), [LAYER, ROTARY], ["autocast"], c)
    assert ("estimated GEMM speedup over BF16, DelayedScaling: 1.83x (1 GEMM(s) that failed in it counted at "
            "BF16 time)") in c.export_text()


def test_with_no_bf16_time_to_count_the_total_still_fails_and_is_not_marked():
    out = _text(totals_table(_bench(failed_bf16=True), [LAYER, ROTARY], "autocast"))
    step = next(line for line in out.splitlines() if "full step" in line)
    assert step.count("failed") == 2 and "†" not in out, out
