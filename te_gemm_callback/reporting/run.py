"""A run folder (its captures, bench.json, ranks/) and everything made from it (:class:`Run`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from te_gemm_callback.capture import GemmCapture
from te_gemm_callback.microbench.cache import ResultCache
from te_gemm_callback.microbench.items import items_from_capture
from te_gemm_callback.microbench.module_cost import CostCache, measure_module_costs
from te_gemm_callback.precisions import te_available
from te_gemm_callback.reporting.projection_tables import project_runs, summary

# What loads torch or matplotlib is imported where used, so that `import te_gemm_callback.cli` does not.

if TYPE_CHECKING:
    from te_gemm_callback.analysis.runs import RunReport
    from te_gemm_callback.microbench.results import BenchResults
    from te_gemm_callback.projection import RunProjection
    from te_gemm_callback.sweep.plan import PrecisionPlan

MODES = ("autocast", "prequantized")


class Run:
    """A run folder: :meth:`bench` its shapes, :meth:`analysis` (kept until a new bench), :meth:`report`,
    :meth:`plan`, :meth:`project`."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._analysis: RunReport | None = None

    def bench(self, recipes: Sequence[str], modes: Sequence[str] = MODES, *, capture: str | Path | None = None,
              cache: ResultCache | None = None, console: Any = None) -> BenchResults:
        """Microbenchmark the capture's GEMMs and TE modules in every recipe and mode into bench.json (no console:
        no progress bar, whose end wrote a line break into a quiet fit)."""
        from te_gemm_callback.microbench.engine import run_bench
        cap = GemmCapture.load(capture or self.path / "gemm_capture.json")
        cache = cache or ResultCache()
        res = run_bench(items_from_capture(cap), recipes, modes, cache=cache, console=console,
                        progress=console is not None)
        costs = module_costs(cap, res.precisions, console, cache, res.meta)
        if costs is not None:
            res.meta["module_costs"] = costs
            cache.save()  # the rows just measured, beside the cells run_bench saved
        res.save(self.path / "bench.json")
        self._analysis = None
        return res

    def analysis(self) -> RunReport:
        from te_gemm_callback.analysis.runs import analyze_run
        if self._analysis is None:
            self._analysis = analyze_run(self.path)
        return self._analysis

    def report(self, out: Any = None, project: Sequence[str] = ()) -> RunReport:
        """Write the report into the folder and print it to ``out`` if given; ``project``: GPUs to project onto."""
        from te_gemm_callback.analysis.prediction import capture_recipe
        from te_gemm_callback.projection.mfu import precision_mfu
        from te_gemm_callback.reporting.speedups import write_run
        rr = self.analysis()
        # Per observed run: its GEMMs at their own formats' peaks.
        mfu = {capture_recipe(c): v for c in rr.captures if (v := precision_mfu(c)) is not None}
        if mfu:
            rr.report.meta["mfu"] = mfu
        if project:
            rr.projections = project_runs(self.path, project, rr)
            if rr.projections:  # report.json says what was projected, beside what was measured
                rr.report.meta["projections"] = [summary(rp) for rp in rr.projections]
        rr.files = write_run(rr, self.path, out)
        return rr

    def plan(self) -> PrecisionPlan:
        """Which modules to keep in BF16 under an FP8 recipe."""
        from te_gemm_callback.analysis.plan import plan_for_run
        rr = self.analysis()
        if rr.bench is None:
            raise ValueError(f"{self.path} has no bench.json: te-gemm bench --capture {self.path}/gemm_capture.json "
                             f"--json {self.path}/bench.json first")
        return plan_for_run(rr)

    def project(self, target: str, source: str | None = None, host_speed: float = 1.0) -> RunProjection:
        """The run on another GPU."""
        from te_gemm_callback.projection import project_run
        return project_run(self.path, target, source, host_speed=host_speed, analysis=self._analysis)


def render_run(run_dir: str | Path, out: Any = None, project: Sequence[str] = ()) -> dict[str, Path]:
    return report(run_dir, out, project).files


def report(run_dir: str | Path, out: Any = None, project: Sequence[str] = ()) -> RunReport:
    """Analyse a run folder, write its report into it and print it to ``out`` if given."""
    return Run(run_dir).report(out, project)


def bench_and_report(run_dir: str | Path, capture_path: str | Path, recipes: Sequence[str], console: Any = None,
                     modes: Sequence[str] = MODES, cache: ResultCache | None = None,
                     project: Sequence[str] = ()) -> dict[str, Path]:
    """A captured run's shapes benchmarked in every recipe, then its report; the files written, by name."""
    cache = cache or ResultCache()
    run = Run(run_dir)
    run.bench(recipes, modes, capture=capture_path, cache=cache, console=console)
    files = run.report(console, project).files
    if cache.save_error and console is not None:  # after the report: nothing shown is lost
        console.print(f"[yellow]warning: {cache.save_error}")
    return files


def module_costs(cap: GemmCapture, recipes: Sequence[str], console: Any = None, cache: ResultCache | None = None,
                 cond: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """Each captured TE module's host and non-GEMM GPU cost per recipe (the replay's input), or None; rows
    cached keyed on ``cond``'s GPU, versions and this CPU."""
    import torch

    specs = cap.meta.get("te_modules") or {}
    tl = cap.kernel_timeline
    if not specs or tl is None or not tl.calls or not torch.cuda.is_available() or not te_available()[0]:
        return None
    from te_gemm_callback.microbench.timing import cpu_model
    cond = cond or {}
    where = f"{cond.get('device', '?')}|{cpu_model()}|torch {cond.get('torch')}, TE {cond.get('transformer_engine')}"
    costs = measure_module_costs(specs, list(recipes), CostCache(cache, where))
    if console is not None:
        cached = f", {costs['cached']} rows from the cache" if costs.get("cached") else ""
        console.print(f"module host costs: {len(costs['kinds'])} module kinds x {len(recipes)} recipes in "
                      f"{costs['wall_s']:.1f} s{cached} (CUPTI's cost per call {costs['cupti_call_tax_us']:.2f} us)")
    return costs
