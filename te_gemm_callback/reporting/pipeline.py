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
    cap = GemmCapture.load(capture_path)
    items = items_from_capture(cap)
    cache = cache or ResultCache()
    # No console (a quiet fit): no progress bar either; its end wrote a line break to the job's stdout.
    res = run_bench(items, recipes, modes, cache=cache, console=console, progress=console is not None)
    costs = module_costs(cap, res.precisions, console, cache, res.meta)
    if costs is not None:
        res.meta["module_costs"] = costs
        cache.save()  # the rows just measured, beside the cells run_bench saved
    res.save(run_dir / "bench.json")
    files = render_run(run_dir, console, project)
    if cache.save_error and console is not None:  # after the report: nothing shown is lost
        console.print(f"[yellow]warning: {cache.save_error}")
    return files


def module_costs(cap: GemmCapture, recipes: Sequence[str], console: Any = None, cache: ResultCache | None = None,
                 cond: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """Each captured TE module's host and non-GEMM GPU cost per recipe that ran (the replay's
    input: microbench/module_cost.py), or None where none can be measured (no TE module captured,
    no kernel timeline to replay, no CUDA or TE here). Rows are kept in ``cache`` beside the GEMM
    cells, keyed on ``cond``'s GPU and versions and this host's CPU."""
    import torch

    from te_gemm_callback.precisions import te_available

    specs = cap.meta.get("te_modules") or {}
    tl = cap.kernel_timeline
    if not specs or tl is None or not tl.calls or not torch.cuda.is_available() or not te_available()[0]:
        return None
    from te_gemm_callback.microbench.module_cost import CostCache, measure_module_costs
    from te_gemm_callback.microbench.timing import cpu_model

    cond = cond or {}
    where = f"{cond.get('device', '?')}|{cpu_model()}|torch {cond.get('torch')}, TE {cond.get('transformer_engine')}"
    costs = measure_module_costs(specs, list(recipes), CostCache(cache, where))
    if console is not None:
        cached = f", {costs['cached']} rows from the cache" if costs.get("cached") else ""
        console.print(f"module host costs: {len(costs['kinds'])} module kinds x {len(recipes)} recipes in "
                      f"{costs['wall_s']:.1f} s{cached} (CUPTI's cost per call {costs['cupti_call_tax_us']:.2f} us)")
    return costs
