"""The schedule's arguments, checked where they are given: a bad one fails at construction with what
to fix, never once training runs (or after it, where the capture would be lost)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from te_gemm_callback.printable import plain


def _check_int(name: str, v: Any, least: int) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < least:
        raise ValueError(f"{name} must be an integer >= {least}, got {v!r}")


def _check_output_dir(output_dir: Any) -> None:
    # Else the capture was lost at the end of training (None: Path(None) raised naming no argument).
    if not isinstance(output_dir, (str, os.PathLike)) or not str(output_dir).strip():
        raise ValueError(f"output_dir must be a folder path (default 'te_gemm'), got {output_dir!r}")
    if "\x00" in str(output_dir):  # no folder can be made with it: the write failed after training
        raise ValueError(f"output_dir must not hold a NUL character, got {output_dir!r}")
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise ValueError(f"output_dir {plain(output_dir)} exists and is not a folder: give a folder path")


def _check_switches(*, report: Any, nvtx: Any, **flags: Any) -> None:
    # A truth test took "no" for True and None for False, where the user meant otherwise.
    if report not in (True, False, "end"):
        raise ValueError(f"report must be True, False or 'end', got {report!r}")
    if not isinstance(nvtx, bool) and nvtx != "auto":
        raise ValueError(f"nvtx must be True, False or 'auto', got {nvtx!r}")
    for name, v in flags.items():
        if not isinstance(v, bool):
            raise ValueError(f"{name} must be True or False, got {v!r}")


def check_arguments(*, wait: int, warmup: int, active: int, instrumented_steps: int, sweep_warmup: int,
                    sweep_steps: int, dispatch_steps: Any, adapters: Sequence[str], filename: str,
                    sweep: Sequence[str] | None, sweep_plan: Any = None, sweep_rounds: int = 6,
                    sweep_budget_s: float = 20.0, set_recipe: Any = None,
                    output_dir: Any = "te_gemm", report: Any = True, nvtx: Any = "auto", nsys_capture: Any = False,
                    verbose: Any = False, kernel_breakdown: Any = True) -> tuple[list[str] | None, Any]:
    """Raise ValueError, with what to fix, on an argument the capture could not use; returns the
    sweep's recipes in TE's names and the precision plan to sweep (loaded; BF16 and its recipe
    added to the recipes). Called where the arguments are given, not once training runs."""
    for name, v in (("wait", wait), ("warmup", warmup), ("sweep_warmup", sweep_warmup),
                    ("sweep_rounds", sweep_rounds)):
        _check_int(name, v, 0)
    if isinstance(active, bool) or not isinstance(active, int) or active < 1:  # one message for 0 and -5
        raise ValueError(f"active must be an integer >= 1 (at least one step has to be captured), got {active!r}")
    _check_int("sweep_steps", sweep_steps, 1)
    if isinstance(sweep_budget_s, bool) or not isinstance(sweep_budget_s, (int, float)) or not sweep_budget_s >= 0:
        raise ValueError(f"sweep_budget_s must be a number of seconds >= 0, got {sweep_budget_s!r}")
    _check_int("instrumented_steps", instrumented_steps, 1)
    if instrumented_steps > active:
        raise ValueError(f"instrumented_steps ({instrumented_steps}) must not exceed active ({active})")
    if dispatch_steps is not None and dispatch_steps != "all":
        _check_int("dispatch_steps", dispatch_steps, 0)
    if isinstance(adapters, str) or not adapters or set(adapters) - {"te", "torch"}:
        raise ValueError(f"adapters must be a list of 'te' and/or 'torch', got {adapters!r}")
    # "." and ".." pass the name test but name a folder: the capture was lost at the end of training.
    if not isinstance(filename, str) or not filename.strip() or Path(filename).name != filename or \
            filename in (".", "..") or not filename.isprintable():
        raise ValueError(f"filename must be a plain file name such as 'gemm_capture.json', got {filename!r}")
    if len(os.fsencode(filename)) > 200:  # the folder's limit is 255 bytes, and ".name.xxxx.tmp" goes beside it
        raise ValueError(f"filename must be at most 200 bytes, got {len(os.fsencode(filename))}")
    _check_output_dir(output_dir)
    _check_switches(report=report, nvtx=nvtx, nsys_capture=nsys_capture, verbose=verbose,
                    kernel_breakdown=kernel_breakdown)
    if set_recipe is not None and not callable(set_recipe):  # else the sweep fails after training
        raise ValueError(f"set_recipe must be a function f(module, recipe_or_None) or None, got {set_recipe!r}")
    return _check_sweep(sweep, sweep_plan)


def _check_sweep(sweep: Sequence[str] | None, sweep_plan: Any) -> tuple[list[str] | None, Any]:
    """The sweep's recipes in TE's names, and its plan loaded (BF16 and the plan's recipe added)."""
    from te_gemm_callback.precisions import user_recipe

    if isinstance(sweep, str):
        raise ValueError(f"sweep must be a list of recipe names, e.g. [{sweep!r}], not a string")
    if sweep is not None and any(not isinstance(r, str) for r in sweep):  # canonical() needs names
        raise ValueError(f"sweep must be a list of recipe names such as ['BF16', 'Float8CurrentScaling'], "
                         f"got {sweep!r}")
    # Bad names fail here, not after training; "FP8" alone as --precisions refuses it (four recipes).
    try:
        recipes = None if sweep is None else [user_recipe(r) for r in sweep]
    except ValueError as err:
        raise ValueError(f"sweep: {err}") from None
    if sweep_plan is None:
        return recipes, None
    from te_gemm_callback.sweep.plan import PrecisionPlan

    try:
        plan = sweep_plan if isinstance(sweep_plan, PrecisionPlan) else PrecisionPlan.load(sweep_plan)
    except (OSError, ValueError, KeyError, TypeError) as err:  # read_schema names the file already
        raise ValueError(f"sweep_plan: {err}; make one with `te-gemm plan RUN_DIR`") from None
    out = list(recipes or [])
    for r in ("BF16", plan.recipe):
        if r not in out:
            out.append(r)
    return out, plan


def check_project(project: Any) -> tuple[str, ...]:
    """The GPUs to project onto, by their keys; a one-line ValueError naming the known ones."""
    from te_gemm_callback.projection import gpu

    if isinstance(project, str):
        project = (project,)
    if not isinstance(project, (list, tuple)):
        raise ValueError(f"project must be a list of GPU names such as ('B300',), got {project!r}")
    try:
        return tuple(gpu(str(g)).key for g in project)
    except ValueError as err:  # "unknown GPU 'FOO'" named no argument
        raise ValueError(f"project: {err}") from None
