"""A recipe's verdict as data (:class:`Verdict`, :class:`Evidence`) and :func:`render`, the one
place both become the sentences a report prints and report.json keeps."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from te_gemm_callback.sweep.intervals import Estimate

_LISTED = 6  # names an evidence line lists before "..."


class Verdict(str, Enum):
    """What a recipe's observed step speedup says against its prediction (report.json's ``verdict_kind``)."""
    BASELINE = "baseline"  # BF16: what every speedup is over
    GEMM_BOUND = "gemm_bound"  # observed within the tolerance of predicted, a GPU-bound step
    HOST_BOUND = "host_bound"  # observed within the tolerance of predicted, a step the replay says the host bounds
    BETTER_THAN_PREDICTED = "better_than_predicted"  # non-GEMM time shrank too
    OVERHEAD_EATS_GAIN = "overhead_eats_gain"  # observed short of predicted
    UNDECIDED = "undecided"  # the observed speedup's interval straddles a line
    NO_GAIN = "no_gain"  # GEMM speedup below the no-gain threshold at these shapes
    SILENT_FALLBACK = "silent_fallback"  # no gain, and GEMMs ran unquantized under the recipe
    PREDICTED_ONLY = "predicted_only"  # no observed run to set the prediction against
    OBSERVED_ONLY = "observed_only"  # an observed run and no prediction: the observed speedup alone
    NOT_JUDGED = "not_judged"  # neither an observed run nor a prediction: GEMMs alone only
    WITHHELD = "withheld"  # refused by the report's checks: "n/a (why)"


# The verdicts drawn from observed / predicted: the ones a too-noisy residual cannot decide.
GAP_VERDICTS = frozenset({Verdict.GEMM_BOUND, Verdict.HOST_BOUND, Verdict.OVERHEAD_EATS_GAIN,
                          Verdict.BETTER_THAN_PREDICTED})
# Verdicts that need no prediction: they stand where the checks refuse the predicted columns.
WITHOUT_PREDICTION = frozenset({Verdict.BASELINE, Verdict.NO_GAIN, Verdict.SILENT_FALLBACK, Verdict.OBSERVED_ONLY,
                                Verdict.NOT_JUDGED})


@dataclass
class Straddle:
    """An observed speedup whose 95% interval (or the rounds' range) reaches across ``edge`` x predicted."""
    low: float
    high: float
    edge: float  # 1 - tolerance (as predicted vs overhead) or 1 + tolerance (as predicted vs better)
    rounds: int
    rounds_range: bool = False


@dataclass
class StepParts:
    """A sweep step split into forward+backward and the rest, in both runs."""
    bf16_fwd_bwd_ms: float
    fwd_bwd_ms: float
    bf16_step_ms: float
    step_ms: float


@dataclass
class PlanEvidence:
    """A swept precision plan: what it kept in BF16, and the best single recipe observed beside it."""
    recipe: str | None
    keep_bf16: list[str]
    step_ms: float
    best_single: str | None = None
    best_single_ms: float | None = None
    file_predicted: float | None = None  # the plan file's own prediction, shown where this run's replaced it


@dataclass
class Evidence:
    """The numbers a verdict rests on; every field optional, each rendered as one line where set."""
    recipe: str = ""
    unquantized: list[str] = field(default_factory=list)  # GEMMs that ran in high precision under the recipe
    padded_rows_pct: float | None = None
    row_alignment: int | None = None
    high_precision: list[str] = field(default_factory=list)  # GEMMs the recipe cannot run, timed in BF16
    gemm_speedup: float | None = None
    gemm_source: str = "bench"  # where the GEMM speedup comes from: "bench" or "in job" (the runs' own GEMM times)
    in_job_gemm_ms: tuple[float, float] | None = None  # (BF16, this recipe)
    no_gain_below: float | None = None  # the GEMM speedup under which a recipe gains nothing
    predicted: float | None = None  # step speedup over BF16, the replay's
    bound: str | None = None  # "host" or "gpu": what bounds the replayed step
    gemms_alone: float | None = None  # Amdahl over the GEMM share: shown, never judged against
    no_prediction: str | None = None  # why there is no prediction (no replay) to judge against
    observed: float | None = None  # step speedup over BF16
    estimate: Estimate | None = None  # the per-round speedups' median and interval
    tolerance: float | None = None  # |observed / predicted - 1| within this: GEMM-bound
    straddle: Straddle | None = None
    unfused: float | None = None  # GEMMs alone with every quantization unfused: shown, never judged against
    non_gemm_ms: tuple[float, float] | None = None  # (BF16, this recipe)
    step_parts: StepParts | None = None
    kernel_moves: list[tuple[str, float]] = field(default_factory=list)  # (category, ms per step), largest first
    idle_ms: float | None = None  # step time in no kernel, this recipe minus BF16
    host_wait_ms: float | None = None  # the overhead is mostly the GPU waiting on the host: this much more
    non_gemm_withheld: bool = False  # the checks refused the lines made from the non-GEMM time
    plan: PlanEvidence | None = None
    cleared: bool = False  # the checks refused all of it
    withheld: str | None = None  # why the checks refused the verdict

    @property
    def residual(self) -> float | None:
        """observed / predicted - 1."""
        if self.observed is None or self.predicted is None:
            return None
        return self.observed / self.predicted - 1

    @property
    def overhead_ms(self) -> float | None:
        """How much the non-GEMM time per step grew from BF16 to this recipe."""
        return None if self.non_gemm_ms is None else self.non_gemm_ms[1] - self.non_gemm_ms[0]


def _listed(names: list[str]) -> str:
    return ", ".join(names[:_LISTED]) + (" ..." if len(names) > _LISTED else "")


def verdict_text(kind: Verdict | None, ev: Evidence) -> str:
    """The verdict's sentence."""
    if kind is None:
        return ""
    if kind is Verdict.WITHHELD:
        # The reason's head, "too noisy to decide"; the whole reason is the evidence's last line.
        return f"n/a ({(ev.withheld or '').split(':')[0]})"
    return {
        Verdict.BASELINE: "baseline",
        Verdict.GEMM_BOUND: "GEMM-bound: working as expected",
        Verdict.HOST_BOUND: "host-bound as predicted: working as expected (the host's time, not the GEMMs', sets "
                            "the step)",
        Verdict.BETTER_THAN_PREDICTED: "better than predicted (the step gained more than the prediction expects)",
        Verdict.OVERHEAD_EATS_GAIN: "overhead eats the gain",
        Verdict.UNDECIDED: "undecided (the observed speedup's interval straddles the line)",
        Verdict.NO_GAIN: _no_gain_text(ev),
        Verdict.SILENT_FALLBACK: "no gain (silent fallback)",
        Verdict.PREDICTED_ONLY: "predicted only (no observed run in this recipe)",
        Verdict.OBSERVED_ONLY: f"observed only: {_direction(ev)} (no prediction to judge against: "
                               f"{_short(ev.no_prediction)})",
        Verdict.NOT_JUDGED: f"not judged: no observed run in this recipe and no prediction "
                            f"({_short(ev.no_prediction)})",
    }[kind]


def _short(reason: str | None) -> str:
    """A reason's head, up to its first colon or parenthesis: what fits inside a verdict's parentheses."""
    return re.split(r":| \(", reason or "no replay", maxsplit=1)[0]


def _no_gain_text(ev: Evidence) -> str:
    """Slower GEMMs are a slowdown, not "no gain"; the GEMMs ran quantized (else: silent fallback)."""
    if ev.gemm_speedup is not None and ev.gemm_speedup < 1:
        return f"slower GEMMs at these shapes ({ev.gemm_speedup:.2f}x GEMM speedup)"
    return "no gain (no gain at these shapes)"


def _direction(ev: Evidence) -> str:
    """Which side of BF16 the observed step lies on, by its interval where there is one."""
    est, obs = ev.estimate, ev.observed
    lo, hi = (est.low, est.high) if est is not None and est.low is not None else (obs, obs)
    if lo is None or hi is None:
        return "no observed speedup"
    if lo > 1:
        return "faster than BF16"
    if hi < 1:
        return "slower than BF16"
    return "not told apart from BF16 (its interval holds 1.00x)"


def _comparison(ev: Evidence) -> str:
    """Predicted against observed, with the interval and what it leaves undecided (``residual`` set)."""
    predicted, residual = cast(float, ev.predicted), cast(float, ev.residual)
    observed = ev.estimate.text() if ev.estimate else f"{ev.observed:.2f}x"
    line = f"predicted step speedup {predicted:.2f}x, observed {observed} (residual {100 * residual:+.1f}%)"
    if (s := ev.straddle) is not None:
        what = f"{s.rounds} rounds (too few for a 95% interval) range" if s.rounds_range else "95% interval"
        # A host-bound step that meets its prediction is not GEMM-bound: the line is named for what it is.
        near = "host-bound as predicted" if ev.bound == "host" else "GEMM-bound"
        sides = f"{near} and overhead eating the gain" if s.edge < 1 else f"{near} and better than predicted"
        line += (f"; undecided: its {what} {s.low:.2f}-{s.high:.2f}x reaches across {s.edge * predicted:.2f}x "
                 f"({100 * (s.edge - 1):+.0f}% of the prediction), the line between {sides}")
    return line


def _unfused_line(ev: Evidence) -> str:
    """GEMMs alone and its unfused variant, apart from the prediction: bounds, not predicted steps."""
    alone = f"GEMMs alone {ev.gemms_alone:.2f}x, with" if ev.gemms_alone is not None else "GEMMs alone with"
    return (f"{alone} every quantization unfused {cast(float, ev.unfused):.2f}x (Amdahl over the GEMM share: the "
            "rest of the step held fixed, so not predictions of the step, never judged against)")


def _observed_line(ev: Evidence, kind: Verdict | None) -> str:
    """The observed speedup without a prediction: GEMMs alone beside it, and why it is not judged against."""
    observed = ev.estimate.text() if ev.estimate else f"{ev.observed:.2f}x"
    line = f"observed step speedup {observed}"
    if ev.gemms_alone is not None:
        line += (f"; GEMMs alone {ev.gemms_alone:.2f}x (Amdahl over the GEMM share: the rest of the step held fixed, "
                 "so not a prediction of the step)")
    if ev.no_prediction:
        line += f"; no prediction: {ev.no_prediction}"
        if kind is Verdict.OBSERVED_ONLY:  # a no-gain verdict rests on the GEMM speedup instead
            line += "; this verdict rests on the observed speedup and its interval"
    return line


def _cause(kind: Verdict, ev: Evidence) -> str | None:
    if kind is Verdict.UNDECIDED:
        return "more rounds narrow it: a larger sweep time budget (sweep_budget_s), or sweep_steps"
    if kind is Verdict.BETTER_THAN_PREDICTED:
        return ("likely cause: fused norm/activation kernels write FP8 outputs (half the bytes of BF16); on a "
                "host-bound step, the module benchmark's host cost above the job's (benchmarks/host_cost_check.py)")
    if kind is Verdict.OVERHEAD_EATS_GAIN:
        if ev.host_wait_ms is not None:
            return (f"where it goes: mostly host time: the GPU waits {ev.host_wait_ms:.2f} ms more per step between "
                    "kernels (likely the Python and launch cost of the recipe's quantization in every layer); "
                    "larger micro-batches or CUDA graphs hide it")
        return "where it goes: quantization and cast kernels, amax reductions, layers left in high precision"
    return None


def evidence_lines(kind: Verdict | None, ev: Evidence) -> list[str]:
    """The evidence as the report prints it, one line per fact."""
    lines = [] if ev.cleared else _fact_lines(kind, ev)
    if ev.withheld:
        lines.append(ev.withheld)
    return lines


def _gemm_lines(ev: Evidence) -> list[str]:
    """What the recipe's GEMMs did: kept, unquantized, padded, in high precision, and their speedups."""
    lines: list[str] = []
    p = ev.plan
    if p is not None:
        kept = f": {_listed(p.keep_bf16)}" if p.keep_bf16 else ""
        lines.append(f"{p.recipe} with {len(p.keep_bf16)} module(s) kept in BF16{kept}")
    if ev.unquantized:
        lines.append(f"{len(ev.unquantized)} GEMM(s) ran in high precision under {ev.recipe}: "
                     + _listed(ev.unquantized))
    if ev.padded_rows_pct:
        lines.append(f"grouped GEMMs timed with each expert's rows padded to a multiple of {ev.row_alignment}: "
                     f"{ev.padded_rows_pct:+.1f}% rows")
    if ev.high_precision:
        lines.append(f"{len(ev.high_precision)} GEMM(s) cannot run in {ev.recipe}, counted at BF16 time: "
                     + "; ".join(ev.high_precision[:3]))
    if ev.gemm_speedup is not None:
        src = "" if ev.gemm_source == "bench" else " (the runs' own GEMM times, no microbenchmark)"
        lines.append(f"GEMM speedup {ev.gemm_speedup:.2f}x{src}")
    if ev.in_job_gemm_ms is not None:
        b, r = ev.in_job_gemm_ms
        lines.append(f"in-job GEMM time {b:.2f} -> {r:.2f} ms ({b / r:.2f}x)")
    return lines


def _fact_lines(kind: Verdict | None, ev: Evidence) -> list[str]:
    lines = _gemm_lines(ev)
    p = ev.plan
    if ev.residual is not None:
        lines.append(_comparison(ev))
        if ev.unfused is not None:
            lines.append(_unfused_line(ev))
    elif ev.observed is not None:
        lines.append(_observed_line(ev, kind))
    if ev.non_gemm_ms is not None and not ev.non_gemm_withheld:
        b, r = ev.non_gemm_ms
        lines.append(f"non-GEMM time {b:.2f} -> {r:.2f} ms ({ev.overhead_ms:+.2f} ms per step)")
    s = ev.step_parts
    if s is not None:
        lines.append(f"forward+backward {s.bf16_fwd_bwd_ms:.2f} -> {s.fwd_bwd_ms:.2f} ms "
                     f"({s.bf16_fwd_bwd_ms / s.fwd_bwd_ms:.2f}x); the optimizer step and the rest of the step "
                     f"{s.bf16_step_ms - s.bf16_fwd_bwd_ms:.2f} -> {s.step_ms - s.fwd_bwd_ms:.2f} ms")
    if ev.kernel_moves:
        lines.append("kernel time that moved (torch.profiler, per step): "
                     + ", ".join(f"{k} {d:+.2f} ms" for k, d in ev.kernel_moves))
    if ev.idle_ms is not None and not ev.non_gemm_withheld:
        lines.append(f"GPU time in no kernel (host-bound gaps) {ev.idle_ms:+.2f} ms per step")
    cause = _cause(kind, ev) if kind is not None else None
    # The undecided hint rests on the rounds; the causes on the non-GEMM time, which may be withheld.
    if cause and (kind is Verdict.UNDECIDED or not ev.non_gemm_withheld):
        lines.append(cause)
    if p is not None and p.best_single is not None and p.best_single_ms is not None:  # set together
        lines.append(f"best single recipe observed: {p.best_single} {p.best_single_ms:.2f} ms per step; the plan "
                     f"{p.step_ms:.2f} ms ({100 * (p.step_ms / p.best_single_ms - 1):+.1f}%)")
    if p is not None and p.file_predicted:
        lines.append(f"the plan file's GEMMs alone {p.file_predicted:.2f}x (from the run it was made "
                     "from); the GEMMs alone above comes from this run, like the recipes'")
    return lines


def render(kind: Verdict | None, ev: Evidence) -> tuple[str, list[str]]:
    """(the verdict's sentence, its evidence lines): what the report prints and report.json keeps."""
    return verdict_text(kind, ev), evidence_lines(kind, ev)
