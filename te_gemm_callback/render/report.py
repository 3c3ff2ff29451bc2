"""The speedup report: terminal table and verdict panel, figures, JSON."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from rich.console import Group  # noqa: E402
from rich.panel import Panel  # noqa: E402
from rich.table import Table  # noqa: E402

from ..analysis import Report  # noqa: E402

if TYPE_CHECKING:
    from ..runs import RunReport
from ..jsonio import check_target, json_kind, write_json  # noqa: E402
from ..pngfile import PNG_KIND, plain_name  # noqa: E402
from .figures import save_figure  # noqa: E402
from ..printable import safe  # noqa: E402

log = logging.getLogger("te_gemm_callback")
REPORT_SCHEMA = "te-gemm-report/1"


def _x(v: float | None, fmt: str = "{:.2f}x") -> str:
    return "-" if v is None else fmt.format(v)


def _held(rep: Report, recipe: str) -> dict[str, str]:
    """The fields of a recipe's row the report's checks refused (meta["withheld"]: field -> why)."""
    return (rep.meta.get("withheld") or {}).get(recipe) or {}


def _cell(rep: Report, a: Any, name: str, fmt: str = "{:.2f}x") -> str:
    # "n/a" for a refused figure (its why is in the caption), "-" for one never measured.
    return "n/a" if name in _held(rep, a.recipe) else _x(getattr(a, name), fmt)


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
    cols = ["recipe", "GEMM ms (bench)", "GEMM speedup"] + ([f"vs {safe(rep.current_recipe)}"] if vs_cur else []) + \
        ["predicted step"] + (["pred. unfused"] if unfused else []) + ["observed step", "95% CI", "a rerun", "observed ms"]
    for c in cols:
        t.add_column(c, justify="left" if c == "recipe" else "right", no_wrap=True)
    for a in rep.recipes:
        name = f"{a.recipe} (ran {ran})" if ran and a.recipe == "BF16" else a.recipe
        row = [safe(name), _cell(rep, a, "gemm_ms_bench", "{:.2f}"), _cell(rep, a, "gemm_speedup")] + \
            ([_cell(rep, a, "gemm_speedup_vs_current")] if vs_cur else []) + [_cell(rep, a, "predicted_step_speedup")] + \
            ([_cell(rep, a, "predicted_step_speedup_unfused")] if unfused else [])
        t.add_row(*row, _cell(rep, a, "observed_step_speedup"), _interval(a), _rerun(a), _x(a.observed_step_ms, "{:.2f}"))
    for r, why in rep.skipped.items():
        t.add_row(safe(r), "not run", *[""] * (len(cols) - 2), style="dim")
    notes = ([f"Note: {rep.meta['step_note']}"] if rep.meta.get("step_note") else []) + \
        [rep.meta[k] for k in ("job_step_note", "framework_note", "clock_note", "duty_note") if rep.meta.get(k)]
    if rep.meta.get("timing"):
        notes.append(f"Timing: {rep.meta['timing']}")
    held = {why for r in (rep.meta.get("withheld") or {}) for f, why in _held(rep, r).items()
            if f not in ("verdict", "evidence")}
    notes += [f"n/a: {why}" for why in sorted(held)]
    over = f"the BF16 run, which ran {ran}" if ran else "BF16"
    t.caption = safe(f"speedups over {over}. GEMM: {rep.meta.get('mode', 'autocast')} microbenchmarks of the captured "
                     "shapes. predicted step: Amdahl with the measured GEMM share, GEMMs alone; pred. unfused: each GEMM "
                     "plus a standalone quantization of its inputs (autocast mode). observed step: whole training steps "
                     "(optimizer included) in the sweep's alternating rounds, the median of the per-round ratios; 95% CI: "
                     "its order-statistic interval (from 6 rounds); a rerun: where another run's median (a loop of "
                     "your own) should fall, the CI widened by sqrt(2). Attention's QK^T and softmax·V "
                     "count as non-GEMM time" + "".join(f". {n}" for n in notes))
    return t


def _rerun(a: Any) -> str:
    """Where a rerun's median should fall (the CI widened by sqrt(2), stats.Estimate.rerun): the range
    to hold a user's own timing loop against, since their loop has an error of its own."""
    r = getattr(a, "observed_rerun", None)
    return f"{r[0]:.2f}-{r[1]:.2f}x" if a.recipe != "BF16" and r else ""


