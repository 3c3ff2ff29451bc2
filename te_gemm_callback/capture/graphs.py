"""CUDA graphs: modules whose forward ``make_graphed_callables`` replaced with a graph replay.

A replay launches the captured kernels without running any Python of the module, so no hook and
no ``general_gemm`` interception sees its GEMMs. Both ``te.make_graphed_callables`` and
``torch.cuda.make_graphed_callables`` (when given modules) set ``module.forward`` to a closure
``new_fwd`` that replays the graph when the module's training mode is the one it was captured in
and otherwise calls the original forward, which the closure keeps as ``orig_fwd``.

The profiler's instrumented steps run those modules' original forward (eagerly, the same
parameters, FP8 state and autograd): shapes, owners and precisions come from there. Kernels and
clean steps replay the graphs as the job does; the kernels step's GEMM kernels (graph kernels are
in CUPTI's records like any other) join the eager step's GEMMs by launch order.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the report imports in_graphed; the CLI must start without loading torch
    from torch import nn


def graphed_modules(model: nn.Module) -> dict[str, tuple[nn.Module, Callable[..., Any]]]:
    """name -> (module, its eager forward) for each module whose forward is a graph replay."""
    out: dict[str, tuple[nn.Module, Callable[..., Any]]] = {}
    for name, m in model.named_modules():
        fwd = m.__dict__.get("forward")
        if fwd is None or getattr(fwd, "__name__", "") != "new_fwd":
            continue
        try:
            free = inspect.getclosurevars(fwd).nonlocals
        except (TypeError, ValueError):
            continue
        orig = free.get("orig_fwd")
        if callable(orig) and "graphed" in free:
            out[name] = (m, orig)
    return out


class EagerForwards:
    """Swap graphed modules to their eager forward (``enter``) and back (``exit``)."""

    def __init__(self, graphed: dict[str, tuple[nn.Module, Callable[..., Any]]]) -> None:
        self.graphed = graphed
        self._saved: list[tuple[nn.Module, Any]] = []

    @property
    def active(self) -> bool:
        return bool(self._saved)

    def enter(self) -> None:
        if self._saved:
            return
        for m, orig in self.graphed.values():
            self._saved.append((m, m.__dict__["forward"]))
            m.forward = orig  # type: ignore[method-assign]

    def exit(self) -> None:
        saved, self._saved = self._saved, []
        for m, fwd in reversed(saved):
            m.forward = fwd  # type: ignore[method-assign]


def in_graphed(name: str, graphed: list[str]) -> bool:
    """Whether module ``name`` is, or sits inside, one of the ``graphed`` modules."""
    return any(g == "" or name == g or name.startswith(g + ".") for g in graphed)


__all__ = ["graphed_modules", "EagerForwards", "in_graphed"]
