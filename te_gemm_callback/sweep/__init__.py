"""The sweep: the observed speedup of each recipe on the live job. It runs the job's own whole
training steps (forward, backward, the optimizer step) under every recipe, first a capture per
recipe, then alternating rounds with every recipe in each, until every speedup's 95% interval is
within +-2% or the time budget is spent, and then puts the job back bitwise: weights, gradients,
optimizer state, TE's FP8 state and RNG (:mod:`~te_gemm_callback.sweep.engine` runs it,
:mod:`~te_gemm_callback.sweep.state` puts the job back, :mod:`~te_gemm_callback.sweep.intervals` gives the
intervals).
"""

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
