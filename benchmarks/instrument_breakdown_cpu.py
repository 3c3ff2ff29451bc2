#!/usr/bin/env python
"""instrument_breakdown.py's question on a CPU: what each part of an instrumented step costs, with
the TE stand-in of tests/test_te_adapter_mock.py (TE's module layout and GEMM call conventions;
Transformer Engine cannot be installed without a GPU). 36 stand-in te.Linear layers of width 16:
the step is all host work.

Parts, each switched on alone in shuffled interleaved blocks against clean blocks of the same
round (median of per-round differences): hooks on the TE modules, the same without the autograd
tag walk, TE interception alone, and instrumented steps as GemmProfiler runs them, with owners by
launch order after the first step ("profiler", the default) and hooked on every step
(``reuse_owners=False``). ``Part`` is instrument_breakdown.py's.

    python benchmarks/instrument_breakdown_cpu.py --rounds 30
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
import types
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import test_te_adapter_mock as stand_in  # noqa: E402


def install_stand_in() -> types.ModuleType:
    gemm = types.ModuleType("transformer_engine.pytorch.cpp_extensions.gemm")
    gemm.general_gemm, gemm.general_grouped_gemm = stand_in._general_gemm, stand_in._general_grouped_gemm
    linear = types.ModuleType("transformer_engine.pytorch.module.linear")
    linear.general_gemm = gemm.general_gemm
    for mod in (types.ModuleType("transformer_engine"), types.ModuleType("transformer_engine.pytorch"), gemm, linear):
        sys.modules[mod.__name__] = mod
    return linear


def stand_in_job(layers: int = 36) -> tuple[nn.Module, Any]:
    """``layers`` stand-in te.Linear of width 16 behind LayerNorms: (model, step); all host work."""
    linear = install_stand_in()
    torch.set_num_threads(1)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin, self.norm = stand_in.make_linear(linear, 16, 16), nn.LayerNorm(16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.lin(self.norm(x))

    model = nn.Sequential(*[Block() for _ in range(layers)])
    x = torch.randn(4, 16, requires_grad=True)

    def step() -> None:
        model(x).sum().backward()

    return model, step


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--layers", type=int, default=36)
    a = p.parse_args()
    from instrument_breakdown import Part  # the parts as the GPU breakdown switches them

    model, step = stand_in_job(a.layers)

    parts = ["clean", "hooks", "hooks, no tag walk", "interception", "profiler", "profiler, hooked every step"]
    for _ in range(20):
        step()
    diffs: dict[str, list[float]] = {n: [] for n in parts}
    rng, order = random.Random(0), list(parts)
    for _ in range(a.rounds):
        rng.shuffle(order)
        med = {}
        for name in order:
            part = Part(model, name)
            part.start()
            ts = []
            for _ in range(12):
                t0 = time.perf_counter()
                step()
                part.step()
                ts.append(time.perf_counter() - t0)
            part.stop()
            med[name] = statistics.median(ts[2:])  # the first steps of a block carry its start
        for name in parts:
            diffs[name].append(med[name] - med["clean"])
    gemms = 3 * a.layers
    print(f"breakdown-cpu: {a.layers} stand-in te.Linear, {gemms} GEMMs per step, torch {torch.__version__}")
    for name in parts[1:]:
        d = statistics.median(diffs[name]) * 1e6
        print(f"breakdown-cpu: {name:28s} +{d:7.1f} µs per step ({d / a.layers:5.2f} µs per module, "
              f"{d / gemms:5.2f} µs per GEMM)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
