"""Per-layer precision plan: which modules to keep in BF16 under an FP8 recipe.

For each GEMM-owning module of the captured job, the autocast-mode microbenchmarks (each GEMM plus
the quantization of its inputs, what training pays) give its GEMM time per step under every recipe
that ran. A plan is one FP8 recipe with the modules where that recipe loses kept in BF16; the best
plan is the one with the least GEMM time. Step times are predicted the way the report predicts
them (Amdahl over the job's measured GEMM share: T - G + G x B(plan) / B(job recipe)).

A module that TE cannot run in the recipe (FP8 needs dims divisible by 16; a cell that failed) is
kept in BF16: a plan never asks TE for what it refused in the microbenchmark.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from te_gemm_callback.capture.capture_file import GemmCapture
from te_gemm_callback.capture.guards import StandIn
from te_gemm_callback.files.jsonio import (
    SPECS,
    check,
    check_target,
    from_fields,
    json_kind,
    read_schema,
    text_kind,
    write_json,
    write_text,
)
from te_gemm_callback.microbench.cells import WorkItem
from te_gemm_callback.microbench.results import BenchResults, item_ms

SCHEMA = "te-gemm-plan/1"
MODE = "autocast"
# The YAML's first line: what marks a file as ours to replace (a YAML file has no schema field).
YAML_MARKER = "# te-gemm precision plan: TE debug-API config written by te-gemm (safe to regenerate)"
# Files written before the marker existed start with the config's key.
YAML_KIND = text_kind("te-gemm plan YAML", YAML_MARKER.encode(), b"te_gemm_plan_keep_bf16:")


@dataclass
class ModuleChoice:
    module: str
    bf16_ms: float | None  # GEMM (+ quantization) time per step in BF16
    fp8_ms: float | None  # ... in the plan's recipe (None: TE cannot run it)
    keep_bf16: bool

    @property
    def fp8_loss_ms(self) -> float | None:
        """How much slower the recipe is than BF16 on this module, per step (> 0: FP8 loses)."""
        return None if self.fp8_ms is None or self.bf16_ms is None else self.fp8_ms - self.bf16_ms


@dataclass
class PrecisionPlan:
    """One FP8 recipe, and the modules kept in BF16 under it.

    Example:
        >>> plan = PrecisionPlan("Float8CurrentScaling", ["lm_head"])
        >>> plan.keep_bf16
        ['lm_head']
    """

    recipe: str
    keep_bf16: list[str]
    modules: list[ModuleChoice] = field(default_factory=list)
    predicted_step_ms: dict[str, float] = field(default_factory=dict)  # "BF16", each recipe, "plan"
    predicted_speedup: dict[str, float] = field(default_factory=dict)  # over BF16
    gemm_ms: dict[str, float] = field(default_factory=dict)  # bench GEMM time per step, same keys
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def same_as(self) -> str | None:
        """The single recipe this plan amounts to, or None for a mixed plan: "BF16" when every
        module stays BF16, the recipe when only modules TE cannot run in it stay BF16 (TE would
        run those in BF16 under the recipe alone too)."""
        if not self.modules:
            return None if self.keep_bf16 else self.recipe
        kept = set(self.keep_bf16)
        if kept >= {m.module for m in self.modules}:
            return "BF16"
        if kept <= {m.module for m in self.modules if m.fp8_ms is None}:
            return self.recipe
        return None

    @property
    def best_single(self) -> str | None:
        singles = {k: v for k, v in self.predicted_step_ms.items() if k != "plan"}
        return min(singles, key=singles.get) if singles else None

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, **asdict(self)}

    def save(self, path: str | Path) -> Path:
        return write_json(path, self.to_dict(), schema=SCHEMA)

    @classmethod
    def load(cls, path: str | Path) -> PrecisionPlan:
        d = read_schema(path, SCHEMA, "te-gemm precision plan")  # field types checked (jsonio.PLAN_FILE)
        mods = [from_fields(ModuleChoice, m) for m in d.get("modules", [])]
        return cls(d["recipe"], list(d["keep_bf16"]), mods, d.get("predicted_step_ms", {}),
                   d.get("predicted_speedup", {}), d.get("gemm_ms", {}), d.get("meta", {}))

    def nvdlfw_yaml(self) -> str:
        """A config for TE's debug API (nvdlfw_inspect) that keeps the same modules out of FP8,
        without this package: ``debug_api.initialize(config_file=...)``. Layer names are this
        capture's module paths; where TE's inferred names differ (another root), edit the pattern."""
        bad = [m for m in self.keep_bf16 if not m.isprintable()]
        if bad:  # a YAML scalar cannot hold them literally, and no module path of TE's has them
            raise ValueError(f"module name {bad[0]!r} holds control characters: it cannot go in the YAML config")
        # A single-quoted YAML scalar: its only escape is a doubled quote (a module named a'b broke the file).
        pattern = ("^(" + "|".join(re.escape(m) for m in self.keep_bf16) + ")$").replace("'", "''")
        return (YAML_MARKER + "\n"
                "te_gemm_plan_keep_bf16:\n"
                f"  enabled: {bool(self.keep_bf16)}\n"
                "  layers:\n"
                f"    layer_name_regex_pattern: '{pattern}'\n"
                "  transformer_engine:\n"
                "    DisableFP8Layer:\n"
                "      enabled: True\n")


def module_times(items: list[WorkItem], owner: dict[str, str], bench: BenchResults,
                 recipe: str) -> dict[str, float | None]:
    """GEMM time per step of each module under ``recipe`` (None where a cell failed)."""
    out: dict[str, float | None] = {}
    for it in items:
        mod = owner.get(it.name, it.name)
        t = item_ms(bench, it, recipe, MODE)
        prev = out.get(mod, 0.0)
        out[mod] = None if t is None or prev is None else prev + t * it.count
    return out


def fp8_shape_ok(it: WorkItem) -> bool:
    """Whether TE can run this layer's GEMMs in FP8: every dimension a multiple of 16 (rows of a
    grouped GEMM excepted: MoE code pads each expert's rows under FP8)."""
    f = it.fprop
    return f.k % 16 == 0 and f.n % 16 == 0 and (it.m_splits is not None or f.m % 16 == 0)


