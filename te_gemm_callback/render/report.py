"""The speedup report: terminal table and verdict panel, figures, JSON."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from rich.console import Group  # noqa: E402
from rich.markup import escape  # noqa: E402
from rich.panel import Panel  # noqa: E402
from rich.table import Table  # noqa: E402

from ..analysis import Report  # noqa: E402

if TYPE_CHECKING:
    from ..runs import RunReport
from ..jsonio import write_json  # noqa: E402
from .figures import save_figure  # noqa: E402


def _x(v: float | None, fmt: str = "{:.2f}x") -> str:
    return "-" if v is None else fmt.format(v)


def report_table(rep: Report) -> Table:
    share = rep.gemm_share
    t = Table(title=(f"GEMM vs step speedup — job ran {rep.current_recipe}: step {rep.step_ms:.2f} ms, GEMMs "
                     f"{_x(rep.gemm_ms, '{:.2f}')} ms ({_x(None if share is None else 100 * share, '{:.1f}')}% of the step)"))
    unfused = any(a.predicted_step_speedup_unfused is not None for a in rep.recipes)
    vs_cur = rep.current_recipe != "BF16"
    cols = ["recipe", "GEMM ms (bench)", "GEMM speedup"] + ([f"vs {rep.current_recipe}"] if vs_cur else []) + \
        ["predicted step"] + (["pred. unfused"] if unfused else []) + ["observed step", "observed ms"]
    for c in cols:
        t.add_column(c, justify="left" if c == "recipe" else "right", no_wrap=True)
    for a in rep.recipes:
        row = [a.recipe, _x(a.gemm_ms_bench, "{:.2f}"), _x(a.gemm_speedup)] + \
            ([_x(a.gemm_speedup_vs_current)] if vs_cur else []) + [_x(a.predicted_step_speedup)] + \
            ([_x(a.predicted_step_speedup_unfused)] if unfused else [])
        t.add_row(*row, _x(a.observed_step_speedup), _x(a.observed_step_ms, "{:.2f}"))
    for r, why in rep.skipped.items():
        t.add_row(r, "not run", *[""] * (len(cols) - 2), style="dim")
    notes = ([f"Note: {rep.meta['step_note']}"] if rep.meta.get("step_note") else []) + \
        [rep.meta[k] for k in ("job_step_note", "clock_note", "duty_note") if rep.meta.get(k)]
    t.caption = (f"speedups over BF16. GEMM: {rep.meta.get('mode', 'autocast')} microbenchmarks of the captured "
                 "shapes. predicted step: Amdahl with the measured GEMM share, GEMMs alone; pred. unfused: each GEMM "
                 "plus a standalone quantization of its inputs (autocast mode). Attention's QK^T and softmax·V "
                 "count as non-GEMM time" + "".join(f". {n}" for n in notes))
    return t


def verdict_panel(rep: Report) -> Panel:
    lines = []
    for a in rep.recipes:
        if a.recipe == "BF16":
            continue
        lines.append(f"[b]{a.recipe}[/b]: {escape(a.verdict)}")
        lines += [f"   • {escape(e)}" for e in a.evidence]
    for r, why in rep.skipped.items():
        lines.append(f"[dim]{r}: not available here — {escape(why)}[/dim]")
    return Panel(Group(*lines) if lines else "only BF16 was measured", title="verdicts")


def speedup_figure(rep: Report, path: str | Path) -> Path:
    """Predicted (GEMMs alone) against observed step speedup per recipe, GEMM speedup beside them."""
    recs = [a for a in rep.recipes]
    x = range(len(recs))
    fig, ax = plt.subplots(figsize=(max(6, 1.8 * len(recs) + 2), 4.5))
    w = 0.27
    for off, key, label, color in ((-w, "gemm_speedup", "GEMM speedup (bench)", "#9ecae1"),
                                   (0, "predicted_step_speedup", "predicted step speedup", "#3182bd"),
                                   (w, "observed_step_speedup", "observed step speedup", "#e6550d")):
        vals = [getattr(a, key) or 0 for a in recs]
        bars = ax.bar([i + off for i in x], vals, w, label=label, color=color)
        for b, v in zip(bars, vals):
            if v:
                ax.text(b.get_x() + b.get_width() / 2, v, f"{v:.2f}", ha="center", va="bottom", fontsize=8)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks(list(x), [a.recipe for a in recs], rotation=15)
    ax.set_ylabel("speedup over BF16")
    ax.set_title(f"Predicted vs observed speedup — {rep.meta.get('device', '')}")
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def step_split_figure(rep: Report, path: str | Path, kernels: dict[str, dict[str, float]] | None = None) -> Path:
    """Observed step time per recipe: GEMM and the rest, and, where the sweep profiled kernels,
    the rest split into attention, quantization/cast, norm, communication, optimizer and other."""
    from ..kernels import CATEGORIES

    recs = [a for a in rep.recipes if a.observed_step_ms]
    colors = dict(zip(CATEGORIES, ("#3182bd", "#9e9ac8", "#e6550d", "#74c476", "#fd8d3c", "#fdd0a2", "#bdbdbd")))
    fig, ax = plt.subplots(figsize=(max(5, 1.5 * len(recs) + 3), 4.5))
    seen = set()
    for i, a in enumerate(recs):
        g = a.observed_gemm_ms or 0.0
        parts = [("gemm", g)]
        split = (kernels or {}).get(a.recipe)
        if split:  # kernel times; what they do not cover is idle/launch time, shown as other
            rest = [(k, v) for k, v in split.items() if k != "gemm" and v > 0]
            covered = g + sum(v for _, v in rest)
            parts += rest + [("no kernel (host-bound gaps)", max(a.observed_step_ms - covered, 0.0))]
        else:
            parts.append(("other", a.observed_step_ms - g))
        bottom = 0.0
        for k, v in parts:
            ax.bar(i, v, bottom=bottom, color=colors.get(k, "#f0f0f0"), edgecolor="#bdbdbd" if k not in colors else None,
                   hatch="//" if k not in colors else None, label=None if k in seen else k)
            seen.add(k)
            bottom += v
        ax.text(i, a.observed_step_ms, f"{a.observed_step_ms:.1f} ms\n{100 * g / a.observed_step_ms:.0f}% GEMM",
                ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(recs)), [a.recipe for a in recs], rotation=15)
    ax.set_ylim(0, 1.18 * max((a.observed_step_ms for a in recs), default=1.0))  # room for the labels
    ax.set_ylabel("ms per step")
    ax.set_title("Step time split (GEMM: CUDA events; the rest: kernel time by category)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save_figure(fig, path)


def write_report_json(rep: Report, path: str | Path) -> Path:
    return write_json(path, rep.to_dict(), schema="te-gemm-report/1")



def render_run(run_dir: str | Path, out: Any = None) -> dict[str, Path]:
    """:func:`report`'s files."""
    return report(run_dir, out).files


