"""Observed speedup in the live job: a few forward+backward steps under each recipe.

The sweep runs on the job's own model and batch, with no optimizer step, and puts everything back
afterwards: parameters, buffers and TE's FP8 metadata (state_dict, extra state included),
gradients, and the RNG states; so training continues exactly as if the sweep had not run.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import torch
from torch import nn

from .capture import GemmCapture
from .capture.instruments import boundary_times
from .capture.record import StepTime
from .capture.steps import CLEAN, capture_steps
from .precisions import autocast, availability, canonical

log = logging.getLogger("te_gemm_callback")


@dataclass
class SweepResult:
    captures: dict[str, GemmCapture] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    paths: dict[str, Path] = field(default_factory=dict)


class _Snapshot:
    """Everything a forward+backward can change, copied to host memory.

    Parameters and buffers are copied back tensor by tensor (bitwise, same storage, so optimizer
    state keyed by parameter stays valid). Module extra state (TE's FP8 scales and amax history)
    goes back through each module's own get/set_extra_state.
    """

    def __init__(self, model: nn.Module) -> None:
        self.tensors = {k: v.detach().to("cpu", copy=True)
                        for k, v in itertools.chain(model.named_parameters(), model.named_buffers())}
        self.extra = {n: copy.deepcopy(m.get_extra_state()) for n, m in model.named_modules()
                      if type(m).get_extra_state is not nn.Module.get_extra_state}
        self.grads = {n: (p.grad.detach().clone() if p.grad is not None else None) for n, p in model.named_parameters()}
        self.rng_cpu = torch.get_rng_state()
        self.rng_cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None

    def restore(self, model: nn.Module) -> None:
        with torch.no_grad():
            for k, v in itertools.chain(model.named_parameters(), model.named_buffers()):
                v.copy_(self.tensors[k])
        for n, p in model.named_parameters():
            p.grad = self.grads[n]
        torch.set_rng_state(self.rng_cpu)
        if self.rng_cuda is not None:
            torch.cuda.set_rng_state_all(self.rng_cuda)
        modules = dict(model.named_modules())
        # TE refuses pickled FP8 metadata unless told the source is trusted: this is our own
        # snapshot, taken from this process moments ago.
        with _env("NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE", "1"):
            for n, state in self.extra.items():
                modules[n].set_extra_state(state)


@contextlib.contextmanager
def _env(name: str, value: str) -> Iterator[None]:
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


# Measured with TE 2.20 on the H200 (benchmarks/sweep_state_matrix.py, tests/test_gpu.py): a TE module
# that ran DelayedScaling, then another FP8 recipe, then DelayedScaling again keeps its scales at 1.0
# and its loss frozen, with faster (mostly-zero) FP8 GEMMs; a module's first DelayedScaling use after
# another FP8 recipe updates them normally. So DelayedScaling is swept before other FP8 recipes, and
# a job that trains in DelayedScaling is never switched to another FP8 recipe.
_SWITCH_NOTE = ("TE stops updating DelayedScaling scales in a module that returns to DelayedScaling after "
                "another FP8 recipe")


def sweep_order(recipes: Iterable[str]) -> list[str]:
    """BF16 first, DelayedScaling before the other FP8 recipes, otherwise as given."""
    rs = list(dict.fromkeys(canonical(r) for r in recipes))
    return sorted(rs, key=lambda r: {"BF16": 0, "DelayedScaling": 1}.get(r, 2))


def plan_entries(order: list[str], plan: Any = None) -> list[tuple[str, str, Any]]:
    """(name in the results, recipe, plan) per swept entry. The plan runs right after its own
    recipe: under the same DelayedScaling state rules (a DelayedScaling plan must come before any
    other FP8 recipe touches the modules) and next to the run it differs from."""
    entries = [(r, r, None) for r in order]
    if plan is not None:
        at = next((i + 1 for i, e in enumerate(entries) if e[1] == plan.recipe), len(entries))
        entries.insert(at, ("plan", plan.recipe, plan))
    return entries


def switch_conflict(recipe: str, job_recipe: str | None, fp8_used: set[str]) -> str | None:
    """Why ``recipe`` must not run on this model now, or None. ``fp8_used``: FP8 recipes its TE
    modules have already run (the job's own one included)."""
    if recipe == "BF16":
        return None
    if job_recipe == "DelayedScaling" and recipe != "DelayedScaling":
        return (f"not swept on a job that trains in DelayedScaling: {_SWITCH_NOTE}, which would freeze this "
                "job's scaling; time it in a separate run and use `te-gemm compare`")
    others = sorted(fp8_used - {"DelayedScaling"})
    if recipe == "DelayedScaling" and "DelayedScaling" in fp8_used and others:
        return (f"not swept again after {', '.join(others)} on the same modules: {_SWITCH_NOTE}, so the timing "
                "would describe scales stuck at 1.0; time it in a separate run and use `te-gemm compare`")
    return None


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


def sweep_phases(entries: list[tuple[str, str, Any]]) -> list[list[tuple[str, str, Any]]]:
    """The entries in the phases their alternating rounds run in: BF16 and DelayedScaling (with a
    DelayedScaling plan) first, then the other FP8 recipes; within a phase the recipes alternate
    freely, and no DelayedScaling step ever follows another FP8 recipe (see :func:`switch_conflict`).

    Example:
        >>> [[e[0] for e in ph] for ph in sweep_phases(plan_entries(sweep_order(["fp8_block", "DelayedScaling", "BF16"])))]
        [['BF16', 'DelayedScaling'], ['Float8BlockScaling']]
    """
    first = [e for e in entries if e[1] in ("BF16", "DelayedScaling")]
    rest = [e for e in entries if e not in first]
    return [ph for ph in (first, rest) if ph]


def run_sweep(model: nn.Module, step_fn: Callable[[], Any], recipes: Iterable[str], *, steps: int = 3,
              warmup: int = 1, set_recipe: Callable[[nn.Module, str], Any] | None = None,
              context: Callable[[], Any] | None = None, out_dir: str | Path | None = None,
              nvtx: bool | str = "auto", profile_kernels: bool = True, job_recipe: str | None = None,
              plan: Any = None, rounds: int = 3) -> SweepResult:
    """Time ``steps`` forward+backward steps of ``step_fn`` under each recipe.

    Args:
        step_fn: runs one forward and returns the loss (the sweep calls backward).
        set_recipe: how the model picks its recipe, for models that enter ``te.autocast``
            themselves (called with each recipe, then with None to restore). Without it, the
            forward runs inside ``te.autocast(recipe)``.
        context: an outer context per step (Lightning's precision plugin forward context).
        job_recipe: the recipe the job trains in (read from its capture); decides which FP8
            recipes can be swept on its modules without breaking DelayedScaling (see
            :func:`switch_conflict`). Recipes run BF16 first, then DelayedScaling, then the rest.
        plan: a :class:`~te_gemm_callback.plan.PrecisionPlan` (or its JSON path) swept right after
            its own recipe (:func:`plan_entries`), as ``"plan"``: its recipe with its ``keep_bf16`` modules under ``te.autocast(enabled=False)``
            (:func:`~te_gemm_callback.plan.apply_precision_plan`, removed after its steps). Its
            capture holds the plan and its predicted speedup, to set against the observed one. A
            plan that amounts to a single recipe (``plan.same_as``) is not timed again.
        profile_kernels: on CUDA, one kernels step (torch.profiler, kernels only, after a warm-up
            step with the records already running) following the instrumented one: per-GEMM GPU time, and kernel time split into GEMM, attention,
            quantization/cast, norm, communication, optimizer and other
            (``meta["kernel_breakdown_ms"]``): where the time went that the GEMMs did not explain.
        rounds: alternating rounds after the captures: in each, every swept entry of a phase
            (:func:`sweep_phases`; BF16 in each) runs one untimed step (the switch) and ``steps``
            clean timed steps. A host-bound job's step time drifts by 10-50% over seconds (the
            H200 host-bound stack, docs/results/h200.md): recipes timed seconds apart in
            alternation see the same drift, so the observed speedup is the median over rounds of
            each round's ratio (:func:`~te_gemm_callback.analysis.observed_speedup`). 0: no rounds.

    Per recipe: ``warmup`` untimed steps, one instrumented step (shapes and precisions), the
    kernels warm-up, kernels and settle steps, then ``steps`` clean steps with nothing attached;
    then the rounds. The observed step time is the median of the rounds' medians (without rounds,
    of the recipe's clean steps), so the profiler's own host cost never enters a speedup or a
    verdict.
    """
    if steps < 1:
        raise ValueError("sweep steps must be >= 1")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0:
        raise ValueError(f"sweep rounds must be an integer >= 0, got {rounds!r}")
    from .plan import PrecisionPlan, apply_precision_plan

    if plan is not None and not isinstance(plan, PrecisionPlan):
        plan = PrecisionPlan.load(plan)
    res = SweepResult()
    snap = _Snapshot(model)
    on_cuda = _on_cuda(model)
    cuda = on_cuda and torch.cuda.is_available()
    fp8_used = {job_recipe} if job_recipe and job_recipe != "BF16" else set()
    handle = None

    def make_step(recipe: str) -> Callable[[], None]:
        def one_step() -> None:
            for p in model.parameters():
                p.grad = None  # no accumulation across sweep steps; restored at the end
            outer = context() if context is not None else contextlib.nullcontext()
            with outer:
                if set_recipe is not None:
                    set_recipe(model, recipe)
                    loss = _loss(step_fn())
                else:
                    with autocast(recipe):
                        loss = _loss(step_fn())
            loss.backward()

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
        conflict = switch_conflict(recipe, job_recipe, fp8_used)
        if conflict:
            res.skipped[label] = conflict
            return False
        if recipe != "BF16":
            fp8_used.add(recipe)
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
        cap.meta.update(recipe=label, sweep=True, note="forward+backward only, no optimizer step")
        if entry_plan is not None:
            cap.meta["plan"] = {"recipe": entry_plan.recipe, "keep_bf16": list(entry_plan.keep_bf16),
                                "predicted_speedup": entry_plan.predicted_speedup.get("plan"),
                                "predicted_step_ms": entry_plan.predicted_step_ms.get("plan")}
        res.captures[label] = cap
        save(label)  # now, so that a later entry that fails loses nothing of this one
        return True

    def save(label: str) -> None:
        if out_dir is not None:
            res.paths[label] = res.captures[label].save(Path(out_dir) / label / "gemm_capture.json")

    def time_rounds(timed: list[tuple[str, str, Any]], first_round: int) -> None:
        nonlocal handle
        for k in range(rounds):
            # Forward, then backward order (ABBA): a steady drift over a round pair falls on
            # every entry alike.
            for label, recipe, entry_plan in (timed if k % 2 == 0 else timed[::-1]):
                handle = apply_precision_plan(model, entry_plan) if entry_plan is not None else None
                one_step = make_step(recipe)
                one_step()  # the switch from the previous entry: not a steady-state step
                times = boundary_times(one_step, steps, cuda)
                if handle is not None:
                    handle.remove()
                    handle = None
                cap = res.captures[label]
                n = len(cap.steps)
                cap.steps += [StepTime(index=n + i, wall_ms=wall, gpu_ms=gpu, kind=CLEAN, round=first_round + k)
                              for i, (wall, gpu) in enumerate(times)]

    n_rounds = 0
    try:
        for phase in sweep_phases(plan_entries(sweep_order(recipes), plan)):
            ran = [e for e in phase if capture_entry(*e)]
            # BF16, the speedups' base, runs in every phase's rounds.
            timed = ran if "BF16" not in res.captures or any(e[0] == "BF16" for e in ran) else \
                [("BF16", "BF16", None)] + ran
            if rounds and len(timed) > 1:
                time_rounds(timed, n_rounds)
                n_rounds += rounds
                for label, _, _ in timed:  # the captures again, with their rounds' steps
                    res.captures[label].meta["sweep_rounds"] = (
                        "alternating rounds after the captures: clean steps per round are tagged with their "
                        "round; speedups are medians of per-round ratios")
                    save(label)
    finally:
        if handle is not None:  # a step raised while the plan was applied
            handle.remove()
        if set_recipe is not None:
            set_recipe(model, None)
        snap.restore(model)
    return res
