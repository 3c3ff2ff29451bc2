"""The speedup report of an analysed run: terminal table and verdict panel, figures, JSON, written
as :func:`te_gemm_callback.analysis.runs.analyze_run` hands them over (:func:`write_run`)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Group
from rich.panel import Panel
from rich.table import Table

from te_gemm_callback.files.jsonio import check_target, json_kind, write_json
from te_gemm_callback.files.png import PNG_KIND, plain_name
from te_gemm_callback.printable import safe
from te_gemm_callback.reporting.figures import speedup_figure, step_split_figure, step_split_title

if TYPE_CHECKING:
    from te_gemm_callback.analysis.runs import RunReport
    from te_gemm_callback.analysis.verdicts import Report

# The figures' names, importable from here as before they moved to reporting.figures.
__all__ = ["REPORT_SCHEMA", "bench_modes", "plan_line", "render_run", "report", "report_table", "report_targets",
           "share_text", "speedup_figure", "step_split_figure", "step_split_title", "verdict_panel",
           "write_report_json", "write_run"]

log = logging.getLogger("te_gemm_callback")
REPORT_SCHEMA = "te-gemm-report/1"


def _x(v: float | None, fmt: str = "{:.2f}x") -> str:
    return "-" if v is None else fmt.format(v)


def _cell(rep: Report, a: Any, name: str, fmt: str = "{:.2f}x") -> str:
    # "n/a" for a refused figure (its why is in the caption), "-" for one never measured.
    return "n/a" if name in rep.withheld(a.recipe) else _x(getattr(a, name), fmt)


def share_text(rep: Report) -> str:
    """The GEMM share as the report may state it: of the step shown, of the steps the GEMMs were
    timed in (host clock), or "n/a (why)"; never a share above 100%."""
    share, basis = rep.gemm_share, rep.meta.get("gemm_share_basis", "step")
    if rep.gemm_ms is None:
        return "GEMMs not timed"
    if share is None:
        why = rep.meta.get("gemm_share_na") or "GEMM time exceeds the step"
        return f"GEMMs {rep.gemm_ms:.2f} ms, GEMM share n/a ({why.split(': ')[0]})"
    if basis == "timed steps":
        of = rep.meta.get("gemm_share_of_ms")
        # A lower bound where that step ran slower than the step shown: it also ran the instruments.
        low = "; a lower bound: that step also ran the capture instruments" if of and of > rep.step_ms else ""
        return (f"GEMMs {100 * share:.1f}% of the instrumented step they were timed in"
                + (f" ({share * of:.2f} of {of:.2f} ms, host clock{low})" if of else " (host clock)"))
    return f"GEMMs {rep.gemm_ms:.2f} ms ({100 * share:.1f}% of the step)"


def report_table(rep: Report) -> Table:
    # The job's precision is what its GEMMs ran (FP32 on an fp32 model), not the key its run is joined on.
    job = rep.meta.get("job_precision") or rep.current_recipe
    # Recipe and precision names, notes and reasons come from files: escaped (printable.safe).
    t = Table(title=safe(f"GEMM vs step speedup — job ran {job}: step {rep.step_ms:.2f} ms, {share_text(rep)}"))
    ran = rep.meta.get("baseline_ran")
    unfused = any(a.predicted_step_speedup_unfused is not None for a in rep.recipes)
    # The job's own column only where some row has it (an FP32 job's has no FP32 microbenchmark).
    vs_cur = rep.current_recipe != "BF16" and any(a.gemm_speedup_vs_current is not None for a in rep.recipes)
    cols = (["recipe", "GEMM ms (bench)", "GEMM speedup"] + ([f"vs {safe(rep.current_recipe)}"] if vs_cur else [])
            + ["predicted step"] + (["pred. unfused"] if unfused else [])
            + ["observed step", "95% CI", "a rerun", "observed ms"])
    for c in cols:
        t.add_column(c, justify="left" if c == "recipe" else "right", no_wrap=True)
    for a in rep.recipes:
        name = f"{a.recipe} (ran {ran})" if ran and a.recipe == "BF16" else a.recipe
        row = ([safe(name), _cell(rep, a, "gemm_ms_bench", "{:.2f}"), _cell(rep, a, "gemm_speedup")]
               + ([_cell(rep, a, "gemm_speedup_vs_current")] if vs_cur else [])
               + [_cell(rep, a, "predicted_step_speedup")]
               + ([_cell(rep, a, "predicted_step_speedup_unfused")] if unfused else []))
        t.add_row(*row, _cell(rep, a, "observed_step_speedup"), _interval(a), _rerun(a),
                  _x(a.observed_step_ms, "{:.2f}"))
    for r in rep.skipped:  # why each was skipped: the verdict panel says
        t.add_row(safe(r), "not run", *[""] * (len(cols) - 2), style="dim")
    notes = ([f"Note: {rep.meta['step_note']}"] if rep.meta.get("step_note") else []) + \
        [rep.meta[k] for k in ("job_step_note", "framework_note", "clock_note", "duty_note") if rep.meta.get(k)]
    if rep.meta.get("timing"):
        notes.append(f"Timing: {rep.meta['timing']}")
    held = {why for r in (rep.meta.get("withheld") or {}) for f, why in rep.withheld(r).items()
            if f not in ("verdict", "evidence")}
    notes += [f"n/a: {why}" for why in sorted(held)]
    over = f"the BF16 run, which ran {ran}" if ran else "BF16"
    t.caption = safe(f"speedups over {over}. GEMM: {rep.meta.get('mode', 'autocast')} microbenchmarks of the "
                     "captured shapes. predicted step: Amdahl with the measured GEMM share, GEMMs alone; pred. "
                     "unfused: each GEMM plus a standalone quantization of its inputs (autocast mode). observed step: "
                     "whole training steps (optimizer included) in the sweep's alternating rounds, the median of the "
                     "per-round ratios; 95% CI: its order-statistic interval (from 6 rounds); a rerun: where another "
                     "run's median (a loop of your own) should fall, the CI widened by sqrt(2). Attention's QK^T and "
                     "softmax·V count as non-GEMM time" + "".join(f". {n}" for n in notes))
    return t


def _rerun(a: Any) -> str:
    """Where a rerun's median should fall (the CI widened by sqrt(2), stats.Estimate.rerun): the range
    to hold a user's own timing loop against, since their loop has an error of its own."""
    r = getattr(a, "observed_rerun", None)
    return f"{r[0]:.2f}-{r[1]:.2f}x" if a.recipe != "BF16" and r else ""


