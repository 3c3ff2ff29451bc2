"""The report in a few lines for the job's log, read from report.json: speedups and verdict per recipe."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from te_gemm_callback.capture.capture_file import GemmCapture
from te_gemm_callback.files.jsonio import read_json
from te_gemm_callback.printable import plain
from te_gemm_callback.reporting.capture_tables import summary_metrics

MAX_CHECKS = 3  # the report's checks said in the log; report.md has them all
MAX_LINES = 25  # what a training log takes of ours by default


def _x(v: Any) -> str:
    return f"{v:.2f}x" if isinstance(v, (int, float)) else "-"


def _range(r: Any) -> str:
    return f" ({r[0]:.2f}-{r[1]:.2f})" if isinstance(r, (list, tuple)) and len(r) == 2 else ""


def _job_figures(path: Path) -> tuple[float | None, float | None, str | None] | None:
    """(step ms, GEMM share, its basis) of the job's own capture, as the logger has them; None if unreadable."""
    try:
        m = summary_metrics(GemmCapture.load(path), prefix="")
        return m.get("step_ms"), m.get("gemm_share"), "step" if "gemm_ms_per_step" in m else "timed steps"
    except ValueError:  # load's every refusal of a missing or damaged file: the report's figures stand
        return None


def summary_lines(report_json: str | Path, report_md: str | Path | None = None,
                  tables_shown: bool = False) -> list[str]:
    """At most MAX_LINES lines, none over about 120 characters: the decision, not the tables."""
    rep = read_json(report_json, "report.json")
    meta = rep.get("meta") or {}
    base = meta.get("baseline_ran")
    # The speedups' base: the BF16 run's step (report.json's own step_ms is the job's recipe's run).
    bf16: dict[str, Any] = next((r for r in rep.get("recipes", []) if r.get("recipe") == "BF16"), {})
    base_ms = bf16.get("observed_step_ms") or (rep.get("step_ms") if rep.get("current_recipe") == "BF16" else None)
    head = f"te-gemm: {plain(meta.get('job_precision') or rep.get('current_recipe', '?'))} job"
    # The job's own step and share as te_gemm/step_ms and te_gemm/gemm_share log them, else the report's.
    own = _job_figures(Path(report_json).with_name("gemm_capture.json"))
    step, share, basis = own or (rep.get("step_ms"), rep.get("gemm_share"), meta.get("gemm_share_basis"))
    if isinstance(step, (int, float)):
        head += f", step {step:.1f} ms"
    if isinstance(share, (int, float)):
        # Timed on another step than the clean ones (a CPU's instrumented step): a lower bound.
        head += f", GEMMs {'' if basis in (None, 'step') else 'at least '}{100 * share:.0f}% of it"
    swept = own is not None and isinstance(base_ms, (int, float)) and isinstance(step, (int, float)) \
        and abs(base_ms - step) > 0.005 * step
    # An FP32 model's BF16 run ran FP32: the head names what the speedups are over, line 2 says why.
    lines = [head + f"; speedups over {plain(base) if base else 'BF16'}: GEMMs / predicted step / observed step: "
                    "verdict"]
    run = f"the sweep's BF16 run, step {base_ms:.1f} ms" if swept else "its BF16 run"
    if base:
        lines.append(f"  ({run}, FP8 off, ran {plain(base)}: every speedup here is over {plain(base)})")
    elif swept:
        lines.append(f"  (every speedup here is over {run})")
    # The report's checks, but the one line 2 already says.
    checks = [plain(str(w)) for w in meta.get("warnings") or []
              if not str(w).startswith("the BF16 run (FP8 off) ran")][:MAX_CHECKS]
    room = MAX_LINES - 6 - len(checks)
    recipes = [r for r in rep.get("recipes", []) if r.get("recipe") != "BF16"]
    for r in recipes[:room]:
        pred = _x(r.get("predicted_step_speedup")) + _range(r.get("predicted_band"))
        if r.get("predicted_bound"):
            pred += f" {r['predicted_bound']}-bound"
        obs = _x(r.get("observed_step_speedup")) + _range(r.get("observed_ci"))
        verdict = plain(str(r.get("verdict") or "")).split(" (")[0]
        lines.append(f"  {plain(r['recipe'])}: {_x(r.get('gemm_speedup'))} / {pred} / {obs}: {verdict}")
    if len(recipes) > room:
        lines.append(f"  ... {len(recipes) - room} more recipe(s) in the report")
    lines += [f"  check: {w if len(w) <= 110 else w[:107] + '...'}" for w in checks]
    if mfu := meta.get("mfu"):
        lines.append("  precision-aware MFU: " + ", ".join(f"{plain(r)} {100 * v:.0f}%" for r, v in mfu.items()))
    if skipped := rep.get("skipped"):
        lines.append(f"  not run here: {', '.join(plain(k) for k in sorted(skipped))} (the report says why)")
    if str(meta.get("device", "")).startswith("CPU"):
        lines.append("  on a CPU: these timings exercise the tool, they say nothing of FP8 on a GPU")
    where = report_md or Path(report_json).with_name("report.md")
    hint = "" if tables_shown else " (verbose=True prints its tables here)"
    lines.append(f"te-gemm: the full report: {plain(where)}{hint}")
    return lines[:MAX_LINES]
