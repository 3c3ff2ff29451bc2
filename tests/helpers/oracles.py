"""Independent oracles: FlopCounterMode, and a TorchDispatchMode + ModuleTracker recorder.

Neither shares code with te_gemm_callback: they are how torch itself counts and attributes GEMMs.
"""

from __future__ import annotations

import collections

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode
from torch.utils.module_tracker import ModuleTracker

aten = torch.ops.aten
MM_OPS = {"mm", "addmm", "bmm", "baddbmm"}


def flop_counter_mm(step_fn) -> tuple[int, dict[str, int]]:
    """(total mm-family FLOPs, per-module mm FLOPs) of one forward+backward, per FlopCounterMode."""
    with FlopCounterMode(display=False) as fc:
        step_fn()
    per_module = {}
    for mod, counts in fc.get_flop_counts().items():
        per_module[mod] = sum(v for op, v in counts.items() if op.__name__.split(".")[0] in MM_OPS)
    return per_module.pop("Global", 0), per_module


class TrackerRecorder(TorchDispatchMode):
    """Forward GEMM shapes per innermost module, as ModuleTracker sees them."""

    def __init__(self):
        super().__init__()
        self.tracker = ModuleTracker()
        self.forward = collections.defaultdict(list)

    def __enter__(self):
        self.tracker.__enter__()
        return super().__enter__()

    def __exit__(self, *a):
        super().__exit__(*a)
        self.tracker.__exit__(*a)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in MM_OPS and not self.tracker.is_bw:
            a, b = (args[1], args[2]) if name in ("addmm", "baddbmm") else (args[0], args[1])
            owner = max(self.tracker.parents, key=lambda p: p.count("."))
            self.forward[owner].append((a.shape[-2], a.shape[-1], b.shape[-1]))
        return func(*args, **(kwargs or {}))
