"""The sweep: the observed speedup of each recipe on the live job's own whole training steps, alternated
in rounds, then the job put back bitwise (:mod:`.engine` runs it, :mod:`.state` puts the job back)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from te_gemm_callback.sweep.engine import SweepResult, run_sweep

__all__ = ["SweepResult", "run_sweep"]


def __getattr__(name: str):
    # On demand: the engine needs torch, and the report reads sweep.intervals and sweep.observed without it.
    if name in __all__:
        from te_gemm_callback.sweep import engine
        return getattr(engine, name)
    raise AttributeError(name)
