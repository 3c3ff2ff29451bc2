"""The report's speedup table as plain text, for the terminal and report.md to escape; the plan's table."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rich.table import Table

from te_gemm_callback.printable import safe
from te_gemm_callback.reporting.capture_tables import ms_text
from te_gemm_callback.reporting.console import make_table

if TYPE_CHECKING:
    from te_gemm_callback.analysis.verdicts import Report


# Amdahl with autocast-mode GEMM times: a variant of GEMMs alone, so named, never of the predicted step.
UNFUSED = "GEMMs alone, unfused"


def plan_table(plan: Any, limit: int | None = 40) -> Table:
    """Per module its GEMM time in BF16 and in the plan's recipe, and the choice; the caption: predicted steps."""
    title = (f"Precision plan: {plan.same_as} everywhere" if plan.same_as else
             f"Precision plan: {plan.recipe}, {len(plan.keep_bf16)} module(s) kept in BF16")
    t = make_table(safe(title), ("module", "BF16 ms/step", f"{safe(plan.recipe)} ms/step", "FP8 - BF16", "runs in"),
                   left=("module", "runs in"), wrap=("module",))
    rows = sorted(plan.modules, key=lambda m: -(m.fp8_loss_ms if m.fp8_loss_ms is not None else float("inf")))
    for m in rows[:limit] if limit else rows:
        loss = m.fp8_loss_ms
        # No FP8 time: a shape TE cannot run in FP8, or a plain torch layer of a TE job (high precision always).
        t.add_row(safe(m.module), ms_text(m.bf16_ms), "stays BF16" if m.fp8_ms is None else ms_text(m.fp8_ms),
                  "-" if loss is None else f"{loss:+.3f}", "BF16" if m.keep_bf16 else safe(plan.recipe),
                  style="yellow" if m.keep_bf16 else None)
    if limit and len(rows) > limit:
        t.add_row(f"... {len(rows) - limit} more", "", "", "", "")
    if plan.predicted_step_ms:
        from te_gemm_callback.analysis.plan import MIN_GAIN  # loads torch: not at the CLI's import
        bound = plan.meta.get("bound") or {}
        parts = [f"{k} {v:.2f} ms ({plan.predicted_speedup[k]:.2f}x{f', {bound[k]}-bound' if k in bound else ''})"
                 for k, v in plan.predicted_step_ms.items()]
        if (why := plan.meta.get("plan_not_replayed")) and "plan" in (alone := plan.meta.get("gemms_alone") or {}):
            parts.append(f"plan: GEMMs alone {alone['plan']:.2f}x ({why})")
        # The choice weighs autocast-mode module costs (what training pays), not the figures above: said so.
        verdict = (f"The plan is {plan.same_as} everywhere, the single recipe of least autocast-mode GEMM time: "
                   f"no mixed plan gains {100 * MIN_GAIN:g}% of the step." if plan.same_as else
                   f"Best single recipe: {plan.best_single}; the mixed plan keeps {len(plan.keep_bf16)} module(s) "
                   "in BF16.")
        # Only a replay is a predicted step; without one these figures are GEMMs alone, and headed so.
        how = str(plan.meta.get("prediction"))
        head = f"predicted step ({how})" if bound else f"GEMMs alone, no replay ({how.removeprefix('GEMMs alone: ')})"
        t.caption = safe(f"{head}: " + ", ".join(parts) + f". {verdict}")
    return t


