"""Predicted GEMM speedup against observed step speedup, with a verdict per recipe.

Inputs are measurements only: captures of the live job (step time, in-job GEMM time, operand
precisions), one per recipe where available, and microbenchmark results on the captured shapes.

Prediction (Amdahl's law, Amdahl 1967; DESIGN.md "Speedup accounting"). With the job observed in
recipe r0 (step time T, in-job GEMM time G) and microbenchmarked GEMM time B(r) per step for each
recipe r, the step time if only the GEMMs changed is

    T_pred(r) = T - G + G * B(r) / B(r0)

and the predicted step speedup of r over BF16 is T_pred(BF16) / T_pred(r). For r0 = BF16 this is
T / (T - G + G / s_r) with s_r = B(BF16) / B(r), the GEMM speedup.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from .bench.cells import WorkItem, items_from_capture
from .bench.engine import BenchResults
from .bench.engine import step_ms as bench_step_ms
from .capture.record import GemmCapture

# Precision families a TE recipe's GEMMs should show in a capture.
RECIPE_FAMILY = {"BF16": "bf16", "DelayedScaling": "fp8_delayed", "Float8CurrentScaling": "fp8_current",
                 "Float8BlockScaling": "fp8_block", "MXFP8BlockScaling": "mxfp8", "NVFP4BlockScaling": "nvfp4"}
FAMILY_RECIPE = {v: k for k, v in RECIPE_FAMILY.items()}
GEMM_BOUND_TOL = 0.05  # |observed / predicted - 1| within this: the GEMMs explain the step
NO_GAIN = 1.05  # GEMM speedup below this: no gain at these shapes


def amdahl(step_ms: float, gemm_ms: float, gemm_speedup: float) -> float:
    """Step speedup if only the GEMM part (gemm_ms of step_ms) gets gemm_speedup times faster."""
    if step_ms <= 0 or gemm_speedup <= 0 or not 0 <= gemm_ms <= step_ms:
        raise ValueError(f"need 0 <= gemm_ms <= step_ms and a positive speedup, got {gemm_ms}, {step_ms}, {gemm_speedup}")
    return step_ms / (step_ms - gemm_ms + gemm_ms / gemm_speedup)


def capture_recipe(cap: GemmCapture) -> str:
    """The recipe a capture ran in, read from its TE GEMMs' operand precisions (torch GEMMs beside
    TE layers stay BF16 under every recipe, so they do not vote)."""
    if cap.meta.get("recipe"):
        return cap.meta["recipe"]
    te = [r for r in cap.records if r.source == "te"] or cap.records
    fams = [f for r in te for f in r.precision.split("+") if f in FAMILY_RECIPE]
    if not fams:
        return "BF16"
    return FAMILY_RECIPE[statistics.mode(fams)]


@dataclass
class Observed:
    """What one captured run measured."""

    recipe: str
    step_ms: float
    gemm_ms: float | None
    unquantized: list[str] = field(default_factory=list)  # GEMMs left in high precision
    kernels: dict[str, float] = field(default_factory=dict)  # kernel ms per step by category

    @property
    def non_gemm_ms(self) -> float | None:
        return None if self.gemm_ms is None else self.step_ms - self.gemm_ms


def observe(cap: GemmCapture) -> Observed:
    recipe = capture_recipe(cap)
    fam = RECIPE_FAMILY.get(recipe, "bf16")
    left = sorted({r.name for r in cap.records if r.op == "fprop" and fam not in r.precision.split("+")}) \
        if recipe != "BF16" else []
    step = cap.step_ms()
    if step is None:
        raise ValueError("capture has no step times")
    return Observed(recipe, step, cap.gemm_ms_per_step(), left, dict(cap.meta.get("kernel_breakdown_ms") or {}))


@dataclass
class RecipeAnalysis:
    recipe: str
    gemm_ms_bench: float | None = None  # microbenchmarked GEMM time per step
    gemm_speedup: float | None = None  # over BF16, microbenchmarks
    gemm_speedup_vs_current: float | None = None  # over the recipe the job ran in
    predicted_step_ms: float | None = None
    predicted_step_speedup: float | None = None  # over BF16
    observed_step_ms: float | None = None
    observed_gemm_ms: float | None = None
    observed_step_speedup: float | None = None  # over BF16
    verdict: str = ""
    evidence: list[str] = field(default_factory=list)


@dataclass
class Report:
    current_recipe: str
    step_ms: float
    gemm_ms: float | None
    recipes: list[RecipeAnalysis]
    skipped: dict[str, str]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def gemm_share(self) -> float | None:
        return self.gemm_ms / self.step_ms if self.gemm_ms is not None else None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["schema"] = "te-gemm-report/1"
        d["gemm_share"] = self.gemm_share
        return d


def analyze(capture: GemmCapture, bench: BenchResults | None = None, observed: list[GemmCapture] = (),
            mode: str = "autocast", items: list[WorkItem] | None = None) -> Report:
    """Join the job's capture, microbenchmarks of its shapes, and captures run in other recipes."""
    base = observe(capture)
    if base.gemm_ms is None:
        raise ValueError("the capture has no GEMM times (captured on CPU?): time it on the GPU to analyse")
    runs = {base.recipe: base}
    for cap in observed:
        o = observe(cap)
        runs.setdefault(o.recipe, o)
    items = items or items_from_capture(capture)
    recipes = list(dict.fromkeys((bench.precisions if bench else []) + list(runs)))
    bench_ms = {r: bench_step_ms(bench, items, r, mode) for r in recipes} if bench else {}
    pred_step = {}
    b0 = bench_ms.get(base.recipe)
    for r in recipes:
        if bench_ms.get(r) and b0:
            pred_step[r] = base.step_ms - base.gemm_ms + base.gemm_ms * bench_ms[r] / b0
    out = []
    for r in recipes:
        a = RecipeAnalysis(r, gemm_ms_bench=bench_ms.get(r))
        if bench_ms.get(r) and bench_ms.get("BF16"):
            a.gemm_speedup = bench_ms["BF16"] / bench_ms[r]
        if bench_ms.get(r) and b0:
            a.gemm_speedup_vs_current = b0 / bench_ms[r]
        if r in pred_step:
            a.predicted_step_ms = pred_step[r]
            if "BF16" in pred_step:
                a.predicted_step_speedup = pred_step["BF16"] / pred_step[r]
        if r in runs:
            a.observed_step_ms, a.observed_gemm_ms = runs[r].step_ms, runs[r].gemm_ms
            if "BF16" in runs:
                a.observed_step_speedup = runs["BF16"].step_ms / runs[r].step_ms
        a.verdict, a.evidence = verdict(a, runs.get(r), runs.get("BF16"))
        out.append(a)
    skipped = dict(bench.skipped) if bench else {}
    return Report(base.recipe, base.step_ms, base.gemm_ms, out, skipped,
                  meta={"device": capture.meta.get("device"), "mode": mode,
                        "timing": "step: CUDA events between step boundaries; GEMM: CUDA-event pair per GEMM"})


