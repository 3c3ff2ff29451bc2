"""Predicted GEMM speedup against observed step speedup, with a verdict per recipe.

Inputs are measurements only: captures of the live job (step time, in-job GEMM time, operand
precisions), one per recipe where available, and microbenchmark results on the captured shapes.

Prediction (Amdahl's law, Amdahl 1967; docs/benchmark-methodology.md). With the job observed in
recipe r0 (step time T, in-job GEMM time G) and microbenchmarked GEMM time B(r) per step for each
recipe r, the step time if only the GEMMs changed is

    T_pred(r) = T - G + G * B(r) / B(r0)

and the predicted step speedup of r over BF16 is T_pred(BF16) / T_pred(r). For r0 = BF16 this is
T / (T - G + G / s_r) with s_r = B(BF16) / B(r), the GEMM speedup.

G is GEMM kernel time (the TE interceptor brackets general_gemm; quantization runs before it), so
B comes from the pre-quantized microbenchmarks (GEMM kernels alone) when they exist: "the GEMMs
alone". What the job then gains or loses outside the GEMMs (quantization and cast kernels, amax
reductions, FP8 outputs of fused norm and activation kernels that move half the bytes) is the
residual, read from the observed runs' non-GEMM time and kernel categories. The autocast-mode
microbenchmarks (GEMM plus a standalone quantization of its inputs) give a second, pessimistic
prediction: every cast unfused.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from .bench.cells import WorkItem, items_from_capture
from .bench.results import BenchResults, fallback_items, measured_items, step_ms as bench_step_ms
from .capture.record import GemmCapture
from .checks import apply_withheld, precision_ran, report_checks
from .notes import gemm_timing, step_timing
from .precisions import RECIPE_FAMILY, padded_splits, row_alignment
from .stats import Estimate, estimate

GEMM_BOUND_TOL = 0.05  # |observed / predicted - 1| within this: the GEMMs explain the step
NO_GAIN = 1.05  # GEMM speedup below this: no gain at these shapes


def amdahl(step_ms: float, gemm_ms: float, gemm_speedup: float) -> float:
    """Step speedup if only the GEMM part (gemm_ms of step_ms) gets gemm_speedup times faster."""
    if step_ms <= 0 or gemm_speedup <= 0 or not 0 <= gemm_ms <= step_ms:
        raise ValueError(f"need 0 <= gemm_ms <= step_ms and a positive speedup, got {gemm_ms}, {step_ms}, {gemm_speedup}")
    return step_ms / (step_ms - gemm_ms + gemm_ms / gemm_speedup)


def capture_recipe(cap: GemmCapture) -> str:
    """The recipe a capture ran in: the one its file names (a sweep's entry, the key speedups are
    joined on; "BF16" is the sweep's FP8-off baseline, FP32 on an fp32 model, which the report's
    checks say), else read from its GEMMs' operand precisions (:func:`checks.precision_ran`): an
    FP8 recipe, or the high precision that ran: BF16, FP16 or FP32 (an fp32 job is not a BF16 one)."""
    if cap.meta.get("recipe"):
        return cap.meta["recipe"]
    return precision_ran(cap)


@dataclass
class Observed:
    """What one captured run measured."""

    recipe: str
    step_ms: float
    gemm_ms: float | None
    unquantized: list[str] = field(default_factory=list)  # GEMMs left in high precision
    kernels: dict[str, float] = field(default_factory=dict)  # kernel ms per step by category
    round_ms: dict[int, float] = field(default_factory=dict)  # a sweep's alternating rounds: median ms each
    fwd_bwd_ms: float | None = None  # a sweep step's forward+backward part (median), before its optimizer step

    @property
    def non_gemm_ms(self) -> float | None:
        return None if self.gemm_ms is None else self.step_ms - self.gemm_ms


def round_speedups(base: Observed, run: Observed) -> list[float]:
    """Step speedup of ``run`` over ``base`` in each sweep round both ran in, in round order."""
    return [base.round_ms[k] / run.round_ms[k] for k in sorted(set(base.round_ms) & set(run.round_ms))]


def observed_estimate(base: Observed, run: Observed) -> Estimate | None:
    """The median of the per-round speedups with its 95% interval (:mod:`te_gemm_callback.stats`),
    or None without common rounds."""
    per_round = round_speedups(base, run)
    return estimate(per_round) if per_round else None


def observed_speedup(base: Observed, run: Observed) -> float:
    """Step speedup of ``run`` over ``base``: the median over the sweep's alternating rounds of each
    round's ratio where both ran in the same rounds (the host's drift over the sweep cancels within
    a round), else the ratio of their median step times."""
    per_round = round_speedups(base, run)
    return statistics.median(per_round) if per_round else base.step_ms / run.step_ms


def observe(cap: GemmCapture) -> Observed:
    recipe = capture_recipe(cap)
    plan = cap.meta.get("plan") or {}
    # A precision plan's run: its recipe's format, and its BF16 modules left out on purpose.
    fam = RECIPE_FAMILY.get(plan.get("recipe", recipe), "bf16")
    kept = tuple(plan.get("keep_bf16", ()))
    left = sorted({r.name for r in cap.records if r.op == "fprop" and fam not in r.precision.split("+")
                   and not any(r.module == k or r.module.startswith(k + ".") for k in kept)}) \
        if recipe != "BF16" else []
    step = cap.step_ms()
    if step is None:
        raise ValueError("capture has no step times")
    by_round: dict[int, list[float]] = {}
    for s in cap.steps_of("clean"):
        if s.round is not None:
            by_round.setdefault(s.round, []).append(s.ms)
    round_ms = {k: statistics.median(v) for k, v in by_round.items()}
    if round_ms:
        # The step time of the rounds the speedup comes from, so the table's step, its non-GEMM
        # time and the speedup agree: the capture's own clean steps ran minutes from the other
        # recipes' (HF on the H200: DelayedScaling 133.0 ms over all clean steps, 0.89x by rounds).
        step = statistics.median(round_ms.values())
    parts = [s.fwd_bwd_ms for s in cap.steps_of("clean") if s.fwd_bwd_ms is not None]
    return Observed(recipe, step, cap.gemm_ms_per_step(), left, dict(cap.meta.get("kernel_breakdown_ms") or {}),
                    round_ms, statistics.median(parts) if parts else None)


@dataclass
class RecipeAnalysis:
    recipe: str
    gemm_ms_bench: float | None = None  # microbenchmarked GEMM time per step
    gemm_speedup: float | None = None  # over BF16, microbenchmarks
    gemm_speedup_vs_current: float | None = None  # over the recipe the job ran in
    predicted_step_ms: float | None = None
    predicted_step_speedup: float | None = None  # over BF16, GEMM kernels alone
    predicted_step_speedup_unfused: float | None = None  # over BF16, GEMMs + standalone quantization
    observed_step_ms: float | None = None
    observed_gemm_ms: float | None = None
    observed_step_speedup: float | None = None  # over BF16: the median of the sweep's per-round ratios
    observed_ci: tuple[float, float] | None = None  # its 95% interval (None: too few rounds, or no rounds)
    observed_rerun: tuple[float, float] | None = None  # where a rerun's median should fall, 95% (stats.Estimate.rerun)
    observed_rounds: int = 0
    verdict: str = ""
    evidence: list[str] = field(default_factory=list)
    high_precision: list[str] = field(default_factory=list)  # GEMMs this recipe cannot run, timed in BF16
    padded_rows_pct: float | None = None  # grouped GEMMs: extra rows from per-expert alignment


@dataclass
class Report:
    current_recipe: str
    step_ms: float
    gemm_ms: float | None
    recipes: list[RecipeAnalysis]
    skipped: dict[str, str]
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # A report states no figure its own checks refused (meta["withheld"]): cleared here, once,
        # for every consumer (tables, figures, report.json); a refused verdict reads "n/a (why)".
        apply_withheld(self.recipes, self.meta.get("withheld") or {})

    @property
    def gemm_share(self) -> float | None:
        """GEMM time over step time where the two can be compared (``meta["gemm_share_basis"]``
        says over which step); None where they cannot (``meta["gemm_share_na"]`` says why).
        Never above 1: a GEMM share over 100% is two steps' times set against each other."""
        if "gemm_share" in self.meta:
            return self.meta["gemm_share"]
        share = self.gemm_ms / self.step_ms if self.gemm_ms is not None and self.step_ms else None
        return share if share is None or share <= 1 else None

    @property
    def warnings(self) -> list[str]:
        """What the checks found that the report cannot state as a result (printed, and in report.json)."""
        return list(self.meta.get("warnings") or [])

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["schema"] = "te-gemm-report/1"
        d["gemm_share"] = self.gemm_share
        return d


