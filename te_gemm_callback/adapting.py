"""What the training-framework adapters share (Lightning's callback, Hugging Face's TrainerCallback):
argument checks, the schedule's phases, publishing a capture, and the failure guard. No framework
is imported here.
"""

from __future__ import annotations

import logging
import os
import uuid
from pathlib import Path
from typing import Any, Callable, Sequence

from .capture import GemmCapture
from .capture.distributed import RANKS_SCHEMA, rank_summary
from .jsonio import read_json, write_json
from .printable import plain

log = logging.getLogger("te_gemm_callback")


def check_int(name: str, v: Any, least: int) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < least:
        raise ValueError(f"{name} must be an integer >= {least}, got {v!r}")


def check_arguments(*, wait: int, warmup: int, active: int, instrumented_steps: int, sweep_warmup: int,
                    sweep_steps: int, dispatch_steps: Any, adapters: Sequence[str], filename: str,
                    sweep: Sequence[str] | None, sweep_plan: Any = None, sweep_rounds: int = 6,
                    sweep_budget_s: float = 20.0, set_recipe: Any = None,
                    output_dir: Any = None) -> tuple[list[str] | None, Any]:
    """Raise ValueError, with what to fix, on an argument the capture could not use; returns the
    sweep's recipes in TE's names and the precision plan to sweep (loaded; BF16 and its recipe
    added to the recipes). Called where the arguments are given, not once training runs."""
    for name, v in (("wait", wait), ("warmup", warmup), ("active", active), ("sweep_warmup", sweep_warmup),
                    ("sweep_rounds", sweep_rounds)):
        check_int(name, v, 0)
    check_int("sweep_steps", sweep_steps, 1)
    if isinstance(sweep_budget_s, bool) or not isinstance(sweep_budget_s, (int, float)) or not sweep_budget_s >= 0:
        raise ValueError(f"sweep_budget_s must be a number of seconds >= 0, got {sweep_budget_s!r}")
    check_int("instrumented_steps", instrumented_steps, 1)
    if active < 1:
        raise ValueError("active must be >= 1: at least one step has to be captured")
    if instrumented_steps > active:
        raise ValueError(f"instrumented_steps ({instrumented_steps}) must not exceed active ({active})")
    if dispatch_steps is not None and dispatch_steps != "all":
        check_int("dispatch_steps", dispatch_steps, 0)
    if isinstance(adapters, str) or not adapters or set(adapters) - {"te", "torch"}:
        raise ValueError(f"adapters must be a list of 'te' and/or 'torch', got {adapters!r}")
    # "." and ".." pass the name test but name a folder: the capture was lost at the end of training.
    if not isinstance(filename, str) or not filename.strip() or Path(filename).name != filename or \
            filename in (".", "..") or not filename.isprintable():
        raise ValueError(f"filename must be a plain file name such as 'gemm_capture.json', got {filename!r}")
    if len(os.fsencode(filename)) > 200:  # the folder's limit is 255 bytes, and ".name.xxxx.tmp" goes beside it
        raise ValueError(f"filename must be at most 200 bytes, got {len(os.fsencode(filename))}")
    if output_dir is not None:  # else the capture was lost at the end of training
        if not isinstance(output_dir, (str, os.PathLike)) or not str(output_dir).strip():
            raise ValueError(f"output_dir must be a folder path, got {output_dir!r}")
        if os.path.exists(output_dir) and not os.path.isdir(output_dir):
            raise ValueError(f"output_dir {plain(output_dir)} exists and is not a folder: give a folder path")
    if set_recipe is not None and not callable(set_recipe):  # else the sweep fails after training
        raise ValueError(f"set_recipe must be a function f(module, recipe_or_None) or None, got {set_recipe!r}")
    from .precisions import canonical

    if isinstance(sweep, str):
        raise ValueError(f"sweep must be a list of recipe names, e.g. [{sweep!r}], not a string")
    if sweep is not None and any(not isinstance(r, str) for r in sweep):  # canonical() needs names
        raise ValueError(f"sweep must be a list of recipe names such as ['BF16', 'Float8CurrentScaling'], got {sweep!r}")
    recipes = None if sweep is None else [canonical(r) for r in sweep]  # bad names fail here, not after training
    if sweep_plan is None:
        return recipes, None
    from .plan import PrecisionPlan

    try:
        plan = sweep_plan if isinstance(sweep_plan, PrecisionPlan) else PrecisionPlan.load(sweep_plan)
    except (OSError, ValueError, KeyError, TypeError) as err:  # read_schema names the file already
        raise ValueError(f"sweep_plan: {err}; make one with `te-gemm plan RUN_DIR`") from None
    out = list(recipes or [])
    for r in ("BF16", plan.recipe):
        if r not in out:
            out.append(r)
    return out, plan


class LiveState:
    """For the adapters: a copy or pickle of a callback leaves its live capture behind (the
    profiler holds thread-local state, hooks and a dispatch mode that belong to the running job):
    ``copy.deepcopy(callback)`` inside the capture window gives a callback with no capture open."""

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_prof"], state["_phase"] = None, None
        return state


def new_run_id() -> str:
    """The id a run folder's captures share (the job's and its sweep's): ``meta["run_id"]``."""
    return uuid.uuid4().hex


