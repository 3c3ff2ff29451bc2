"""The sweep's options: :func:`~te_gemm_callback.sweep.run_sweep` takes them by field name, the schedule
and the callbacks by their keywords (``sweep``, ``sweep_steps``, ...)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from te_gemm_callback.options import Options, function_or_none, integer, option, seconds
from te_gemm_callback.precisions import user_recipe

# sweep.plan loads torch: _plan imports it, so that importing the options does not.

BUDGET_S = 20.0  # a 150 ms step, 4 recipes, 4 steps each: about 8 rounds


def _recipes(v: Any, name: str) -> list[str] | None:
    """TE's names of the recipes; bad names fail here, not after training."""
    if v is None:
        return None
    if isinstance(v, str):
        raise ValueError(f"{name} must be a list of recipe names, e.g. [{v!r}], not a string")
    if any(not isinstance(r, str) for r in v):  # canonical() needs names
        raise ValueError(f"{name} must be a list of recipe names such as ['BF16', 'Float8CurrentScaling'], got {v!r}")
    try:  # "FP8" alone refuses itself (four recipes)
        names = [user_recipe(r) for r in v]
    except ValueError as err:
        raise ValueError(f"{name}: {err}") from None
    if twice := sorted({r for r in names if names.count(r) > 1}):
        raise ValueError(f"{name} names {', '.join(twice)} more than once: give each recipe once")
    return names


def _plan(v: Any, name: str) -> Any:
    from te_gemm_callback.sweep.plan import PrecisionPlan
    if v is None or isinstance(v, PrecisionPlan):
        return v
    try:
        return PrecisionPlan.load(v)
    except (OSError, ValueError, KeyError, TypeError) as err:  # read_schema names the file already
        raise ValueError(f"{name}: {err}; make one with `te-gemm plan RUN_DIR`") from None


def _target(v: Any, name: str) -> Any:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 1:
        raise ValueError(f"{name} must be a fraction between 0 and 1 (0.02: +-2%), got {v!r}")
    return v


@dataclass(frozen=True)
class SweepConfig(Options):
    """Which recipes the sweep times on the job's own steps, and for how long."""

    recipes: Sequence[str] | None = option(
        None, "recipes to time on the job's own model and batch (:func:`~te_gemm_callback.sweep.run_sweep`): "
              "whole training steps alternated in rounds, then everything put back; written to "
              "output_dir/sweep/<recipe>/. The report's observed step speedups come from here.", _recipes, kw="sweep")
    steps: int = option(3, "clean timed steps per recipe and round.", integer(1), kw="sweep_steps")
    warmup: int = option(2, "untimed steps per recipe before its capture.", integer(0), kw="sweep_warmup")
    rounds: int = option(6, "the fewest alternating rounds (0: no fewest); then more until every observed speedup's "
                            "95% interval is within sweep_target or sweep_budget_s seconds are spent. A 95% interval "
                            "needs 6 rounds; sweep_rounds=0, sweep_budget_s=0 runs none (each recipe's capture steps "
                            "alone give its step time, without an interval).", integer(0), kw="sweep_rounds")
    budget_s: float = option(BUDGET_S, "seconds of rounds past the fewest (the rounds asked for always run).",
                             seconds, kw="sweep_budget_s")
    target: float = option(0.02, "the interval's half-width the rounds aim for (0.02: +-2%).", _target,
                           kw="sweep_target")
    set_recipe: Any = option(None, "f(module, recipe_or_None) for models that enter te.autocast themselves.",
                             function_or_none("a function f(module, recipe_or_None)"))
    plan: Any = option(None, "a precision plan (te-gemm plan's file or a PrecisionPlan) swept as 'plan', right "
                             "after its own recipe (BF16 and that recipe are swept with it).", _plan, kw="sweep_plan")

    def check_together(self, labels: dict[str, str]) -> None:
        if self.plan is not None:  # swept beside BF16 and its own recipe
            out = list(self.recipes or [])
            out += [r for r in ("BF16", self.plan.recipe) if r not in out]
            object.__setattr__(self, "recipes", out)
