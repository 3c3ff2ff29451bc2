"""The job's host-side state a sweep step can change, put back afterwards: every random stream (the
global ones, and each generator on the modules or the named objects, e.g. a DataLoader) and the Python
state on the model's modules (a ``training_step`` that counts its calls would carry the sweep's steps into
the job's metrics). Containers get their contents back in the same objects (the job may hold a reference);
what is too large to copy is named before the sweep runs. TE's modules are left to state.py."""

from __future__ import annotations

import functools
import logging
import random
import sys
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

# TE module attributes that hold one recipe's quantization state (TransformerEngineBaseModule; te.ops
# BasicOperation), and the flags that tell TE whether that state is set up for the current recipe.
_STATE_DICTS = ("fp8_meta", "quantizers", "_fp8_workspaces")
_STATE_OBJECTS = ("_fp8_metas", "_quantizers")
_STATE_FLAGS = ("fp8_initialized", "fp8_meta_tensors_initialized", "fp8", "fp8_calibration", "fp8_parameters")
_TE_STATE = frozenset(_STATE_DICTS + _STATE_OBJECTS + _STATE_FLAGS)  # RecipeStates puts these back
# torch's own bookkeeping on every module (parameters, buffers, hooks): never copied or put back.
_MODULE_OWN = frozenset(k for k in vars(nn.Module()) if k.startswith("_"))
_SCALARS = (bool, int, float, str, type(None))
_CONTAINERS = (list, dict, set, deque)
MAX_NODES = 200_000  # container entries copied per attribute: beyond, it is named, not copied
MAX_TENSOR = 2**22  # elements of a tensor attribute copied: beyond, it is named, not copied
MAX_DEPTH = 6  # containers nested deeper are kept by reference
STREAM_DEPTH = 4  # attributes followed from a named object to its random streams
log = logging.getLogger("te_gemm_callback")


class _TooBig(Exception):
    pass


def _snap(v: Any, budget: list[int], depth: int = 0) -> Any:
    """A node of the copy: ("c", container, children), ("t", tensor, values) or ("v", value) by reference."""
    if isinstance(v, torch.Tensor) and not isinstance(v, nn.Parameter):
        if v.numel() > MAX_TENSOR:
            raise _TooBig
        return ("t", v, v.detach().clone())
    if not isinstance(v, (*_CONTAINERS, tuple)) or depth > MAX_DEPTH:
        return ("v", v)
    budget[0] -= len(v)
    if budget[0] < 0:
        raise _TooBig
    if isinstance(v, dict):
        return ("c", v, [(k, _snap(x, budget, depth + 1)) for k, x in v.items()])
    if isinstance(v, set):
        return ("c", v, list(v))
    return ("c", v, [_snap(x, budget, depth + 1) for x in v])


def _put(node: Any) -> Any:
    if node[0] == "v":
        return node[1]
    if node[0] == "t":
        t, values = node[1], node[2]
        if t.shape == values.shape and t.dtype == values.dtype:
            with torch.no_grad():
                t.copy_(values)
        return t
    obj, children = node[1], node[2]
    if isinstance(obj, dict):
        obj.clear()
        obj.update((k, _put(c)) for k, c in children)
    elif isinstance(obj, set):
        obj.clear()
        obj.update(children)
    elif isinstance(obj, list):
        obj[:] = [_put(c) for c in children]
    elif isinstance(obj, deque):
        obj.clear()
        obj.extend(_put(c) for c in children)
    else:  # a tuple: its own items cannot change, their contents can
        for c in children:
            _put(c)
    return obj


def _differs(node: Any) -> bool:
    """Whether the live object departs from the copy (its items by identity, a tensor's values)."""
    if node[0] == "v":
        return False
    if node[0] == "t":
        t, values = node[1], node[2]
        return t.shape != values.shape or not torch.equal(t.detach(), values)
    obj, children = node[1], node[2]
    if isinstance(obj, dict):
        return list(obj) != [k for k, _ in children] or any(obj[k] is not c[1] or _differs(c) for k, c in children)
    if isinstance(obj, set):
        return obj != set(children)
    return len(obj) != len(children) or any(x is not c[1] or _differs(c) for x, c in zip(obj, children))


def _is_stream(obj: Any) -> bool:
    np = sys.modules.get("numpy")
    return isinstance(obj, (torch.Generator, random.Random)) or (
        np is not None and isinstance(obj, (np.random.Generator, np.random.RandomState)))


def _stream(obj: Any) -> tuple[Callable[[Any], Any], Any] | None:
    """(how to put it back, its state) of a random stream; None for anything else, or a stream without a
    state (``random.SystemRandom`` reads the OS)."""
    np = sys.modules.get("numpy")
    try:
        if isinstance(obj, torch.Generator) or (np is not None and isinstance(obj, np.random.RandomState)):
            return obj.set_state, obj.get_state()
        if isinstance(obj, random.Random):
            return obj.setstate, obj.getstate()
        if np is not None and isinstance(obj, np.random.Generator):
            return functools.partial(setattr, obj.bit_generator, "state"), obj.bit_generator.state
    except NotImplementedError:
        return None
    return None


