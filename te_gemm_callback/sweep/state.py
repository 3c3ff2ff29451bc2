"""What the sweep's steps change in a training job, put back: :class:`TrainingSnapshot` the values, bitwise, in
place; :class:`RecipeStates` TE's very quantization-state objects at each switch: a module joins TE's global
DelayedScaling amax buffers only once, so after DelayedScaling -> another recipe -> DelayedScaling its new
scales would never update (docs/results/h200.md: DelayedScaling state)."""

from __future__ import annotations

import copy
import itertools
import logging
import os
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from te_gemm_callback.sweep.host_state import _STATE_DICTS, _STATE_FLAGS, _STATE_OBJECTS, HostState
from te_gemm_callback.sweep.te_global import BufferWorlds

log = logging.getLogger("te_gemm_callback")
_TRUST = "NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE"


def _stash(m: nn.Module) -> dict[str, Any]:
    """References, not copies, to a module's recipe-state objects: TE's global buffers hold their tensors."""
    d = m.__dict__
    out: dict[str, Any] = {}
    for k in _STATE_DICTS:
        if isinstance(d.get(k), dict):
            # The dict and a shallow copy of it: TE changes fp8_meta and the quantizers' lists in place.
            out[k] = (d[k], {kk: (list(v) if isinstance(v, list) else v) for kk, v in d[k].items()})
    out.update((k, d[k]) for k in _STATE_OBJECTS + _STATE_FLAGS if k in d)
    return out


def _unstash(m: nn.Module, saved: dict[str, Any]) -> None:
    d = m.__dict__
    for k, v in saved.items():
        if k in _STATE_DICTS:
            obj, content = v
            obj.clear()  # the same dict object: TE and its global buffers may hold it
            obj.update({kk: (list(vv) if isinstance(vv, list) else vv) for kk, vv in content.items()})
            d[k] = obj
        else:
            d[k] = v  # set in __dict__ as TE's fast_setattr does


_BUFFER_INDEX = "buffer_index_and_autocast_key"  # FP8GlobalStateManager.get_buffer_info()


def _forget_registration(mods: list[nn.Module], label: str) -> None:
    """Before a label's first steps: a module whose ``fp8_meta`` holds another recipe's state gets new
    state objects from TE, which join the global buffers only if the module's buffer index is gone
    (``add_fp8_tensors_to_global_buffer`` returns early while it is there). The stash keeps the index."""
    te_class = "CustomRecipe" if label.endswith(" plan") else label  # the native plan: TE's CustomRecipe
    for m in mods:
        meta = m.__dict__.get("fp8_meta")
        if isinstance(meta, dict) and _BUFFER_INDEX in meta and type(meta.get("recipe")).__name__ != te_class:
            del meta[_BUFFER_INDEX]


class RecipeStates:
    """Each TE module's quantization-state objects kept per recipe, put back on every switch, and TE's
    global DelayedScaling buffers kept apart for the DelayedScaling steps (:class:`BufferWorlds`).

    Example:
        >>> keep = RecipeStates(torch.nn.Linear(2, 2))     # no TE module: nothing to keep
        >>> keep.switch("BF16"); keep.switch("DelayedScaling"); keep.restore_job()
        >>> keep.modules
        0
    """

    def __init__(self, model: nn.Module) -> None:
        self.buffers = BufferWorlds()
        self._mods = [m for m in model.modules() if isinstance(getattr(m, "fp8_meta", None), dict)
                      or hasattr(m, "_fp8_metas")]
        self._job = [_stash(m) for m in self._mods]  # what the job's own recipe left
        self._by_recipe: dict[str, list[dict[str, Any]]] = {}
        self._current: str | None = None

    @property
    def modules(self) -> int:
        return len(self._mods)

    def switch(self, recipe: str) -> None:
        """Keep what the previous recipe's steps left, then put back what ``recipe`` had (if it ran before)."""
        self.buffers.switch(recipe)
        if not self._mods or recipe == self._current:
            return
        if self._current is not None and self._current != "BF16":
            self._by_recipe[self._current] = [_stash(m) for m in self._mods]
        for m, s in zip(self._mods, self._by_recipe.get(recipe, ())):
            _unstash(m, s)
        if recipe not in self._by_recipe and recipe != "BF16":
            _forget_registration(self._mods, recipe)
        self._current = recipe

    def restore_job(self) -> None:
        """The job's own objects and TE's global buffers back (:class:`TrainingSnapshot` puts their values back)."""
        try:
            for m, s in zip(self._mods, self._job):
                _unstash(m, s)
        finally:
            self._current = None
            self.buffers.restore_job()


def _to_host(v: Any) -> Any:
    """A host copy of an optimizer state value, with the device to put it back on."""
    if isinstance(v, torch.Tensor):
        return v.detach().to("cpu", copy=True), v.device
    return copy.deepcopy(v), None