def _predict(base: Observed, bench_ms: dict[str, float | None]) -> dict[str, float]:
    """Step time per recipe if only the GEMMs changed (module docstring)."""
    b0 = bench_ms.get(base.recipe)
    if not b0 or base.gemm_ms is None:
        return {}
    return {r: base.step_ms - base.gemm_ms + base.gemm_ms * b / b0 for r, b in bench_ms.items() if b}


def analyze(capture: GemmCapture, bench: BenchResults | None = None, observed: list[GemmCapture] = (),
            mode: str | None = None, items: list[WorkItem] | None = None) -> Report:
    """Join the job's capture, microbenchmarks of its shapes, and captures run in other recipes.

    ``mode``: the microbenchmark mode behind the GEMM speedups and the prediction; default
    pre-quantized where measured (it times what the capture times: GEMM kernels), else autocast.
    """
    base = observe(capture)
    if base.gemm_ms is None:
        raise ValueError("the capture has no GEMM times (captured on CPU?): time it on the GPU to analyse")
    runs = {base.recipe: base}
    plan_meta = next((c.meta["plan"] for c in observed if c.meta.get("plan")), None)
    for cap in observed:
        o = observe(cap)
        runs.setdefault(o.recipe, o)
    plan_run = runs.pop("plan", None)
    items = items or items_from_capture(capture)
    if bench is not None:
        items = measured_items(bench, items)
    modes = bench.meta.get("modes", ["autocast"]) if bench else []
    mode = mode or ("prequantized" if "prequantized" in modes else "autocast")
    recipes = list(dict.fromkeys((bench.precisions if bench else []) + list(runs)))
    # A GEMM a recipe cannot run (an 8-wide router in FP8) stays in BF16 in the job: count it so.
    bench_ms = {r: bench_step_ms(bench, items, r, mode, fallback="BF16") for r in recipes} if bench else {}
    pred_step = _predict(base, bench_ms)
    unfused, auto_ms = {}, {}
    if bench and mode != "autocast" and "autocast" in modes:
        auto_ms = {r: bench_step_ms(bench, items, r, "autocast", fallback="BF16") for r in recipes}
        unfused = _predict(base, auto_ms)
    out = []
    for r in recipes:
        a = RecipeAnalysis(r, gemm_ms_bench=bench_ms.get(r))
        if bench_ms.get(r) and bench_ms.get("BF16"):
            a.gemm_speedup = bench_ms["BF16"] / bench_ms[r]
        if bench_ms.get(r) and bench_ms.get(base.recipe):
            a.gemm_speedup_vs_current = bench_ms[base.recipe] / bench_ms[r]
        if bench and r != "BF16":
            a.high_precision = [f"{it.name} ({it.fprop.mkn}): {_short(why)}"
                                for it, why in fallback_items(bench, items, r, mode)]
        a.padded_rows_pct = _padding_pct(items, r)
        if r in pred_step:
            a.predicted_step_ms = pred_step[r]
            if "BF16" in pred_step:
                a.predicted_step_speedup = pred_step["BF16"] / pred_step[r]
        if r in unfused and "BF16" in unfused:
            a.predicted_step_speedup_unfused = unfused["BF16"] / unfused[r]
        if r in runs:
            a.observed_step_ms, a.observed_gemm_ms = runs[r].step_ms, runs[r].gemm_ms
            if "BF16" in runs:
                a.observed_step_speedup = observed_speedup(runs["BF16"], runs[r])
                _set_interval(a, observed_estimate(runs["BF16"], runs[r]))
        if a.predicted_step_speedup is None and a.gemm_speedup is None and r in runs and "BF16" in runs:
            # No microbenchmark of this recipe: the in-job GEMM times of the two runs stand in.
            a.gemm_speedup = _in_job_gemm_speedup(runs[r], runs["BF16"])
            bf = runs["BF16"]
            if a.gemm_speedup and bf.gemm_ms is not None:
                # GEMM time read on instrumented steps (host clock on CPU) can exceed a clean step.
                a.predicted_step_speedup = amdahl(bf.step_ms, min(bf.gemm_ms, bf.step_ms), a.gemm_speedup)
        a.verdict, a.evidence = verdict(a, runs.get(r), runs.get("BF16"))
        out.append(a)
    if plan_run is not None and plan_meta is not None:
        predicted = _plan_prediction(plan_meta, base, capture, bench, items, bench_ms, auto_ms, mode) if bench else None
        out.append(_plan_analysis(plan_run, plan_meta, runs, predicted))
    skipped = dict(bench.skipped) if bench else {}
    return Report(base.recipe, base.step_ms, base.gemm_ms, out, skipped,
                  meta={"device": capture.meta.get("device"), "mode": mode,
                        "prediction": "Amdahl over the measured GEMM share with microbenchmarked GEMM speedups "
                                      f"({mode} mode)",
                        # Named per device from the capture: the host clock on a CPU, never assumed CUDA.
                        "timing": f"step: {step_timing(capture)}; GEMM: {_gemm_timing(capture)}",
                        "step_clock": capture.step_clock(), "gemm_clock": capture.gemm_clock(),
                        **report_checks(base.recipe, {**runs, **({"plan": plan_run} if plan_run else {})},
                                        [capture, *observed], capture_recipe, out, bench, GEMM_BOUND_TOL)})


