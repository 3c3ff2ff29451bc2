"""The job's host-side state that a sweep step can change, put back afterwards.

- Every random stream the job can draw from: torch's CPU and CUDA generators, Python's ``random``,
  NumPy's global generator (where NumPy is loaded), and every ``torch.Generator`` reachable from
  the model's modules and from the objects the caller names (a DataLoader, its sampler, a
  datamodule), as Lightning's own ``_collect_rng_states`` covers the first four.
- The Python containers and counters on the model's modules: a ``training_step`` that appends its
  loss to ``self.training_step_outputs`` (Lightning 2's idiom for epoch-end averages) or counts its
  calls would otherwise carry the sweep's steps into the job's metrics. Lists, dicts and sets get
  their contents back in the same object (the job may hold a reference); numbers, strings and
  None are set back. Attributes the sweep added are removed. TE's modules are left to the
  snapshot's TE-state handling (state.py).
"""

from __future__ import annotations

import random
import sys
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

# TE module attributes that hold one recipe's quantization state (TransformerEngineBaseModule:
# fp8_meta, quantizers, the cached FP8 weight workspaces; te.ops BasicOperation: _fp8_metas,
# _quantizers), and the flags that tell TE whether that state is set up for the current recipe.
_STATE_DICTS = ("fp8_meta", "quantizers", "_fp8_workspaces")
_STATE_OBJECTS = ("_fp8_metas", "_quantizers")
_STATE_FLAGS = ("fp8_initialized", "fp8_meta_tensors_initialized", "fp8", "fp8_calibration", "fp8_parameters")
_TE_STATE = frozenset(_STATE_DICTS + _STATE_OBJECTS + _STATE_FLAGS)  # RecipeStates puts these back
_SCALARS = (bool, int, float, str, type(None))
_CONTAINERS = (list, dict, set)


def _generators(objs: Iterable[Any]) -> list[torch.Generator]:
    """Every torch.Generator an attribute of ``objs`` holds (one level down: a loader's sampler)."""
    out: dict[int, torch.Generator] = {}
    seen: set[int] = set()

    def visit(obj: Any, depth: int) -> None:
        if obj is None or id(obj) in seen or depth > 2:
            return
        seen.add(id(obj))
        if isinstance(obj, torch.Generator):
            out[id(obj)] = obj
            return
        try:
            attrs = vars(obj)
        except TypeError:  # no __dict__: a builtin
            return
        for v in list(attrs.values()):
            if isinstance(v, torch.Generator):
                out[id(v)] = v
            elif depth < 2 and not isinstance(v, (torch.Tensor, *_SCALARS, *_CONTAINERS)):
                visit(v, depth + 1)

    for o in objs:
        visit(o, 0)
    return list(out.values())


class HostState:
    """``HostState(model, extra=(loader,))`` copies; ``.restore()`` puts it back; ``.changed``
    names what it found changed and put back (for a line in the log)."""

    def __init__(self, model: nn.Module, extra: Iterable[Any] = ()) -> None:
        self.torch_cpu = torch.get_rng_state()
        self.torch_cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        self.python = random.getstate()
        np = sys.modules.get("numpy")
        self.numpy = np.random.get_state() if np is not None else None
        self.generators = [(g, g.get_state()) for g in _generators([*model.modules(), *extra])]
        self.attrs: dict[int, tuple[nn.Module, dict[str, Any]]] = {}
        for m in model.modules():
            if type(m).__module__.startswith("transformer_engine"):
                continue  # TE's recipe state: RecipeStates and the modules' extra state put it back
            saved = {}
            for k, v in vars(m).items():
                if k.startswith("_") or k in _TE_STATE or isinstance(v, (nn.Module, torch.Tensor)):
                    continue  # torch's own bookkeeping, submodules, parameters and tensors: not ours here
                if isinstance(v, _SCALARS):
                    saved[k] = v
                elif isinstance(v, _CONTAINERS):
                    saved[k] = (v, type(v)(v) if not isinstance(v, dict) else dict(v))
            self.attrs[id(m)] = (m, saved)
        self.changed: list[str] = []

    def restore(self) -> list[str]:
        torch.set_rng_state(self.torch_cpu)
        if self.torch_cuda is not None:
            torch.cuda.set_rng_state_all(self.torch_cuda)
        random.setstate(self.python)
        np = sys.modules.get("numpy")
        if self.numpy is not None and np is not None:
            np.random.set_state(self.numpy)
        for g, state in self.generators:
            g.set_state(state)
        self.changed = []
        for m, saved in self.attrs.values():
            now = vars(m)
            for k in [k for k in now if not k.startswith("_") and k not in saved and k not in _TE_STATE
                      and isinstance(now[k], (*_SCALARS, *_CONTAINERS))]:
                del now[k]  # added by the sweep's steps
                self.changed.append(f"{type(m).__name__}.{k}")
            for k, v in saved.items():
                if isinstance(v, tuple):
                    obj, contents = v
                    if now.get(k) is not obj or not _same(obj, contents):
                        self.changed.append(f"{type(m).__name__}.{k}")
                    if isinstance(obj, list):
                        obj[:] = contents
                    else:
                        obj.clear()
                        obj.update(contents)
                    now[k] = obj
                elif not _same(now.get(k, _MISSING), v):
                    self.changed.append(f"{type(m).__name__}.{k}")
                    now[k] = v
        return self.changed


_MISSING = object()


def _same(a: Any, b: Any) -> bool:
    """Equal, without asking a tensor inside for its truth (identical elements compare equal)."""
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:  # a tensor's == is a tensor: not the same value we saved
        return False
