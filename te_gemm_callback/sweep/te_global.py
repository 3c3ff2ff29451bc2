"""TE's process-global FP8 state (``FP8GlobalStateManager``), taken and put back in the same objects.

A module that runs DelayedScaling joins TE's global amax, amax-history and scale buffers for the life of
the process, and every FP8 autocast's exit and first module's backward then reduce and update every
entry, whatever the recipe (TE's quantization.py, ``reduce_and_update_fp8_tensors``). So the sweep's
DelayedScaling steps, or the module benchmark's modules, would make each later FP8 step of the job run
an update over modules that are not its own. The sweep keeps one set of buffers for its DelayedScaling
steps and one for the other recipes (:class:`BufferWorlds`); the job gets its own back at the end, and
the bench runs inside :func:`te_global_kept`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections import deque
from collections.abc import Iterator
from typing import Any

_MANAGER_MODULES = ("transformer_engine.pytorch.quantization", "transformer_engine.pytorch.fp8")
# The containers TE fills per module (DelayedScaling only) and per autocast; on TE releases whose
# manager keeps its state as class attributes, these are the names that matter.
BUFFERS = ("global_amax_buffer", "global_amax_history_buffer", "global_scale_buffer",
           "fp8_tensors_recompute_buffer", "autocast_arguments")

# (manager, state holder, {container field: (the container, its items' contents)}, {other field: value})
Saved = tuple[Any, Any, dict[str, tuple[Any, Any]], dict[str, Any]]


def _manager() -> Any:
    """TE's FP8GlobalStateManager if TE is loaded (never imported here: a job without TE has none)."""
    for name in _MANAGER_MODULES:
        mgr = getattr(sys.modules.get(name), "FP8GlobalStateManager", None)
        if mgr is not None:
            return mgr
    return None


def _holder(mgr: Any) -> Any:
    return getattr(mgr, "quantization_state", mgr)  # TE 2.20: an FP8GlobalState instance; older: the class


def _contents(item: Any) -> list[Any] | None:
    return list(item) if isinstance(item, (list, deque)) else None


def take() -> Saved | None:
    """A copy of TE's global FP8 state (each container with its items' contents), or None without TE."""
    mgr = _manager()
    if mgr is None:
        return None
    holder = _holder(mgr)
    names = [f.name for f in dataclasses.fields(holder)] if dataclasses.is_dataclass(holder) else list(BUFFERS)
    containers: dict[str, tuple[Any, Any]] = {}
    values: dict[str, Any] = {}
    for k in names:
        if not hasattr(holder, k):
            continue
        v = getattr(holder, k)
        if isinstance(v, dict):
            containers[k] = (v, {kk: (vv, _contents(vv)) for kk, vv in v.items()})
        elif isinstance(v, list):
            containers[k] = (v, [(x, _contents(x)) for x in v])
        else:
            values[k] = v
    return mgr, holder, containers, values


def _refill(item: Any, content: list[Any] | None) -> Any:
    if content is not None:
        item.clear()
        item.extend(content)
    return item


def put(saved: Saved | None) -> None:
    """TE's global state as ``saved`` had it, in the same containers; None: TE's buffers emptied (the
    state of a process that never ran DelayedScaling). Nothing happens without TE loaded."""
    mgr = _manager()
    if mgr is None:
        return
    if saved is None:
        holder = _holder(mgr)
        for k in BUFFERS:
            v = getattr(holder, k, None)
            if isinstance(v, (dict, list)):
                v.clear()
        return
    owner, holder, containers, values = saved
    if owner is mgr and hasattr(mgr, "quantization_state") and mgr.quantization_state is not holder:
        mgr.quantization_state = holder  # replaced since (FP8GlobalStateManager.reset())
    for k, (live, items) in containers.items():
        if isinstance(live, dict):
            live.clear()
            live.update((kk, _refill(item, content)) for kk, (item, content) in items.items())
        else:
            live[:] = [_refill(item, content) for item, content in items]
        setattr(holder, k, live)  # TE may have bound a new one (its recompute buffer's list)
    for k, v in values.items():
        setattr(holder, k, v)


def has_delayed_entries(saved: Saved | None) -> bool:
    """Whether the state holds modules registered for DelayedScaling's global update."""
    if saved is None:
        return False
    amax = saved[2].get("global_amax_buffer")
    return bool(amax and any(content for _, content in amax[1].values()))


@contextlib.contextmanager
def te_global_kept() -> Iterator[None]:
    """Inside, TE's global buffers are empty, so what runs there (the bench's own modules) updates none of
    the job's DelayedScaling amaxes and scales; on the way out the job's state is put back."""
    saved = take()
    try:
        put(None)
        yield
    finally:
        put(saved)


def world(recipe: str) -> str:
    """Which set of global buffers a sweep label's steps use: DelayedScaling's (a plan of it too) or the rest's."""
    return "delayed" if "DelayedScaling" in recipe else "other"


class BufferWorlds:
    """The sweep's two sets of TE's global buffers: its DelayedScaling steps keep theirs across switches
    (a module joins them once), the other recipes' steps see the job's (or none, in a DelayedScaling job),
    and the job gets exactly its own back."""

    def __init__(self) -> None:
        self.job = take()
        # The buffers tell, not the job's recipe label: a job whose GEMMs are mostly another recipe's may
        # still have modules in DelayedScaling, and those never join the buffers again.
        self.job_world = "delayed" if has_delayed_entries(self.job) else "other"
        self.current = self.job_world
        self.kept: dict[str, Saved | None] = {}

    def switch(self, recipe: str) -> None:
        target = world(recipe)
        if target == self.current:
            return
        self.kept[self.current] = take()
        put(self.kept[target] if target in self.kept else (self.job if target == self.job_world else None))
        self.current = target

    def restore_job(self) -> None:
        put(self.job)
        self.current = self.job_world
        self.kept.clear()
