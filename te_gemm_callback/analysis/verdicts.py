"""Predicted GEMM speedup against observed step speedup, with a verdict per recipe (:func:`analyze`, :func:`judge`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, cast

from te_gemm_callback.analysis.checks import apply_withheld, report_checks
from te_gemm_callback.analysis.findings import (
    Evidence,
    PlanEvidence,
    StepParts,
    Straddle,
    Verdict,
    evidence_lines,
    render,
    verdict_text,
)
from te_gemm_callback.analysis.notes import gemm_timing, step_timing
from te_gemm_callback.analysis.prediction import (
    Observed,
    amdahl,
    capture_recipe,
    gemm_mode,
    observe,
    observed_estimate,
    observed_speedup,
    padding_pct,
    plan_prediction,
    predict_steps,
    round_speedups,
    short_error,
)
from te_gemm_callback.analysis.whatif import job_trace, module_host, replay_recipes
from te_gemm_callback.capture.capture_file import GemmCapture
from te_gemm_callback.microbench.items import WorkItem, items_from_capture
from te_gemm_callback.microbench.results import BenchResults, fallback_items, measured_items
from te_gemm_callback.microbench.results import step_ms as bench_step_ms
from te_gemm_callback.precisions import row_alignment
from te_gemm_callback.sweep.intervals import Estimate, estimate

__all__ = ["GEMM_BOUND_TOL", "NO_GAIN", "Observed", "RecipeAnalysis", "Report", "Verdict", "amdahl", "analyze",
           "capture_recipe", "judge", "observe", "observed_estimate", "observed_speedup", "round_speedups",
           "verdict"]

GEMM_BOUND_TOL = 0.05  # |observed / predicted - 1| within this: the GEMMs explain the step
NO_GAIN = 1.05  # GEMM speedup below this: no gain at these shapes


@dataclass
class RecipeAnalysis:
    """One recipe's row of the report; ``verdict`` and ``evidence`` render ``verdict_kind`` and ``verdict_evidence``."""

    recipe: str
    gemm_ms_bench: float | None = None  # microbenchmarked GEMM time per step
    gemm_speedup: float | None = None  # over BF16, microbenchmarks
    gemm_speedup_vs_current: float | None = None  # over the recipe the job ran in
    predicted_step_ms: float | None = None
    predicted_step_speedup: float | None = None  # over BF16, GEMM kernels alone
    predicted_step_speedup_unfused: float | None = None  # over BF16, GEMMs + standalone quantization
    predicted_gemms_alone: float | None = None  # over BF16, Amdahl over the GEMM share (kept beside the replay)
    predicted_band: tuple[float, float] | None = None  # the replay's band on predicted_step_speedup
    predicted_bound: str | None = None  # "host" or "gpu": what bounds the replayed step in this recipe
    predicted_by: str | None = None  # "replay" (the job's step replayed), else None (no prediction)
    predicted_ledger: str | None = None  # the replayed step's host and GPU time: which side bounds it
    predicted_na: str | None = None  # why no step is predicted (no replay), where none is
    observed_step_ms: float | None = None
    observed_gemm_ms: float | None = None
    observed_step_speedup: float | None = None  # over BF16: the median of the sweep's per-round ratios
    observed_ci: tuple[float, float] | None = None  # its 95% interval (None: too few rounds, or no rounds)
    observed_rerun: tuple[float, float] | None = None  # where a rerun's median should fall, 95% (Estimate.rerun)
    observed_rounds: int = 0
    high_precision: list[str] = field(default_factory=list)  # GEMMs this recipe cannot run, timed in BF16
    padded_rows_pct: float | None = None  # grouped GEMMs: extra rows from per-expert alignment
    verdict_kind: Verdict | None = None
    verdict_evidence: Evidence = field(default_factory=Evidence)

    @property
    def verdict(self) -> str:
        return verdict_text(self.verdict_kind, self.verdict_evidence)

    @property
    def evidence(self) -> list[str]:
        return evidence_lines(self.verdict_kind, self.verdict_evidence) + (
            [self.predicted_ledger] if self.predicted_ledger else [])

    def to_dict(self) -> dict[str, Any]:
        kind = self.verdict_kind.value if self.verdict_kind is not None else None
        return {**asdict(self), "verdict": self.verdict, "evidence": self.evidence, "verdict_kind": kind}


