"""The capture beside Nsight Systems' projection of its GEMM ranges (analysis.nsys; docs/nsight-systems.md)."""

from __future__ import annotations

import statistics
from typing import Any

from rich.table import Table

from te_gemm_callback.printable import safe
from te_gemm_callback.reporting.console import make_table

COLUMNS = ("GEMM range", "nsys ms (median)", "nsys instances", "capture ms (median)", "capture vs nsys")


def nsys_summary(cmp: Any) -> str:
    """One line: how close, and what was left out."""
    d = cmp.differences
    if not d:
        return "no GEMM of the capture has a projection in this report"
    worst = max((r for r in cmp.rows if r["capture_vs_nsys"] is not None), key=lambda r: abs(r["capture_vs_nsys"]))
    text = (f"{len(d)} of {len(cmp.rows)} GEMMs: |capture - nsys| / nsys, median {100 * statistics.median(d):.2f}%, "
            f"worst {100 * d[-1]:.2f}% ({worst['gemm']}); -: the capture shorter (by up to ~1 us by design: the "
            "event-pair floor, docs/nsight-systems.md)")
    missing = [r["gemm"] for r in cmp.rows if r["nsys_proj_ms"] is None]
    if missing:
        text += f"; no projection for {len(missing)} ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})"
    if cmp.outside_steps:
        text += f"; {cmp.outside_steps} GEMM range(s) in no step range, left out"
    return text


def nsys_table(cmp: Any, limit: int | None = None) -> Table:
    rows = [[safe(r["gemm"]), "-" if r["nsys_proj_ms"] is None else f"{r['nsys_proj_ms']:.4f}", str(r["instances"]),
             f"{r['capture_ms']:.4f}",
             "no projection" if r["capture_vs_nsys"] is None else f"{100 * r['capture_vs_nsys']:+.2f}%"]
            for r in cmp.rows[:limit]]
    return make_table("GEMM times: the capture (CUDA events) beside nsys's projection of each range (its kernel "
                      "records), medians over the same steps", COLUMNS, left=COLUMNS[:1], wrap=COLUMNS[:1],
                      rows=rows, caption=safe(nsys_summary(cmp)))
