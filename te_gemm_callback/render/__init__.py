"""Rendering: rich tables (and, with the analysis, figures and JSON)."""

from .tables import capture_table, human_flops, print_table, shapes_table, summary_metrics

__all__ = ["capture_table", "human_flops", "print_table", "shapes_table", "summary_metrics"]
