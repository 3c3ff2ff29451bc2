"""Matplotlib figures (Agg backend: works headless)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ..bench.cells import WorkItem  # noqa: E402
from ..bench.engine import BenchResults  # noqa: E402
from ..shapes import GemmOp  # noqa: E402
from ..bench.engine import item_ms  # noqa: E402


def stacked_gemm_figure(res: BenchResults, items: list[WorkItem], mode: str, path: str | Path,
                        title: str | None = None) -> Path:
    """One bar per precision; per work item a Fprop+Dgrad segment and a Wgrad segment, weighted
    by calls per step; speedup over BF16 above each bar (the seed tool's figure, on real shapes)."""
    precs = [p for p in res.precisions]
    cmap = plt.get_cmap("tab20")
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(precs) + 3), 5.5))
    totals = {}
    for j, p in enumerate(precs):
        bottom = 0.0
        for i, it in enumerate(items):
            fd = item_ms(res, it, p, mode, (GemmOp.FPROP, GemmOp.DGRAD))
            w = item_ms(res, it, p, mode, (GemmOp.WGRAD,))
            for seg, val, shade in (("Fprop+Dgrad", fd, 0), ("Wgrad", w, 1)):
                if val is None:
                    continue
                h = val * it.count
                ax.bar(j, h, bottom=bottom, color=cmap((2 * i + shade) % 20), edgecolor="white", linewidth=0.5,
                       label=f"{it.name} {seg}" if j == 0 else None)
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
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path