def _interval(a: Any) -> str:
    """The observed speedup's 95% interval, or why there is none (the baseline has none: 1.00x by
    definition)."""
    if a.recipe == "BF16":
        return ""
    if a.observed_ci:
        return f"{a.observed_ci[0]:.2f}-{a.observed_ci[1]:.2f}x"
    if a.observed_rounds:
        return f"({a.observed_rounds} rounds: too few)"
    return ""


def verdict_panel(rep: Report) -> Panel:
    # What the checks refused to state comes first: a reader sees it before any figure it touches.
    lines = [f"[yellow]check: {safe(w)}[/yellow]" for w in rep.warnings]
    for a in rep.recipes:
        if a.recipe == "BF16":
            continue
        lines.append(f"[b]{safe(a.recipe)}[/b]: {safe(a.verdict)}")
        lines += [f"   • {safe(e)}" for e in a.evidence]
    for r, why in rep.skipped.items():
        lines.append(f"[dim]{safe(r)}: not available here — {safe(why)}[/dim]")
    if not any(a.recipe != "BF16" for a in rep.recipes) and not rep.skipped:
        lines.append("only BF16 was measured")
    return Panel(Group(*lines), title="verdicts")


def write_report_json(rep: Report, path: str | Path) -> Path:
    return write_json(path, rep.to_dict(), schema=REPORT_SCHEMA)



def render_run(run_dir: str | Path, out: Any = None) -> dict[str, Path]:
    """:func:`report`'s files."""
    return report(run_dir, out).files


def report(run_dir: str | Path, out: Any = None) -> RunReport:
    """Analyse a run folder (:func:`te_gemm_callback.analysis.runs.analyze_run`), write report.json, the
    figures and the precision plan into it, and print the tables and verdicts to ``out`` (a rich
    Console) if given (:func:`write_run`).

    Example:
        >>> rr = report("runs/demo")                              # doctest: +SKIP
        >>> rr.files["speedups"], rr.report.recipes[1].verdict    # doctest: +SKIP
    """
    from te_gemm_callback.analysis.runs import analyze_run

    rr = analyze_run(run_dir)
    rr.files = write_run(rr, run_dir, out)
    return rr


