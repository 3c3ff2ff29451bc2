"""Per-layer precision plan: one FP8 recipe with the modules where it loses (or that TE cannot run in it)
kept in BF16, from the autocast-mode microbenchmarks; the best plan has the least GEMM time."""

from __future__ import annotations

from typing import Any, cast

from te_gemm_callback.analysis.prediction import capture_recipe, gemm_mode, gemms_alone_steps, observe
from te_gemm_callback.analysis.whatif import replay_recipes
from te_gemm_callback.capture.capture_file import GemmCapture
from te_gemm_callback.microbench.items import WorkItem, items_from_capture
from te_gemm_callback.microbench.results import BenchResults, item_ms
from te_gemm_callback.sweep.plan import (  # noqa: F401  (the plan's public names, where users import them)
    MODE,
    SCHEMA,
    YAML_KIND,
    YAML_MARKER,
    ModuleChoice,
    PlanHandle,
    PrecisionPlan,
    apply_precision_plan,
    write_plan,
)


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
    """Whether TE can run this layer's GEMMs in FP8: every dimension a multiple of 16 (a grouped GEMM's rows
    excepted: MoE code pads them per expert)."""
    f = it.fprop
    return f.k % 16 == 0 and f.n % 16 == 0 and (it.m_splits is not None or f.m % 16 == 0)


MIN_GAIN = 0.005  # a mixed plan's least gain over the best single recipe (share of the step): below it, noise


def make_plan(capture: GemmCapture, bench: BenchResults, items: list[WorkItem] | None = None,
              observed: GemmCapture | None = None, min_gain: float = MIN_GAIN) -> PrecisionPlan:
    """The best plan among the FP8 recipes the bench ran, against BF16 and every single recipe; ``observed``
    is the run whose step and GEMM time anchor the prediction (default ``capture``)."""
    if MODE not in bench.meta.get("modes", [MODE]):
        raise ValueError("the plan needs autocast-mode microbenchmarks (GEMM + quantization): run te-gemm bench "
                         "without --pre-quantize")
    items = items if items is not None else items_from_capture(capture)
    owner = {r.name: r.module for r in capture.records}
    recipes = [r for r in bench.precisions if r != "BF16"]
    if "BF16" not in bench.precisions or not recipes:
        raise ValueError("the plan needs BF16 and at least one FP8 recipe in the microbenchmarks")
    bf16_times = module_times(items, owner, bench, "BF16")
    if any(v is None for v in bf16_times.values()):
        raise ValueError("some GEMMs have no BF16 time in the microbenchmarks: bench this capture again")
    bf16 = cast("dict[str, float]", bf16_times)  # no None left: checked just above
    totals: dict[str, float] = {"BF16": sum(bf16.values())}
    if totals["BF16"] <= 0:  # every share below would divide by it
        raise ValueError("the capture holds no weight GEMM that runs in a step (no fprop records, or all "
                         "with 0 calls per step): nothing to plan")
    plans = {}
    # A module with a GEMM TE cannot run in FP8 stays BF16 (an attention bmm runs BF16 in every recipe).
    unsafe = {owner.get(it.name, it.name) for it in items if it.runs_recipe and not fp8_shape_ok(it)}
    # In a TE job a plain torch layer (an nn.Linear lm_head) runs high precision under every recipe.
    te = {r.module for r in capture.records if getattr(r, "source", "te") == "te"}
    if te:
        unsafe |= {r.module for r in capture.records if getattr(r, "source", "te") != "te"} - te
    for r in recipes:
        times = {m: (None if m in unsafe else t) for m, t in module_times(items, owner, bench, r).items()}
        choices = [ModuleChoice(m, bf16[m], (t := times.get(m)), keep_bf16=t is None or t >= bf16[m])
                   for m in bf16]
        # The single recipe as TE would run it: modules it cannot run stay BF16, the rest in r.
        totals[r] = sum(cast(float, c.fp8_ms if c.fp8_ms is not None else c.bf16_ms) for c in choices)
        plans[r] = (sum(cast(float, c.bf16_ms if c.keep_bf16 else c.fp8_ms) for c in choices), choices)
    best = min(plans, key=lambda r: plans[r][0])
    plan_ms, choices = plans[best]
    base = observed or capture
    step, gemm, job = base.step_ms(), base.gemm_ms_per_step(), capture_recipe(base)
    single = min(totals, key=totals.__getitem__)
    # As in checks.report_checks, no step is predicted from a GEMM time above its step.
    withheld = None if step and gemm is not None and gemm <= step else (
        "GEMMs not timed" if gemm is None or not step else
        f"the job's GEMM time ({gemm:.2f} ms) exceeds the step it is set against ({step:.2f} ms)")
    scale = gemm / totals[job] if withheld is None and gemm is not None and totals.get(job) else None
    gain = (totals[single] - plan_ms) * scale / step if scale is not None and step else 1 - plan_ms / totals[single]
    if gain < min_gain:
        if single == "BF16":
            choices = [ModuleChoice(c.module, c.bf16_ms, c.fp8_ms, keep_bf16=True) for c in choices]
        else:
            best = single
            choices = [ModuleChoice(c.module, c.bf16_ms, c.fp8_ms, keep_bf16=c.fp8_ms is None)
                       for c in plans[single][1]]
        plan_ms = totals[single]
    totals["plan"] = plan_ms
    plan = PrecisionPlan(best, [c.module for c in choices if c.keep_bf16], choices, gemm_ms=totals,
                         meta={"device": bench.meta.get("device"), "mode": MODE, "job_recipe": job})
    _gemms_alone(plan, base, bench, items, withheld)
    return plan