def _streams(objs: Iterable[Any]) -> list[tuple[Callable[[Any], Any], Any]]:
    """Every random stream an attribute of ``objs`` holds, down to STREAM_DEPTH attributes deep (the
    HF Trainer's loader's base loader's collate_fn's data collator's generator)."""
    out: dict[int, tuple[Callable[[Any], Any], Any]] = {}
    seen: set[int] = set()

    def visit(obj: Any, depth: int) -> None:
        if _is_stream(obj):
            if (got := _stream(obj)) is not None:
                out.setdefault(id(obj), got)
        elif obj is not None and id(obj) not in seen and hasattr(obj, "__dict__"):  # not a builtin
            seen.add(id(obj))
            for v in list(vars(obj).values()):
                if _is_stream(v) or (depth < STREAM_DEPTH
                                     and not isinstance(v, (torch.Tensor, *_SCALARS, *_CONTAINERS))):
                    visit(v, depth + 1)

    for o in objs:
        visit(o, 0)
    return list(out.values())


class HostState:
    """``HostState(model, extra=(loader,))`` copies; ``.restore()`` puts it back and returns what changed."""

    def __init__(self, model: nn.Module, extra: Iterable[Any] = ()) -> None:
        # (how to put a stream back, its state): torch's, CUDA's, Python's, NumPy's (if loaded), the generators.
        self.rngs: list[tuple[Any, Any]] = [(torch.set_rng_state, torch.get_rng_state())]
        if torch.cuda.is_available():
            self.rngs.append((torch.cuda.set_rng_state_all, torch.cuda.get_rng_state_all()))
        self.rngs.append((random.setstate, random.getstate()))
        np = sys.modules.get("numpy")
        if np is not None:
            self.rngs.append((np.random.set_state, np.random.get_state()))
        self.rngs += _streams([*model.modules(), *extra])
        self.attrs: dict[int, tuple[Any, str, dict[str, Any]]] = {}
        self.not_copied: list[str] = []
        for m in model.modules():
            if type(m).__module__.startswith("transformer_engine"):
                continue  # TE's recipe state: RecipeStates and the modules' extra state put it back
            self._keep(m, type(m).__name__)
        if self.not_copied:  # said before the sweep runs: what it may change and cannot put back
            log.warning("te-gemm: too large to copy before the sweep, so not put back after it: %s",
                        ", ".join(self.not_copied[:8]) + (" ..." if len(self.not_copied) > 8 else ""))

    def _keep(self, obj: Any, label: str, depth: int = 0) -> None:
        """Copy ``obj``'s scalars, containers, non-parameter tensors, and one level down a plain object's."""
        if id(obj) in self.attrs:
            return
        saved: dict[str, Any] = {}
        self.attrs[id(obj)] = (obj, label, saved)
        torch_own = type(obj).__module__.split(".")[0] == "torch"
        for k, v in list(vars(obj).items()):
            # A private name is the job's too (a metric's _update_count), except on torch's own classes.
            if k in _MODULE_OWN or k in _TE_STATE or (torch_own and k.startswith("_")) or \
                    isinstance(v, (nn.Module, nn.Parameter)):
                continue  # torch's own bookkeeping, submodules and parameters: not ours here
            if isinstance(v, _SCALARS):
                saved[k] = v
            elif isinstance(v, (*_CONTAINERS, tuple, torch.Tensor)):
                try:
                    saved[k] = _snap(v, [MAX_NODES])
                except _TooBig:
                    self.not_copied.append(f"{label}.{k}")
            elif depth == 0 and _plain_object(v):
                self._keep(v, f"{label}.{k}", depth=depth + 1)

    def restore(self) -> list[str]:
        for put_back, state in self.rngs:
            put_back(state)
        changed = []
        for obj, label, saved in self.attrs.values():
            now = vars(obj)
            # A public name the sweep's steps added goes; a private one may be a library's lazy cache: it stays.
            for k in [k for k in now if not k.startswith("_") and k not in saved and k not in _TE_STATE
                      and isinstance(now[k], (*_SCALARS, *_CONTAINERS))]:
                del now[k]
                changed.append(f"{label}.{k}")
            for k, v in saved.items():
                if isinstance(v, tuple) and v and v[0] in ("c", "t"):
                    if now.get(k) is not v[1] or _differs(v):
                        changed.append(f"{label}.{k}")
                    now[k] = _put(v)
                elif not _same(now.get(k, _MISSING), v):
                    changed.append(f"{label}.{k}")
                    now[k] = v
        return changed


_MISSING = object()


def _plain_object(v: Any) -> bool:
    """An object of the job's own whose attributes a step may change (a metrics tracker), not a library's."""
    mod = type(v).__module__ or ""
    return hasattr(v, "__dict__") and not isinstance(v, (type, torch.Generator)) and not callable(v) and \
        not mod.startswith(("torch", "pytorch_lightning", "lightning", "builtins", "logging", "numpy", "transformers",
                            "accelerate", "collections", "functools", "transformer_engine", "tensorboard", "wandb",
                            "mlflow", "rich", "tqdm", "te_gemm_callback"))


def _same(a: Any, b: Any) -> bool:
    """Equal, without asking a tensor inside for its truth."""
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:  # a tensor's == is a tensor: not the same value we saved
        return False
