"""Matplotlib figures, each on its own Agg canvas, never through pyplot: the user's backend stays as they chose it."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from te_gemm_callback.analysis.notes import GEMM_CLOCK_SHORT
from te_gemm_callback.capture.kernels import CATEGORIES
from te_gemm_callback.files.png import write_figure_atomic
from te_gemm_callback.microbench.items import WorkItem
from te_gemm_callback.microbench.results import BenchResults, item_ms
from te_gemm_callback.precisions import skipped_lines
from te_gemm_callback.printable import plain
from te_gemm_callback.reporting.report_tables import predicted_drawn, recipe_label, speedup_title
from te_gemm_callback.shapes import GemmOp

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from te_gemm_callback.analysis.verdicts import RecipeAnalysis, Report


def new_figure(figsize: tuple[float, float]) -> tuple[Figure, Axes]:
    """A figure with one axes on an Agg canvas of its own, freed with the caller (no pyplot registry)."""
    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)
    return fig, fig.subplots()


def save_figure(fig: Figure, path: str | Path) -> Path:
    """Write a figure as a PNG marked as ours, its texts' control characters shown as "?" (an ESC reached warnings)."""
    from matplotlib.text import Text
    for t in fig.findobj(Text):
        text = t.get_text()
        shown = "\n".join(plain(line) for line in text.split("\n"))
        if shown != text:
            t.set_text(shown)
    fig.tight_layout()
    return write_figure_atomic(fig, path, dpi=120, bbox_inches="tight")


FOOTNOTE_FONTSIZE = 7
FOOTNOTE_LINES = 3  # per note: a long reason (a TE error) is shortened, at a word boundary, past this


def footnote_lines(text: str, width: int, max_lines: int = FOOTNOTE_LINES) -> list[str]:
    """``text`` wrapped at words, "..." past ``max_lines``, "$" escaped (matplotlib reads text between two as math)."""
    lines = textwrap.wrap(" ".join(str(text).split()), width=max(width, 20), subsequent_indent="  ",
                          break_long_words=False, break_on_hyphens=False, max_lines=max_lines, placeholder=" ...")
    return [ln.replace("$", r"\$") for ln in lines]


def layer_groups(items: list[WorkItem]) -> list[tuple[str, list[WorkItem]]]:
    """Items of one shape that differ only in their layer index as one group, labelled ``blocks.*.fc1 (x2)``."""
    groups: dict[tuple, list[WorkItem]] = {}
    for it in items:
        groups.setdefault((re.sub(r"\.\d+(?=\.|$)", ".*", it.name), it.key[:4]), []).append(it)
    return [(name if len(layers) == 1 else f"{name} (x{len(layers)})", g)
            for (name, _), g in groups.items() for layers in [{it.name for it in g}]]


