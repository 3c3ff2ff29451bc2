"""Observed speedup in the live job: its whole training steps under each recipe, alternated in rounds,
then the job put back exactly (:mod:`.state`). :func:`run_sweep` is the entry point."""

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
from te_gemm_callback.sweep.intervals import estimate
from te_gemm_callback.sweep.native_plan import HOW, native_plan, native_support
from te_gemm_callback.sweep.observed import observe, round_speedups
from te_gemm_callback.sweep.plan import apply_precision_plan
from te_gemm_callback.sweep.state import RecipeStates, TrainingSnapshot, put_back

log = logging.getLogger("te_gemm_callback")

MAX_ROUNDS = 60

Entry = tuple[str, str, Any]  # (name in the results, recipe, precision plan or None)


@dataclass
class SweepResult:
    captures: dict[str, GemmCapture] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    paths: dict[str, Path] = field(default_factory=dict)
    rounds: int = 0  # alternating rounds run
    stopped: str = ""  # why the rounds stopped


def sweep_order(recipes: Iterable[str]) -> list[str]:
    """BF16 first (the speedups' base), then DelayedScaling (on a BF16 job nothing to put back yet), then as given."""
    rs = list(dict.fromkeys(canonical(r) for r in recipes))
    return sorted(rs, key=lambda r: {"BF16": 0, "DelayedScaling": 1}.get(r, 2))


def plan_entries(order: list[str], plan: Any = None) -> list[Entry]:
    """One entry per recipe, and the plan's right after its own recipe (next to the run it differs from)."""
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
    """Refuse optimizers the sweep could not put back: one that steps none of the model's parameters, or
    one stepped from inside backward that it was not given; say step hooks it cannot put back."""
    mine, given = {id(p) for p in model.parameters()}, set()
    for opt in optimizers:
        params = {id(p) for g in getattr(opt, "param_groups", []) for p in g["params"]}
        if params and not params & mine:
            raise ValueError(f"the sweep's optimizer {type(opt).__name__} steps none of the given model's parameters: "
                             "give the sweep the model the step function trains")
        given |= params
    hooked = [n for n, p in model.named_parameters() if getattr(p, "_post_accumulate_grad_hooks", None)
              and id(p) not in given]
    if hooked:
        raise ValueError(f"{len(hooked)} parameter(s) ({', '.join(hooked[:3])}) run a hook after their gradient "
                         "(an optimizer stepped inside backward?) that no optimizer the sweep was given steps: the "
                         "sweep's backward passes would change its state; give the sweep those optimizers")
    hooks = [h for opt in optimizers for h in (*getattr(opt, "_optimizer_step_pre_hooks", {}).values(),
                                               *getattr(opt, "_optimizer_step_post_hooks", {}).values())]
    if hooks:  # said, not refused: what such a hook changes outside the model and optimizers is unknown
        log.warning("te-gemm: the sweep's optimizer steps run %d step hook(s) of the job's optimizers (%s): what "
                    "they change beyond the model and the optimizers (an EMA of the weights) is not put back",
                    len(hooks), ", ".join(sorted({getattr(h, "__qualname__", type(h).__name__) for h in hooks})))


