"""Reporting: draws and writes what :mod:`te_gemm_callback.analysis` hands it (tables, figures, report.json,
report.md); it computes no result of its own, and leaves the user's matplotlib backend as they chose it."""

from te_gemm_callback.reporting.capture_tables import capture_table, human_flops, shapes_table, summary_metrics
from te_gemm_callback.reporting.console import print_table

__all__ = ["capture_table", "human_flops", "print_table", "shapes_table", "summary_metrics"]