def write_run(rr: RunReport, run_dir: str | Path, out: Any = None) -> dict[str, Path]:
    """Draw and write an analysed run into ``run_dir``: report.json, the figures, and the precision
    plan it holds; print the tables and verdicts to ``out`` if given. Nothing is computed here.
    Every target is checked before anything is written (:func:`report_targets`: a link, a user's
    own PNG or JSON there is refused in one line); the precision plan, an extra, is skipped with a
    warning naming the file where a file of the user's holds its place."""
    from te_gemm_callback.reporting.figures import ranks_figure, stacked_gemm_figure

    root = Path(run_dir)
    rep, bench, items, ranks, plan = rr.report, rr.bench, rr.items, rr.ranks, rr.plan
    modes = bench_modes(bench) if bench is not None else []
    targets = report_targets(root, modes, bool(ranks))  # all refused before any is written
    files = {"report": write_report_json(rep, targets["report"]),
             "speedups": speedup_figure(rep, targets["speedups"]),
             "step_split": step_split_figure(rep, targets["step_split"], rr.kernels)}
    for mode in modes:
        files[f"gemm_{mode}"] = stacked_gemm_figure(bench, items, mode, targets[f"gemm_{mode}"])
    if ranks:
        files["ranks"] = ranks_figure(ranks, targets["ranks"])
    if plan is not None:
        from te_gemm_callback.analysis.plan import write_plan

        try:
            files["plan"], files["plan_nvdlfw"] = write_plan(plan, root / "precision_plan.json",
                                                             root / "precision_plan_nvdlfw.yaml")
        except ValueError as err:  # a file of the user's where the plan goes: the report itself stands
            log.warning("te-gemm: precision plan not written: %s", err)
    if out is not None:
        _print_run(rr, modes, files, out)
    return files


def _print_run(rr: RunReport, modes: list[str], files: dict[str, Path], out: Any) -> None:
    rep, bench = rr.report, rr.bench
    if rr.ranks:
        from te_gemm_callback.reporting.tables import ranks_table

        out.print(ranks_table(rr.ranks))
    if bench is not None:  # TE's benchmark_gemm.py per-GEMM table, on the job's real shapes
        from te_gemm_callback.reporting.bench_tables import totals_table

        for mode in modes:
            out.print(totals_table(bench, rr.items, mode))
    out.print(report_table(rep))
    out.print(verdict_panel(rep))
    if rr.plan is not None:
        out.print(safe(plan_line(rr.plan)))
    for key in rr.host_bound_notes:
        out.print(f"[yellow]warning: {safe(rep.meta[key])}[/yellow]")
    for name, path in files.items():
        out.print(f"{name}: {safe(path)}")


def bench_modes(bench: Any) -> list[str]:
    """The bench's modes: a list of names (each names a figure, ``gemm_<mode>.png``); a string
    would be drawn letter by letter, one figure each."""
    modes = bench.meta.get("modes", ["autocast"])
    if not isinstance(modes, list) or not all(isinstance(m, str) for m in modes):
        raise ValueError(f"bench.json: meta.modes must be a list of mode names, got {modes!r}")
    return modes  # each checked as a file name by report_targets


def report_targets(root: Path, modes: Sequence[str] = (), ranks: bool = False) -> dict[str, Path]:
    """The files a report writes into ``root``, each checked as :func:`report` writes it (not a
    symbolic link, not a file this tool did not write: one-line ValueError), none written yet."""
    names = {"report": "report.json", "speedups": "speedups.png", "step_split": "step_split.png",
             **{f"gemm_{m}": f"gemm_{m}.png" for m in modes}, **({"ranks": "ranks.png"} if ranks else {})}
    # A mode from a hand-edited bench.json could hold "/" or "..": the figure would land elsewhere.
    out = {key: root / plain_name(name) for key, name in names.items()}
    for key, path in out.items():
        check_target(path, json_kind(REPORT_SCHEMA) if key == "report" else PNG_KIND)
    return out


def plan_line(plan: Any) -> str:
    """One line for the report: the plan, its predicted step speedup, where to find it."""
    pred = plan.predicted_speedup
    what = (f"{plan.same_as} everywhere (no mixed plan gains enough)" if plan.same_as else
            f"{plan.recipe} with {len(plan.keep_bf16)} module(s) kept in BF16")
    tail = (f", predicted {pred['plan']:.2f}x vs best single {plan.best_single} {pred[plan.best_single]:.2f}x"
            if pred.get("plan") and plan.best_single in pred else
            f", predicted speedup {plan.meta.get('prediction', 'n/a')}")  # says why none is given
    return f"precision plan: {what}{tail}; te-gemm plan RUN_DIR for the per-module table"