def _plan_analysis(run: Observed, plan: dict[str, Any], runs: dict[str, Observed],
                   predicted: tuple[float, float, float | None] | None = None) -> RecipeAnalysis:
    """The swept precision plan against its prediction and against the best single recipe observed
    in the same sweep. ``predicted`` (step ms, speedup, unfused speedup): made from this run like
    the single recipes' (:func:`_plan_prediction`); without it, the plan file's own."""
    a = RecipeAnalysis("plan", predicted_step_ms=plan.get("predicted_step_ms"),
                       predicted_step_speedup=plan.get("predicted_speedup"),
                       observed_step_ms=run.step_ms, observed_gemm_ms=run.gemm_ms)
    if predicted is not None:
        a.predicted_step_ms, a.predicted_step_speedup, a.predicted_step_speedup_unfused = predicted
    bf16 = runs.get("BF16")
    if bf16 is not None:
        a.observed_step_speedup = observed_speedup(bf16, run)
        _set_interval(a, observed_estimate(bf16, run))
    a.verdict, a.evidence = verdict(a, run, bf16)
    kept = plan.get("keep_bf16", [])
    a.evidence.insert(0, f"{plan.get('recipe')} with {len(kept)} module(s) kept in BF16"
                      + (": " + ", ".join(kept[:6]) + (" ..." if len(kept) > 6 else "") if kept else ""))
    singles = {r: o.step_ms for r, o in runs.items()}
    if singles:
        best = min(singles, key=singles.get)
        a.evidence.append(f"best single recipe observed: {best} {singles[best]:.2f} ms per step; the plan "
                          f"{run.step_ms:.2f} ms ({100 * (run.step_ms / singles[best] - 1):+.1f}%)")
    if predicted is not None and plan.get("predicted_speedup"):
        a.evidence.append(f"the plan file predicted {plan['predicted_speedup']:.2f}x (autocast mode, from the run "
                          "it was made from); the prediction above comes from this run, like the recipes'")
    return a