def _gemms_alone(plan: PrecisionPlan, base: GemmCapture, bench: BenchResults, items: list[WorkItem],
                 withheld: str | None) -> None:
    """The plan's step figures before any replay: the report's GEMMs alone (pre-quantized GEMM times where the
    bench has them, the report's base step), not the autocast module costs the choice above weighs, which
    gave a second GEMMs alone beside the report's (1.43x against its 1.49x)."""
    mode = gemm_mode(bench.meta.get("modes", [MODE]))
    steps = {} if withheld else gemms_alone_steps(observe(base), base, bench, items,
                                                  {"recipe": plan.recipe, "keep_bf16": plan.keep_bf16})
    if "BF16" not in steps:
        plan.meta["prediction"] = f"n/a: {withheld or 'no GEMM time of the job recipe'}"
        return
    if plan.same_as in steps:  # the plan is that recipe: its figure, as the report's row has it
        steps["plan"] = steps[cast(str, plan.same_as)]
    plan.predicted_step_ms = steps
    plan.predicted_speedup = {k: steps["BF16"] / v for k, v in steps.items()}
    plan.meta["prediction"] = (f"GEMMs alone: Amdahl over the job's measured GEMM share with {mode} GEMM times, "
                               "as the report's GEMMs alone column; the rest of the step held fixed, a bound, not "
                               "a prediction of the step")


def plan_for_run(rr: Any) -> PrecisionPlan:
    """The plan of an analysed run folder, anchored on the sweep's run in the job's recipe where there is one."""
    if rr.bench is None:
        raise ValueError("no bench.json: te-gemm bench --capture RUN_DIR/gemm_capture.json "
                         "--json RUN_DIR/bench.json first")
    base = next((c for c in rr.captures if c.meta.get("sweep") and c.meta.get("recipe") == rr.report.current_recipe),
                None)
    plan = make_plan(rr.job, rr.bench, rr.items, observed=base)
    replay = dict(rr.report.meta.get("replay") or {})
    if "BF16" in replay and plan.same_as is None and (mixed := _replay_mixed(rr, plan)) is not None:
        replay["plan"] = mixed.to_dict()
    return replayed(plan, replay)


def _replay_mixed(rr: Any, plan: PrecisionPlan) -> Any:
    """The replay of a mixed ``plan`` (its modules kept in BF16 under its recipe), from the capture and anchor
    the report's replay has: the job's run in its own recipe, the report's base step."""
    got = replay_recipes(rr.replay_from or rr.job, rr.bench, [plan.recipe], rr.report.current_recipe,
                         rr.report.step_ms, rr.bench.meta.get("module_costs"), keep=frozenset(plan.keep_bf16))
    return got.get(plan.recipe)


def replayed(plan: PrecisionPlan, replay: dict[str, Any]) -> PrecisionPlan:
    """``plan`` with its predicted steps the report's replay, as the report's predicted column has them (a mixed
    plan's under "plan" where replayed); its Amdahl figures kept as GEMMs alone."""
    if "BF16" not in replay:
        return plan  # no replay: make_plan's figures are GEMMs alone, and its meta says so
    alone = dict(plan.predicted_speedup)
    same = plan.same_as or "plan"  # a mixed plan: its own replay, where the caller made one
    steps = {k: float(replay[k]["step_ms"]) for k in plan.predicted_step_ms if k != "plan" and k in replay}
    if same in replay:  # a single recipe's replay, or the mixed plan's
        steps["plan"] = float(replay[same]["step_ms"])
    plan.predicted_step_ms = steps
    plan.predicted_speedup = {k: steps["BF16"] / v for k, v in steps.items()}
    plan.meta.update(prediction="the replay of the job's kernels step, as the report's predicted column",
                     bound={k: replay[same if k == "plan" else k]["bound"] for k in steps},
                     gemms_alone=alone, gemms_alone_basis=plan.meta.get("prediction"))
    if "plan" not in steps:
        plan.meta["plan_not_replayed"] = "the plan was not replayed: its figure is GEMMs alone"
    return plan


def run_plan(rr: Any) -> PrecisionPlan | None:
    """:func:`plan_for_run` where the run's bench allows a plan, else None."""
    if rr.bench is None or MODE not in rr.bench.meta.get("modes", [MODE]):
        return None
    try:
        return plan_for_run(rr)
    except ValueError:  # no FP8 recipe ran, or GEMMs without BF16 time: nothing to plan from
        return None
