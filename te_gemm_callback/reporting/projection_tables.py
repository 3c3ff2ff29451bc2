"""A run projected onto another GPU (te_gemm_callback.projection), as tables and report.json's summary."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.table import Table

from te_gemm_callback.printable import safe
from te_gemm_callback.reporting.console import make_table
from te_gemm_callback.reporting.report_tables import x_text

log = logging.getLogger("te_gemm_callback")
# Speedups over BF16 on the target, on the source (bench, observed), the source's step and the target's gain.
COLUMNS = ("recipe", "GEMM ms/step (band)", "step ms (band)", "vs BF16", "bound", "GEMMs alone", "source: bench",
           "source: observed", "source step ms", "target gain")


def rows(rp: Any) -> list[list[str]]:
    return [[s.recipe, f"{s.gemm_ms:.2f} ({s.gemm_low_ms:.1f}-{s.gemm_high_ms:.1f})",
             f"{s.step_ms:.2f} ({s.step_low_ms:.1f}-{s.step_high_ms:.1f})" if s.step_ms is not None else "-",
             x_text(s.speedup), s.bound or "-", x_text(s.gemms_alone_speedup), x_text(s.source_speedup),
             x_text(s.observed_speedup), x_text(s.source_step_ms, "{:.2f}"), x_text(s.vs_source)]
            for s in rp.steps]


def title(rp: Any) -> str:
    """The table's title, saying what its step column is (an old folder's capture has no host calls to replay)."""
    by = {s.step_by for s in rp.steps if s.step_ms is not None}
    step = ("the job's step replayed with it" if by == {"replay"} else
            "GEMMs alone from it (no replay: the rest of the step held fixed, not a predicted step)"
            if "replay" not in by else "the step replayed with it where a bound is given, else GEMMs alone")
    return (f"{'measured' if rp.measured else 'projection'}: {rp.source.name} -> {rp.target.name}: GEMM time per "
            f"step ({rp.mode}) and {step}, with bands; speedups over BF16 on each GPU; the same recipe's step on "
            "both")


def projection_table(rp: Any) -> Table:
    return make_table(safe(title(rp)), COLUMNS, left=COLUMNS[:1], wrap=COLUMNS[1:], rows=rows(rp),
                      caption=safe("; ".join(rp.notes)))


def summary(rp: Any) -> dict[str, Any]:
    """What report.json keeps of a projection (the cells stay in projection-GPU.json)."""
    d = rp.to_dict()
    return {k: d[k] for k in ("label", "target", "source", "mode", "job_recipe", "gemms_alone", "steps", "notes")}


def project_runs(run_dir: str | Path, gpus: Sequence[str], analysis: Any = None) -> list[Any]:
    """One projection per GPU (``analysis``: the run's, if made); one that cannot be made is logged and left out."""
    from te_gemm_callback.projection import project_run  # loads torch: not at the CLI's import
    out = []
    for g in gpus:
        try:
            out.append(project_run(run_dir, g, analysis=analysis))
        except ValueError as err:
            log.warning("te-gemm: no projection onto %s: %s", g, err)
    return out