def _plan_prediction(plan: dict[str, Any], base: Observed, capture: GemmCapture, bench: BenchResults,
                     items: list[WorkItem], bench_ms: dict[str, float | None], auto_ms: dict[str, float | None],
                     mode: str) -> tuple[float, float, float | None] | None:
    """(step ms, speedup, unfused speedup) of the plan, predicted like the single recipes beside it:
    this run's baseline and bench, the same mode, its ``keep_bf16`` modules at their BF16 time and
    the rest in its recipe. The plan file's own prediction is anchored on the run it was made from:
    on a host-bound job the two runs' step times differ, and so would the two predictions."""
    owner = {r.name: r.module for r in capture.records}
    keep = set(plan.get("keep_bf16", []))

    def total(m: str) -> float | None:
        kept = [it for it in items if owner.get(it.name, it.name) in keep]
        rest = [it for it in items if owner.get(it.name, it.name) not in keep]
        t_kept = bench_step_ms(bench, kept, "BF16", m)
        t_rest = bench_step_ms(bench, rest, plan.get("recipe", "BF16"), m, fallback="BF16")
        return None if t_kept is None or t_rest is None else t_kept + t_rest

    pred = _predict(base, {**bench_ms, "plan": total(mode)})
    if "plan" not in pred or "BF16" not in pred:
        return None
    unfused = None
    if auto_ms:  # the autocast-mode totals behind the recipes' "unfused" prediction
        u = _predict(base, {**auto_ms, "plan": total("autocast")})
        if "plan" in u and "BF16" in u:
            unfused = u["BF16"] / u["plan"]
    return pred["plan"], pred["BF16"] / pred["plan"], unfused