@dataclass
class Report:
    current_recipe: str
    step_ms: float
    gemm_ms: float | None
    recipes: list[RecipeAnalysis]
    skipped: dict[str, str]
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # The figures the checks refused (meta["withheld"]) are cleared once, for every consumer.
        apply_withheld(self.recipes, self.meta.get("withheld") or {})

    @property
    def gemm_share(self) -> float | None:
        """GEMM time over step time where the two can be compared, else None; never above 1."""
        if "gemm_share" in self.meta:
            return self.meta["gemm_share"]
        share = self.gemm_ms / self.step_ms if self.gemm_ms is not None and self.step_ms else None
        return share if share is None or share <= 1 else None

    def withheld(self, recipe: str) -> dict[str, str]:
        """The fields of a recipe's row the checks refused: field -> why."""
        return (self.meta.get("withheld") or {}).get(recipe) or {}

    @property
    def warnings(self) -> list[str]:
        """What the checks found that the report cannot state as a result."""
        return list(self.meta.get("warnings") or [])

    def to_dict(self) -> dict[str, Any]:
        d = {**asdict(self), "recipes": [a.to_dict() for a in self.recipes], "schema": "te-gemm-report/1",
             "gemm_share": self.gemm_share}
        if self.meta.get("gemm_share_basis") != "step" and d.get("gemm_ms") is not None:
            # Not of the steps step_ms is of: named for what it is.
            d["gemm_ms_timed_steps"] = d.pop("gemm_ms")
        return d


def no_gemm_times(capture: GemmCapture) -> str:
    """Why a capture has no GEMM time to analyse, in one line."""
    if not capture.records:
        return ("no GEMM ran in the captured steps (a model without Linear, matmul or TE GEMM layers, or steps "
                "that ran none of them): nothing to analyse")
    if str(capture.meta.get("device") or "").startswith("meta"):
        return "the model ran on the meta device: nothing runs there, so no GEMM was timed; capture it on a GPU"
    return ("the capture has no GEMM times (GemmProfiler(timing='none'), or no GEMM could be timed under "
            "another profiler): capture it again with timing on to analyse")


def _set_observed(a: RecipeAnalysis, run: Observed, bf: Observed | None) -> None:
    """A recipe's observed run and its speedup over BF16; without a microbenchmark, the GEMM speedup and GEMMs
    alone come from the runs' own (in-job) GEMM times, which ``gemm_ms_bench`` left None says."""
    a.observed_step_ms, a.observed_gemm_ms = run.step_ms, run.gemm_ms
    if bf is None:
        return
    _set_speedup(a, run, bf)
    if a.gemm_ms_bench is None and a.gemm_speedup is None:
        a.gemm_speedup = bf.gemm_ms / run.gemm_ms if run.gemm_ms and bf.gemm_ms else None
        if a.gemm_speedup and bf.gemm_ms is not None:
            # GEMM time read on instrumented steps (host clock on CPU) can exceed a clean step.
            a.predicted_gemms_alone = amdahl(bf.step_ms, min(bf.gemm_ms, bf.step_ms), a.gemm_speedup)


NO_BENCH = "no microbenchmark of the job's GEMM shapes (bench.json), whose GEMM times the replay runs on"


def no_replay(bench: BenchResults | None, traced: Any, no_bench: str = NO_BENCH, cap: Any = None) -> str | None:
    """Why the job's step (``cap``'s) cannot be replayed, or None where it can."""
    if bench is None:
        return no_bench
    if traced is None:
        tl = getattr(cap, "kernel_timeline", None)
        if tl is not None and tl.kernels and not tl.calls:
            return ("the capture's kernels step holds kernel records but no host calls (a capture made before "
                    "they were recorded): capture again for a replay")
        return ("the capture holds no host calls of a kernels step (no kernel records: timing off, a CPU, or "
                "another tool held CUPTI), which the replay starts from")
    return None


