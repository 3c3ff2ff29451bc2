"""The host's time in each TE module's forward and backward inside the job's own step, for the replay to set beside
the module benchmark's (:func:`~te_gemm_callback.analysis.whatif.module_host`). Read on the settle step by forward
hooks and hooks on the autograd nodes; they change no value."""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger("te_gemm_callback")


def _first_tensor(x: Any) -> torch.Tensor | None:
    if isinstance(x, torch.Tensor):  # the common case, in every timed module's hook: no generator
        return x
    if isinstance(x, (tuple, list)):
        return next((t for t in x if isinstance(t, torch.Tensor)), None)
    return None


def _module_node(node: Any, depth: int = 2) -> Any:
    """The node of the module's own autograd Function (``_LinearBackward``...) behind its output's
    ``node``, past a view or bias add; else ``node``. Its end is the module's backward's end."""
    frontier = [node]
    for _ in range(depth):
        for n in frontier:
            if type(n).__name__.startswith("_") or n.name().startswith("_"):
                return n
        frontier = [f for n in frontier for f, _ in n.next_functions if f is not None]
    return node


class ModuleHostClock:
    """Host µs per forward and backward of each of ``modules`` ({name: module}) while attached;
    :meth:`detach` gives {name: {"fwd": µs, "bwd": µs}}, medians over its calls."""

    def __init__(self, modules: dict[str, Any], clock: Callable[[], float] = time.perf_counter) -> None:
        self.modules, self.clock = modules, clock
        self.times: dict[str, dict[str, list[float]]] = {n: {"fwd": [], "bwd": []} for n in modules}
        self._handles: list[Any] = []
        self._on = False
        self._t0: dict[str, float] = {}
        self._bwd0: dict[str, float] = {}

    def attach(self) -> None:
        for name, mod in self.modules.items():
            self._handles.append(mod.register_forward_pre_hook(self._pre(name)))
            self._handles.append(mod.register_forward_hook(self._post(name)))
        self._on = True

    def detach(self) -> dict[str, dict[str, float]]:
        self._on = False
        for h in self._handles:
            h.remove()
        self._handles.clear()
        return {n: {side: round(statistics.median(v), 2) for side, v in t.items() if v}
                for n, t in self.times.items() if t["fwd"] or t["bwd"]}

    def _pre(self, name: str) -> Callable[..., None]:
        def hook(mod: Any, args: Any) -> None:
            if self._on:
                self._t0[name] = self.clock()
        return hook

    def _post(self, name: str) -> Callable[..., None]:
        def hook(mod: Any, args: Any, out: Any) -> None:
            if not self._on or name not in self._t0:
                return
            try:
                self.times[name]["fwd"].append((self.clock() - self._t0.pop(name)) * 1e6)
                y = _first_tensor(out)
                node = y.grad_fn if y is not None and torch.is_grad_enabled() else None
                if node is None:
                    return  # no backward through this module to time

                def begin(grads: Any) -> None:
                    if self._on:
                        self._bwd0[name] = self.clock()

                def end(grads_in: Any, grads_out: Any) -> None:
                    if self._on and name in self._bwd0:
                        self.times[name]["bwd"].append((self.clock() - self._bwd0.pop(name)) * 1e6)
                node.register_prehook(begin)
                _module_node(node).register_hook(end)
            except Exception as err:  # never the job's failure: this module goes untimed
                log.debug("te-gemm: host clock of %s off: %s", name, err)
        return hook