def _set_interval(a: RecipeAnalysis, est: Estimate | None) -> None:
    if est is not None:
        a.observed_rounds = est.rounds
        a.observed_ci = (est.low, est.high) if est.low is not None else None
        a.observed_rerun = est.rerun


def _gemm_timing(cap: GemmCapture) -> str:
    """The GEMM clock in words, read from the capture (``GemmCapture.gemm_clock``): kernel records,
    CUDA-event pairs, or the host clock on a CPU; "not timed" rather than a guess."""
    return gemm_timing(cap)


def _padding_pct(items: list[WorkItem], recipe: str) -> float | None:
    """Extra grouped-GEMM rows when every expert's rows are padded to the recipe's alignment (the
    microbenchmarks time the padded GEMMs, as MoE code under that recipe runs them)."""
    grouped = [it for it in items if it.m_splits]
    rows = sum(sum(it.m_splits) * it.count for it in grouped)
    if not rows or recipe not in RECIPE_FAMILY or recipe == "BF16":  # FP32 / FP16 jobs pad nothing either
        return None
    padded = sum(sum(padded_splits(it.m_splits, recipe)) * it.count for it in grouped)
    return 100 * (padded / rows - 1)


def _short(err: str) -> str:
    """TE's assertion text without the source location: 'ret.lda % 16 == 0' is the part that matters."""
    if "Assertion failed:" in err:
        err = err.split("Assertion failed:", 1)[1].split(". ")[0].strip()
    return err[:120]


def _in_job_gemm_speedup(run: Observed, bf16: Observed) -> float | None:
    return bf16.gemm_ms / run.gemm_ms if run.gemm_ms and bf16.gemm_ms else None


def _kernel_moves(run: Observed, bf16: Observed) -> str | None:
    """Kernel categories (torch.profiler) whose time moved from BF16 to this recipe, largest first."""
    if not (run.kernels and bf16.kernels):
        return None
    deltas = sorted(((run.kernels.get(k, 0.0) - bf16.kernels.get(k, 0.0), k) for k in run.kernels if k != "gemm"),
                    key=lambda d: -abs(d[0]))
    moved = [f"{k} {d:+.2f} ms" for d, k in deltas if abs(d) > 0.01]
    return "kernel time that moved (torch.profiler, per step): " + ", ".join(moved) if moved else None


def _undecided(est: Estimate | None, per_round: list[float], pred: float) -> str | None:
    """Why the observed speedup cannot pick a side of a verdict's threshold (the edges of the band
    around the prediction), or None. With a 95% interval: it reaches across an edge. With too few
    rounds for one (under 6): the rounds themselves fall on both sides of an edge."""
    if est is None or est.rounds < 2:
        return None
    lo, hi, what = est.low, est.high, "95% interval"
    if lo is None or hi is None:
        lo, hi, what = min(per_round), max(per_round), f"{est.rounds} rounds (too few for a 95% interval) range"
    for edge, sides in ((1 - GEMM_BOUND_TOL, "GEMM-bound and overhead eating the gain"),
                        (1 + GEMM_BOUND_TOL, "GEMM-bound and better than predicted")):
        if lo < edge * pred < hi:
            return (f"undecided: its {what} {lo:.2f}-{hi:.2f}x reaches across {edge * pred:.2f}x "
                    f"({100 * (edge - 1):+.0f}% of the prediction), the line between {sides}")
    return None


