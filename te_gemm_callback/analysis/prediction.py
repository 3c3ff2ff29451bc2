"""What each captured run measured, and the step time predicted for each recipe.

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
residual, read from the observed runs' non-GEMM time and kernel categories
(:mod:`te_gemm_callback.analysis.verdicts`). The autocast-mode microbenchmarks (GEMM plus a
standalone quantization of its inputs) give a second, pessimistic prediction: every cast unfused.
"""

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


def plan_prediction(plan: dict[str, Any], base: Observed, capture: GemmCapture, bench: BenchResults,
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

    pred = predict_steps(base, {**bench_ms, "plan": total(mode)})
    if "plan" not in pred or "BF16" not in pred:
        return None
    unfused = None
    if auto_ms:  # the autocast-mode totals behind the recipes' "unfused" prediction
        u = predict_steps(base, {**auto_ms, "plan": total("autocast")})
        if "plan" in u and "BF16" in u:
            unfused = u["BF16"] / u["plan"]
    return pred["plan"], pred["BF16"] / pred["plan"], unfused


def padding_pct(items: list[WorkItem], recipe: str) -> float | None:
    """Extra grouped-GEMM rows when every expert's rows are padded to the recipe's alignment (the
    microbenchmarks time the padded GEMMs, as MoE code under that recipe runs them)."""
    grouped = [(it.m_splits, it.count) for it in items if it.m_splits]
    rows = sum(sum(splits) * count for splits, count in grouped)
    if not rows or recipe not in RECIPE_FAMILY or recipe == "BF16":  # FP32 / FP16 jobs pad nothing either
        return None
    padded = sum(sum(padded_splits(splits, recipe)) * count for splits, count in grouped)
    return 100 * (padded / rows - 1)


def short_error(err: str) -> str:
    """TE's assertion text without the source location: 'ret.lda % 16 == 0' is the part that matters."""
    if "Assertion failed:" in err:
        err = err.split("Assertion failed:", 1)[1].split(". ")[0].strip()
    return err[:120]


def in_job_gemm_speedup(run: Observed, bf16: Observed) -> float | None:
    return bf16.gemm_ms / run.gemm_ms if run.gemm_ms and bf16.gemm_ms else None