def stacked_gemm_figure(res: BenchResults, items: list[WorkItem], mode: str, path: str | Path,
                        title: str | None = None) -> Path:
    """TE's benchmark_gemm.py figure on real shapes: a bar per precision, segments per layer group and pass.
    A GEMM a recipe cannot run is drawn hatched at its BF16 time (the job keeps it in BF16)."""
    precs = list(res.precisions)
    cmap = colormaps["tab20"]
    fig, ax = new_figure((max(6, 1.6 * len(precs) + 3), 5.5))
    totals = {}
    for j, p in enumerate(precs):
        bottom = 0.0
        for i, (label, group) in enumerate(layer_groups(items)):
            for seg, ops, shade in (("Fprop+Dgrad", (GemmOp.FPROP, GemmOp.DGRAD), 0), ("Wgrad", (GemmOp.WGRAD,), 1)):
                h, fell_back = 0.0, False
                for it in group:
                    val = item_ms(res, it, p, mode, ops)
                    if val is None and p != "BF16":
                        val, fell_back = item_ms(res, it, "BF16", mode, ops), True
                    h += (val or 0.0) * it.count
                if not h:
                    continue
                ax.bar(j, h, bottom=bottom, color=cmap((2 * i + shade) % 20), edgecolor="white", linewidth=0.5,
                       hatch="xx" if fell_back else None, label=f"{label} {seg}" if j == 0 else None)
                bottom += h
        totals[p] = bottom
    base = totals.get("BF16")
    for j, p in enumerate(precs):
        if totals[p] and base:
            ax.text(j, totals[p], f"{base / totals[p]:.2f}x", ha="center", va="bottom", fontsize=10, weight="bold")
    ax.set_xticks(range(len(precs)), precs, rotation=15)
    ax.set_ylabel("GEMM time (ms)")
    ax.set_title(title or f"GEMM time per step by precision ({mode}) — {res.meta.get('device', '')}")
    _legend(ax, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    if res.skipped:
        width = int(fig.get_figwidth() * 72 / (0.6 * FOOTNOTE_FONTSIZE))  # an average glyph: 0.6 of the font size
        lines = [ln for text in skipped_lines(res.skipped) for ln in footnote_lines(text, width)]
        fig.text(0.01, -0.02 * len(lines), "\n".join(lines), fontsize=FOOTNOTE_FONTSIZE, va="bottom")
    return save_figure(fig, path)


def ranks_figure(rows: list[dict], path: str | Path) -> Path:
    """Per rank: GEMM, communication no compute overlapped and the rest; grouped-GEMM rows (MoE) above."""
    fig, ax = new_figure((max(5, 0.9 * len(rows) + 3), 4.2))
    for i, r in enumerate(rows):
        step, gemm, exposed = r.get("step_ms") or 0.0, r.get("gemm_ms") or 0.0, r.get("comm_exposed_ms") or 0.0
        exposed = min(exposed, max(step - gemm, 0.0))  # a warm-up wait can exceed one step: clip to it
        bottom = 0.0
        for label, v, color in (("GEMM", gemm, "#3182bd"), ("NCCL not overlapped", exposed, "#fd8d3c"),
                                ("rest of the step", max(step - gemm - exposed, 0.0), "#bdbdbd")):
            ax.bar(i, v, bottom=bottom, color=color, label=label if i == 0 else None)
            bottom += v
        rows_text = f"\n{r['grouped_rows_per_step']:.0f} rows" if r.get("grouped_rows_per_step") else ""
        ax.text(i, bottom, f"{step:.1f} ms{rows_text}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(rows)), [f"rank {r['rank']}" + (" (error)" if r.get("error") else "") for r in rows])
    ax.set_ylim(0, 1.2 * max((r.get("step_ms") or 0.0 for r in rows), default=1.0) or 1.0)
    ax.set_ylabel("ms per step")
    window = next((r.get("comm_window") for r in rows if r.get("comm_window")), None)
    ax.set_title("Per-rank step: GEMM, exposed communication, rest"
                 + (f"\n(GEMM and step: captured steps; NCCL: {window})" if window else ""), fontsize=10)
    _legend(ax, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save_figure(fig, path)


def speedup_figure(rep: Report, path: str | Path) -> Path:
    """Predicted (with the replay's band and bound) against observed (95% interval) step speedup per recipe, GEMM
    speedup beside them; without a replay no predicted bars, and the title says so."""
    recs = list(rep.recipes)
    x = range(len(recs))
    fig, ax = new_figure((max(6, 1.8 * len(recs) + 2), 4.5))
    predicted, ticks = _predicted_marks(recs)
    observed = "observed step speedup" + (" (95% CI)" if any(a.observed_ci for a in recs) else "")  # rounds ran
    # Without a bench the GEMM speedups are the runs' own GEMM times, as the report's table says.
    gemm = "GEMM speedup (bench)" if any(a.gemm_ms_bench is not None for a in recs) else "GEMM speedup (in job)"
    series = [("gemm_speedup", None, gemm, "#9ecae1"),
              ("predicted_step_speedup", "predicted_band", predicted, "#3182bd"),
              ("observed_step_speedup", "observed_ci", observed, "#e6550d")]
    if not predicted_drawn(rep):  # no bar to draw: a legend entry for none said nothing of why (the title does)
        del series[1]
    w = 0.8 / len(series)
    tops = [1.0]
    for k, (key, span, label, color) in enumerate(series):
        off = (k - (len(series) - 1) / 2) * w
        vals = [getattr(a, key) or 0 for a in recs]
        # A span is drawn only around a value it belongs to (a refused value keeps no whisker).
        spans = [getattr(a, span) if span and v else None for a, v in zip(recs, vals)]
        err = ([[v - s[0] if s else 0 for v, s in zip(vals, spans)],
                [s[1] - v if s else 0 for v, s in zip(vals, spans)]] if any(spans) else None)
        bars = ax.bar([i + off for i in x], vals, w, label=label, color=color, yerr=err, capsize=3 if err else 0)
        for a, b, v, s in zip(recs, bars, vals, spans):
            mid = b.get_x() + b.get_width() / 2
            if v:  # above its whisker, where it has one: a label on the whisker is unreadable
                top = max(v, s[1]) if s else v
                tops.append(top)
                ax.text(mid, top, f"{v:.2f}", ha="center", va="bottom", fontsize=8)
            elif key in rep.withheld(a.recipe):  # refused by the report's checks: said, not left blank
                ax.text(mid, 0.02, "n/a", ha="center", va="bottom", fontsize=7, rotation=90)
    ax.axhline(1.0, color="grey", lw=0.8)
    # Headroom above the tallest label for the legend: at "best" it sat over a bar once its labels grew.
    ax.set_ylim(0, 1.4 * max(tops))
    ran = rep.meta.get("baseline_ran")
    ax.set_xticks(list(x), [recipe_label(rep, a.recipe, "\n") + ticks.get(a.recipe, "") for a in recs],
                  rotation=15)
    ax.set_ylabel(f"speedup over BF16 (ran {ran})" if ran else "speedup over BF16")
    head, _, why = speedup_title(rep).partition(" (")
    ax.set_title(f"{head} — {rep.meta.get('device', '')}" + (f"\n({why}" if why else ""), fontsize=10)
    _legend(ax, fontsize=8, loc="upper left")
    return save_figure(fig, path)


_BOUND_WORDS = {"host": "host-bound", "gpu": "GPU-bound"}


def _predicted_marks(recs: list[RecipeAnalysis]) -> tuple[str, dict[str, str]]:
    """The predicted bars' legend label, and where rows differ in basis (a replay's bound, GEMMs alone) a tick line
    per recipe saying its own: a host-bound prediction never passes for a GPU-bound one."""
    # Without a replay's bound a prediction is Amdahl over the GEMM share: GEMMs alone, or a plan's.
    how = {a.recipe: "replay, " + _BOUND_WORDS.get(a.predicted_bound, a.predicted_bound) if a.predicted_bound
           else "GEMMs alone" for a in recs if a.predicted_step_speedup}
    kinds = set(how.values())
    band = ", band" if any(a.predicted_band for a in recs) else ""
    if len(kinds) == 1:
        return f"predicted step speedup ({kinds.pop()}{band})", {}
    if not kinds:
        return "predicted step speedup", {}
    return (f"predicted step speedup ({band[2:] + '; ' if band else ''}how: under each recipe)",
            {r: f"\n(pred. {h.removeprefix('replay, ')})" for r, h in how.items()})


def _run_share(rep: Report, a: RecipeAnalysis) -> tuple[float | None, str]:
    """(GEMM share of this run's step, its basis) as the report's checks gave it, else the plain ratio."""
    chk = (rep.meta.get("gemm_shares") or {}).get(a.recipe)
    if chk is not None:
        return chk.get("share"), chk.get("basis") or ""
    g, step = a.observed_gemm_ms, cast(float, a.observed_step_ms)  # the figure draws runs with a step time only
    return (g / step, "step") if g is not None and g <= step else (None, "")


# The GEMM part of a bar drawn from the share of another step (host clock): an estimate, hatched.
_TIMED_SHARE = "gemm (share of its timed step)"


def step_split_title(rep: Report, kernels: dict[str, dict[str, float]] | None = None) -> str:
    """The step-split figure's title, its clocks named for what they were on this device."""
    rest = "kernel time by category" if any((kernels or {}).values()) else "the step minus GEMM"
    clock = GEMM_CLOCK_SHORT.get(rep.meta["gemm_clock"]) if "gemm_clock" in rep.meta else "in-job timing"
    return f"Step time split (GEMM: {clock}; the rest: {rest})"


def step_split_figure(rep: Report, path: str | Path, kernels: dict[str, dict[str, float]] | None = None) -> Path:
    """Observed step time per recipe: GEMM and the rest, by kernel category where the sweep profiled kernels."""
    recs = [a for a in rep.recipes if a.observed_step_ms]
    steps = [cast(float, a.observed_step_ms) for a in recs]  # each set: recs are the runs with a step time
    colors = dict(zip(CATEGORIES, ("#3182bd", "#9e9ac8", "#e6550d", "#74c476", "#fd8d3c", "#fdd0a2", "#bdbdbd")))
    fig, ax = new_figure((max(5, 1.5 * len(recs) + 3), 4.5))
    seen = set()
    for i, a in enumerate(recs):
        parts, label = _split_bar(a, *_run_share(rep, a), (kernels or {}).get(a.recipe))
        bottom = 0.0
        for k, v in parts:
            est = k == _TIMED_SHARE
            ax.bar(i, v, bottom=bottom, color=colors["gemm"] if est else colors.get(k, "#f0f0f0"),
                   edgecolor="#bdbdbd" if k not in colors else None,
                   hatch=".." if est else "//" if k not in colors else None, label=None if k in seen else k)
            seen.add(k)
            bottom += v
        ax.text(i, steps[i], label, ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(recs)), [recipe_label(rep, a.recipe, "\n") for a in recs], rotation=15)
    ax.set_ylim(0, 1.22 * max(steps, default=1.0))  # room for the labels
    ax.set_ylabel("ms per step")
    ax.set_title(step_split_title(rep, kernels))
    _legend(ax, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save_figure(fig, path)


def _split_bar(a: RecipeAnalysis, share: float | None, basis: str,
               split: dict[str, float] | None) -> tuple[list[tuple[str, float]], str]:
    """One run's bar in the step-split figure: its (part, ms) segments, bottom up, and its label."""
    step = cast(float, a.observed_step_ms)  # the figure draws runs with a step time only
    if share is None:
        what = "GEMMs not timed" if a.observed_gemm_ms is None else "GEMM share n/a"
        return [(f"step ({what})", step)], f"{step:.1f} ms\n{what}"
    g = share * step
    # A share of the timed step, drawn at that share of this step: an estimate, drawn hatched.
    parts = [("gemm" if basis == "step" else _TIMED_SHARE, g)]
    if split and basis == "step":  # kernel times; what they do not cover is idle/launch time, shown as other
        rest = [(k, v) for k, v in split.items() if k != "gemm" and v > 0]
        covered = g + sum(v for _, v in rest)
        parts += rest + [("no kernel (host-bound gaps)", max(step - covered, 0.0))]
    else:
        parts.append(("other", step - g))
    timed = "\n(of its timed step)" if basis == "timed steps" else ""
    return parts, f"{step:.1f} ms\n{100 * share:.0f}% GEMM{timed}"


def _legend(ax: Any, **kw: Any) -> None:
    """The axes' legend, where something is labelled: matplotlib warns into the job's stderr otherwise."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kw)
