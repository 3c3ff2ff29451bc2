"""What a schedule hands out: the adapters' view of its results, and the sweep's logger scalars."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from te_gemm_callback.analysis.verdicts import analyze
from te_gemm_callback.precisions import skipped_lines, warn_once

if TYPE_CHECKING:
    from te_gemm_callback.schedule import GemmSchedule


class ScheduleResults:
    """What a framework adapter shows of its :class:`GemmSchedule` (``self.schedule``)."""

    schedule: GemmSchedule
    capture = property(lambda self: self.schedule.capture, doc="The published capture (None before the window ends).")
    path = property(lambda self: self.schedule.path, doc="Where the capture was written.")
    sweep_result = property(lambda self: self.schedule.sweep_result, doc="The recipe sweep's result (None without).")
    metrics = property(lambda self: self.schedule.metrics, doc="Summary and sweep metrics, as logged.")
    run_id = property(lambda self: self.schedule.run_id, doc="meta['run_id'] of the capture and its sweep's.")
    rank_summary = property(lambda self: self.schedule.rank_summary, doc="Per-rank summary of a multi-process job.")
    done = property(lambda self: self.schedule.done, doc="The window is over (captured, or given up).")
    steps_seen = property(lambda self: self.schedule.steps_seen, doc="Optimizer steps completed while watched.")
    output_dir = property(lambda self: self.schedule.report_config.output_dir, doc="The run folder.")
    sweep = property(lambda self: self.schedule.sweep_config.recipes, doc="The recipes to sweep, in TE's names.")
    sweep_plan = property(lambda self: self.schedule.sweep_config.plan, doc="The precision plan to sweep, loaded.")


def sweep_metrics(res: Any) -> dict[str, float]:
    """Logger scalars from a sweep's result: observed step time and speedup per recipe."""
    for line in skipped_lines(res.skipped):  # one line per cause, once per process
        warn_once(f"te-gemm: sweep: {line}")
    caps = list(res.captures.values())
    if not caps:
        return {}
    try:
        rep = analyze(caps[0], None, caps[1:])
    except ValueError:
        return {}
    return {f"te_gemm/{name}/{a.recipe}": v for a in rep.recipes
            for name, v in (("observed_step_speedup", a.observed_step_speedup), ("sweep_step_ms", a.observed_step_ms))
            if v is not None}