# A mixed plan must beat the best single recipe by this share of the predicted step (of the GEMM
# time without a step prediction); otherwise the plan is that recipe. Below it, a gain is within
# what the microbenchmarks and a job's step-to-step spread can tell apart, and every module kept in
# BF16 is one more place where the job's configuration departs from a plain recipe.
MIN_GAIN = 0.005


def make_plan(capture: GemmCapture, bench: BenchResults, items: list[WorkItem] | None = None,
              observed: GemmCapture | None = None, min_gain: float = MIN_GAIN) -> PrecisionPlan:
    """The best plan among the FP8 recipes the bench ran, against BF16 and every single recipe.

    ``observed``: the run whose clean step time and GEMM time anchor the prediction (the sweep's
    baseline when there is one; default the capture itself). ``min_gain``: the least gain over the
    best single recipe, as a share of the step, for which a mixed plan is proposed
    (:data:`MIN_GAIN`); otherwise the plan is that single recipe (:attr:`PrecisionPlan.same_as`)."""
    from te_gemm_callback.analysis.prediction import capture_recipe
    from te_gemm_callback.microbench.cells import items_from_capture

    if MODE not in bench.meta.get("modes", [MODE]):
        raise ValueError("the plan needs autocast-mode microbenchmarks (GEMM + quantization): run te-gemm bench "
                         "without --pre-quantize")
    items = items if items is not None else items_from_capture(capture)
    owner = {r.name: r.module for r in capture.records}
    recipes = [r for r in bench.precisions if r != "BF16"]
    if "BF16" not in bench.precisions or not recipes:
        raise ValueError("the plan needs BF16 and at least one FP8 recipe in the microbenchmarks")
    bf16 = module_times(items, owner, bench, "BF16")
    if any(v is None for v in bf16.values()):
        raise ValueError("some GEMMs have no BF16 time in the microbenchmarks: bench this capture again")
    totals = {"BF16": sum(bf16.values())}
    if totals["BF16"] <= 0:  # every share below would divide by it
        raise ValueError("the capture holds no weight GEMM that runs in a step (no fprop records, or all "
                         "with 0 calls per step): nothing to plan")
    plans = {}
    # Safe by construction: TE's FP8 GEMMs need K and N (and M, the wgrad's inner dimension) to be
    # multiples of 16 (it asserts "Leading dimension requirement on A for FP8 GEMM"); a module with
    # such a GEMM stays BF16 whatever its bench cell says. Grouped GEMMs' rows are padded per expert
    # by the MoE code under FP8, and the bench times them padded.
    # Only GEMMs a recipe runs can keep a module in BF16: an attention bmm runs in BF16 under every recipe.
    unsafe = {owner.get(it.name, it.name) for it in items if it.runs_recipe and not fp8_shape_ok(it)}
    # In a TE job a plain torch layer (an nn.Linear lm_head) runs in high precision under every
    # recipe: no recipe is the plan's to give it. (A job without TE layers is planned as if its
    # layers were TE's: that is the question it asks.)
    te = {r.module for r in capture.records if getattr(r, "source", "te") == "te"}
    if te:
        unsafe |= {r.module for r in capture.records if getattr(r, "source", "te") != "te"} - te
    for r in recipes:
        times = {m: (None if m in unsafe else t) for m, t in module_times(items, owner, bench, r).items()}
        choices = [ModuleChoice(m, bf16[m], times.get(m), keep_bf16=times.get(m) is None or times[m] >= bf16[m])
                   for m in bf16]
        # The single recipe as TE would run it: modules it cannot run stay BF16, the rest in r.
        totals[r] = sum(c.fp8_ms if c.fp8_ms is not None else c.bf16_ms for c in choices)
        plans[r] = (sum(c.bf16_ms if c.keep_bf16 else c.fp8_ms for c in choices), choices)
    best = min(plans, key=lambda r: plans[r][0])
    plan_ms, choices = plans[best]
    base = observed or capture
    step, gemm, job = base.step_ms(), base.gemm_ms_per_step(), capture_recipe(base)
    single = min(totals, key=totals.get)
    # The gain in step time equals the gain in GEMM time scaled by the job's GEMM share.
    # As the report's checks (checks.report_checks): a GEMM time above the step it is set against
    # (host-clock GEMMs of an instrumented step vs a clean one) makes the non-GEMM time negative,
    # so no step is predicted (the plan then ranks by GEMM time alone).
    withheld = None if step and gemm is not None and gemm <= step else (
        "GEMMs not timed" if gemm is None or not step else
        f"the job's GEMM time ({gemm:.2f} ms) exceeds the step it is set against ({step:.2f} ms)")
    scale = gemm / totals[job] if withheld is None and totals.get(job) else None
    gain = (totals[single] - plan_ms) * scale / step if scale is not None else 1 - plan_ms / totals[single]
    if gain < min_gain:
        if single == "BF16":
            choices = [ModuleChoice(c.module, c.bf16_ms, c.fp8_ms, keep_bf16=True) for c in choices]
        else:
            best = single
            choices = [ModuleChoice(c.module, c.bf16_ms, c.fp8_ms, keep_bf16=c.fp8_ms is None)
                       for c in plans[single][1]]
        plan_ms = totals[single]
    totals["plan"] = plan_ms
    pred: dict[str, float] = {}
    if scale is not None:
        pred = {k: step - gemm + v * scale for k, v in totals.items()}
    plan = PrecisionPlan(best, [c.module for c in choices if c.keep_bf16], choices, pred,
                         {k: pred["BF16"] / v for k, v in pred.items()} if pred else {}, totals,
                         {"device": bench.meta.get("device"), "mode": MODE, "job_recipe": job,
                          "prediction": "Amdahl over the job's measured GEMM share, autocast-mode microbenchmarks"
                          if pred else f"n/a: {withheld or 'no GEMM time of the job recipe'}"})
    return plan


