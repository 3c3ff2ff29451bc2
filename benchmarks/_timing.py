"""Step timing shared by the benchmark scripts."""

from __future__ import annotations

from typing import Any, Callable

import torch


def event_times(step: Callable[[], Any], n: int) -> list[float]:
    """GPU ms of each of ``n`` back-to-back calls of ``step``: a CUDA event at every boundary and no
    sync inside the block (what the profiler's step boundaries read); one sync after the last."""
    evs = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
    evs[0].record()
    for i in range(n):
        step()
        evs[i + 1].record()
    torch.cuda.synchronize()  # after the block's last event: outside every timed step
    return [a.elapsed_time(b) for a, b in zip(evs, evs[1:])]