def analyze(capture: GemmCapture, bench: BenchResults | None = None, observed: Sequence[GemmCapture] = (),
            mode: str | None = None, items: list[WorkItem] | None = None,
            replay_from: GemmCapture | None = None, no_bench: str = NO_BENCH) -> Report:
    """Join the job's capture, microbenchmarks of its shapes, and captures run in other recipes. The predicted
    column is the replay's alone; without one it stays empty and says why (``no_bench``: why without a bench)."""
    replay_from = replay_from or capture
    base = observe(capture)
    if base.gemm_ms is None:
        raise ValueError(no_gemm_times(capture))
    runs = {base.recipe: base}
    for o in map(observe, observed):
        runs.setdefault(o.recipe, o)
    plan_run = runs.pop("plan", None)
    plan_meta = next((c.meta["plan"] for c in observed if c.meta.get("plan")), None)
    items = items or items_from_capture(capture)
    items = measured_items(bench, items) if bench is not None else items
    modes = bench.meta.get("modes", ["autocast"]) if bench else []
    mode = mode or gemm_mode(modes)
    recipes = list(dict.fromkeys((bench.precisions if bench else []) + list(runs)))
    # A GEMM a recipe cannot run (an 8-wide router in FP8) stays in BF16 in the job: count it so.
    bench_ms = {r: bench_step_ms(bench, items, r, mode, fallback="BF16") for r in recipes} if bench else {}
    pred_step = predict_steps(base, bench_ms)
    costs = bench.meta.get("module_costs") if bench else None
    traced = job_trace(replay_from, costs)
    replays = replay_recipes(replay_from, bench, recipes, base.recipe, base.step_ms, costs,
                             traced=traced) if bench else {}
    unfused, auto_ms = {}, {}
    if bench and mode != "autocast" and "autocast" in modes:
        auto_ms = {r: bench_step_ms(bench, items, r, "autocast", fallback="BF16") for r in recipes}
        unfused = predict_steps(base, auto_ms)
    why_not = no_replay(bench, traced, no_bench, replay_from)
    out = []
    for r in recipes:
        ms, ms_bf16, ms_base = bench_ms.get(r), bench_ms.get("BF16"), bench_ms.get(base.recipe)
        a = RecipeAnalysis(r, gemm_ms_bench=ms, gemm_speedup=ms_bf16 / ms if ms and ms_bf16 else None,
                           gemm_speedup_vs_current=ms_base / ms if ms and ms_base else None,
                           padded_rows_pct=padding_pct(items, r))
        if bench and r != "BF16":
            a.high_precision = [f"{it.name} ({it.fprop.mkn}): {short_error(why)}"
                                for it, why in fallback_items(bench, items, r, mode)]
        if r in pred_step and "BF16" in pred_step:
            a.predicted_gemms_alone = pred_step["BF16"] / pred_step[r]
        if r in replays and "BF16" in replays:
            _set_replay(a, replays[r], replays["BF16"])
        elif r != "BF16":
            a.predicted_na = why_not or f"{r} or BF16 not microbenchmarked, so not replayed"
        if r in unfused and "BF16" in unfused:
            a.predicted_step_speedup_unfused = unfused["BF16"] / unfused[r]
        if r in runs:
            _set_observed(a, runs[r], runs.get("BF16"))
        a.verdict_kind, a.verdict_evidence = judge(a, runs.get(r), runs.get("BF16"))
        out.append(a)
    if plan_run is not None and plan_meta is not None:
        predicted = plan_prediction(plan_meta, base, capture, bench, items, bench_ms, auto_ms, mode) if bench else None
        # The plan's modules kept in BF16 under its recipe, replayed like the recipes beside it.
        keep, recipe = frozenset(plan_meta.get("keep_bf16", [])), str(plan_meta.get("recipe", "BF16"))
        got = replay_recipes(replay_from, bench, [recipe], base.recipe, base.step_ms, costs, traced=traced,
                             keep=keep) if bench and traced else {}
        out.append(_plan_analysis(plan_run, plan_meta, runs, predicted, why_not,
                                  (got[recipe], replays["BF16"]) if recipe in got and "BF16" in replays else None))
    return Report(base.recipe, base.step_ms, base.gemm_ms, out, dict(bench.skipped) if bench else {},
                  meta={"device": capture.meta.get("device"), "mode": mode,
                        "run_id": replay_from.meta.get("run_id"),  # the job's: what a kept report is checked by
                        "prediction": ("a replay of the job's own kernels step (host calls and kernels) with each "
                                       f"recipe's GEMM times ({mode} mode) and module host and quantization costs"
                                       if replays else None),
                        "no_replay": why_not,
                        "replay": {r: rr.to_dict() for r, rr in replays.items()} or None,
                        "replay_own": traced[1] if traced and replays else None,  # no replay: nothing to check
                        "module_host": module_host(replay_from, costs, base.recipe),
                        "timing": f"step: {step_timing(capture)}; GEMM: {gemm_timing(capture)}",
                        "step_clock": capture.step_clock(), "gemm_clock": capture.gemm_clock(),
                        **report_checks(base.recipe, {**runs, **({"plan": plan_run} if plan_run else {})},
                                        [capture, *observed], capture_recipe, out, bench, GEMM_BOUND_TOL)})