def clear_stale_sweep(output_dir: Path, run_id: str) -> list[Path]:
    """Remove the sweep captures an earlier run left in ``output_dir/sweep/`` (captures of ours
    whose run id is not ``run_id``), then the folders that leaves empty: a report would take them
    for this run's baseline. Files that are not our captures, and links, are left alone."""
    from .capture.record import SCHEMA

    sweep, gone = output_dir / "sweep", []
    if not sweep.is_dir() or sweep.is_symlink():
        return gone
    root = output_dir.resolve()
    for p in sorted(sweep.glob("*/gemm_capture.json")):
        # glob follows a linked subfolder (sweep/old -> elsewhere): never delete through a link, and
        # only a regular file that really lies inside output_dir.
        if p.parent.is_symlink() or p.is_symlink() or not p.is_file() or \
                not p.resolve().is_relative_to(root):
            continue
        try:
            data = read_json(p)
        except ValueError:
            continue
        if isinstance(data, dict) and data.get("schema") == SCHEMA and \
                (data.get("meta") or {}).get("run_id") != run_id:
            p.unlink()
            gone.append(p)
    for d in [*{p.parent for p in gone}, sweep]:
        try:
            d.rmdir()  # only when empty: anything else of the user's stays
        except OSError:
            pass
    if gone:
        log.warning("te-gemm: removed %d sweep capture(s) of an earlier run from %s: this run's report must not "
                    "take them for its own", len(gone), sweep)
    return gone


def kernel_steps(kernels: bool, active: int, instrumented: int) -> dict[str, int]:
    """GemmProfiler's kernel arguments for an active window: one kernels step, then a settle step
    (untimed: the records' sync drained the GPU queue), with a warm-up step before them, where the
    window still has room for a clean step after them. A shorter window keeps the kernels step and
    a clean step time; the settle step goes before the warm-up (it biases the step time, the warm-up
    only the GEMM times' clock)."""
    if not kernels or active <= instrumented:
        return {"kernel_steps": 0}
    room = active - instrumented - 2  # after the kernels step and one clean step
    return {"kernel_steps": 1, "settle_steps": 1 if room >= 1 else 0, "kernel_warmup_steps": 1 if room >= 2 else 0}


def phase(step: int, wait: int, warmup: int, active: int) -> str:
    """The schedule of ``torch.profiler.schedule``: untouched, warm-up (discarded), active, done."""
    if step < wait:
        return "wait"
    if step < wait + warmup:
        return "warmup"
    if step < wait + warmup + active:
        return "active"
    return "done"


def guard(fn: Callable[[], Any], what: str) -> Any:
    """Run one piece of our own work; a failure is logged once and never reaches the training job
    (returns False then)."""
    try:
        return fn()
    except Exception as err:
        log.warning("te-gemm: %s: %s: %s (training goes on)", what, type(err).__name__, err)
        return False


def drop_profiler(prof: Any) -> None:
    """Take everything a profiler put on off after a failure (instruments, forward guard, graph
    counter); it is not used again."""
    try:
        prof._release()
    except Exception:  # already broken: nothing of it is used
        pass


def finish_profiler(prof: Any, micro_batches: int) -> GemmCapture | None:
    """Close the open step and stop; on a failure of ours, log it, take everything off, return None."""
    def stop() -> GemmCapture:
        prof.resume()  # stop() closes the open step with its boundary event
        return prof.stop(micro_batches=max(micro_batches, 1))

    cap = guard(stop, "capture could not be finished")
    if cap is False:
        drop_profiler(prof)
        return None
    return cap


def save_capture(cap: GemmCapture, output_dir: Path, filename: str, *, keep_existing: bool = False) -> Path:
    """Write the capture; with ``keep_existing`` (a resumed job), a capture already at the path
    stays as it was and this one goes beside it, named after its last step."""
    path = output_dir / filename
    if keep_existing and path.exists():
        path = path.with_name(f"{path.stem}.step{cap.meta.get('global_step_end', 'resumed')}{path.suffix}")
        log.warning("te-gemm: %s exists from before the resume: this capture goes to %s", output_dir / filename, path)
    return cap.save(path)


def write_ranks(caps: list[GemmCapture], output_dir: Path) -> list[dict[str, Any]]:
    """Every rank's capture and the per-rank summary under ``output_dir/ranks/``."""
    for c in caps:
        c.save(output_dir / "ranks" / f"rank{c.meta.get('rank')}.json", root=output_dir)  # ranks/ a link: refused
    summary = rank_summary(caps)
    write_json(output_dir / "ranks" / "summary.json", {"schema": RANKS_SCHEMA, "ranks": summary},
               schema=RANKS_SCHEMA, root=output_dir)
    return summary


def sweep_metrics(res: Any) -> dict[str, float]:
    """Logger scalars from a :class:`~te_gemm_callback.sweep.SweepResult`: observed step time and
    speedup per recipe."""
    from .analysis import analyze

    for r, why in res.skipped.items():
        log.warning("te-gemm: sweep skipped %s: %s", r, why)
    caps = list(res.captures.values())
    if not caps:
        return {}
    try:
        rep = analyze(caps[0], None, caps[1:])
    except ValueError:
        return {}
    out = {}
    for a in rep.recipes:
        if a.observed_step_speedup is not None:
            out[f"te_gemm/observed_step_speedup/{a.recipe}"] = a.observed_step_speedup
        if a.observed_step_ms is not None:
            out[f"te_gemm/sweep_step_ms/{a.recipe}"] = a.observed_step_ms
    return out