def plan_for_run(rr: Any) -> PrecisionPlan:
    """The plan of an analysed run folder (:class:`~te_gemm_callback.analysis.runs.RunReport`): anchored on
    the sweep's run in the job's recipe where there is one (clean steps of the same step function
    as the other recipes), else on the job's own capture."""
    if rr.bench is None:
        raise ValueError("no bench.json: te-gemm bench --capture RUN_DIR/gemm_capture.json "
                         "--json RUN_DIR/bench.json first")
    base = next((c for c in rr.captures if c.meta.get("sweep") and c.meta.get("recipe") == rr.report.current_recipe),
                None)
    return make_plan(rr.job, rr.bench, rr.items, observed=base)


def run_plan(rr: Any) -> PrecisionPlan | None:
    """:func:`plan_for_run` where the run's bench allows a plan (BF16 and an FP8 recipe in autocast
    mode: a CPU run's BF16-only bench has none), else None: the report's plan is an extra."""
    if rr.bench is None or MODE not in rr.bench.meta.get("modes", [MODE]):
        return None
    try:
        return plan_for_run(rr)
    except ValueError:  # no FP8 recipe ran, or GEMMs without BF16 time: nothing to plan from
        return None


def write_plan(plan: PrecisionPlan, json_path: str | Path, yaml_path: str | Path) -> tuple[Path, Path]:
    """The plan as JSON (for :func:`apply_precision_plan` and ``sweep_plan=``) and as TE's debug-API
    config (:meth:`PrecisionPlan.nvdlfw_yaml`)."""
    # Both targets checked before either is written: a refused YAML path leaves no new JSON behind.
    check_target(json_path, json_kind(SCHEMA))
    check_target(yaml_path, YAML_KIND)
    try:  # never write a plan that PrecisionPlan.load would refuse
        check(plan.to_dict(), SPECS[SCHEMA])
    except ValueError as err:
        raise ValueError(f"precision plan not written, its values are invalid: {err}") from None
    text = plan.nvdlfw_yaml()  # refuses a module name it cannot hold before either file is written
    return plan.save(json_path), write_text(yaml_path, text, YAML_KIND)


