"""The checks that keep a report from contradicting itself: where a join of numbers from different steps
or clocks cannot hold, the report states "n/a (why)" instead (:func:`report_checks`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from te_gemm_callback.analysis.findings import GAP_VERDICTS, WITHOUT_PREDICTION, Verdict
from te_gemm_callback.analysis.notes import GEMM_CLOCK_SHORT
from te_gemm_callback.analysis.prediction import precision_ran
from te_gemm_callback.capture.capture_file import GemmCapture
from te_gemm_callback.microbench.results import BenchResults

OTHER_HIGH = ("FP32", "FP16")  # not BF16: the speedups' base, which every table is written over

PREDICTED = ("predicted_step_ms", "predicted_step_speedup", "predicted_step_speedup_unfused", "predicted_gemms_alone")
# A refused figure goes from the verdict's evidence too, where a verdict without a prediction kept it.
_EVIDENCE_OF = {"predicted_step_speedup": ("predicted",), "predicted_step_speedup_unfused": ("unfused",),
                "predicted_gemms_alone": ("gemms_alone",)}
BENCHED = ("gemm_ms_bench", "gemm_speedup", "gemm_speedup_vs_current", "high_precision")
BENCH_OVER_STEP = 2.0  # the bench's GEMM time per step over this many whole steps: not this job's GEMMs
BENCH_VS_JOB = 3.0  # the bench's GEMM time this many times the job's own, or a third of it: said
STEP_NOISE_WARN_PCT = 10.0  # the job's steps spread wider than this: said, since every figure carries it
# What was attached to the steps a step time came from: only steps alike are compared.
ATTACHED = {"clean": "nothing attached", "settle": "nothing attached", "kernels": "kernel records on",
            "instrumented": "capture instruments on"}


def share_check(cap: GemmCapture, step_ms: float, gemm_ms: float | None) -> dict[str, Any]:
    """The GEMM share of a run's step a report may state: ``share`` (None, with ``why``), ``basis``, ``of_ms``,
    ``clock``, and ``warning`` where a ratio was refused."""
    clock = cap.gemm_clock()
    if gemm_ms is None or not step_ms:
        return {"share": None, "clock": clock, "why": "GEMMs not timed"}
    raw = gemm_ms / step_ms
    if clock == "host_clock":
        # Host-clock times of two steps are not comparable: the share is taken within the timed steps.
        own = cap.gemm_share_in_timed_steps()
        if own is None or own[0] > 1:
            return {"share": None, "clock": clock,
                    "why": "the GEMMs' host-clock time exceeds the very step they were timed in (overlapping timers)"}
        out = {"share": own[0], "basis": "timed steps", "of_ms": own[1], "clock": clock}
        if raw > 1:
            out["warning"] = (f"the GEMMs' host-clock time on the instrumented step ({gemm_ms:.2f} ms) is "
                              f"{100 * raw:.0f}% of the clean step ({step_ms:.2f} ms): on the CPU two steps' "
                              "host-clock times are not comparable (first calls, caches, the host's other load), "
                              f"so the share is taken within the instrumented step: {100 * own[0]:.1f}%")
        return out
    if raw > 1:
        cause: dict[str | None, str] = {
            "kernel_records": "the kernels step's GEMM kernels add up to more than a clean step: kernels on concurrent "
                              "streams count each, or the kernels step ran slower (clock, other load)",
            "cuda_events": "each CUDA-event pair also counts the GPU's idle time between its start event and the "
                           "GEMM's launch (a host-bound job), on instrumented steps slower than the clean ones"}
        return {"share": None, "clock": clock,
                "why": (f"GEMM time {gemm_ms:.2f} ms ({GEMM_CLOCK_SHORT[clock]}) exceeds the {step_ms:.2f} ms step: "
                        + cause.get(clock, "the two come from different steps"))}
    return {"share": raw, "basis": "step", "of_ms": step_ms, "clock": clock}


class _Checks:
    """One report's checks: the fields they withhold (recipe -> field -> why) and the warnings they say."""

    def __init__(self, job: str, runs: dict[str, Any], by: dict[str, GemmCapture], recipes: list[Any],
                 bench: BenchResults | None) -> None:
        self.job, self.runs, self.by, self.recipes, self.bench = job, runs, by, recipes, bench
        self.warnings: list[str] = []
        self.withheld: dict[str, dict[str, str]] = {}

    def hold(self, recipe: str, fields: Iterable[str], why: str) -> None:
        for f in fields:
            self.withheld.setdefault(recipe, {}).setdefault(f, why)  # the first reason found stands

    def hold_all(self, fields: Iterable[str], why: str) -> None:
        for a in self.recipes:
            self.hold(a.recipe, fields, why)

    def bench_fits(self, own_cells: bool) -> list[str]:
        """Withhold every prediction where the bench's GEMMs far exceed the step; the warning where they are far
        from the job's own GEMM time (returned, said last)."""
        job, runs = self.job, self.runs
        # Far above the whole step, the cells are not this job's GEMMs (a loaded machine, another run's cache).
        benched = next((a.gemm_ms_bench for a in self.recipes if a.recipe == job and a.gemm_ms_bench), None)
        if benched and job in runs and benched > BENCH_OVER_STEP * runs[job].step_ms:
            why = (f"the microbenchmark puts {job}'s GEMMs at {benched:.2f} ms a step, over {BENCH_OVER_STEP:g}x the "
                   f"whole observed step ({runs[job].step_ms:.2f} ms): its cells do not describe this job's GEMMs "
                   "(timed on a loaded machine, or cached from another run): te-gemm bench --no-cache measures again")
            self.warnings.append(why)
            self.hold_all(PREDICTED, why)
        elif own_cells and benched and job in runs and runs[job].gemm_ms:
            # Said, not withheld: within a whole step the cells may still rank the recipes right.
            ratio = benched / runs[job].gemm_ms
            if not 1 / BENCH_VS_JOB <= ratio <= BENCH_VS_JOB:
                return [f"the microbenchmark puts {job}'s GEMMs at {benched:.2f} ms a step, {ratio:.2g}x their time "
                        f"in the job ({runs[job].gemm_ms:.2f} ms): its cells ran under other conditions (a loaded "
                        "machine, CPU threads, another run's cache), and every prediction rests on them"]
        return []

    def baseline_ran(self) -> str | None:
        """The precision the BF16 run really ran where it is FP32 / FP16 (a sweep's FP8-off entry on such
        a model); predictions are withheld without a microbenchmark of it."""
        ran = precision_ran(self.by["BF16"]) if "BF16" in self.by else "BF16"
        if ran not in OTHER_HIGH:
            return None
        self.warnings.append(f"the BF16 run (FP8 off) ran {ran} GEMMs, the model's own dtype: every speedup over "
                             f"BF16 here is over {ran}")
        if self.bench is not None and ran not in self.bench.precisions:
            self.hold_all(PREDICTED, f"no {ran} microbenchmark: the BF16 run's GEMMs ran {ran}, and predictions "
                          f"that scale its GEMM time by BF16 microbenchmark times would be BF16's, not {ran}'s")
        return ran

    def high_precision(self) -> None:
        """An FP32 or FP16 job: every speedup is written over BF16, which it did not run."""
        job, bench = self.job, self.bench
        for a in self.recipes:
            if a.recipe in OTHER_HIGH:  # verdict() judges FP8 recipes; its "ran in high precision" would misread it
                own = "the job's own" if a.recipe == job else "a"
                self.hold(a.recipe, ("verdict", "evidence"), f"not an FP8 recipe: {a.recipe} is {own} high "
                          "precision, so there is no recipe to judge; its step time is shown, its speedup over BF16 "
                          "where a BF16 run was observed")
        if job not in OTHER_HIGH:
            return
        if bench is not None and job not in bench.precisions:
            # Unbenched, its GEMMs would stand in at BF16 time: every prediction would make BF16 = FP32.
            why = (f"no {job} microbenchmark: the microbenchmarks timed {', '.join(bench.precisions)} only, so "
                   f"neither {job}'s GEMM time nor a prediction scaled from it (microbenchmark time over {job}'s) "
                   "can be stated")
            self.hold(job, BENCHED, why)
            self.hold_all(("gemm_speedup_vs_current",) + PREDICTED, why)
            self.warnings.append(f"the job ran {job} and the microbenchmarks timed no {job} GEMM: no step time is "
                                 "predicted")
        if "BF16" not in self.runs:
            self.warnings.append(f"the job ran {job} and no BF16 run was observed: the observed column (step speedup "
                                 "over BF16) stays empty; a run under BF16 autocast (Lightning "
                                 "precision='bf16-mixed', HF bf16=True) gives the baseline the speedups are written "
                                 "over")
            for a in self.recipes:
                if a.recipe in self.runs and a.recipe not in OTHER_HIGH:
                    self.hold(a.recipe, ("verdict",), f"no BF16 run: the job ran {job}, so there is no BF16 step to "
                              f"take {a.recipe}'s speedup over")

    def recipe_holds(self, a: Any, over: set[str], tol: float) -> None:
        """Withhold a row's figures resting on a withheld prediction, an overlong GEMM time, unlike steps or noise."""
        r, run, base, by, held = a.recipe, self.runs.get(a.recipe), self.runs.get("BF16"), self.by, self.withheld
        if any(f in held.get(r, {}) for f in PREDICTED) and a.verdict_kind not in WITHOUT_PREDICTION:
            self.hold(r, ("verdict",), next(held[r][f] for f in PREDICTED if f in held[r]))
        if run is None or base is None or r not in by or "BF16" not in by:
            return
        if r in over or "BF16" in over:
            self.hold(r, ("verdict", "derived_evidence"), f"GEMM share n/a: {'BF16' if 'BF16' in over else r}'s GEMM "
                      "time exceeds its step, so its non-GEMM time would be negative")
        kb, kr = by["BF16"].step_kind(), by[r].step_kind()
        if kb and kr and ATTACHED[kb] != ATTACHED[kr]:
            self.hold(r, ("observed_step_speedup", "observed_ci", "verdict"), f"steps not comparable: BF16's step "
                      f"time comes from {kb} steps ({ATTACHED[kb]}), {r}'s from {kr} steps ({ATTACHED[kr]})")
        if noisy := _too_noisy(a, run, base, by[r], by["BF16"], tol):
            self.hold(r, ("verdict",), noisy)