def plan_line(plan: Any) -> str:
    """The plan, its predicted step speedup and where to find it, in one line."""
    pred, bound, best = plan.predicted_speedup, plan.meta.get("bound") or {}, plan.best_single
    what = (f"{plan.same_as} everywhere (no mixed plan gains enough)" if plan.same_as else
            f"{plan.recipe} with {len(plan.keep_bf16)} module(s) kept in BF16")
    alone = (plan.meta.get("gemms_alone") or {}).get("plan")
    if pred.get("plan") and best in pred:
        # The replay where the report has one, as its predicted column; else GEMMs alone, named so.
        how = (f"replay, {bound['plan']}-bound, as the report's predicted column" if bound else
               "Amdahl over the GEMM share, as the report's GEMMs alone: no replay")
        tail = f", {'predicted' if bound else 'GEMMs alone'} {pred['plan']:.2f}x vs best single {best} " \
               f"{pred[best]:.2f}x ({how})"
    elif bound and alone and best in pred:
        tail = (f", GEMMs alone {alone:.2f}x ({plan.meta.get('plan_not_replayed')}); best single {best} predicted "
                f"{pred[best]:.2f}x (replay, {bound[best]}-bound)")
    else:
        tail = f", predicted speedup {plan.meta.get('prediction', 'n/a')}"  # says why none is given
    return f"precision plan: {what}{tail}; te-gemm plan RUN_DIR for the per-module table"


def predicted_drawn(rep: Report) -> bool:
    """Whether speedups.png has predicted bars: a row with a predicted step, or one the checks refused ("n/a")."""
    return any(a.predicted_step_speedup or "predicted_step_speedup" in rep.withheld(a.recipe) for a in rep.recipes)


def speedup_title(rep: Report) -> str:
    """What speedups.png shows: without a replay no predicted step, and a title that promised one misled."""
    return ("Predicted vs observed step speedup" if predicted_drawn(rep) else
            "GEMM and observed step speedup (no replay, so no predicted step)")


def x_text(v: float | None, fmt: str = "{:.2f}x") -> str:
    """``v`` in ``fmt`` (a speedup by default), "-" for None."""
    return "-" if v is None else fmt.format(v)


def _cell(rep: Report, a: Any, name: str, fmt: str = "{:.2f}x") -> str:
    # "n/a" for a refused figure (its why is in the caption), "-" for one never measured.
    return "n/a" if name in rep.withheld(a.recipe) else x_text(getattr(a, name), fmt)


def withheld_reasons(rep: Report) -> list[str]:
    """Why the report's checks refused figures of its rows (verdicts and evidence aside), once each."""
    return sorted({why for r in (rep.meta.get("withheld") or {}) for f, why in rep.withheld(r).items()
                   if f not in ("verdict", "evidence")})


def share_text(rep: Report) -> str:
    """The GEMM share of the step shown, or of the steps the GEMMs were timed in, or "n/a (why)"."""
    share, basis = rep.gemm_share, rep.meta.get("gemm_share_basis", "step")
    if rep.gemm_ms is None:
        return "GEMMs not timed"
    if share is None:
        why = rep.meta.get("gemm_share_na") or "GEMM time exceeds the step"
        return f"GEMMs {rep.gemm_ms:.2f} ms, GEMM share n/a ({why.split(': ')[0]})"
    if basis == "timed steps":
        of = rep.meta.get("gemm_share_of_ms")
        low = "; a lower bound: that step also ran the capture instruments" if of and of > rep.step_ms else ""
        return (f"GEMMs {100 * share:.1f}% of the instrumented step they were timed in"
                + (f" ({share * of:.2f} of {of:.2f} ms, host clock{low})" if of else " (host clock)"))
    # The sweep's run of the job's recipe is not the job's own steps (the log's summary gives those): said whose.
    whose = "that run's step" if rep.meta.get("base_run") == "sweep" else "the step"
    return f"GEMMs {rep.gemm_ms:.2f} ms ({100 * share:.1f}% of {whose})"


def _span(r: Any) -> str:
    return f"{r[0]:.2f}-{r[1]:.2f}x" if r else ""


def rerun_text(a: Any) -> str:
    """Where a rerun's median should fall (the CI widened by sqrt(2)): what a user's own loop is held to."""
    return "" if a.recipe == "BF16" else _span(getattr(a, "observed_rerun", None))


def interval_text(a: Any) -> str:
    """The observed speedup's 95% interval, or why there is none (BF16 is 1.00x by definition)."""
    too_few = f"({a.observed_rounds} rounds: too few)" if a.observed_rounds else ""
    return "" if a.recipe == "BF16" else _span(a.observed_ci) or too_few