class PlanHandle:
    """What :func:`apply_precision_plan` changed; ``remove()`` puts it back."""

    def __init__(self) -> None:
        self._undo: list[tuple[nn.Module, Any]] = []

    def remove(self) -> None:
        for module, had in reversed(self._undo):
            if had is None:
                module.__dict__.pop("forward", None)
            else:
                module.forward = had
        self._undo.clear()


def apply_precision_plan(model: nn.Module, plan: PrecisionPlan | str | Path) -> PlanHandle:
    """Keep the plan's modules out of FP8 inside the job's own ``te.autocast``: each listed module's
    forward runs under ``te.autocast(enabled=False)`` (its backward follows its forward's
    precision). No hook is registered and no weight touched; ``.remove()`` undoes it.

    Example:
        >>> import torch
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
        >>> h = apply_precision_plan(model, PrecisionPlan("Float8CurrentScaling", ["1"]))
        >>> model(torch.randn(3, 4)).shape
        torch.Size([3, 2])
        >>> h.remove()
    """
    if not isinstance(plan, PrecisionPlan):
        plan = PrecisionPlan.load(plan)
    handle = PlanHandle()
    missing = [name for name in plan.keep_bf16 if _get(model, name) is None]
    if missing:
        raise ValueError(f"the plan names modules this model does not have: {', '.join(missing[:5])} "
                         "(was it made for another model, or another root module?)")
    for name in plan.keep_bf16:
        module = _get(model, name)
        had = module.__dict__.get("forward")
        module.forward = _BF16Forward(module.forward)
        handle._undo.append((module, had))
    return handle


class _BF16Forward(StandIn):
    """A listed module's forward under ``autocast("BF16")``. A StandIn, not a closure: a closure
    could not be pickled (``torch.save(model)`` failed) and a ``deepcopy`` shared it, so the copy's
    forward ran the original module's weights; a copy or pickle gets the forward it replaced,
    re-bound to the copy."""

    __slots__ = ()

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from te_gemm_callback.precisions import autocast

        with autocast("BF16"):  # explicitly off inside the job's FP8 autocast
            return self.fn(*args, **kwargs)


def _get(model: nn.Module, name: str) -> nn.Module | None:
    try:
        return model.get_submodule(name) if name else model
    except AttributeError:
        return None