def report_checks(job: str, runs: dict[str, Any], caps: Iterable[GemmCapture], recipe_of: Callable[[GemmCapture], str],
                  recipes: list[Any], bench: BenchResults | None, tol: float) -> dict[str, Any]:
    """``Report.meta`` entries from the checks. ``job``: the baseline's recipe; ``caps``: the runs'
    captures, the job's first; ``recipes``: the RecipeAnalysis rows; ``tol``: GEMM_BOUND_TOL."""
    by: dict[str, GemmCapture] = {}
    for c in caps:
        by.setdefault(recipe_of(c), c)  # the first capture of a recipe is its run, as in analyze()
    ck = _Checks(job, runs, by, recipes, bench)
    shares = {r: share_check(by[r], o.step_ms, o.gemm_ms) for r, o in runs.items() if r in by}
    for r, chk in shares.items():
        if chk.get("warning"):
            ck.warnings.append(f"{r}: {chk['warning']}")
        elif chk["share"] is None and runs[r].gemm_ms is not None:
            ck.warnings.append(f"{r}: GEMM share n/a: {chk['why']}")
    # GEMM time above the step it is set against: Amdahl's inputs and the non-GEMM time go negative.
    over = {r for r, o in runs.items() if o.gemm_ms is not None and o.gemm_ms > o.step_ms}
    if job in over:
        why = (f"GEMM share n/a: the prediction scales the job's GEMM time ({runs[job].gemm_ms:.2f} ms), which "
               f"exceeds the step it is set against ({runs[job].step_ms:.2f} ms)")
        for a in recipes:
            if a.recipe != "plan" or bench is not None:  # without a bench, the plan's is its file's own
                ck.hold(a.recipe, PREDICTED, why)
    # Only cells of the precision the job's GEMMs ran are set against its GEMM time: an FP32 job's
    # stand-in BF16 cells are another precision's (and high_precision() says so).
    own_cells = job in by and precision_ran(by[job]) == job and bench is not None and job in bench.precisions
    far = ck.bench_fits(own_cells)
    baseline_ran = ck.baseline_ran()
    ck.high_precision()
    for a in recipes:
        if a.recipe != "BF16":
            ck.recipe_holds(a, over, tol)
    spread = by[job].step_spread() if job in by else None
    if spread and spread["spread_pct"] is not None and spread["spread_pct"] > STEP_NOISE_WARN_PCT \
            and not runs[job].round_ms:
        ck.warnings.append(f"{job}: its {spread['steps']} {spread['kind']} steps vary ±{spread['spread_pct']:.0f}%: "
                           "its step time, and every share and speedup made from it, carries that noise")
    ck.warnings += far  # after the checks that hold figures: the log shows the first few
    jc = shares.get(job) or {"share": None, "why": "GEMMs not timed"}
    basis = ({"gemm_share_na": jc["why"]} if jc["share"] is None
             else {"gemm_share_basis": jc["basis"], "gemm_share_of_ms": jc["of_ms"]})
    return {"job_precision": baseline_ran if job == "BF16" and baseline_ran else job, "baseline_ran": baseline_ran,
            "gemm_share": jc["share"], "gemm_shares": shares, "warnings": ck.warnings, "withheld": ck.withheld,
            **basis}


