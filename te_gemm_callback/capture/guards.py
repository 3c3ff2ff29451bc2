"""What the profiler puts on the user's model, made safe to leave behind.

- :class:`ForwardGuard`: the root's forward for the capture window: an exception going through it takes every
  instrument off. An instance attribute, not a hook: while an exception unwinds, torch iterates the hook dict.
- :class:`HookFn`: our hook callables; in a deepcopy or pickle of the model they become :class:`Inert`.
Copies of the model never carry anything of ours that works.
"""

from __future__ import annotations

import contextlib
import copy
import sys
from collections.abc import Callable
from typing import Any, cast

from torch import nn

from te_gemm_callback.capture.steady import compiled_forward

PRE, POST = "pre", "post"


def _same(x: Any) -> Any:  # the unpickler's constructor for what we stood in for
    return x


class Inert:
    """Where our hook was, in a copy of the model: a no-op that removes itself when first called."""

    __slots__ = ("kind", "hook_id")

    def __init__(self, kind: str = POST, hook_id: int | None = None) -> None:
        self.kind, self.hook_id = kind, hook_id

    def __call__(self, module: nn.Module, *args: Any) -> None:
        # Safe to remove ourselves except while an exception unwinds: torch then iterates the dict itself.
        if self.hook_id is None or (self.kind == POST and sys.exc_info()[0] is not None):
            return None
        names = ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs") if self.kind == PRE else \
            ("_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called")
        for name in names:
            getattr(module, name).pop(self.hook_id, None)
        return None

    def __reduce__(self) -> tuple:
        return Inert, (self.kind, self.hook_id)


class HookFn:
    """Base of a hook callable of ours (``kind``: PRE or POST): deep copies and pickles are :class:`Inert`."""

    __slots__ = ("hook_id",)
    kind = POST
    hook_id: int  # set by register()

    def __reduce__(self) -> tuple:
        return Inert, (self.kind, getattr(self, "hook_id", None))


def register(module: nn.Module, hook: HookFn, **kwargs: Any) -> Any:
    """Register ``hook`` (pre- or post-hook by its kind) and keep its id, for a copy's :class:`Inert`."""
    add = module.register_forward_pre_hook if hook.kind == PRE else module.register_forward_hook
    handle = add(cast(Callable[..., Any], hook), **kwargs)  # every HookFn subclass defines __call__
    hook.hook_id = handle.id
    return handle


class StandIn:
    """A bound method of ours stored on a module: a copy or pickle of the module gets ``fn``, what was there before."""

    __slots__ = ("fn",)

    def __deepcopy__(self, memo: dict) -> Any:
        return copy.deepcopy(self.fn, memo)

    def __reduce__(self) -> tuple:
        return _same, (self.fn,)

    @property
    def __wrapped__(self) -> Any:
        # inspect.signature() follows it: the Trainer picks columns by forward's signature.
        return self.fn

    def __getattr__(self, name: str) -> Any:
        if name == "fn":  # not set yet: no recursion
            raise AttributeError(name)
        return getattr(self.fn, name)  # __self__, __name__, ... of the method we stand for


class ForwardGuard(StandIn):
    """``model.forward`` for the capture window: an exception through it calls ``on_raise`` before it goes on up."""

    __slots__ = ("on_raise", "model", "had", "had_replicate", "live")

    def __init__(self, model: nn.Module, on_raise: Callable[[BaseException], None]) -> None:
        self.model, self.on_raise, self.live = model, on_raise, True
        self.had = model.__dict__.get("forward")  # an instance attribute someone set before us
        self.had_replicate = model.__dict__.get("_replicate_for_data_parallel")
        self.fn = model.forward

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self.fn(*args, **kwargs)
        except BaseException as err:
            if self.live:
                self.live = False
                with contextlib.suppress(Exception):  # taking ours off must never change the job's exception
                    self.on_raise(err)
            raise

    @classmethod
    def install(cls, model: nn.Module, on_raise: Callable[[BaseException], None]) -> ForwardGuard | None:
        """The guard on ``model``, or None for a ``torch.compile``d root (dynamo guards on its forward)."""
        if type(model).__name__ == "OptimizedModule" or model.__dict__.get("_compiled_call_impl") is not None \
                or compiled_forward(model):
            return None
        guard = cls(model, on_raise)
        model.__dict__["forward"] = guard  # the instance attribute Module._call_impl reads
        model.__dict__["_replicate_for_data_parallel"] = _Replicate(model, guard)
        return guard

    def remove(self) -> None:
        """Put back what was there, or take ours out of a later guard's chain."""
        self.live = False
        d = self.model.__dict__
        if d.get("forward") is not self:
            _unlink(d.get("forward"), self)  # another guard went on after us and is still on
        _restore(d, self)


def _unlink(top: Any, guard: ForwardGuard) -> None:
    """Take ``guard`` out of a chain of guards (profilers stopped out of order): the one above takes over from it."""
    cur = top
    while isinstance(cur, ForwardGuard):
        if cur.fn is guard:
            cur.fn, cur.had = guard.fn, guard.had
            if isinstance(cur.had_replicate, _Replicate) and cur.had_replicate.guard is guard:
                cur.had_replicate = guard.had_replicate
            return
        cur = cur.fn


def _restore(d: dict, guard: ForwardGuard) -> None:
    """Put back in a module's ``__dict__`` what the guard's two attributes replaced."""
    if d.get("forward") is guard:
        if guard.had is None:
            del d["forward"]
        else:
            d["forward"] = guard.had
    rep = d.get("_replicate_for_data_parallel")
    if isinstance(rep, _Replicate) and rep.guard is guard:
        if guard.had_replicate is None:
            del d["_replicate_for_data_parallel"]
        else:
            d["_replicate_for_data_parallel"] = guard.had_replicate


class _Replicate(StandIn):
    """``nn.DataParallel`` copies the root's ``__dict__`` into each replica: this takes our guards off it."""

    __slots__ = ("guard",)

    def __init__(self, model: nn.Module, guard: ForwardGuard) -> None:
        self.fn, self.guard = type(model)._replicate_for_data_parallel.__get__(model), guard

    def __call__(self) -> nn.Module:
        replica = self.fn()
        d = replica.__dict__
        _restore(d, self.guard)
        while isinstance(d.get("forward"), ForwardGuard):  # profilers nested on one model: every guard off
            _restore(d, d["forward"])
        return replica
