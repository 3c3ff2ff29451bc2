"""Rich terminal tables for shapes and captures, and the plain text behind the speedup table
(:func:`speedup_rows`), which the terminal table and report.md each render in their own escaping."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from rich.console import Console
from rich.table import Table

from te_gemm_callback.capture.capture_file import GemmCapture
from te_gemm_callback.capture.graphs import in_graphed
from te_gemm_callback.printable import safe
from te_gemm_callback.shapes import ConfigGemm, ModelConfig, gemm_passes

if TYPE_CHECKING:
    from te_gemm_callback.analysis.verdicts import Report


def human_flops(x: float) -> str:
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.2f} {unit}"
    return f"{x:.0f} "


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def shapes_table(cfg: ModelConfig, gemms: list[ConfigGemm]) -> Table:
    """Per-layer GEMMs of a config (fprop, dgrad, wgrad), with FLOPs per layer and per model."""
    t = Table(title=f"GEMMs per micro-batch: M = {cfg.micro_batch_size} x {cfg.sequence_length} tokens"
                    + (f", TP={cfg.tensor_parallel}" if cfg.tensor_parallel > 1 else ""))
    for col in ("GEMM", "pass", "M x K x N", "calls", "FLOPs/call", "FLOPs/model", "note"):
        t.add_column(col, justify="right" if col.startswith(("FLOP", "calls")) else "left",
                     no_wrap=col != "note")
    layer_total = model_total = 0.0
    for g in gemms:
        for s in gemm_passes(g.fprop):
            total = s.flops * g.count(cfg)
            model_total += total
            layer_total += s.flops if g.per_layer else 0
            note = g.notes
            if g.m_splits:  # one grouped GEMM over all experts; M is the routed token count
                note = (f"grouped: {len(g.m_splits)} experts x ~{g.m_splits[0]} tokens"
                        + (f"; {note}" if note else ""))
            first = s.op == "fprop"
            t.add_row(g.name if first else "", str(s.op), s.mkn, str(g.count(cfg)),
                      human_flops(s.flops), human_flops(total), note if first else "")
        t.add_section()
    t.caption = (f"per layer {human_flops(layer_total)}FLOP, full model ({cfg.num_hidden_layers} layers"
                 f"{' + lm_head' if cfg.vocab_size else ''}) {human_flops(model_total)}FLOP per micro-batch")
    return t


def capture_table(cap: GemmCapture, limit: int | None = None) -> Table:
    """One row per captured GEMM record."""
    timed = any(r.times_ms for r in cap.records)
    # Every string from the capture is escaped: module names come from the user's model (or a file).
    t = Table(title=f"GEMMs captured on {safe(cap.meta.get('device', '?'))} ({len(cap.steps)} step(s))")
    cols = ["module", "pass", "M x K x N", "precision", "calls/step", "GFLOP/step"]
    if timed:
        cols += ["ms/call (median)", "ms/step", "TFLOP/s"]
    for c in cols:
        t.add_column(c, justify="left" if c in ("module", "pass", "M x K x N", "precision") else "right",
                     no_wrap=c != "module")
    rows = cap.records if limit is None else cap.records[:limit]
    graphed = cap.meta.get("graphed_modules") or []
    for r in rows:
        op = r.op + (" (recompute)" if r.recompute else "") + (" (graphed)" if in_graphed(r.module, graphed) else "")
        shape = r.shape.mkn + (f" [{len(r.m_splits[0])} groups]" if r.m_splits else "")
        row = [safe(r.name), safe(op), shape, safe(r.precision), f"{r.calls_per_step:g}",
               f"{r.flops_per_step / 1e9:.3f}"]
        if timed:
            med = r.median_ms
            tflops = r.flops / (med * 1e-3) / 1e12 if med else None
            row += [_ms(med), _ms(r.ms_per_step), "-" if tflops is None else f"{tflops:.1f}"]
        t.add_row(*row)
    if limit is not None and len(cap.records) > limit:
        t.add_row(f"... {len(cap.records) - limit} more", *[""] * (len(cols) - 1))
    caption = f"{human_flops(cap.flops_per_step)}FLOP of GEMMs per step"
    share = capture_share(cap)
    if share is not None:
        caption += f"; {share}"
    from te_gemm_callback.analysis.notes import instrument_note

    note = instrument_note(cap)
    t.caption = safe(caption + (f". {note}" if note else ""))
    return t


def capture_share(cap: GemmCapture) -> str | None:
    """The capture's GEMM time and share in words, on the clocks it was measured with (the host
    clock on a CPU), never a share above 100% (:func:`te_gemm_callback.analysis.checks.share_check`)."""
    from te_gemm_callback.analysis.checks import share_check
    from te_gemm_callback.analysis.notes import GEMM_CLOCK_SHORT, STEP_CLOCK_WORDS

    gemm_ms, step_ms = cap.gemm_ms_per_step(), cap.step_ms()
    if gemm_ms is None or not step_ms:
        return None
    chk = share_check(cap, step_ms, gemm_ms)
    # A step time means a step clock: step_clock() is None only without one.
    clocks = f"GEMM: {GEMM_CLOCK_SHORT[chk['clock']]}, step: {STEP_CLOCK_WORDS[cast(str, cap.step_clock())]}"
    if chk["share"] is None:
        return f"GEMM time {gemm_ms:.2f} ms, GEMM share n/a ({chk['why']}; {clocks})"
    if chk["basis"] == "timed steps":
        return (f"GEMM time {100 * chk['share']:.1f}% of the instrumented step it was timed in ({chk['of_ms']:.2f} ms; "
                f"a {step_ms:.2f} ms clean step; {clocks})")
    return f"GEMM time {gemm_ms:.2f} ms of a {step_ms:.2f} ms step ({100 * chk['share']:.1f}%, {clocks})"


_STDERR = False  # a command prints JSON on standard output (`--json -`): its tables go to stderr


def tables_to_stderr(on: bool = True) -> None:
    global _STDERR
    _STDERR = on


class _FileConsole(Console):
    """A console for a file or a pipe (a job's log): a table takes the width it needs, so that no
    cell is cut to fit a terminal that is not there; text wraps at the console's width."""

    def print(self, *objects: Any, **kw: Any) -> None:
        tables = [o for o in objects if isinstance(o, Table)]
        if not tables:
            super().print(*objects, **kw)
            return
        from rich.measure import Measurement

        need = max(Measurement.get(self, self.options.update(width=100_000), t).maximum for t in tables)
        # print(width=) cannot go past the console's own width: widen the console for this print.
        width = self.width
        self.width = max(width, need)
        try:
            super().print(*objects, **kw)
        finally:
            self.width = width


def console() -> Console:
    """A console for the terminal, or for a file or a pipe one whose tables take the width they need
    (rich cuts them to 80 columns there); on standard error where standard output carries a
    command's JSON."""
    c = Console(stderr=_STDERR)
    return c if c.is_terminal else _FileConsole(width=120, stderr=_STDERR)


def print_table(table: Table, out: Console | None = None) -> None:
    (out or console()).print(table)


def summary_metrics(cap: GemmCapture, prefix: str = "te_gemm/") -> dict[str, Any]:
    """Scalars for a logger (TensorBoard, CSV): what a training dashboard should show."""
    out: dict[str, Any] = {
        f"{prefix}gemm_tflop_per_step": cap.flops_per_step / 1e12,
        f"{prefix}num_gemm_records": len(cap.records),
        f"{prefix}step_ms": cap.step_ms(),
    }
    gemm_ms, step_ms = cap.gemm_ms_per_step(), cap.step_ms()
    if gemm_ms is not None and step_ms:
        from te_gemm_callback.analysis.checks import share_check

        # The share the report states (within the timed steps on a CPU); none where refused. The
        # GEMM time goes beside step_ms only where it is of the same steps' basis (then never
        # above it); else under the name of what it is: the GEMMs' time in the steps they were
        # timed in (the instrumented or kernels step, another step than the clean ones).
        share = share_check(cap, step_ms, gemm_ms)
        out[f"{prefix}gemm_share"] = share["share"]
        out[f"{prefix}gemm_ms_per_step" if share.get("basis") == "step" else f"{prefix}gemm_ms_timed_steps"] = gemm_ms
    elif gemm_ms is not None:
        out[f"{prefix}gemm_ms_timed_steps"] = gemm_ms
    return {k: v for k, v in out.items() if v is not None}


def ranks_table(rows: list[dict[str, Any]]) -> Table:
    """Per-rank differences: step and GEMM time, communication (total and exposed), FLOPs,
    grouped-GEMM rows (MoE load), errors."""
    t = Table(title="Per-rank capture (rank 0 gathered)")
    cols = ("rank", "step ms", "vs median", "GEMM ms", "NCCL ms", "NCCL exposed ms", "GEMM TFLOP/step",
            "grouped rows/step", "error")
    for c in cols:
        t.add_column(c, justify="left" if c in ("rank", "error") else "right")
    for r in rows:
        vs_median = "-" if r["step_vs_median"] is None else f"{r['step_vs_median']:.3f}"
        rows_per_step = "-" if r["grouped_rows_per_step"] is None else f"{r['grouped_rows_per_step']:.0f}"
        t.add_row(str(r["rank"]), _ms(r["step_ms"]), vs_median, _ms(r["gemm_ms"]), _ms(r.get("comm_ms")),
                  _ms(r.get("comm_exposed_ms")), f"{r['gemm_tflop_per_step']:.4f}", rows_per_step,
                  safe(r["error"] or ""))
    window = next((r.get("comm_window") for r in rows if r.get("comm_window")), None) or "a profiled step"
    t.caption = (f"NCCL: kernel time of {window} (torch.profiler), including waits for other ranks; exposed = not "
                 "overlapped by any compute kernel. Grouped rows: rows of all grouped-GEMM forwards (fc1 + fc2 count "
                 "twice)")
    return t


def plan_table(plan: Any, limit: int | None = 40) -> Table:
    """A precision plan: per module its GEMM time in BF16 and in the plan's recipe, and the choice;
    the caption sets the plan's predicted step against BF16 and every single recipe."""
    title = (f"Precision plan: {plan.same_as} everywhere" if plan.same_as else
             f"Precision plan: {plan.recipe}, {len(plan.keep_bf16)} module(s) kept in BF16")
    t = Table(title=safe(title))  # a plan file's names are the user's (or anyone's who edited it)
    for c in ("module", "BF16 ms/step", f"{safe(plan.recipe)} ms/step", "FP8 - BF16", "runs in"):
        t.add_column(c, justify="left" if c in ("module", "runs in") else "right", no_wrap=c != "module")
    rows = sorted(plan.modules, key=lambda m: -(m.fp8_loss_ms if m.fp8_loss_ms is not None else float("inf")))
    for m in rows[:limit] if limit else rows:
        loss = m.fp8_loss_ms
        t.add_row(safe(m.module), _ms(m.bf16_ms), "cannot run" if m.fp8_ms is None else _ms(m.fp8_ms),
                  "-" if loss is None else f"{loss:+.3f}", "BF16" if m.keep_bf16 else safe(plan.recipe),
                  style="yellow" if m.keep_bf16 else None)
    if limit and len(rows) > limit:
        t.add_row(f"... {len(rows) - limit} more", "", "", "", "")
    if plan.predicted_step_ms:
        parts = [f"{k} {v:.2f} ms ({plan.predicted_speedup[k]:.2f}x)" for k, v in plan.predicted_step_ms.items()]
        from te_gemm_callback.analysis.plan import (
            MIN_GAIN,  # here: the plan module loads torch, the CLI's start must not
        )

        same = plan.same_as
        verdict = (f"The plan is {same} everywhere, the best single recipe: no mixed plan gains "
                   f"{100 * MIN_GAIN:g}% of the step." if same else
                   f"Best single recipe: {plan.best_single}; the mixed plan keeps {len(plan.keep_bf16)} module(s) "
                   "in BF16.")
        t.caption = safe("predicted step (Amdahl over the job's GEMM share, autocast-mode microbenchmarks): "
                         + ", ".join(parts) + f". {verdict}")
    return t


def plan_line(plan: Any) -> str:
    """One line for the report: the plan, its predicted step speedup, where to find it."""
    pred = plan.predicted_speedup
    what = (f"{plan.same_as} everywhere (no mixed plan gains enough)" if plan.same_as else
            f"{plan.recipe} with {len(plan.keep_bf16)} module(s) kept in BF16")
    # The plan's figures are GEMMs alone (Amdahl over the GEMM share), not the replay's column.
    tail = (f", predicted {pred['plan']:.2f}x vs best single {plan.best_single} {pred[plan.best_single]:.2f}x "
            "(GEMMs alone)"
            if pred.get("plan") and plan.best_single in pred else
            f", predicted speedup {plan.meta.get('prediction', 'n/a')}")  # says why none is given
    return f"precision plan: {what}{tail}; te-gemm plan RUN_DIR for the per-module table"


# ---------------------------------------------------------------------------------------------
# The speedup table's text: unescaped, so that each renderer escapes it for where it goes (rich
# markup for the terminal, Markdown for report.md) and the two never disagree on a number.


def _x(v: float | None, fmt: str = "{:.2f}x") -> str:
    return "-" if v is None else fmt.format(v)


def _cell(rep: Report, a: Any, name: str, fmt: str = "{:.2f}x") -> str:
    # "n/a" for a refused figure (its why is in the caption), "-" for one never measured.
    return "n/a" if name in rep.withheld(a.recipe) else _x(getattr(a, name), fmt)


def share_text(rep: Report) -> str:
    """The GEMM share as the report may state it: of the step shown, of the steps the GEMMs were
    timed in (host clock), or "n/a (why)"; never a share above 100%."""
    share, basis = rep.gemm_share, rep.meta.get("gemm_share_basis", "step")
    if rep.gemm_ms is None:
        return "GEMMs not timed"
    if share is None:
        why = rep.meta.get("gemm_share_na") or "GEMM time exceeds the step"
        return f"GEMMs {rep.gemm_ms:.2f} ms, GEMM share n/a ({why.split(': ')[0]})"
    if basis == "timed steps":
        of = rep.meta.get("gemm_share_of_ms")
        # A lower bound where that step ran slower than the step shown: it also ran the instruments.
        low = "; a lower bound: that step also ran the capture instruments" if of and of > rep.step_ms else ""
        return (f"GEMMs {100 * share:.1f}% of the instrumented step they were timed in"
                + (f" ({share * of:.2f} of {of:.2f} ms, host clock{low})" if of else " (host clock)"))
    return f"GEMMs {rep.gemm_ms:.2f} ms ({100 * share:.1f}% of the step)"


def rerun_text(a: Any) -> str:
    """Where a rerun's median should fall (the CI widened by sqrt(2), stats.Estimate.rerun): the range
    to hold a user's own timing loop against, since their loop has an error of its own."""
    r = getattr(a, "observed_rerun", None)
    return f"{r[0]:.2f}-{r[1]:.2f}x" if a.recipe != "BF16" and r else ""


def interval_text(a: Any) -> str:
    """The observed speedup's 95% interval, or why there is none (the baseline has none: 1.00x by
    definition)."""
    if a.recipe == "BF16":
        return ""
    if a.observed_ci:
        return f"{a.observed_ci[0]:.2f}-{a.observed_ci[1]:.2f}x"
    if a.observed_rounds:
        return f"({a.observed_rounds} rounds: too few)"
    return ""


@dataclass
class SpeedupRows:
    """The speedup table as plain, unescaped text: ``rows`` one per ``Report.recipes`` (in order),
    ``skipped`` the recipes not run; ``explained`` says what the columns are, ``notes`` what the
    report adds about this run (instrument cost, clocks, timing, why a figure is n/a)."""

    title: str
    columns: list[str]
    rows: list[list[str]]
    skipped: list[str] = field(default_factory=list)
    explained: str = ""
    notes: list[str] = field(default_factory=list)


def recipe_label(rep: Report, recipe: str, sep: str = " ") -> str:
    """One name per run in every table and figure: the BF16 run (FP8 off) of an FP32 model says
    what it ran; a BF16 row that only the microbenchmark has, beside a job of another precision
    with no BF16 run, says so; the job's own row of such a precision says it is the job."""
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
    """How the replay of the job's own step compares with its clean step (the replay's check on
    itself), or None where no replay was made."""
    own = rep.meta.get("replay_own")
    if not own or not own.get("clean_ms"):
        return None
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


def band_text(a: Any) -> str:
    """The replay's band on a recipe's predicted step speedup, or "-"."""
    return f"{a.predicted_band[0]:.2f}-{a.predicted_band[1]:.2f}x" if a.predicted_band else "-"


def speedup_rows(rep: Report) -> SpeedupRows:
    """The GEMM vs step speedup table of a report, as text (:class:`SpeedupRows`)."""
    # The job's precision is what its GEMMs ran (FP32 on an fp32 model), not the key its run is joined on.
    job = rep.meta.get("job_precision") or rep.current_recipe
    title = f"GEMM vs step speedup — job ran {job}: step {rep.step_ms:.2f} ms, {share_text(rep)}"
    ran = rep.meta.get("baseline_ran")
    unfused = any(a.predicted_step_speedup_unfused is not None for a in rep.recipes)
    replayed = any(a.predicted_by == "replay" for a in rep.recipes)
    # The job's own column only where some row has it (an FP32 job's has no FP32 microbenchmark).
    vs_cur = rep.current_recipe != "BF16" and any(a.gemm_speedup_vs_current is not None for a in rep.recipes)
    cols = (["recipe", "GEMM ms (bench)", "GEMM speedup"] + ([f"vs {rep.current_recipe}"] if vs_cur else [])
            + (["predicted step", "band", "bound", "GEMMs alone"] if replayed else ["predicted step"])
            + (["pred. unfused"] if unfused else [])
            + ["observed step", "95% CI", "a rerun", "observed ms"])
    rows = []
    for a in rep.recipes:
        name = recipe_label(rep, a.recipe)
        rows.append([name, _cell(rep, a, "gemm_ms_bench", "{:.2f}"), _cell(rep, a, "gemm_speedup")]
                    + ([_cell(rep, a, "gemm_speedup_vs_current")] if vs_cur else [])
                    + [_cell(rep, a, "predicted_step_speedup")]
                    + ([band_text(a), a.predicted_bound or "-", _cell(rep, a, "predicted_gemms_alone")]
                       if replayed else [])
                    + ([_cell(rep, a, "predicted_step_speedup_unfused")] if unfused else [])
                    + [_cell(rep, a, "observed_step_speedup"), interval_text(a), rerun_text(a),
                       _x(a.observed_step_ms, "{:.2f}")])
    notes = ([f"Note: {rep.meta['step_note']}"] if rep.meta.get("step_note") else []) + \
        [rep.meta[k] for k in ("job_step_note", "framework_note", "clock_note", "duty_note") if rep.meta.get(k)]
    if rep.meta.get("timing"):
        notes.append(f"Timing: {rep.meta['timing']}")
    held = {why for r in (rep.meta.get("withheld") or {}) for f, why in rep.withheld(r).items()
            if f not in ("verdict", "evidence")}
    notes += [f"n/a: {why}" for why in sorted(held)]
    over = f"the BF16 run, which ran {ran}" if ran else "BF16"
    # The rounds the sweep ran (the caption said "from 6 rounds" whatever sweep_rounds was).
    rounds = sorted({a.observed_rounds for a in rep.recipes if a.observed_rounds})
    rounds_text = (f"from {rounds[0]} rounds" if len(rounds) == 1 else
                   f"from {rounds[0]}-{rounds[-1]} rounds" if rounds else "")
    benched = any(a.gemm_ms_bench is not None for a in rep.recipes)
    # Said only for what the table holds: runs compared without a bench or a sweep (te-gemm
    # compare) were captioned with microbenchmarks, an unfused column and rounds they had not.
    gemm_text = (f"{rep.meta.get('mode', 'autocast')} microbenchmarks of the captured shapes" if benched else
                 "the runs' own GEMM times (no microbenchmark)")
    unfused_text = ("; pred. unfused: each GEMM plus a standalone quantization of its inputs (autocast mode)"
                    if unfused else "")
    observed_text = ("whole training steps (optimizer included) in the sweep's alternating rounds, the median of "
                     f"the per-round ratios; 95% CI: its order-statistic interval ({rounds_text}); a rerun: where "
                     "another run's median (a loop of your own) should fall, the CI widened by sqrt(2)" if rounds else
                     "the ratio of the runs' clean-step medians, each run timed on its own (no rounds: no interval)")
    explained = (f"speedups over {over}. GEMM: {gemm_text}. predicted step: "
                 + ("the job's own step replayed as the host issues it and the GPU runs it, with each recipe's "
                    "GEMM times and each module's host and quantization cost; band: GEMM quartiles, module costs "
                    "x0.5-1.5 and the replay's miss on the job's own step; bound: host or GPU in that recipe; "
                    "GEMMs alone: Amdahl with the measured GEMM share" if replayed else
                    "Amdahl with the measured GEMM share, GEMMs alone") + unfused_text
                 + f". observed step: {observed_text}. Attention's QK^T and softmax·V count as non-GEMM time")
    return SpeedupRows(title, cols, rows, list(rep.skipped), explained, notes)


SLOW_FACTOR = 10.0  # a GEMM this many times slower per FLOP than its neighbours' median is flagged
NEIGHBOUR_FLOPS = 4.0  # neighbours: GEMMs within this factor of its FLOPs
MIN_NEIGHBOURS = 3


def slower_than_neighbours(rec: Any, records: list[Any]) -> float | None:
    """How many times slower per FLOP ``rec`` ran than the median of GEMMs of about its size (FLOPs
    within NEIGHBOUR_FLOPS either way), where that is above SLOW_FACTOR: a cell a CPU's noise or a
    first call inflated leads a top-GEMM table otherwise unmarked. None where it is not, or with
    fewer than MIN_NEIGHBOURS neighbours."""
    if not rec.median_ms or not rec.flops:
        return None
    per = [r.median_ms / r.flops for r in records if r is not rec and r.median_ms and r.flops
           and rec.flops / NEIGHBOUR_FLOPS <= r.flops <= rec.flops * NEIGHBOUR_FLOPS]
    if len(per) < MIN_NEIGHBOURS:
        return None
    per.sort()
    k = (rec.median_ms / rec.flops) / per[len(per) // 2]
    return k if k > SLOW_FACTOR else None


def top_gemm_rows(cap: GemmCapture, limit: int = 10) -> tuple[list[str], list[list[str]], int]:
    """The capture's GEMMs that took the most time per step, as text: (columns, rows, how many more).
    The share is of the captured GEMM time per step; an untimed capture (no per-call times) is
    ordered by FLOPs, its times "-"."""
    timed = any(r.times_ms for r in cap.records)
    total = sum(r.ms_per_step or 0.0 for r in cap.records)
    graphed = cap.meta.get("graphed_modules") or []
    key = (lambda r: -(r.ms_per_step or 0.0)) if timed else (lambda r: -r.flops_per_step)
    ranked = sorted(cap.records, key=key)
    rows = []
    for r in ranked[:limit]:
        op = r.op + (" (recompute)" if r.recompute else "") + (" (graphed)" if in_graphed(r.module, graphed) else "")
        shape = r.shape.mkn + (f" [{len(r.m_splits[0])} groups]" if r.m_splits else "")
        ms = r.ms_per_step
        share = f"{100 * ms / total:.1f}%" if ms is not None and total > 0 else "-"
        slow = slower_than_neighbours(r, cap.records)
        if slow is not None:
            share += f" (slow: {slow:.0f}x the time per FLOP of GEMMs its size: a noisy timing?)"
        rows.append([r.name, op, shape, r.precision, _ms(ms), share])
    cols = ["module", "pass", "M x K x N", "precision", "ms/step", "share of GEMM time"]
    return cols, rows, max(len(ranked) - limit, 0)