def _interval(a: Any) -> str:
    """The observed speedup's 95% interval, or why there is none (the baseline has none: 1.00x by definition)."""
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
        # The observed bars carry their 95% interval (the sweep's rounds), where there is one.
        err = None
        if key == "observed_step_speedup" and any(a.observed_ci for a in recs):
            err = [[v - a.observed_ci[0] if a.observed_ci and v else 0 for a, v in zip(recs, vals)],
                   [a.observed_ci[1] - v if a.observed_ci and v else 0 for a, v in zip(recs, vals)]]
        bars = ax.bar([i + off for i in x], vals, w, label=label, color=color, yerr=err, capsize=3 if err else 0)
        for a, b, v in zip(recs, bars, vals):
            if v:
                ax.text(b.get_x() + b.get_width() / 2, v, f"{v:.2f}", ha="center", va="bottom", fontsize=8)
            elif key in _held(rep, a.recipe):  # refused by the report's checks: said, not left blank
                ax.text(b.get_x() + b.get_width() / 2, 0.02, "n/a", ha="center", va="bottom", fontsize=7, rotation=90)
    ax.axhline(1.0, color="grey", lw=0.8)
    ran = rep.meta.get("baseline_ran")
    ax.set_xticks(list(x), [f"{a.recipe}\n(ran {ran})" if ran and a.recipe == "BF16" else a.recipe for a in recs],
                  rotation=15)
    ax.set_ylabel(f"speedup over BF16 (ran {ran})" if ran else "speedup over BF16")
    ax.set_title(f"Predicted vs observed speedup — {rep.meta.get('device', '')}")
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def _run_share(rep: Report, a: Any) -> tuple[float | None, str]:
    """(GEMM share of this run's step, its basis) as the report's checks gave it; for a Report made
    without them, the plain ratio where it is one (never above 1)."""
    chk = (rep.meta.get("gemm_shares") or {}).get(a.recipe)
    if chk is not None:
        return chk.get("share"), chk.get("basis") or ""
    g = a.observed_gemm_ms
    return (g / a.observed_step_ms, "step") if g is not None and g <= a.observed_step_ms else (None, "")


def step_split_title(rep: Report, kernels: dict[str, dict[str, float]] | None = None) -> str:
    """The step-split figure's title: its clocks named for what they were on this device (the host
    clock on a CPU, kernel records or CUDA events on a GPU)."""
    from ..notes import GEMM_CLOCK_SHORT

    rest = "kernel time by category" if any((kernels or {}).values()) else "the step minus GEMM"
    clock = GEMM_CLOCK_SHORT.get(rep.meta["gemm_clock"]) if "gemm_clock" in rep.meta else "in-job timing"
    return f"Step time split (GEMM: {clock}; the rest: {rest})"


def step_split_figure(rep: Report, path: str | Path, kernels: dict[str, dict[str, float]] | None = None) -> Path:
    """Observed step time per recipe: GEMM and the rest, and, where the sweep profiled kernels,
    the rest split into attention, quantization/cast, norm, communication, optimizer and other.
    A run whose GEMM share the checks refused is drawn whole, unsplit, and says so; one whose share
    comes from the steps its GEMMs were timed in (host clock) is split by that share."""
    from ..kernels import CATEGORIES

    recs = [a for a in rep.recipes if a.observed_step_ms]
    colors = dict(zip(CATEGORIES, ("#3182bd", "#9e9ac8", "#e6550d", "#74c476", "#fd8d3c", "#fdd0a2", "#bdbdbd")))
    fig, ax = plt.subplots(figsize=(max(5, 1.5 * len(recs) + 3), 4.5))
    seen = set()
    for i, a in enumerate(recs):
        share, basis = _run_share(rep, a)
        if share is None:
            what = "GEMMs not timed" if a.observed_gemm_ms is None else "GEMM share n/a"
            parts = [(f"step ({what})", a.observed_step_ms)]
            label = f"{a.observed_step_ms:.1f} ms\n{what}"
        else:
            g = share * a.observed_step_ms
            # A share of the timed step, drawn at that share of this step: an estimate, drawn hatched.
            parts = [("gemm" if basis == "step" else "gemm (share of its timed step)", g)]
            split = (kernels or {}).get(a.recipe)
            if split and basis == "step":  # kernel times; what they do not cover is idle/launch time, shown as other
                rest = [(k, v) for k, v in split.items() if k != "gemm" and v > 0]
                covered = g + sum(v for _, v in rest)
                parts += rest + [("no kernel (host-bound gaps)", max(a.observed_step_ms - covered, 0.0))]
            else:
                parts.append(("other", a.observed_step_ms - g))
            label = (f"{a.observed_step_ms:.1f} ms\n{100 * share:.0f}% GEMM"
                     + ("\n(of its timed step)" if basis == "timed steps" else ""))
        bottom = 0.0
        for k, v in parts:
            est = k.startswith("gemm (")
            ax.bar(i, v, bottom=bottom, color=colors["gemm"] if est else colors.get(k, "#f0f0f0"),
                   edgecolor="#bdbdbd" if k not in colors else None,
                   hatch=".." if est else "//" if k not in colors else None, label=None if k in seen else k)
            seen.add(k)
            bottom += v
        ax.text(i, a.observed_step_ms, label, ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(recs)), [a.recipe for a in recs], rotation=15)
    ax.set_ylim(0, 1.22 * max((a.observed_step_ms for a in recs), default=1.0))  # room for the labels
    ax.set_ylabel("ms per step")
    ax.set_title(step_split_title(rep, kernels))
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save_figure(fig, path)