def _set_replay(a: RecipeAnalysis, rr: Any, bf16: Any) -> None:
    """The replay's prediction as the recipe's predicted column, with its band and bound."""
    a.predicted_step_ms, a.predicted_step_speedup = rr.step_ms, bf16.step_ms / rr.step_ms
    a.predicted_band = (bf16.low_ms / rr.high_ms, bf16.high_ms / rr.low_ms)
    a.predicted_bound, a.predicted_by = rr.bound, "replay"
    side = "the host" if rr.bound == "host" else "the GPU"
    a.predicted_ledger = (f"replayed: {side} bounds the step (host {rr.host_ms:.1f} ms of its own work per step, "
                          f"GPU busy {rr.gpu_busy_ms:.1f} ms)" + (f"; {'; '.join(rr.notes)}" if rr.notes else ""))


def _plan_analysis(run: Observed, plan: dict[str, Any], runs: dict[str, Observed],
                   predicted: tuple[float, float, float | None] | None = None,
                   why_not: str | None = None, replayed: tuple[Any, Any] | None = None) -> RecipeAnalysis:
    """The swept plan against the best single recipe in the same sweep; predicted by the replay (``replayed``: the
    plan's and BF16's), GEMMs alone from this run (else the plan file's own), never judged against."""
    a = RecipeAnalysis("plan", predicted_gemms_alone=plan.get("predicted_speedup"), observed_step_ms=run.step_ms,
                       observed_gemm_ms=run.gemm_ms, predicted_na=why_not or "the plan's recipe was not replayed")
    if predicted is not None:
        a.predicted_gemms_alone, a.predicted_step_speedup_unfused = predicted[1], predicted[2]
    if replayed is not None:
        _set_replay(a, *replayed)
        a.predicted_na = None
    bf16 = runs.get("BF16")
    if bf16 is not None:
        _set_speedup(a, run, bf16)
    a.verdict_kind, a.verdict_evidence = judge(a, run, bf16)
    best = min(runs.values(), key=lambda o: o.step_ms, default=None)  # the best single recipe
    file_predicted = (plan.get("predicted_speedup") or None) if predicted is not None else None
    a.verdict_evidence.plan = PlanEvidence(plan.get("recipe"), list(plan.get("keep_bf16", [])), run.step_ms,
                                           best.recipe if best else None, best.step_ms if best else None,
                                           file_predicted)
    return a


def _set_speedup(a: RecipeAnalysis, run: Observed, bf16: Observed) -> None:
    """The observed speedup over BF16, with its interval over the rounds."""
    a.observed_step_speedup = observed_speedup(bf16, run)
    if (est := observed_estimate(bf16, run)) is not None:
        a.observed_rounds = est.rounds
        a.observed_ci = cast("tuple[float, float]", (est.low, est.high)) if est.low is not None else None
        a.observed_rerun = est.rerun


def _kernel_moves(run: Observed, bf16: Observed) -> list[tuple[str, float]]:
    """Kernel categories (torch.profiler) whose time moved from BF16 to this recipe, largest first."""
    if not (run.kernels and bf16.kernels):
        return []
    deltas = sorted(((run.kernels.get(k, 0.0) - bf16.kernels.get(k, 0.0), k) for k in run.kernels if k != "gemm"),
                    key=lambda d: -abs(d[0]))
    return [(k, d) for d, k in deltas if abs(d) > 0.01]


def _straddle(est: Estimate | None, per_round: list[float], pred: float) -> Straddle | None:
    """Where the observed interval (else the rounds' range) reaches across a verdict's edge, or None."""
    if est is None or est.rounds < 2:
        return None
    lo, hi, rounds_range = est.low, est.high, False
    if lo is None or hi is None:
        lo, hi, rounds_range = min(per_round), max(per_round), True
    for edge in (1 - GEMM_BOUND_TOL, 1 + GEMM_BOUND_TOL):
        if lo < edge * pred < hi:
            return Straddle(lo, hi, edge, est.rounds, rounds_range)
    return None