def report(run_dir: str | Path, out: Any = None) -> "RunReport":
    """Analyse a run folder (:func:`te_gemm_callback.runs.analyze_run`), write report.json and the
    figures into it, and print the tables and verdicts to ``out`` (a rich Console) if given.

    Example:
        >>> rr = report("runs/demo")                              # doctest: +SKIP
        >>> rr.files["speedups"], rr.report.recipes[1].verdict    # doctest: +SKIP
    """
    from ..runs import analyze_run
    from .figures import ranks_figure, stacked_gemm_figure

    root = Path(run_dir)
    rr = analyze_run(root)
    rep, bench, items, ranks = rr.report, rr.bench, rr.items, rr.ranks
    files = {"report": write_report_json(rep, root / "report.json"),
             "speedups": speedup_figure(rep, root / "speedups.png"),
             "step_split": step_split_figure(rep, root / "step_split.png", rr.kernels)}
    if bench is not None:
        for mode in bench.meta.get("modes", ["autocast"]):
            files[f"gemm_{mode}"] = stacked_gemm_figure(bench, items, mode, root / f"gemm_{mode}.png")
    if ranks:
        files["ranks"] = ranks_figure(ranks, root / "ranks.png")
    plan = _run_plan(rr)
    if plan is not None:
        from ..plan import write_plan

        files["plan"], files["plan_nvdlfw"] = write_plan(plan, root / "precision_plan.json",
                                                         root / "precision_plan_nvdlfw.yaml")
    if out is not None:
        if ranks:
            from .tables import ranks_table

            out.print(ranks_table(ranks))
        if bench is not None:  # TE's benchmark_gemm.py per-GEMM table, on the job's real shapes
            from .bench_tables import totals_table

            for mode in bench.meta.get("modes", ["autocast"]):
                out.print(totals_table(bench, items, mode))
        out.print(report_table(rep))
        out.print(verdict_panel(rep))
        if plan is not None:
            out.print(plan_line(plan))
        for key in ("step_note", "job_step_note"):
            if "host-bound" in (rep.meta.get(key) or ""):
                out.print(f"[yellow]warning: {escape(rep.meta[key])}[/yellow]")
        for name, path in files.items():
            out.print(f"{name}: {path}")
    rr.files = files
    return rr


def _run_plan(rr: Any) -> Any:
    """The run's precision plan where its bench allows one (BF16 and an FP8 recipe in autocast mode:
    a CPU run's BF16-only bench has none), else None."""
    if rr.bench is None or "autocast" not in rr.bench.meta.get("modes", ["autocast"]):
        return None
    from ..plan import plan_for_run

    try:
        return plan_for_run(rr)
    except ValueError:  # no FP8 recipe ran, or GEMMs without BF16 time: nothing to plan from
        return None


def plan_line(plan: Any) -> str:
    """One line for the report: the plan, its predicted step speedup, where to find it."""
    pred = plan.predicted_speedup
    what = (f"{plan.same_as} everywhere (no mixed plan gains enough)" if plan.same_as else
            f"{plan.recipe} with {len(plan.keep_bf16)} module(s) kept in BF16")
    tail = (f", predicted {pred['plan']:.2f}x vs best single {plan.best_single} {pred[plan.best_single]:.2f}x"
            if pred.get("plan") and plan.best_single in pred else "")
    return f"precision plan: {what}{tail}; te-gemm plan RUN_DIR for the per-module table"