def verdict(a: RecipeAnalysis, run: Observed | None, bf16: Observed | None) -> tuple[str, list[str]]:
    """GEMM-bound / overhead eats the gain / no gain or silent fallback, with the numbers behind it.
    Pure: reads ``a`` and the observed runs, changes nothing."""
    if a.recipe == "BF16":
        return "baseline", []
    ev: list[str] = []
    if run is not None and run.unquantized:
        ev.append(f"{len(run.unquantized)} GEMM(s) ran in high precision under {a.recipe}: "
                  + ", ".join(run.unquantized[:6]) + (" ..." if len(run.unquantized) > 6 else ""))
    if a.padded_rows_pct:
        ev.append(f"grouped GEMMs timed with each expert's rows padded to a multiple of {row_alignment(a.recipe)}: "
                  f"{a.padded_rows_pct:+.1f}% rows")
    if a.high_precision:
        ev.append(f"{len(a.high_precision)} GEMM(s) cannot run in {a.recipe}, counted at BF16 time: "
                  + "; ".join(a.high_precision[:3]))
    sp = a.gemm_speedup
    if sp is not None:
        ev.append(f"GEMM speedup {sp:.2f}x")
    if run is not None and bf16 is not None and run.gemm_ms and bf16.gemm_ms:
        ev.append(f"in-job GEMM time {bf16.gemm_ms:.2f} -> {run.gemm_ms:.2f} ms "
                  f"({bf16.gemm_ms / run.gemm_ms:.2f}x)")
    if sp is not None and sp < NO_GAIN:
        what = "silent fallback" if run is not None and run.unquantized else "no gain at these shapes"
        return f"no gain ({what})", ev
    obs, pred = a.observed_step_speedup, a.predicted_step_speedup
    if obs is None or pred is None:
        return "predicted only (no observed run in this recipe)", ev
    gap = obs / pred - 1
    per_round = round_speedups(bf16, run) if run is not None and bf16 is not None else []
    est = estimate(per_round) if per_round else None
    line = (f"predicted step speedup {pred:.2f}x, observed {est.text() if est else f'{obs:.2f}x'} "
            f"(residual {100 * gap:+.1f}%)")
    undecided = _undecided(est, per_round, pred)
    if undecided:
        line += f"; {undecided}"
    if a.predicted_step_speedup_unfused is not None:
        line += f"; with every quantization unfused {a.predicted_step_speedup_unfused:.2f}x"
    ev.append(line)
    moved = idle = None
    if run is not None and bf16 is not None and run.non_gemm_ms is not None and bf16.non_gemm_ms is not None:
        moved = run.non_gemm_ms - bf16.non_gemm_ms
        ev.append(f"non-GEMM time {bf16.non_gemm_ms:.2f} -> {run.non_gemm_ms:.2f} ms ({moved:+.2f} ms per step)")
    if run is not None and bf16 is not None and run.fwd_bwd_ms and bf16.fwd_bwd_ms:
        ev.append(f"forward+backward {bf16.fwd_bwd_ms:.2f} -> {run.fwd_bwd_ms:.2f} ms "
                  f"({bf16.fwd_bwd_ms / run.fwd_bwd_ms:.2f}x); the optimizer step and the rest of the step "
                  f"{bf16.step_ms - bf16.fwd_bwd_ms:.2f} -> {run.step_ms - run.fwd_bwd_ms:.2f} ms")
    if run is not None and bf16 is not None and abs(gap) > GEMM_BOUND_TOL:
        kern = _kernel_moves(run, bf16)
        if kern:
            ev.append(kern)
        if run.kernels and bf16.kernels:  # step time in no kernel at all: host-bound, GPU idle
            idle = (run.step_ms - sum(run.kernels.values())) - (bf16.step_ms - sum(bf16.kernels.values()))
            if abs(idle) > 0.01:
                ev.append(f"GPU time in no kernel (host-bound gaps) {idle:+.2f} ms per step")
    if undecided:
        ev.append("more rounds narrow it: a larger sweep time budget (sweep_budget_s), or sweep_steps")
        return "undecided (the observed speedup's interval straddles the line)", ev
    if abs(gap) <= GEMM_BOUND_TOL:
        return "GEMM-bound: working as expected", ev
    if gap > 0:
        ev.append("likely cause: fused norm/activation kernels write FP8 outputs (half the bytes of BF16)")
        return "better than the GEMMs alone predict (non-GEMM time shrank too)", ev
    if idle is not None and moved is not None and idle > 0 and idle >= 0.5 * moved:
        ev.append(f"where it goes: mostly host time: the GPU waits {idle:.2f} ms more per step between kernels "
                  "(likely the Python and launch cost of the recipe's quantization in every layer); larger micro-batches "
                  "or CUDA graphs hide it")
    else:
        ev.append("where it goes: quantization and cast kernels, amax reductions, layers left in high precision")
    return "overhead eats the gain", ev
