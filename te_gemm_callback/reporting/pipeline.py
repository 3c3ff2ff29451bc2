"""After a captured run: microbenchmark its real shapes in every recipe, then write the report.

Shared by ``te-gemm run`` and the training recipes; no Lightning here.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from te_gemm_callback.capture import GemmCapture
from te_gemm_callback.microbench.cells import ResultCache, items_from_capture
from te_gemm_callback.microbench.engine import run_bench
from te_gemm_callback.reporting.speedups import render_run


def bench_and_report(run_dir: str | Path, capture_path: str | Path, recipes: Sequence[str],
                     console: Any = None, modes: Sequence[str] = ("autocast", "prequantized"),
                     cache: ResultCache | None = None, project: Sequence[str] = ()) -> dict[str, Path]:
    run_dir = Path(run_dir)
    items = items_from_capture(GemmCapture.load(capture_path))
    cache = cache or ResultCache()
    res = run_bench(items, recipes, modes, cache=cache, console=console)
    res.save(run_dir / "bench.json")
    files = render_run(run_dir, console, project)
    if cache.save_error and console is not None:  # after the report: nothing shown is lost
        console.print(f"[yellow]warning: {cache.save_error}")
    return files