def verdict(a: RecipeAnalysis, run: Observed | None, bf16: Observed | None) -> tuple[str, list[str]]:
    """GEMM-bound / overhead eats the gain / no gain or silent fallback, with the numbers behind it."""
    if a.recipe == "BF16":
        return "baseline", []
    ev: list[str] = []
    if run is not None and run.unquantized:
        ev.append(f"{len(run.unquantized)} GEMM(s) ran in high precision under {a.recipe}: "
                  + ", ".join(run.unquantized[:6]) + (" ..." if len(run.unquantized) > 6 else ""))
    sp = a.gemm_speedup
    if sp is None and run is not None and bf16 is not None and run.gemm_ms and bf16.gemm_ms:
        sp = bf16.gemm_ms / run.gemm_ms  # in-job GEMM times of the two runs
        ev.append(f"in-job GEMM time {bf16.gemm_ms:.2f} -> {run.gemm_ms:.2f} ms")
    if sp is not None:
        ev.append(f"GEMM speedup {sp:.2f}x")
    if sp is not None and sp < NO_GAIN:
        what = "silent fallback" if run is not None and run.unquantized else "no gain at these shapes"
        return f"no gain ({what})", ev
    obs, pred = a.observed_step_speedup, a.predicted_step_speedup
    if pred is None and sp is not None and bf16 is not None and bf16.gemm_ms is not None:
        pred = amdahl(bf16.step_ms, bf16.gemm_ms, sp)
        a.predicted_step_speedup = pred
    if obs is None or pred is None:
        return "predicted only (no observed run in this recipe)", ev
    ev.append(f"predicted step speedup {pred:.2f}x, observed {obs:.2f}x")
    gap = obs / pred - 1
    if abs(gap) <= GEMM_BOUND_TOL:
        return "GEMM-bound: working as expected", ev
    if gap > 0:
        if run is not None and bf16 is not None and run.non_gemm_ms is not None and bf16.non_gemm_ms is not None:
            ev.append(f"non-GEMM time {bf16.non_gemm_ms:.2f} -> {run.non_gemm_ms:.2f} ms")
        return "better than the GEMMs alone predict (non-GEMM time shrank too)", ev
    if run is not None and bf16 is not None and run.non_gemm_ms is not None and bf16.non_gemm_ms is not None:
        moved = run.non_gemm_ms - bf16.non_gemm_ms
        ev.append(f"non-GEMM time {bf16.non_gemm_ms:.2f} -> {run.non_gemm_ms:.2f} ms ({moved:+.2f} ms per step: "
                  "quantization, casts, amax reductions, layers left in high precision)")
    if run is not None and bf16 is not None and run.kernels and bf16.kernels:
        deltas = sorted(((run.kernels.get(k, 0.0) - bf16.kernels.get(k, 0.0), k) for k in run.kernels
                         if k != "gemm"), reverse=True)
        grew = [f"{k} {d:+.2f} ms" for d, k in deltas if d > 0.01]
        if grew:
            ev.append("kernel time that grew (torch.profiler, per step): " + ", ".join(grew))
    return "overhead eats the gain", ev