class Sweep:
    """One sweep of a live job: built right before :meth:`run` (it copies the job's state), which puts the
    job back however it ends."""

    def __init__(self, model: nn.Module, step_fn: Callable[[], Any], config: SweepConfig, *,
                 context: Callable[[], Any] | None, out_dir: str | Path | None, nvtx: bool | str,
                 profile_kernels: bool, job_recipe: str | None, optimizers: Sequence[torch.optim.Optimizer],
                 optimizer_step: Callable[[], Any] | None, run_id: str | None,
                 rng_objects: Sequence[Any] = ()) -> None:
        _check_model(model, optimizers)
        self.model, self.step_fn, self.config, self.context = model, step_fn, config, context
        self.optimizers, self.optimizer_step = list(optimizers), optimizer_step
        self.whole = bool(self.optimizers) or optimizer_step is not None  # else forward+backward only
        self.entries = plan_entries(sweep_order(config.recipes or ()), config.plan)
        self.nvtx, self.profile_kernels = nvtx, profile_kernels
        self.out_dir, self.job_recipe, self.run_id = out_dir, job_recipe, run_id
        self.result = SweepResult()
        self.snapshot = TrainingSnapshot(model, self.optimizers, rng_objects)
        self._native: Any = None  # the plan entry's TE recipe object while it runs as TE's per-module recipe
        self.plan_applied: str | None = None  # how the plan entry ran, for its capture
        self.states = RecipeStates(model)
        self.on_cuda = _on_cuda(model)
        self.cuda = self.on_cuda and torch.cuda.is_available()
        self.started: float | None = None  # the budget clock: when the first round began

    def step(self, recipe: str, mid: MidMark | None = None) -> None:
        """One of the job's training steps under ``recipe``; ``mid`` marks the end of backward."""
        for p in self.model.parameters():
            p.grad = None  # the job's zero_grad (set_to_none); its own gradients are put back at the end
        outer = self.context() if self.context is not None else contextlib.nullcontext()
        with outer, warnings.catch_warnings():
            # TE warns at every recipe switch; the sweep switches on purpose.
            warnings.filterwarnings("ignore", message="Recipe type changed")
            if self.config.set_recipe is not None:
                self.config.set_recipe(self.model, recipe)
                loss = step_loss(self.step_fn())
            else:
                with autocast(self._native.recipe if self._native is not None else recipe):
                    loss = step_loss(self.step_fn())
        loss.backward()
        if mid is not None:
            mid()
        if self.whole:
            if self.optimizer_step is not None:
                self.optimizer_step()
            else:
                for opt in self.optimizers:
                    opt.step()

    @contextlib.contextmanager
    def _entry(self, recipe: str, entry_plan: Any) -> Iterator[None]:
        """TE's objects for ``recipe`` back and the entry's plan applied; the plan removed on the way out."""
        handle: Any = None  # NativePlan or PlanHandle
        if entry_plan is not None and self.config.set_recipe is None and native_support(entry_plan.recipe) is None:
            # TE's per-module recipe: its quantizer state is not the plain recipe's, so it is kept apart.
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

    def skip_reason(self, recipe: str, entry_plan: Any) -> str | None:
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
        """One entry's warm-up and step plan (docs/step-plan.md), saved at once; False when skipped."""
        why = self.skip_reason(recipe, entry_plan)
        if why is not None:
            self.result.skipped[label] = why
            return False
        one_step = functools.partial(self.step, recipe)
        with self._entry(recipe, entry_plan):
            for _ in range(self.config.warmup):  # a recipe's first step initialises its quantizers
                one_step()
            kernel_steps = 1 if self.profile_kernels and self.on_cuda else 0
            cap = capture_steps(self.model, one_step, self.config.steps, nvtx=self.nvtx, kernel_steps=kernel_steps)
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

    def run_round(self, timed: list[Entry], k: int) -> None:
        """Round ``k``: per entry one untimed step (the switch), then ``steps`` timed ones added to its capture."""
        # Forward, then backward order (ABBA): a steady drift over a round pair falls on every entry alike.
        for label, recipe, entry_plan in (timed if k % 2 == 0 else timed[::-1]):
            mid = MidMark(self.cuda)
            one_step = functools.partial(self.step, recipe, mid if self.whole else None)
            with self._entry(recipe, entry_plan):
                one_step()  # the switch from the previous entry: not a steady-state step
                mid.marks.clear()
                times = boundary_times(one_step, self.config.steps, self.cuda, mid=mid if self.whole else None)
            parts: list[float | None] = [g if g is not None else w for w, g in mid.part_ms] or [None] * len(times)
            cap = self.result.captures[label]
            n = len(cap.steps)
            cap.steps += [StepTime(index=n + i, wall_ms=wall, gpu_ms=gpu, kind=CLEAN, round=k, fwd_bwd_ms=part)
                          for i, ((wall, gpu), part) in enumerate(zip(times, parts))]

    def stop_reason(self, timed: Sequence[str], k: int) -> str | None:
        """Why the rounds stop after round ``k`` (0-based), or None to go on."""
        elapsed, cfg = self.elapsed(), self.config
        if k + 1 >= MAX_ROUNDS:
            return f"{MAX_ROUNDS} rounds (the most the sweep runs)"
        if k + 1 < cfg.rounds:  # the rounds asked for always run; the budget bounds the ones after them
            return None
        caps = self.result.captures
        base = observe(caps["BF16"])
        widths = [estimate(round_speedups(base, observe(caps[lb]))).half_width for lb in timed if lb != "BF16"]
        if widths and all(w is not None and w <= cfg.target for w in widths):
            return f"every observed speedup's 95% interval within +-{100 * cfg.target:g}%"
        if elapsed >= cfg.budget_s:
            worst = max((w for w in widths if w is not None), default=None)
            return (f"the time budget ({cfg.budget_s:g} s) with intervals up to +-{100 * worst:.1f}%"
                    if worst is not None else
                    f"the time budget ({cfg.budget_s:g} s) before a 95% interval (6 rounds needed)")
        return None

    def elapsed(self) -> float:
        return 0.0 if self.started is None else time.perf_counter() - self.started

    def run_rounds(self, timed: list[Entry]) -> None:
        """Alternating rounds until :meth:`stop_reason` gives a reason; then every capture saved again."""
        labels, cfg = [e[0] for e in timed], self.config
        log.info("te-gemm: sweep: alternating rounds of %s until every observed speedup's 95%% interval is "
                 "within +-%g%% or %g s (at least %d rounds)", ", ".join(labels), 100 * cfg.target,
                 cfg.budget_s, cfg.rounds)
        self.started = time.perf_counter()
        k, why = 0, None
        while not why:
            self.run_round(timed, k)
            why = self.stop_reason(labels, k)
            k += 1
        self.result.rounds, self.result.stopped = k, why
        log.info("te-gemm: sweep: %d rounds in %.1f s, stopped at %s", k, self.elapsed(), why)
        for label in labels:
            self.result.captures[label].meta["sweep_rounds"] = {
                "rounds": k, "stopped": why, "min_rounds": cfg.rounds, "budget_s": cfg.budget_s,
                "target": cfg.target,
                "method": "alternating rounds after the captures (forward, then reverse order); speedup: "
                          "median of per-round ratios, 95% order-statistic interval"}
            self.save(label)

    def restore(self) -> None:
        """The job as it was: its recipe, TE's objects, then their values (which go into those objects);
        each part whatever another's failure (RestoreError after)."""
        set_recipe = self.config.set_recipe
        recipe = [("the job's recipe", lambda: set_recipe(self.model, None))] if set_recipe is not None else []
        put_back([*recipe, ("TE's recipe state objects", self.states.restore_job), *self.snapshot.parts(self.model)])

    def run(self) -> SweepResult:
        try:
            ran = [e for e in self.entries if self.capture(*e)]
            if self.config.rounds and len(ran) > 1 and "BF16" in self.result.captures:
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
    """Time whole training steps of ``step_fn`` (one forward, returning the loss) under each recipe: per entry
    ``warmup`` steps and the step plan (docs/step-plan.md), then alternating rounds until every speedup's 95%
    interval is within ``target`` or ``budget_s`` is spent; then the job is put back. Each step runs
    ``optimizer_step`` or steps ``optimizers`` (neither: forward+backward only) inside ``context``;
    ``rng_objects`` hold generators the job draws from (a DataLoader); ``config`` or ``settings``:
    :class:`~te_gemm_callback.sweep.config.SweepConfig`, as one config or as keywords."""
    if recipes is not None:
        settings["recipes"] = list(recipes)
    config = SweepConfig.given("run_sweep", config, settings)
    return Sweep(model, step_fn, config, context=context, out_dir=out_dir, nvtx=nvtx,
                 profile_kernels=profile_kernels, job_recipe=job_recipe, optimizers=optimizers,
                 optimizer_step=optimizer_step, run_id=run_id, rng_objects=rng_objects).run()