@dataclass
class SpeedupRows:
    """The speedup table as unescaped text: a row per ``Report.recipes``, the recipes not run, and notes."""
    title: str
    columns: list[str]
    rows: list[list[str]]
    skipped: list[str] = field(default_factory=list)
    explained: str = ""
    notes: list[str] = field(default_factory=list)


def recipe_label(rep: Report, recipe: str, sep: str = " ") -> str:
    """One name per run in every table and figure, saying what a BF16 run ran or that a row stands in for it."""
    ran = rep.meta.get("baseline_ran")
    if recipe == "BF16" and ran:
        return f"BF16{sep}(ran {ran})"
    job = rep.meta.get("job_precision") or rep.current_recipe
    observed = {a.recipe for a in rep.recipes if a.observed_step_ms is not None}
    if recipe == "BF16" and job != "BF16" and "BF16" not in observed:
        return f"BF16{sep}(microbenchmark only)"
    if recipe == job and job != "BF16" and "BF16" not in observed:
        return f"{recipe}{sep}(the job)"
    return recipe


def replay_own_line(rep: Report) -> str | None:
    """The replay of the job's own step against its clean step (its check on itself), or None."""
    own = rep.meta.get("replay_own")
    if not own or not own.get("clean_ms"):
        return None
    if not own.get("taxes_measured", True):
        # The recording's own cost stays in every host gap: a miss would be the recording's, not the replay's.
        return (f"replay of the job's own step: not checked against its clean step {own['clean_ms']:.2f} ms: the "
                "recording's cost per runtime call and per op was not measured (te-gemm bench measures it with the "
                "module costs, into bench.json), so it cannot be taken off the kernels step's host times")
    scale = own.get("host_scale") or 1.0
    scaled = (f"; its host times then scaled x{scale:.2f} to the clean step (the profiler's callbacks ran in "
              "every host gap of the kernels step)") if scale != 1.0 else ""
    mods = rep.meta.get("module_host")
    te_host = (f"; TE modules' host work {mods['job_ms']:.1f} ms a step ({mods['modules']} modules, forward and "
               f"backward, read on the settle step), the module benchmark's {mods['bench_ms']:.1f} ms"
               if mods else "")
    return (f"replay of the job's own step: {own['replay_ms']:.2f} ms against its clean step {own['clean_ms']:.2f} ms "
            f"({100 * (own['replay_ms'] / own['clean_ms'] - 1):+.1f}%, {own['bound']}-bound; the recording's measured "
            f"cost per call and per op taken off){scaled}{te_host}")


def job_head(rep: Report) -> str:
    """What the job ran, and the step and GEMM time of the run the speedups stand on (with a sweep: its run there)."""
    # The job's precision is what its GEMMs ran (FP32 on an fp32 model), not the key its run is joined on.
    job = rep.meta.get("job_precision") or rep.current_recipe
    where = "; its run in the sweep:" if rep.meta.get("base_run") == "sweep" else ":"
    return f"job ran {job}{where} step {rep.step_ms:.2f} ms, {share_text(rep)}"


