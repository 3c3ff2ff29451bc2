"""What each captured run measured, and each recipe's "GEMMs alone" step by Amdahl's law
(docs/benchmark-methodology.md): with the job observed in recipe r0 (step T, in-job GEMM time G) and
microbenchmarked GEMM time B(r) per step, T(r) = T - G + G * B(r) / B(r0). G is kernel time, so B is
pre-quantized where measured; autocast mode (every quantization unfused) gives its unfused variant. Both are
bounds with the rest of the step held fixed, never the predicted step, which is the replay's (whatif)."""

from __future__ import annotations

from typing import Any

from te_gemm_callback.capture.capture_file import GemmCapture
from te_gemm_callback.microbench.items import WorkItem
from te_gemm_callback.microbench.results import BenchResults
from te_gemm_callback.microbench.results import step_ms as bench_step_ms
from te_gemm_callback.precisions import RECIPE_FAMILY, padded_splits
from te_gemm_callback.sweep.observed import (  # noqa: F401  (re-exported: the analysis reads them from here)
    HIGH_PRECISION,
    Observed,
    capture_recipe,
    observe,
    observed_estimate,
    observed_speedup,
    precision_ran,
    round_speedups,
)


def amdahl(step_ms: float, gemm_ms: float, gemm_speedup: float) -> float:
    """Step speedup if only the GEMM part (gemm_ms of step_ms) gets gemm_speedup times faster."""
    if step_ms <= 0 or gemm_speedup <= 0 or not 0 <= gemm_ms <= step_ms:
        raise ValueError(f"need 0 <= gemm_ms <= step_ms and a positive speedup, "
                         f"got {gemm_ms}, {step_ms}, {gemm_speedup}")
    return step_ms / (step_ms - gemm_ms + gemm_ms / gemm_speedup)


def predict_steps(base: Observed, bench_ms: dict[str, float | None]) -> dict[str, float]:
    """Step time per recipe if only the GEMMs changed (module docstring)."""
    b0 = bench_ms.get(base.recipe)
    if not b0 or base.gemm_ms is None:
        return {}
    return {r: base.step_ms - base.gemm_ms + base.gemm_ms * b / b0 for r, b in bench_ms.items() if b}


def gemm_mode(modes: list[str]) -> str:
    """The bench mode of the report's GEMM figures: pre-quantized where the bench ran it, since the in-job GEMM
    time those figures scale is kernel time with the quantization apart; else autocast."""
    return "prequantized" if "prequantized" in modes else "autocast"


def gemms_alone_steps(base: Observed, capture: GemmCapture, bench: BenchResults, items: list[WorkItem],
                      plan: dict[str, Any]) -> dict[str, float]:
    """The report's GEMMs alone as step ms: each recipe the bench ran, and ``plan`` (its "recipe" and
    "keep_bf16") under "plan", Amdahl over ``base``'s GEMM share with the GEMM times of the report's mode.
    The plan reads them from here so that its figures and the report's GEMMs alone column cannot part."""
    mode = gemm_mode(bench.meta.get("modes", ["autocast"]))
    ms = {r: bench_step_ms(bench, items, r, mode, fallback="BF16") for r in bench.precisions}
    steps = predict_steps(base, ms)
    got = plan_prediction(plan, base, capture, bench, items, ms, {}, mode)
    return {**steps, "plan": got[0]} if got else steps


def plan_prediction(plan: dict[str, Any], base: Observed, capture: GemmCapture, bench: BenchResults,
                    items: list[WorkItem], bench_ms: dict[str, float | None], auto_ms: dict[str, float | None],
                    mode: str) -> tuple[float, float, float | None] | None:
    """(step ms, speedup, unfused speedup) of the plan, predicted like the recipes beside it: its ``keep_bf16``
    modules at their BF16 time, the rest in its recipe."""
    owner = {r.name: r.module for r in capture.records}
    keep = set(plan.get("keep_bf16", []))

    def total(m: str) -> float | None:
        kept = [it for it in items if owner.get(it.name, it.name) in keep]
        rest = [it for it in items if owner.get(it.name, it.name) not in keep]
        t_kept = bench_step_ms(bench, kept, "BF16", m)
        t_rest = bench_step_ms(bench, rest, plan.get("recipe", "BF16"), m, fallback="BF16")
        return None if t_kept is None or t_rest is None else t_kept + t_rest

    def predicted(ms: dict[str, float | None], m: str) -> tuple[float, float] | None:
        p = predict_steps(base, {**ms, "plan": total(m)})
        return (p["plan"], p["BF16"] / p["plan"]) if "plan" in p and "BF16" in p else None

    fused = predicted(bench_ms, mode)
    unfused = predicted(auto_ms, "autocast") if auto_ms else None  # as the recipes' "unfused" prediction
    return None if fused is None else (*fused, unfused[1] if unfused else None)


def padding_pct(items: list[WorkItem], recipe: str) -> float | None:
    """Extra grouped-GEMM rows (%) when every expert's rows are padded to the recipe's alignment."""
    grouped = [(it.m_splits, it.count) for it in items if it.m_splits]
    rows = sum(sum(splits) * count for splits, count in grouped)
    if not rows or recipe not in RECIPE_FAMILY or recipe == "BF16":  # FP32 / FP16 jobs pad nothing either
        return None
    padded = sum(sum(padded_splits(splits, recipe)) * count for splits, count in grouped)
    return 100 * (padded / rows - 1)


def short_error(err: str) -> str:
    """TE's assertion text without the source location ('ret.lda % 16 == 0')."""
    if "Assertion failed:" in err:
        err = err.split("Assertion failed:", 1)[1].split(". ")[0].strip()
    if len(err) <= 160:
        return err
    return err[:160].rsplit(" ", 1)[0].rstrip(",;:") + " ..."  # at a word, and said to go on