class TrainingSnapshot:
    """Everything a training step can change (parameters, buffers, gradients, optimizer state, random
    streams, TE's FP8 metadata through get/set_extra_state), copied to host memory and put back bitwise,
    in place. The sweep steps no learning-rate scheduler, so none is kept."""

    def __init__(self, model: nn.Module, optimizers: Iterable[torch.optim.Optimizer] = (),
                 rng_objects: Iterable[Any] = ()) -> None:
        self.tensors = {k: v.detach().to("cpu", copy=True)
                        for k, v in itertools.chain(model.named_parameters(), model.named_buffers())}
        self.extra = {n: copy.deepcopy(m.get_extra_state()) for n, m in model.named_modules()
                      if type(m).get_extra_state is not nn.Module.get_extra_state}
        self.grads = {n: (p.grad.detach().clone() if p.grad is not None else None) for n, p in model.named_parameters()}
        # Parameters the optimizers step outside the model (a loss head): the sweep's steps change them too.
        mine = {id(p) for p in model.parameters()}
        optimizers = list(optimizers)
        outside = {id(p): p for opt in optimizers for g in opt.param_groups for p in g["params"] if id(p) not in mine}
        self.outside = [(p, p.detach().to("cpu", copy=True), p.grad.detach().clone() if p.grad is not None else None)
                        for p in outside.values()]
        self.host = HostState(model, rng_objects)
        self.optimizers = [(opt, {p: {k: _to_host(v) for k, v in st.items()} for p, st in opt.state.items()},
                            [{k: copy.deepcopy(v) for k, v in g.items() if k != "params"} for g in opt.param_groups])
                           for opt in optimizers]

    def parts(self, model: nn.Module) -> list[tuple[str, Callable[[], Any]]]:
        """What to put back, part by part, for :func:`put_back`: (what, how)."""
        return [("the parameters and buffers", lambda: self._tensors(model)),
                ("the optimizer state", self._optimizers), ("the gradients", lambda: self._grads(model)),
                ("the random streams and the modules' Python state", self._host),
                ("the modules' extra state (TE's FP8 metadata)", lambda: self._extra(model))]

    @torch.no_grad()
    def _tensors(self, model: nn.Module) -> None:
        for k, v in itertools.chain(model.named_parameters(), model.named_buffers()):
            saved = self.tensors.get(k)
            if saved is None:  # a buffer a sweep step added: left, as an attribute it adds is
                continue
            if v.shape == saved.shape and v.dtype == saved.dtype:
                v.copy_(saved)
            else:  # a buffer a step replaced by a grown one: its old values, in the tensor the module holds now
                v.data = saved.to(v.device, copy=True)
        for p, value, _ in self.outside:
            p.copy_(value)

    @torch.no_grad()
    def _optimizers(self) -> None:
        for opt, state, groups in self.optimizers:
            for p in [p for p in opt.state if p not in state]:
                del opt.state[p]  # first created by a sweep step
            for p, st in state.items():
                live = opt.state[p]
                for k in [k for k in live if k not in st]:
                    del live[k]
                for k, (v, device) in st.items():
                    cur = live.get(k)
                    if device is None:
                        live[k] = copy.deepcopy(v)
                    elif isinstance(cur, torch.Tensor) and cur.shape == v.shape and cur.dtype == v.dtype:
                        cur.copy_(v)  # in place: fused and foreach optimizers keep views of it
                    else:
                        live[k] = v.to(device, copy=True)
            for g, saved in zip(opt.param_groups, groups):
                g.update(copy.deepcopy(saved))

    def _grads(self, model: nn.Module) -> None:
        for n, p in model.named_parameters():
            p.grad = self.grads[n]
        for p, _, grad in self.outside:
            p.grad = grad

    def _host(self) -> None:
        changed = self.host.restore()
        if changed:
            log.info("te-gemm: the sweep's steps changed %s; put back", ", ".join(sorted(set(changed))))

    def _extra(self, model: nn.Module) -> None:
        modules = dict(model.named_modules())
        # TE refuses pickled FP8 metadata unless the source is trusted: this snapshot is our own, moments old.
        old = os.environ.get(_TRUST)
        os.environ[_TRUST] = "1"
        try:
            for n, state in self.extra.items():
                modules[n].set_extra_state(state)
        finally:
            if old is None:
                os.environ.pop(_TRUST, None)
            else:
                os.environ[_TRUST] = old


class RestoreError(RuntimeError):
    """Part of the job could not be put back after the sweep: the job goes on changed, and says so."""


def put_back(parts: Iterable[tuple[str, Callable[[], Any]]]) -> None:
    """Run every part; one that raises stops none of the others. Then RestoreError naming each that failed."""
    failed = []
    for what, fn in parts:
        try:
            fn()
        except Exception as err:
            failed.append(f"{what} ({type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''})")
    if failed:
        raise RestoreError(f"the sweep could not put back {'; '.join(failed)}: the job goes on with what its steps "
                           "left there, the rest put back")
