"""What one captured run measured (:class:`Observed`), and the observed step speedup of one run over
another: the median over the sweep's alternating rounds, with its interval."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from te_gemm_callback.capture.capture_file import GemmCapture
from te_gemm_callback.precisions import FAMILY_RECIPE, RECIPE_FAMILY
from te_gemm_callback.sweep.intervals import Estimate, estimate

# High precisions a capture names from its GEMMs' operand dtypes when no FP8 recipe ran.
HIGH_PRECISION = {"bf16": "BF16", "fp16": "FP16", "fp32": "FP32"}


def precision_ran(cap: GemmCapture) -> str:
    """What a capture's GEMMs ran, from their operand precisions: the most common FP8 family's recipe,
    else the most common high precision; "BF16" without any GEMM. Its TE GEMMs vote where it has any
    (torch GEMMs beside TE layers stay high precision under every recipe)."""
    te = [r for r in cap.records if r.source == "te"] or cap.records
    parts = [f for r in te for f in r.precision.split("+")]
    fams = [f for f in parts if f in FAMILY_RECIPE]  # the FP8 families, and "bf16"
    if any(f != "bf16" for f in fams):
        return FAMILY_RECIPE[statistics.mode(fams)]
    high = [HIGH_PRECISION[f] for f in parts if f in HIGH_PRECISION]
    return statistics.mode(high) if high else "BF16"


def capture_recipe(cap: GemmCapture) -> str:
    """The recipe its file names (a sweep's entry: the key speedups are joined on), else :func:`precision_ran`."""
    return cap.meta.get("recipe") or precision_ran(cap)


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
    # Of ``unquantized``, those the recipe was to quantize: a plain torch layer of a TE job runs high
    # precision under every recipe, so leaving it unquantized is the job's choice, not a fallback.
    fallback: list[str] = field(default_factory=list)

    @property
    def non_gemm_ms(self) -> float | None:
        return None if self.gemm_ms is None else self.step_ms - self.gemm_ms


def round_speedups(base: Observed, run: Observed) -> list[float]:
    """Step speedup of ``run`` over ``base`` in each sweep round both ran in, in round order."""
    return [base.round_ms[k] / run.round_ms[k] for k in sorted(set(base.round_ms) & set(run.round_ms))]


def observed_estimate(base: Observed, run: Observed) -> Estimate | None:
    """The median of the per-round speedups with its 95% interval, or None without common rounds."""
    per_round = round_speedups(base, run)
    return estimate(per_round) if per_round else None


def observed_speedup(base: Observed, run: Observed) -> float:
    """Step speedup of ``run`` over ``base``: the median of the per-round ratios where both ran in the
    same rounds (the host's drift cancels within a round), else the ratio of their median step times."""
    per_round = round_speedups(base, run)
    return statistics.median(per_round) if per_round else base.step_ms / run.step_ms


def observe(cap: GemmCapture) -> Observed:
    """What ``cap`` measured; a sweep capture's step time is the median over its rounds."""
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
        # The rounds' step time, so the step, its non-GEMM time and the speedup agree: the capture's own
        # clean steps ran minutes from the other recipes' (docs/results/h200.md: round step time).
        step = statistics.median(round_ms.values())
    parts = [s.fwd_bwd_ms for s in cap.steps_of("clean") if s.fwd_bwd_ms is not None]
    te = any(r.source == "te" for r in cap.records)
    fallback = sorted({r.name for r in cap.records if r.name in left and (r.source == "te" or not te)})
    return Observed(recipe, step, cap.gemm_ms_per_step(), left, dict(cap.meta.get("kernel_breakdown_ms") or {}),
                    round_ms, statistics.median(parts) if parts else None, fallback)