def write_report_json(rep: Report, path: str | Path) -> Path:
    return write_json(path, rep.to_dict(), schema=REPORT_SCHEMA)



def render_run(run_dir: str | Path, out: Any = None) -> dict[str, Path]:
    """:func:`report`'s files."""
    return report(run_dir, out).files


def report(run_dir: str | Path, out: Any = None) -> "RunReport":
    """Analyse a run folder (:func:`te_gemm_callback.runs.analyze_run`), write report.json and the
    figures into it, and print the tables and verdicts to ``out`` (a rich Console) if given.
    Every target is checked before anything is written (:func:`report_targets`: a link, a user's
    own PNG or JSON there is refused in one line); the precision plan, an extra, is skipped with a
    warning naming the file where a file of the user's holds its place.

    Example:
        >>> rr = report("runs/demo")                              # doctest: +SKIP
        >>> rr.files["speedups"], rr.report.recipes[1].verdict    # doctest: +SKIP
    """
    from ..runs import analyze_run
    from .figures import ranks_figure, stacked_gemm_figure

    root = Path(run_dir)
    rr = analyze_run(root)
    rep, bench, items, ranks = rr.report, rr.bench, rr.items, rr.ranks
    modes = bench_modes(bench) if bench is not None else []
    targets = report_targets(root, modes, bool(ranks))  # all refused before any is written
    files = {"report": write_report_json(rep, targets["report"]),
             "speedups": speedup_figure(rep, targets["speedups"]),
             "step_split": step_split_figure(rep, targets["step_split"], rr.kernels)}
    for mode in modes:
        files[f"gemm_{mode}"] = stacked_gemm_figure(bench, items, mode, targets[f"gemm_{mode}"])
    if ranks:
        files["ranks"] = ranks_figure(ranks, targets["ranks"])
    plan = _run_plan(rr)
    if plan is not None:
        from ..plan import write_plan

        try:
            files["plan"], files["plan_nvdlfw"] = write_plan(plan, root / "precision_plan.json",
                                                             root / "precision_plan_nvdlfw.yaml")
        except ValueError as err:  # a file of the user's where the plan goes: the report itself stands
            log.warning("te-gemm: precision plan not written: %s", err)
    if out is not None:
        if ranks:
            from .tables import ranks_table

            out.print(ranks_table(ranks))
        if bench is not None:  # TE's benchmark_gemm.py per-GEMM table, on the job's real shapes
            from .bench_tables import totals_table

            for mode in modes:
                out.print(totals_table(bench, items, mode))
        out.print(report_table(rep))
        out.print(verdict_panel(rep))
        if plan is not None:
            out.print(safe(plan_line(plan)))
        for key in ("step_note", "job_step_note"):
            if "host-bound" in (rep.meta.get(key) or ""):
                out.print(f"[yellow]warning: {safe(rep.meta[key])}[/yellow]")
        for name, path in files.items():
            out.print(f"{name}: {safe(path)}")
    rr.files = files
    return rr


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
            if pred.get("plan") and plan.best_single in pred else
            f", predicted speedup {plan.meta.get('prediction', 'n/a')}")  # says why none is given
    return f"precision plan: {what}{tail}; te-gemm plan RUN_DIR for the per-module table"
