"""Observed speedup in the live job: whole training steps under each recipe, in alternating rounds.

The sweep runs on the job's own model and batch: forward, backward and, given the job's optimizers,
the optimizer step (with the job's clipping, through ``optimizer_step``), so the step it times is
the step a user times. It puts everything back afterwards (:mod:`te_gemm_callback.sweep_state`):
parameters, buffers, gradients, optimizer state, TE's FP8 metadata and the objects that hold it,
and the RNG states; so training continues exactly as if the sweep had not run.
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import torch
from torch import nn

from .capture import GemmCapture
from .capture.instruments import MidMark, boundary_times
from .capture.record import StepTime
from .capture.steps import CLEAN, capture_steps
from .precisions import autocast, availability, canonical
from .sweep_state import RecipeStates, TrainingSnapshot

log = logging.getLogger("te_gemm_callback")

MIN_ROUNDS = 6  # the fewest rounds with a 95% interval for the median ratio (stats.MIN_ROUNDS_FOR_INTERVAL)
BUDGET_S = 20.0  # default time for the rounds: a 150 ms step, 4 recipes, 4 steps each: about 8 rounds
TARGET = 0.02  # rounds stop once every observed speedup's 95% interval is within +-2% of its median
MAX_ROUNDS = 60


@dataclass
class SweepResult:
    captures: dict[str, GemmCapture] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    paths: dict[str, Path] = field(default_factory=dict)
    rounds: int = 0  # alternating rounds run
    stopped: str = ""  # why the rounds stopped


def sweep_order(recipes: Iterable[str]) -> list[str]:
    """BF16 first (the speedups' base), then DelayedScaling (on a BF16 job its first FP8 use, with
    nothing to put back yet), otherwise as given."""
    rs = list(dict.fromkeys(canonical(r) for r in recipes))
    return sorted(rs, key=lambda r: {"BF16": 0, "DelayedScaling": 1}.get(r, 2))


def plan_entries(order: list[str], plan: Any = None) -> list[tuple[str, str, Any]]:
    """(name in the results, recipe, plan) per swept entry. The plan runs right after its own
    recipe, next to the run it differs from."""
    entries = [(r, r, None) for r in order]
    if plan is not None:
        at = next((i + 1 for i, e in enumerate(entries) if e[1] == plan.recipe), len(entries))
        entries.insert(at, ("plan", plan.recipe, plan))
    return entries


def _on_cuda(model: nn.Module) -> bool:
    return any(p.is_cuda for p in model.parameters())


def _loss(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict) and "loss" in out:
        return out["loss"]
    loss = getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    raise TypeError("the sweep's step function must return a loss tensor, a dict with 'loss', or an output with .loss")




def _stop_reason(res: SweepResult, timed: Sequence[str], k: int, min_rounds: int, elapsed: float,
                 budget_s: float, target: float) -> str | None:
    """Why the rounds stop after round ``k`` (0-based), or None to go on: once ``min_rounds`` ran,
    every observed speedup's 95% interval within ``target``, the time budget spent, or
    :data:`MAX_ROUNDS`."""
    from .analysis import observe, round_speedups
    from .stats import estimate

    n = k + 1
    if n >= MAX_ROUNDS:
        return f"{MAX_ROUNDS} rounds (the most the sweep runs)"
    if n < min_rounds:  # the rounds asked for always run; the budget bounds the ones after them
        return None
    base = observe(res.captures["BF16"])
    widths = [estimate(round_speedups(base, observe(res.captures[lb]))).half_width for lb in timed if lb != "BF16"]
    if widths and all(w is not None and w <= target for w in widths):
        return f"every observed speedup's 95% interval within +-{100 * target:g}%"
    if elapsed >= budget_s:
        worst = max((w for w in widths if w is not None), default=None)
        return (f"the time budget ({budget_s:g} s) with intervals up to +-{100 * worst:.1f}%" if worst is not None
                else f"the time budget ({budget_s:g} s) before a 95% interval (6 rounds needed)")
    return None


def run_sweep(model: nn.Module, step_fn: Callable[[], Any], recipes: Iterable[str], *, steps: int = 3,
              warmup: int = 1, set_recipe: Callable[[nn.Module, str], Any] | None = None,
              context: Callable[[], Any] | None = None, out_dir: str | Path | None = None,
              nvtx: bool | str = "auto", profile_kernels: bool = True, job_recipe: str | None = None,
              plan: Any = None, rounds: int = MIN_ROUNDS, budget_s: float = BUDGET_S, target: float = TARGET,
              optimizers: Sequence[torch.optim.Optimizer] = (),
              optimizer_step: Callable[[], Any] | None = None, run_id: str | None = None) -> SweepResult:
    """Time whole training steps of ``step_fn`` under each recipe, alternated in rounds.

    Args:
        step_fn: runs one forward and returns the loss (the sweep calls backward and the optimizer).
        optimizers: the job's optimizers: stepped in every sweep step (unless ``optimizer_step`` is
            given) and their state put back afterwards. Without them (and without
            ``optimizer_step``) the sweep's steps are forward+backward only, and the captures say so.
        optimizer_step: what the job does after backward (clipping, ``optimizer.step()``, ...):
            called in every sweep step in place of stepping ``optimizers``. Gradients are set to
            None before every step (the job's ``zero_grad``).
        set_recipe: how the model picks its recipe, for models that enter ``te.autocast``
            themselves (called with each recipe, then with None to restore). Without it, the
            forward runs inside ``te.autocast(recipe)``.
        context: an outer context per step (Lightning's precision plugin forward context).
        run_id: the job capture's ``meta["run_id"]``, kept in every sweep capture: a report takes
            only sweep captures of its job's run (``runs.analyze_run``).
        job_recipe: the recipe the job trains in (read from its capture), kept in the captures.
            Any recipe can be swept on any job: TE's per-recipe state objects are kept and put
            back at every switch (:class:`~te_gemm_callback.sweep_state.RecipeStates`).
        plan: a :class:`~te_gemm_callback.plan.PrecisionPlan` (or its JSON path) swept right after
            its own recipe (:func:`plan_entries`), as ``"plan"``: its recipe with its ``keep_bf16``
            modules under ``te.autocast(enabled=False)`` (:func:`~te_gemm_callback.plan.apply_precision_plan`,
            removed after its steps). A plan that amounts to a single recipe (``plan.same_as``) is not timed again.
        profile_kernels: on CUDA, one kernels step (torch.profiler, kernels only, after a warm-up
            step with the records already running) following the instrumented one: per-GEMM GPU
            time, and kernel time split into GEMM, attention, quantization/cast, norm,
            communication, optimizer and other (``meta["kernel_breakdown_ms"]``).
        rounds: the fewest alternating rounds after the captures (0: none). In each, every swept
            entry (BF16 among them) runs one untimed step (the switch) and ``steps`` clean timed
            steps, in forward then reverse order. A host-bound job's step time drifts by 10-50%
            over seconds (docs/results/h200.md); recipes timed seconds apart see the same drift, so
            the observed speedup is the median over rounds of each round's ratio, with a 95%
            interval (:mod:`te_gemm_callback.stats`). Rounds go on past ``rounds`` until every
            interval is within ``target`` (0.02: +-2%) or ``budget_s`` seconds of rounds are spent
            (the rounds asked for always run).

    Per entry: ``warmup`` untimed steps, one instrumented step (shapes and precisions), the
    kernels warm-up, kernels and settle steps, then ``steps`` clean steps with nothing attached;
    then the rounds. The observed step time is the median of the rounds' medians (without rounds,
    of the entry's clean steps), so the profiler's own host cost never enters a speedup or a verdict.
    """
    if steps < 1:
        raise ValueError("sweep steps must be >= 1")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0:
        raise ValueError(f"sweep rounds must be an integer >= 0, got {rounds!r}")
    if isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)) or not budget_s >= 0:
        raise ValueError(f"sweep budget must be a number of seconds >= 0, got {budget_s!r}")
    if isinstance(target, bool) or not isinstance(target, (int, float)) or not 0 < target < 1:
        raise ValueError(f"sweep target must be a fraction between 0 and 1 (0.02: +-2%), got {target!r}")
    from .plan import PrecisionPlan, apply_precision_plan

    if plan is not None and not isinstance(plan, PrecisionPlan):
        plan = PrecisionPlan.load(plan)
    optimizers = list(optimizers)
    whole = bool(optimizers) or optimizer_step is not None
    res = SweepResult()
    snap = TrainingSnapshot(model, optimizers)
    keep = RecipeStates(model)
    on_cuda = _on_cuda(model)
    cuda = on_cuda and torch.cuda.is_available()
    handle = None

    def after_backward() -> None:
        if optimizer_step is not None:
            optimizer_step()
        else:
            for opt in optimizers:
                opt.step()

    def make_step(recipe: str, mid: MidMark | None = None) -> Callable[[], None]:
        def one_step() -> None:
            for p in model.parameters():
                p.grad = None  # the job's zero_grad (set_to_none); the job's own gradients are put back at the end
            outer = context() if context is not None else contextlib.nullcontext()
            with outer, warnings.catch_warnings():
                # TE warns at every recipe switch ("Recipe type changed"): the sweep switches on purpose.
                warnings.filterwarnings("ignore", message="Recipe type changed")
                if set_recipe is not None:
                    set_recipe(model, recipe)
                    loss = _loss(step_fn())
                else:
                    with autocast(recipe):
                        loss = _loss(step_fn())
            loss.backward()
            if mid is not None:
                mid()  # the end of forward+backward, before the optimizer step
            if whole:
                after_backward()

        return one_step

    def capture_entry(label: str, recipe: str, entry_plan: Any) -> bool:
        nonlocal handle
        if entry_plan is not None and entry_plan.same_as:
            res.skipped[label] = (f"the plan is {entry_plan.same_as} everywhere (no mixed plan gains enough): "
                                  f"its step time is {entry_plan.same_as}'s")
            return False
        av = availability(recipe)
        if not av.ok:
            res.skipped[label] = av.reason
            return False
        if recipe != "BF16" and not on_cuda:
            res.skipped[label] = "the model runs on the CPU: TE recipes need its layers on a CUDA GPU"
            return False
        keep.switch(recipe)
        handle = apply_precision_plan(model, entry_plan) if entry_plan is not None else None
        one_step = make_step(recipe)
        for _ in range(warmup):  # a recipe's first step initialises its quantizers
            one_step()
        kernel_steps = 1 if profile_kernels and on_cuda else 0
        # Instrumented, kernels warm-up, kernels and settle steps, then ``steps`` clean ones.
        cap = capture_steps(model, one_step, steps, nvtx=nvtx, kernel_steps=kernel_steps)
        if handle is not None:
            handle.remove()
            handle = None
        cap.meta.update(recipe=label, sweep=True, job_recipe=job_recipe, run_id=run_id,
                        sweep_step="whole training step: forward, backward, optimizer step" if whole else
                        "forward+backward only: no optimizer was given to the sweep")
        if entry_plan is not None:
            cap.meta["plan"] = {"recipe": entry_plan.recipe, "keep_bf16": list(entry_plan.keep_bf16),
                                "predicted_speedup": entry_plan.predicted_speedup.get("plan"),
                                "predicted_step_ms": entry_plan.predicted_step_ms.get("plan")}
        res.captures[label] = cap
        save(label)  # now, so that a later entry that fails loses nothing of this one
        return True

    def save(label: str) -> None:
        if out_dir is not None:
            res.paths[label] = res.captures[label].save(Path(out_dir) / label / "gemm_capture.json",
                                                               root=out_dir)  # out_dir/<label> a link: refused

    def one_round(timed: list[tuple[str, str, Any]], k: int) -> None:
        nonlocal handle
        # Forward, then backward order (ABBA): a steady drift over a round pair falls on every entry alike.
        for label, recipe, entry_plan in (timed if k % 2 == 0 else timed[::-1]):
            keep.switch(recipe)
            handle = apply_precision_plan(model, entry_plan) if entry_plan is not None else None
            mid = MidMark(cuda)
            one_step = make_step(recipe, mid if whole else None)
            one_step()  # the switch from the previous entry: not a steady-state step
            mid.marks.clear()
            times = boundary_times(one_step, steps, cuda, mid=mid if whole else None)
            if handle is not None:
                handle.remove()
                handle = None
            parts = [g if g is not None else w for w, g in mid.part_ms] or [None] * len(times)
            cap = res.captures[label]
            n = len(cap.steps)
            cap.steps += [StepTime(index=n + i, wall_ms=wall, gpu_ms=gpu, kind=CLEAN, round=k, fwd_bwd_ms=part)
                          for i, ((wall, gpu), part) in enumerate(zip(times, parts))]

    try:
        ran = [e for e in plan_entries(sweep_order(recipes), plan) if capture_entry(*e)]
        if rounds and len(ran) > 1 and "BF16" in res.captures:
            log.info("te-gemm: sweep: alternating rounds of %s until every observed speedup's 95%% interval is "
                     "within +-%g%% or %g s (at least %d rounds)", ", ".join(e[0] for e in ran), 100 * target,
                     budget_s, rounds)
            t0 = time.perf_counter()
            k = 0
            while True:
                one_round(ran, k)
                why = _stop_reason(res, [e[0] for e in ran], k, rounds, time.perf_counter() - t0, budget_s, target)
                k += 1
                if why:
                    break
            res.rounds, res.stopped = k, why
            log.info("te-gemm: sweep: %d rounds in %.1f s, stopped at %s", k, time.perf_counter() - t0, why)
            for label, _, _ in ran:  # the captures again, with their rounds' steps
                res.captures[label].meta["sweep_rounds"] = {
                    "rounds": k, "stopped": why, "min_rounds": rounds, "budget_s": budget_s, "target": target,
                    "method": "alternating rounds after the captures (forward, then reverse order); speedup: "
                              "median of per-round ratios, 95% order-statistic interval"}
                save(label)
    finally:
        if handle is not None:  # a step raised while the plan was applied
            handle.remove()
        if set_recipe is not None:
            set_recipe(model, None)
        keep.restore_job()  # the objects first: the values below go into them
        snap.restore(model)
    return res
