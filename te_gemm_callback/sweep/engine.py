"""Observed speedup in the live job: whole training steps under each recipe, in alternating rounds.

The sweep runs on the job's own model and batch: forward, backward and, given the job's optimizers,
the optimizer step (with the job's clipping, through ``optimizer_step``), so the step it times is
the step a user times. It puts everything back afterwards (:mod:`te_gemm_callback.sweep.state`):
parameters, buffers, gradients, optimizer state, TE's FP8 metadata and the objects that hold it,
and the RNG states; so training continues exactly as if the sweep had not run.

:func:`run_sweep` is the entry point; :class:`Sweep` is one sweep's state and its stages (one
entry's capture, one round, the stopping rule, the put-back).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from te_gemm_callback.capture import GemmCapture
from te_gemm_callback.capture.capture_file import StepTime
from te_gemm_callback.capture.instruments import MidMark, boundary_times
from te_gemm_callback.capture.steps import CLEAN, capture_steps
from te_gemm_callback.precisions import autocast, availability, canonical
from te_gemm_callback.sweep.config import SweepConfig
from te_gemm_callback.sweep.state import RecipeStates, TrainingSnapshot

log = logging.getLogger("te_gemm_callback")

MAX_ROUNDS = 60

Entry = tuple[str, str, Any]  # (name in the results, recipe, precision plan or None): see plan_entries


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


def plan_entries(order: list[str], plan: Any = None) -> list[Entry]:
    """(name in the results, recipe, plan) per swept entry. The plan runs right after its own
    recipe, next to the run it differs from."""
    entries = [(r, r, None) for r in order]
    if plan is not None:
        at = next((i + 1 for i, e in enumerate(entries) if e[1] == plan.recipe), len(entries))
        entries.insert(at, ("plan", plan.recipe, plan))
    return entries


def _on_cuda(model: nn.Module) -> bool:
    return any(p.is_cuda for p in model.parameters())


def step_loss(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict) and "loss" in out:
        return out["loss"]
    loss = getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    raise TypeError("the sweep's step function must return a loss tensor, a dict with 'loss', or an output with .loss")


def _check_model(model: nn.Module, optimizers: Sequence[torch.optim.Optimizer]) -> None:
    """Refuse optimizers that step none of the model's parameters: the sweep was given another
    model than the one it trains (the step function's), whose weights it could not put back."""
    mine = {id(p) for p in model.parameters()}
    for opt in optimizers:
        params = [p for g in getattr(opt, "param_groups", []) for p in g["params"]]
        if params and not any(id(p) in mine for p in params):
            raise ValueError(f"the sweep's optimizer {type(opt).__name__} steps none of the given model's parameters: "
                             "give the sweep the model the step function trains")


class Sweep:
    """One sweep of a live job: its settings, what it keeps to put back, and what it measured.

    Building it copies the job's training state (:class:`TrainingSnapshot`) and TE's per-recipe
    objects (:class:`RecipeStates`), so it is built right before :meth:`run`, which puts them back
    however it ends. The arguments are :func:`run_sweep`'s (documented there).
    """

    def __init__(self, model: nn.Module, step_fn: Callable[[], Any], config: SweepConfig, *,
                 context: Callable[[], Any] | None, out_dir: str | Path | None, nvtx: bool | str,
                 profile_kernels: bool, job_recipe: str | None, optimizers: Sequence[torch.optim.Optimizer],
                 optimizer_step: Callable[[], Any] | None, run_id: str | None,
                 rng_objects: Sequence[Any] = ()) -> None:
        _check_model(model, optimizers)
        self.config = config
        self.model = model
        self.step_fn = step_fn
        self.set_recipe = config.set_recipe
        self.context = context
        self.optimizers = list(optimizers)
        self.optimizer_step = optimizer_step
        # A whole training step (the optimizer's part included), or forward+backward only.
        self.whole = bool(self.optimizers) or optimizer_step is not None
        self.entries = plan_entries(sweep_order(config.recipes or ()), config.plan)
        self.steps, self.warmup, self.nvtx, self.profile_kernels = config.steps, config.warmup, nvtx, profile_kernels
        self.out_dir, self.job_recipe, self.run_id = out_dir, job_recipe, run_id
        self.min_rounds, self.budget_s, self.target = config.rounds, config.budget_s, config.target
        self.result = SweepResult()  # the captures per entry, with each round's steps appended
        self.snapshot = TrainingSnapshot(model, self.optimizers, rng_objects)
        # The plan entry's TE recipe object while it runs as TE's own per-module recipe (native_plan.py).
        self._native: Any = None
        self.plan_applied: str | None = None  # how the plan entry ran, for its capture
        self.states = RecipeStates(model)
        self.on_cuda = _on_cuda(model)
        self.cuda = self.on_cuda and torch.cuda.is_available()
        self.started: float | None = None  # the budget clock: when the first round began

    # One training step -------------------------------------------------------------------------

    def step(self, recipe: str, mid: MidMark | None = None) -> None:
        """One of the job's training steps under ``recipe``; ``mid`` marks the end of backward."""
        for p in self.model.parameters():
            p.grad = None  # the job's zero_grad (set_to_none); the job's own gradients are put back at the end
        outer = self.context() if self.context is not None else contextlib.nullcontext()
        with outer, warnings.catch_warnings():
            # TE warns at every recipe switch ("Recipe type changed"): the sweep switches on purpose.
            warnings.filterwarnings("ignore", message="Recipe type changed")
            if self.set_recipe is not None:
                self.set_recipe(self.model, recipe)
                loss = step_loss(self.step_fn())
            else:
                with autocast(self._native.recipe if self._native is not None else recipe):
                    loss = step_loss(self.step_fn())
        loss.backward()
        if mid is not None:
            mid()  # the end of forward+backward, before the optimizer step
        if self.whole:
            if self.optimizer_step is not None:
                self.optimizer_step()
            else:
                for opt in self.optimizers:
                    opt.step()

    @contextlib.contextmanager
    def _entry(self, recipe: str, entry_plan: Any) -> Iterator[None]:
        """The model set up for one entry: TE's objects for ``recipe`` back, and the entry's plan
        applied (removed on the way out, also when a step raises)."""
        from te_gemm_callback.sweep.native_plan import HOW, native_plan, native_support
        from te_gemm_callback.sweep.plan import apply_precision_plan

        handle: Any = None  # what undoes the plan: NativePlan or PlanHandle
        if entry_plan is not None and self.set_recipe is None and native_support(entry_plan.recipe) is None:
            # TE's own per-module recipe: its quantizer state is not the plain recipe's, so it is
            # kept apart from it.
            self.states.switch(f"{recipe} plan")
            handle = self._native = native_plan(self.model, entry_plan)
            self.plan_applied = HOW
        else:
            self.states.switch(recipe)
            if entry_plan is not None:
                handle = apply_precision_plan(self.model, entry_plan)
                self.plan_applied = "te.autocast(enabled=False) around each module kept BF16"
        try:
            yield
        finally:
            self._native = None
            if handle is not None:
                handle.remove()

    # The captures ------------------------------------------------------------------------------

    def skip_reason(self, recipe: str, entry_plan: Any) -> str | None:
        """Why an entry is not timed on this job, or None."""
        if entry_plan is not None and entry_plan.same_as:
            return (f"the plan is {entry_plan.same_as} everywhere (no mixed plan gains enough): "
                    f"its step time is {entry_plan.same_as}'s")
        av = availability(recipe)
        if not av.ok:
            return av.reason
        if recipe != "BF16" and not self.on_cuda:
            return "the model runs on the CPU: TE recipes need its layers on a CUDA GPU"
        return None

    def capture(self, label: str, recipe: str, entry_plan: Any) -> bool:
        """One entry's capture: ``warmup`` untimed steps, the instrumented and kernels steps, then
        ``steps`` clean ones; saved at once. False when the entry is skipped (and why is noted)."""
        why = self.skip_reason(recipe, entry_plan)
        if why is not None:
            self.result.skipped[label] = why
            return False
        one_step = functools.partial(self.step, recipe)
        with self._entry(recipe, entry_plan):
            for _ in range(self.warmup):  # a recipe's first step initialises its quantizers
                one_step()
            kernel_steps = 1 if self.profile_kernels and self.on_cuda else 0
            # The step plan (docs/step-plan.md), then ``steps`` clean steps.
            cap = capture_steps(self.model, one_step, self.steps, nvtx=self.nvtx, kernel_steps=kernel_steps)
        cap.meta.update(recipe=label, sweep=True, job_recipe=self.job_recipe, run_id=self.run_id,
                        sweep_step="whole training step: forward, backward, optimizer step" if self.whole else
                        "forward+backward only: no optimizer was given to the sweep")
        if entry_plan is not None:
            cap.meta["plan"] = {"recipe": entry_plan.recipe, "keep_bf16": list(entry_plan.keep_bf16),
                                "applied": self.plan_applied,
                                "predicted_speedup": entry_plan.predicted_speedup.get("plan"),
                                "predicted_step_ms": entry_plan.predicted_step_ms.get("plan")}
        self.result.captures[label] = cap
        self.save(label)  # now, so that a later entry that fails loses nothing of this one
        return True

    def save(self, label: str) -> None:
        if self.out_dir is not None:
            self.result.paths[label] = self.result.captures[label].save(
                Path(self.out_dir) / label / "gemm_capture.json", root=self.out_dir)  # out_dir/<label> a link: refused

    # The rounds --------------------------------------------------------------------------------

    def run_round(self, timed: list[Entry], k: int) -> None:
        """Round ``k``: per entry, one untimed step (the switch) and ``steps`` timed ones, appended
        to its capture as clean steps of round ``k``."""
        # Forward, then backward order (ABBA): a steady drift over a round pair falls on every entry alike.
        for label, recipe, entry_plan in (timed if k % 2 == 0 else timed[::-1]):
            mid = MidMark(self.cuda)
            one_step = functools.partial(self.step, recipe, mid if self.whole else None)
            with self._entry(recipe, entry_plan):
                one_step()  # the switch from the previous entry: not a steady-state step
                mid.marks.clear()
                times = boundary_times(one_step, self.steps, self.cuda, mid=mid if self.whole else None)
            parts: list[float | None] = [g if g is not None else w for w, g in mid.part_ms] or [None] * len(times)
            cap = self.result.captures[label]
            n = len(cap.steps)
            cap.steps += [StepTime(index=n + i, wall_ms=wall, gpu_ms=gpu, kind=CLEAN, round=k, fwd_bwd_ms=part)
                          for i, ((wall, gpu), part) in enumerate(zip(times, parts))]

    def stop_reason(self, timed: Sequence[str], k: int) -> str | None:
        """Why the rounds stop after round ``k`` (0-based), or None to go on: once ``min_rounds`` ran,
        every observed speedup's 95% interval within ``target``, the time budget spent, or
        :data:`MAX_ROUNDS`."""
        from te_gemm_callback.sweep.intervals import estimate
        from te_gemm_callback.sweep.observed import observe, round_speedups

        elapsed = self.elapsed()
        n = k + 1
        if n >= MAX_ROUNDS:
            return f"{MAX_ROUNDS} rounds (the most the sweep runs)"
        if n < self.min_rounds:  # the rounds asked for always run; the budget bounds the ones after them
            return None
        caps = self.result.captures
        base = observe(caps["BF16"])
        widths = [estimate(round_speedups(base, observe(caps[lb]))).half_width for lb in timed if lb != "BF16"]
        if widths and all(w is not None and w <= self.target for w in widths):
            return f"every observed speedup's 95% interval within +-{100 * self.target:g}%"
        if elapsed >= self.budget_s:
            worst = max((w for w in widths if w is not None), default=None)
            return (f"the time budget ({self.budget_s:g} s) with intervals up to +-{100 * worst:.1f}%"
                    if worst is not None else
                    f"the time budget ({self.budget_s:g} s) before a 95% interval (6 rounds needed)")
        return None

    def elapsed(self) -> float:
        """Seconds of rounds so far (0 before the first)."""
        return 0.0 if self.started is None else time.perf_counter() - self.started

    def run_rounds(self, timed: list[Entry]) -> None:
        """Alternating rounds of the captured entries until :meth:`stop_reason` says why not more;
        then every capture is saved again with its rounds' steps."""
        labels = [e[0] for e in timed]
        log.info("te-gemm: sweep: alternating rounds of %s until every observed speedup's 95%% interval is "
                 "within +-%g%% or %g s (at least %d rounds)", ", ".join(labels), 100 * self.target,
                 self.budget_s, self.min_rounds)
        self.started = time.perf_counter()
        k = 0
        while True:
            self.run_round(timed, k)
            why = self.stop_reason(labels, k)
            k += 1
            if why:
                break
        self.result.rounds, self.result.stopped = k, why
        log.info("te-gemm: sweep: %d rounds in %.1f s, stopped at %s", k, self.elapsed(), why)
        for label in labels:  # the captures again, with their rounds' steps
            self.result.captures[label].meta["sweep_rounds"] = {
                "rounds": k, "stopped": why, "min_rounds": self.min_rounds, "budget_s": self.budget_s,
                "target": self.target,
                "method": "alternating rounds after the captures (forward, then reverse order); speedup: "
                          "median of per-round ratios, 95% order-statistic interval"}
            self.save(label)

    # The whole sweep ---------------------------------------------------------------------------

    def restore(self) -> None:
        """The job as it was when the sweep was built: its recipe, TE's objects, then their values."""
        if self.set_recipe is not None:
            self.set_recipe(self.model, None)
        self.states.restore_job()  # the objects first: the values below go into them
        self.snapshot.restore(self.model)

    def run(self) -> SweepResult:
        try:
            ran = [e for e in self.entries if self.capture(*e)]
            if self.min_rounds and len(ran) > 1 and "BF16" in self.result.captures:
                self.run_rounds(ran)
        finally:
            self.restore()
        return self.result


def run_sweep(model: nn.Module, step_fn: Callable[[], Any], recipes: Iterable[str] | None = None, *,
              config: SweepConfig | None = None, context: Callable[[], Any] | None = None,
              out_dir: str | Path | None = None, nvtx: bool | str = "auto", profile_kernels: bool = True,
              job_recipe: str | None = None, optimizers: Sequence[torch.optim.Optimizer] = (),
              optimizer_step: Callable[[], Any] | None = None, run_id: str | None = None,
              rng_objects: Sequence[Any] = (), **settings: Any) -> SweepResult:
    """Time whole training steps of ``step_fn`` under each recipe, alternated in rounds.

    Args:
        step_fn: runs one forward and returns the loss (the sweep calls backward and the optimizer).
        optimizers: the job's optimizers: stepped in every sweep step (unless ``optimizer_step`` is
            given) and their state put back afterwards. Without them (and without
            ``optimizer_step``) the sweep's steps are forward+backward only, and the captures say so.
        optimizer_step: what the job does after backward (clipping, ``optimizer.step()``, ...):
            called in every sweep step in place of stepping ``optimizers``. Gradients are set to
            None before every step (the job's ``zero_grad``).
        context: an outer context per step (Lightning's precision plugin forward context).
        run_id: the job capture's ``meta["run_id"]``, kept in every sweep capture: a report takes
            only sweep captures of its job's run (``runs.analyze_run``).
        rng_objects: objects holding torch.Generators the job draws from (its DataLoader, sampler):
            put back afterwards with torch's, CUDA's, Python's and NumPy's RNGs and the module's own.
        job_recipe: the recipe the job trains in (read from its capture), kept in the captures.
            Any recipe can be swept on any job: TE's per-recipe state objects are kept and put
            back at every switch (:class:`~te_gemm_callback.sweep.state.RecipeStates`).
        profile_kernels: on CUDA, a kernels step per entry (docs/step-plan.md): per-GEMM GPU time
            and the kernel-time breakdown (``meta["kernel_breakdown_ms"]``).
        config, settings: the sweep's settings (:class:`~te_gemm_callback.sweep.config.SweepConfig`:
            ``steps``, ``warmup``, ``rounds``, ``budget_s``, ``target``, ``set_recipe``, ``plan``), as
            one config or as keywords; ``recipes`` as given here or in the config.

    In each round every swept entry (BF16 among them) runs one untimed step (the switch) and
    ``steps`` clean timed steps, in forward then reverse order. A host-bound job's step time drifts
    by 10-50% over seconds (docs/results/h200.md); recipes timed seconds apart see the same drift, so
    the observed speedup is the median over rounds of each round's ratio, with a 95% interval
    (:mod:`te_gemm_callback.sweep.intervals`). Rounds go on past ``rounds`` until every interval is
    within ``target`` or ``budget_s`` seconds of rounds are spent (the rounds asked for always run).
    A plan (``plan``) runs right after its own recipe (:func:`plan_entries`), as ``"plan"``: its
    recipe with its ``keep_bf16`` modules out of FP8 (TE's own per-module recipe where TE has one,
    else :func:`~te_gemm_callback.sweep.plan.apply_precision_plan`), removed after its steps; a plan
    that amounts to a single recipe (``plan.same_as``) is not timed again. ``set_recipe`` is how a
    model that enters ``te.autocast`` itself picks its recipe (called with each recipe, then with
    None to restore); without it the forward runs inside ``te.autocast(recipe)``.

    Per entry: ``warmup`` untimed steps, then the step plan (docs/step-plan.md) with ``steps`` clean
    steps; then the rounds. The observed step time is the median of the rounds' medians (without rounds,
    of the entry's clean steps), so the profiler's own host cost never enters a speedup or a verdict.
    """
    if recipes is not None:
        settings["recipes"] = list(recipes)
    config = SweepConfig.given("run_sweep", config, settings)
    return Sweep(model, step_fn, config, context=context, out_dir=out_dir, nvtx=nvtx,
                 profile_kernels=profile_kernels, job_recipe=job_recipe, optimizers=optimizers,
                 optimizer_step=optimizer_step, run_id=run_id, rng_objects=rng_objects).run()