def speedup_rows(rep: Report) -> SpeedupRows:
    """The GEMM vs step speedup table of a report, as text."""
    title = f"GEMM vs step speedup — {job_head(rep)}"
    ran = rep.meta.get("baseline_ran")
    unfused = any(a.predicted_step_speedup_unfused is not None for a in rep.recipes)
    replayed = any(a.predicted_by == "replay" for a in rep.recipes)
    alone = any(a.predicted_gemms_alone is not None for a in rep.recipes)
    # The job's own column only where some row has it (an FP32 job's has no FP32 microbenchmark).
    vs_cur = rep.current_recipe != "BF16" and any(a.gemm_speedup_vs_current is not None for a in rep.recipes)
    benched = any(a.gemm_ms_bench is not None for a in rep.recipes)
    # Without a bench the GEMM speedups are the runs' own (in-job) GEMM times: the header says so.
    cols = (["recipe", "GEMM ms (bench)" if benched else "GEMM ms (in job)",
             "GEMM speedup" if benched else "GEMM speedup (in job)"]
            + ([f"vs {rep.current_recipe}"] if vs_cur else [])
            + (["predicted step", "band", "bound"] if replayed else ["predicted step"])
            + (["GEMMs alone"] if alone else [])
            + ([UNFUSED] if unfused else [])
            + ["observed step", "95% CI", "a rerun", "observed ms"])
    # No bench (te-gemm compare): the runs' own GEMM times.
    rows = [[recipe_label(rep, a.recipe), _cell(rep, a, "gemm_ms_bench" if benched else "observed_gemm_ms", "{:.2f}"),
             _cell(rep, a, "gemm_speedup")]
            + ([_cell(rep, a, "gemm_speedup_vs_current")] if vs_cur else [])
            + [_cell(rep, a, "predicted_step_speedup")]
            + ([_span(a.predicted_band) or "-", a.predicted_bound or "-"] if replayed else [])
            + ([_cell(rep, a, "predicted_gemms_alone")] if alone else [])
            + ([_cell(rep, a, "predicted_step_speedup_unfused")] if unfused else [])
            + [_cell(rep, a, "observed_step_speedup"), interval_text(a), rerun_text(a),
               x_text(a.observed_step_ms, "{:.2f}")] for a in rep.recipes]
    labelled = (("Note: ", "step_note"), ("", "job_step_note"), ("", "framework_note"), ("", "clock_note"),
                ("", "duty_note"), ("Timing: ", "timing"))
    notes = [f"{label}{rep.meta[k]}" for label, k in labelled if rep.meta.get(k)]
    notes += [f"n/a: {why}" for why in withheld_reasons(rep)]
    over = f"the BF16 run, which ran {ran}" if ran else "BF16"
    rounds = sorted({a.observed_rounds for a in rep.recipes if a.observed_rounds})
    rounds_text = (f"from {rounds[0]} rounds" if len(rounds) == 1 else
                   f"from {rounds[0]}-{rounds[-1]} rounds" if rounds else "")
    # Said only for what the table holds (te-gemm compare: no bench, no sweep).
    gemm_text = (f"{rep.meta.get('mode', 'autocast')} microbenchmarks of the captured shapes" if benched else
                 "the runs' own GEMM times (kernel records of each run's kernels step; no microbenchmark)")
    unfused_text = (f"; {UNFUSED}: the same bound with every quantization unfused, each GEMM plus a standalone "
                    "quantization of its inputs (autocast mode)" if unfused else "")
    observed_text = ("whole training steps (optimizer included) in the sweep's alternating rounds, the median of "
                     f"the per-round ratios; 95% CI: its order-statistic interval ({rounds_text}); a rerun: where "
                     "another run's median (a loop of your own) should fall, the CI widened by sqrt(2)" if rounds else
                     "the ratio of the runs' clean-step medians, each run timed on its own (no rounds: no interval)")
    predicted_text = ("the job's own step replayed as the host issues it and the GPU runs it, with each recipe's "
                      "GEMM times and each module's host and quantization cost; band: GEMM quartiles, module costs "
                      "x0.5-1.5 and the replay's miss on the job's own step; bound: host or GPU in that recipe"
                      if replayed else f"none, no replay: {rep.meta.get('no_replay') or 'not replayed'}")
    alone_text = ("; GEMMs alone: Amdahl with the measured GEMM share and these GEMM speedups, the rest of the step "
                  "held fixed (a bound, not a prediction of the step)" if alone else "")
    explained = (f"speedups over {over}. GEMM: {gemm_text}. predicted step: {predicted_text}{alone_text}"
                 + unfused_text
                 + f". observed step: {observed_text}. Attention's QK^T and softmax·V count as non-GEMM time")
    return SpeedupRows(title, cols, rows, list(rep.skipped), explained, notes)