def judge(a: RecipeAnalysis, run: Observed | None, bf16: Observed | None) -> tuple[Verdict, Evidence]:
    """The recipe's verdict with the numbers behind it. Pure: reads ``a`` and the runs."""
    ev = Evidence(recipe=a.recipe, bound=a.predicted_bound, gemms_alone=a.predicted_gemms_alone,
                  no_prediction=a.predicted_na)
    if a.recipe == "BF16":
        return Verdict.BASELINE, ev
    _gemm_evidence(ev, a, run, bf16)
    obs, pred = a.observed_step_speedup, a.predicted_step_speedup
    per_round = round_speedups(bf16, run) if run is not None and bf16 is not None else []
    if obs is not None:
        ev.observed, ev.estimate = obs, estimate(per_round) if per_round else None
        _step_evidence(ev, run, bf16)
    if obs is not None and pred is not None:
        ev.predicted, ev.tolerance, ev.unfused = pred, GEMM_BOUND_TOL, a.predicted_step_speedup_unfused
    if a.gemm_speedup is not None and a.gemm_speedup < NO_GAIN:
        # Every verdict keeps its numbers: predicted against observed stays, with no line to straddle.
        ev.no_gain_below = NO_GAIN
        return (Verdict.SILENT_FALLBACK if run is not None and run.fallback else Verdict.NO_GAIN), ev
    if obs is None:
        return (Verdict.PREDICTED_ONLY if pred is not None else Verdict.NOT_JUDGED), ev
    if pred is None:
        return Verdict.OBSERVED_ONLY, ev
    ev.straddle = _straddle(ev.estimate, per_round, pred)
    gap = cast(float, ev.residual)  # a float: ev.observed and ev.predicted are set above
    idle = _where_it_went(ev, run, bf16) if abs(gap) > GEMM_BOUND_TOL else None
    if ev.straddle is not None:
        return Verdict.UNDECIDED, ev
    if abs(gap) <= GEMM_BOUND_TOL:
        return (Verdict.HOST_BOUND if a.predicted_bound == "host" else Verdict.GEMM_BOUND), ev
    if gap > 0:
        return Verdict.BETTER_THAN_PREDICTED, ev
    moved = ev.overhead_ms
    if idle is not None and moved is not None and idle > 0 and idle >= 0.5 * moved:
        ev.host_wait_ms = idle
    return Verdict.OVERHEAD_EATS_GAIN, ev


def _step_evidence(ev: Evidence, run: Observed | None, bf16: Observed | None) -> None:
    """The step's non-GEMM time and its parts in both runs."""
    if run is None or bf16 is None:
        return
    if run.non_gemm_ms is not None and bf16.non_gemm_ms is not None:
        ev.non_gemm_ms = (bf16.non_gemm_ms, run.non_gemm_ms)
    if run.fwd_bwd_ms and bf16.fwd_bwd_ms:
        ev.step_parts = StepParts(bf16.fwd_bwd_ms, run.fwd_bwd_ms, bf16.step_ms, run.step_ms)


def _where_it_went(ev: Evidence, run: Observed | None, bf16: Observed | None) -> float | None:
    """Kernel time that moved, and the step time in no kernel (host-bound, GPU idle): this recipe less BF16."""
    if run is None or bf16 is None:
        return None
    ev.kernel_moves = _kernel_moves(run, bf16)
    if not (run.kernels and bf16.kernels):
        return None
    idle = (run.step_ms - sum(run.kernels.values())) - (bf16.step_ms - sum(bf16.kernels.values()))
    if abs(idle) > 0.01:
        ev.idle_ms = idle
    return idle


def _gemm_evidence(ev: Evidence, a: RecipeAnalysis, run: Observed | None, bf16: Observed | None) -> None:
    """What the recipe's GEMMs did: unquantized, padded, in high precision, and their speedups."""
    if run is not None and run.unquantized:
        ev.unquantized = list(run.unquantized)
    if a.padded_rows_pct:
        ev.padded_rows_pct, ev.row_alignment = a.padded_rows_pct, row_alignment(a.recipe)
    ev.high_precision = list(a.high_precision)
    ev.gemm_speedup = a.gemm_speedup
    ev.gemm_source = "bench" if a.gemm_ms_bench is not None else "in job"
    if run is not None and bf16 is not None and run.gemm_ms and bf16.gemm_ms:
        ev.in_job_gemm_ms = (bf16.gemm_ms, run.gemm_ms)


def verdict(a: RecipeAnalysis, run: Observed | None, bf16: Observed | None) -> tuple[str, list[str]]:
    """:func:`judge`'s verdict as the report prints it: (its sentence, its evidence lines)."""
    return render(*judge(a, run, bf16))
