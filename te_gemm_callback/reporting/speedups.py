"""An analysed run drawn and written (:func:`write_run`): tables, figures, report.json, report.md, trace."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from rich.console import Group
from rich.panel import Panel
from rich.table import Table

from te_gemm_callback.files.jsonio import KindCheck, check_target, json_kind, write_json
from te_gemm_callback.files.png import PNG_KIND, plain_name
from te_gemm_callback.precisions import skipped_lines
from te_gemm_callback.printable import plain, safe
from te_gemm_callback.projection import PROJECTION_SCHEMA
from te_gemm_callback.reporting.bench_tables import totals_table
from te_gemm_callback.reporting.capture_tables import ranks_table
from te_gemm_callback.reporting.console import make_table
from te_gemm_callback.reporting.figures import (
    ranks_figure,
    speedup_figure,
    stacked_gemm_figure,
    step_split_figure,
    step_split_title,
)
from te_gemm_callback.reporting.markdown import MD_KIND, write_report_md
from te_gemm_callback.reporting.projection_tables import projection_table
from te_gemm_callback.reporting.report_tables import plan_line, replay_own_line, share_text, speedup_rows
from te_gemm_callback.sweep.plan import SCHEMA as PLAN_SCHEMA
from te_gemm_callback.sweep.plan import YAML_KIND, write_plan

if TYPE_CHECKING:
    from te_gemm_callback.analysis.runs import RunReport
    from te_gemm_callback.analysis.verdicts import Report
    from te_gemm_callback.capture import GemmCapture
    from te_gemm_callback.microbench.results import BenchResults

# reporting.trace may be missing from an install: imported where it is used, inside a try.

# Also importable from here: the figures' names, plan_line and share_text.
__all__ = ["REPORT_FIGURES", "REPORT_SCHEMA", "bench_modes", "plan_line", "remove_stale_figures",
           "report_table", "report_targets", "share_text", "speedup_figure", "step_split_figure",
           "step_split_title", "verdict_panel", "write_report_json", "write_run"]

log = logging.getLogger("te_gemm_callback")
REPORT_SCHEMA = "te-gemm-report/1"
# Every figure a report may draw, the only ones removed as stale (te-gemm bench -o names others).
REPORT_FIGURES = ("speedups.png", "step_split.png", "gemm_autocast.png", "gemm_prequantized.png", "ranks.png")


def report_table(rep: Report) -> Table:
    """The speedup table for the terminal."""
    s = speedup_rows(rep)
    t = make_table(safe(s.title), map(safe, s.columns), left=("recipe",), rows=[[*map(safe, row)] for row in s.rows],
                   caption=safe(s.explained + "".join(f". {n}" for n in s.notes)))
    for r in s.skipped:  # why each was skipped: the verdict panel says
        t.add_row(safe(r), "not run", *[""] * (len(s.columns) - 2), style="dim")
    return t


def verdict_panel(rep: Report) -> Panel:
    # What the checks refused to state comes first: a reader sees it before any figure it touches.
    lines = [f"[yellow]check: {safe(w)}[/yellow]" for w in rep.warnings]
    if (own := replay_own_line(rep)) is not None:
        lines.append(f"[dim]{safe(own)}[/dim]")
    for a in rep.recipes:
        if a.recipe == "BF16":
            continue
        lines.append(f"[b]{safe(a.recipe)}[/b]: {safe(a.verdict)}")
        lines += [f"   • {safe(e)}" for e in a.evidence]
    for line in skipped_lines(rep.skipped):  # one line per cause: on a CPU every TE recipe shares one
        lines.append(f"[dim]{safe(line)}[/dim]")
    if not any(a.recipe != "BF16" for a in rep.recipes) and not rep.skipped:
        lines.append("only BF16 was measured")
    return Panel(Group(*lines), title="verdicts")


def write_report_json(rep: Report, path: str | Path) -> Path:
    return write_json(path, rep.to_dict(), schema=REPORT_SCHEMA)


def write_run(rr: RunReport, run_dir: str | Path, out: Any = None) -> dict[str, Path]:
    """Draw and write an analysed run into ``run_dir``, report.md last, and print it to ``out`` if given; returns
    the files written, by name. An extra (plan, projection, trace) that cannot be written is skipped, said."""
    root = Path(run_dir)
    rep, bench, ranks, plan = rr.report, rr.bench, rr.ranks, rr.plan
    modes = bench_modes(bench) if bench is not None else []
    targets = report_targets(root, modes, bool(ranks))  # all refused before any is written
    files = {"report": write_report_json(rep, targets["report"]),
             "speedups": speedup_figure(rep, targets["speedups"]),
             "step_split": step_split_figure(rep, targets["step_split"], rr.kernels)}
    for mode in modes:  # none without a bench
        files[f"gemm_{mode}"] = stacked_gemm_figure(cast("BenchResults", bench), rr.items, mode,
                                                    targets[f"gemm_{mode}"])
    if ranks:
        files["ranks"] = ranks_figure(ranks, targets["ranks"])
    # Only once this report's figures are all written: a report that fails halfway removes nothing.
    removed = remove_stale_figures(root, files.values())
    if plan is not None:
        try:
            files["plan"], files["plan_nvdlfw"] = write_plan(plan, root / "precision_plan.json",
                                                             root / "precision_plan_nvdlfw.yaml")
        except ValueError as err:  # a file of the user's where the plan goes: the report itself stands
            log.warning("te-gemm: precision plan not written: %s", err)
    for rp in rr.projections:
        try:
            files[f"projection_{rp.target.key}"] = write_json(root / f"projection-{rp.target.key}.json", rp.to_dict(),
                                                              schema=PROJECTION_SCHEMA, root=root)
        except ValueError as err:  # a file of the user's under that name: the report stands
            log.warning("te-gemm: projection-%s.json not written: %s", rp.target.key, err)
    if (trace := _write_trace(rr.job, root / "trace.json")) is not None:
        files["trace"] = trace
    removed += remove_stale_extras(root, files.values())
    files["report_md"] = write_report_md(rr, targets["report_md"], files, root)  # last: it links the above
    if out is not None:
        _print_run(rr, modes, files, out, removed)
    return files


def _write_trace(cap: GemmCapture, path: Path) -> Path | None:
    """The capture's kernel timeline as a Chrome trace, or None (no timeline or trace writer, or writing failed)."""
    try:
        from te_gemm_callback.reporting.trace import write_trace
        return write_trace(cap, path)
    except Exception as err:  # any failure of an extra: logged, never fatal to the report
        # No trace writer in this install: nothing to say. One that is there but cannot load: said.
        if not (isinstance(err, ModuleNotFoundError) and err.name == "te_gemm_callback.reporting.trace"):
            log.warning("te-gemm: trace.json not written: %s", plain(err))
        return None