def _too_noisy(a: Any, run: Any, base: Any, cap: GemmCapture, base_cap: GemmCapture, tol: float) -> str | None:
    """Why the verdict cannot pick a side of its ±tol line from these steps, or None; rounds have an interval."""
    if a.verdict_kind not in GAP_VERDICTS or run.round_ms or base.round_ms:
        return None
    obs, pred = a.observed_step_speedup, a.predicted_step_speedup
    sb, sr = base_cap.step_spread(), cap.step_spread()
    if obs is None or pred is None or not sb or not sr or sb["spread_pct"] is None or sr["spread_pct"] is None:
        return None
    noise = (sb["spread_pct"] + sr["spread_pct"]) / 100  # the ratio of two noisy medians: their spreads add
    gap = obs / pred - 1
    if abs(abs(gap) - tol) >= noise:
        return None  # the residual is farther from the line than the noise reaches
    return (f"too noisy to decide: observed {obs:.2f}x against {pred:.2f}x predicted ({100 * gap:+.1f}%) lies within "
            f"the steps' own noise (±{100 * noise:.0f}%: BF16's {sb['steps']} {sb['kind']} steps vary "
            f"±{sb['spread_pct']:.0f}%, {a.recipe}'s {sr['steps']} ±{sr['spread_pct']:.0f}%) of the ±{100 * tol:.0f}% "
            f"line between {'host-bound as predicted' if a.predicted_bound == 'host' else 'GEMM-bound'} and not; "
            "more clean steps, or the sweep's alternating rounds, settle it")


def apply_withheld(recipes: list[Any], withheld: dict[str, dict[str, str]]) -> None:
    """Clear the rows' fields ``report_checks`` withheld; a refused verdict becomes :attr:`Verdict.WITHHELD`."""
    for a in recipes:
        held = withheld.get(a.recipe) or {}
        ev = a.verdict_evidence
        for f in held:
            if f == "evidence":
                ev.cleared = True
            elif f == "derived_evidence":
                ev.non_gemm_withheld = True
            elif f == "high_precision":
                a.high_precision = []
            elif f != "verdict":
                setattr(a, f, None)
            for name in _EVIDENCE_OF.get(f, ()):
                setattr(ev, name, None)
        if "verdict" in held and a.verdict_kind is not Verdict.WITHHELD:  # not twice for one row
            a.verdict_kind, ev.withheld = Verdict.WITHHELD, held["verdict"]
