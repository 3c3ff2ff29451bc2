"""Matplotlib figures (Agg backend: works headless)."""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ..bench.cells import WorkItem  # noqa: E402
from ..pngfile import write_figure_atomic  # noqa: E402
from ..bench.results import BenchResults, item_ms  # noqa: E402
from ..shapes import GemmOp  # noqa: E402


def save_figure(fig, path: str | Path) -> Path:
    """Write a figure as PNG (parent folders created) and free it, through
    :func:`~te_gemm_callback.pngfile.write_figure_atomic`: atomic, marked as ours, never through a
    symbolic link nor over a PNG this tool did not write (one-line ValueError or OSError naming it)."""
    try:
        fig.tight_layout()
        return write_figure_atomic(fig, path, dpi=120, bbox_inches="tight")
    finally:
        plt.close(fig)  # a refused or failed write must not leak the figure either


def layer_groups(items: list[WorkItem]) -> list[tuple[str, list[WorkItem]]]:
    """Items that differ only in their layer index (blocks.0.fc1, blocks.1.fc1, ... with one
    shape) as one group, labelled blocks.*.fc1 (x4): the per-layer view TE's benchmark_gemm.py gives of a deep model.
    Items of one grouped GEMM that differ only in their m_splits stay one layer."""
    groups: dict[tuple, list[WorkItem]] = {}
    for it in items:
        groups.setdefault((re.sub(r"\.\d+(?=\.|$)", ".*", it.name), it.key[:4]), []).append(it)
    return [(name if len(layers) == 1 else f"{name} (x{len(layers)})", g)
            for (name, _), g in groups.items() for layers in [{it.name for it in g}]]


def stacked_gemm_figure(res: BenchResults, items: list[WorkItem], mode: str, path: str | Path,
                        title: str | None = None) -> Path:
    """One bar per precision; per work item a Fprop+Dgrad segment and a Wgrad segment, weighted
    by calls per step, repeated layers stacked as one group; speedup over BF16 above each bar (the
    figure of TE's benchmark_gemm.py, on real shapes). A GEMM a recipe cannot run is drawn at its BF16 time,
    hatched (the job keeps it in BF16)."""
    precs = [p for p in res.precisions]
    cmap = plt.get_cmap("tab20")
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(precs) + 3), 5.5))
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
    device = res.meta.get("device", "")
    ax.set_title(title or f"GEMM time per step by precision ({mode}) — {device}")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    if res.skipped:
        lines = [f"not run: {p}: {why[:70]}" for p, why in res.skipped.items()]
        fig.text(0.01, -0.02 * len(lines), "\n".join(lines), fontsize=7, va="bottom")
    return save_figure(fig, path)


def ranks_figure(rows: list[dict], path: str | Path) -> Path:
    """Per rank: step time split into GEMM, communication no compute overlapped, and the rest;
    grouped-GEMM rows above each bar for MoE (token imbalance), errors in the label."""
    fig, ax = plt.subplots(figsize=(max(5, 0.9 * len(rows) + 3), 4.2))
    for i, r in enumerate(rows):
        step, gemm, exposed = r.get("step_ms") or 0.0, r.get("gemm_ms") or 0.0, r.get("comm_exposed_ms") or 0.0
        exposed = min(exposed, max(step - gemm, 0.0))  # a warm-up wait can exceed one step: clip to it
        parts = (("GEMM", gemm, "#3182bd"), ("NCCL not overlapped", exposed, "#fd8d3c"),
                 ("rest of the step", max(step - gemm - exposed, 0.0), "#bdbdbd"))
        bottom = 0.0
        for label, v, color in parts:
            ax.bar(i, v, bottom=bottom, color=color, label=label if i == 0 else None)
            bottom += v
        top = f"{step:.1f} ms"
        if r.get("grouped_rows_per_step"):
            top += f"\n{r['grouped_rows_per_step']:.0f} rows"
        ax.text(i, bottom, top, ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(rows)), [f"rank {r['rank']}" + (" (error)" if r.get("error") else "") for r in rows])
    ax.set_ylim(0, 1.2 * max((r.get("step_ms") or 0.0 for r in rows), default=1.0) or 1.0)
    ax.set_ylabel("ms per step")
    window = next((r.get("comm_window") for r in rows if r.get("comm_window")), None)
    ax.set_title("Per-rank step: GEMM, exposed communication, rest"
                 + (f"\n(GEMM and step: captured steps; NCCL: {window})" if window else ""), fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save_figure(fig, path)