def _remove_ours(root: Path, kinds: Sequence[tuple[str, KindCheck]], written: Any) -> list[Path]:
    """Remove the regular files named in ``kinds`` that this report did not write and their kind check takes."""
    keep = {Path(p).name for p in written}
    gone = []
    for name, kind in kinds:
        p = root / name
        if name in keep or p.is_symlink() or not p.is_file():
            continue
        try:
            kind(p)  # raises ValueError unless the file is one of ours
            p.unlink()
            gone.append(p)
        except ValueError:
            pass
        except OSError as err:  # a read-only folder: the report itself stands
            log.warning("te-gemm: could not remove the stale %s: %s", plain(p), err.strerror or err)
    return gone


def remove_stale_figures(root: Path, written: Any = ()) -> list[Path]:
    """Remove and return our figures in ``root`` that this report did not write (they would pass for its own)."""
    gone = _remove_ours(root, [(name, PNG_KIND) for name in REPORT_FIGURES], written)
    if gone:
        log.warning("te-gemm: removed %s: figure(s) of an earlier report that this report's inputs no longer "
                    "produce", ", ".join(plain(p) for p in gone))
    return gone


def remove_stale_extras(root: Path, written: Any = ()) -> list[Path]:
    """Remove and return an earlier report's trace and plan; earlier projections (asked for) are named, left."""
    extras = [("precision_plan.json", json_kind(PLAN_SCHEMA)), ("precision_plan_nvdlfw.yaml", YAML_KIND)]
    with contextlib.suppress(ImportError):  # no trace writer in this install (_write_trace): its files are left
        from te_gemm_callback.reporting.trace import TRACE_SCHEMA
        extras.append(("trace.json", json_kind(TRACE_SCHEMA)))
    gone = _remove_ours(root, extras, written)
    keep = {Path(p).name for p in written}
    older = sorted(p.name for p in root.glob("projection-*.json") if p.name not in keep)
    if older:
        log.warning("te-gemm: %s in %s: made before this report (te-gemm project RUN_DIR --gpu GPU makes it again)",
                    ", ".join(older), plain(root))
    return gone


def _print_run(rr: RunReport, modes: list[str], files: dict[str, Path], out: Any,
               removed: Sequence[Path] = ()) -> None:
    rep, bench = rr.report, rr.bench
    if rr.ranks:
        out.print(ranks_table(rr.ranks))
    for mode in modes:  # TE's benchmark_gemm.py per-GEMM table, on the job's real shapes (none without a bench)
        out.print(totals_table(cast("BenchResults", bench), rr.items, mode))
    out.print(report_table(rep))
    out.print(verdict_panel(rep))
    for rp in rr.projections:
        out.print(projection_table(rp))
    if rr.plan is not None:
        out.print(safe(plan_line(rr.plan)))
    for key in rr.host_bound_notes:
        out.print(f"[yellow]warning: {safe(rep.meta[key])}[/yellow]")
    for name, path in files.items():
        out.print(f"{name}: {safe(path)}")
    for path in removed:
        out.print(f"removed {safe(path)}: a figure of an earlier report that these inputs no longer produce")


def bench_modes(bench: Any) -> list[str]:
    """The bench's modes, each naming a figure ``gemm_<mode>.png`` (a string would be drawn letter by letter)."""
    modes = bench.meta.get("modes", ["autocast"])
    if not isinstance(modes, list) or not all(isinstance(m, str) for m in modes):
        raise ValueError(f"bench.json: meta.modes must be a list of mode names, got {modes!r}")
    return modes  # each checked as a file name by report_targets


def report_targets(root: Path, modes: Sequence[str] = (), ranks: bool = False) -> dict[str, Path]:
    """The files a report writes into ``root``, each checked (:func:`check_target`) before any is written."""
    names = {"report": "report.json", "report_md": "report.md", "speedups": "speedups.png",
             "step_split": "step_split.png", **{f"gemm_{m}": f"gemm_{m}.png" for m in modes},
             **({"ranks": "ranks.png"} if ranks else {})}
    # A mode from a hand-edited bench.json could hold "/" or "..": the figure would land elsewhere.
    out = {key: root / plain_name(name) for key, name in names.items()}
    kinds = {"report": json_kind(REPORT_SCHEMA), "report_md": MD_KIND}
    for key, path in out.items():
        check_target(path, kinds.get(key, PNG_KIND))
    return out
