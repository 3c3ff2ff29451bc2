"""CUDA graphs: modules whose forward ``make_graphed_callables`` replaced with a graph replay, which no hook or
interception sees. TE's and torch's both set ``module.forward`` to a closure ``new_fwd`` keeping the original as
``orig_fwd``: instrumented steps run that eagerly; kernels and clean steps replay the graphs, whose GEMM kernels join
the eager step's GEMMs by launch order."""

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
