"""What the sweep's steps change in a training job, and how it is put back.

The sweep runs whole training steps (forward, backward, the optimizer step) on the job's own model
under several recipes. Two things make that safe:

- :class:`TrainingSnapshot`: parameters, buffers, gradients, RNG states, optimizer state and TE's
  FP8 metadata values, copied before the sweep and copied back bitwise after it (in place, so the
  optimizer's parameter keys and every other reference stay valid).
- :class:`RecipeStates`: the TE objects that hold a module's quantization state per recipe. TE
  replaces them when a module changes recipe, and its DelayedScaling state cannot survive that: the
  module joined TE's global amax buffers once, with its first DelayedScaling state's tensors
  (``FP8GlobalStateManager.add_fp8_tensors_to_global_buffer`` returns early for a module already
  registered), so after DelayedScaling -> another FP8 recipe -> DelayedScaling its new scale and
  amax tensors are never updated (docs/results/h200.md, facts the code relies on: DelayedScaling
  state). Putting back the very objects the module had under a recipe, each time the sweep switches
  to it, keeps the module's quantizers on the tensors TE's global buffers update.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import logging
import os
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from te_gemm_callback.sweep.host_state import _STATE_DICTS, _STATE_FLAGS, _STATE_OBJECTS, HostState

log = logging.getLogger("te_gemm_callback")

def _holds_recipe_state(m: nn.Module) -> bool:
    return isinstance(getattr(m, "fp8_meta", None), dict) or hasattr(m, "_fp8_metas")


def _stash(m: nn.Module) -> dict[str, Any]:
    """References (not copies) to a module's recipe-state objects: the tensors inside are the ones
    TE's global buffers hold, so copies would not do."""
    d = m.__dict__
    out: dict[str, Any] = {}
    for k in _STATE_DICTS:
        if isinstance(d.get(k), dict):
            # Shallow: fp8_meta is mutated in place by TE (scaling_fwd replaced); quantizers' lists too.
            out[k] = (d[k], {kk: (list(v) if isinstance(v, list) else v) for kk, v in d[k].items()})
    for k in _STATE_OBJECTS:
        if k in d:
            out[k] = d[k]
    for k in _STATE_FLAGS:
        if k in d:
            out[k] = d[k]
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
            d[k] = v  # plain attributes; set in __dict__ as TE's fast_setattr does


class RecipeStates:
    """Each TE module's quantization-state objects kept per recipe, put back on every switch.

    Example:
        >>> keep = RecipeStates(torch.nn.Linear(2, 2))     # no TE module: nothing to keep
        >>> keep.switch("BF16"); keep.switch("DelayedScaling"); keep.restore_job()
        >>> keep.modules
        0
    """

    def __init__(self, model: nn.Module) -> None:
        self._mods = [m for m in model.modules() if _holds_recipe_state(m)]
        self._job = [_stash(m) for m in self._mods]  # what the job's own recipe left
        self._by_recipe: dict[str, list[dict[str, Any]]] = {}
        self._current: str | None = None

    @property
    def modules(self) -> int:
        return len(self._mods)

    def switch(self, recipe: str) -> None:
        """Before the first step in ``recipe``: keep what the previous recipe's steps left, then
        put back what ``recipe`` had (nothing the first time: TE builds it on the next forward)."""
        if not self._mods or recipe == self._current:
            return
        if self._current is not None and self._current != "BF16":
            self._by_recipe[self._current] = [_stash(m) for m in self._mods]
        saved = self._by_recipe.get(recipe)
        if saved is not None:
            for m, s in zip(self._mods, saved):
                _unstash(m, s)
        self._current = recipe

    def restore_job(self) -> None:
        """The job's own objects back (their values are put back by :class:`TrainingSnapshot`)."""
        for m, s in zip(self._mods, self._job):
            _unstash(m, s)
        self._current = None


def _to_host(v: Any) -> Any:
    """A host copy of an optimizer state value, with the device to put it back on."""
    if isinstance(v, torch.Tensor):
        return v.detach().to("cpu", copy=True), v.device
    return copy.deepcopy(v), None


class TrainingSnapshot:
    """Everything a training step can change, copied to host memory and put back bitwise.

    Parameters and buffers are copied back tensor by tensor (same storage, so optimizer state keyed
    by parameter stays valid). Module extra state (TE's FP8 scales and amax history) goes back
    through each module's own get/set_extra_state. Optimizer state tensors (Adam's moments, step
    counts) are copied back in place; state the sweep created is dropped; param-group settings are
    put back. Learning-rate schedulers are not stepped by the sweep, so they have nothing to restore.
    """

    def __init__(self, model: nn.Module, optimizers: Iterable[torch.optim.Optimizer] = (),
                 rng_objects: Iterable[Any] = ()) -> None:
        self.tensors = {k: v.detach().to("cpu", copy=True)
                        for k, v in itertools.chain(model.named_parameters(), model.named_buffers())}
        self.extra = {n: copy.deepcopy(m.get_extra_state()) for n, m in model.named_modules()
                      if type(m).get_extra_state is not nn.Module.get_extra_state}
        self.grads = {n: (p.grad.detach().clone() if p.grad is not None else None) for n, p in model.named_parameters()}
        # Parameters the optimizers step that the model does not hold (a loss head, a learnable
        # temperature): the sweep's optimizer steps change them too.
        mine = {id(p) for p in model.parameters()}
        optimizers = list(optimizers)
        outside = {id(p): p for opt in optimizers for g in opt.param_groups for p in g["params"] if id(p) not in mine}
        self.outside = [(p, p.detach().to("cpu", copy=True), p.grad.detach().clone() if p.grad is not None else None)
                        for p in outside.values()]
        # Every RNG (torch, CUDA, Python, NumPy, generators on the modules and ``rng_objects``) and
        # the Python containers and counters on the modules (host_state.py).
        self.host = HostState(model, rng_objects)
        self.optimizers = [(opt, {p: {k: _to_host(v) for k, v in st.items()} for p, st in opt.state.items()},
                            [{k: copy.deepcopy(v) for k, v in g.items() if k != "params"} for g in opt.param_groups])
                           for opt in optimizers]

    def restore(self, model: nn.Module) -> None:
        with torch.no_grad():
            for k, v in itertools.chain(model.named_parameters(), model.named_buffers()):
                v.copy_(self.tensors[k])
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
        for n, p in model.named_parameters():
            p.grad = self.grads[n]
        with torch.no_grad():
            for p, value, grad in self.outside:
                p.copy_(value)
                p.grad = grad
        changed = self.host.restore()
        if changed:
            log.info("te-gemm: the sweep's steps changed %s; put back", ", ".join(sorted(set(changed))))
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
