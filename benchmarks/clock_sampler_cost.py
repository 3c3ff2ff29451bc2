#!/usr/bin/env python
"""What the NVML clock-sampling thread costs a host-bound step (it runs over instrumented and
kernels steps). A plain torch stack of small layers (thousands of kernel launches per step, no
TE), blocks of steps with no sampler, the profiler's sampler (every 50 ms), and one sampling every
5 ms (the same cost, ten times as often), in shuffled order per round; median of per-round ratios
of each block's median step to the no-sampler block of its round, with a bootstrap 95% interval.

    python benchmarks/clock_sampler_cost.py --rounds 12
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from _timing import median_ci
from te_gemm_callback.clocks import ClockSampler, nvml_reader


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--block", type=int, default=12)
    p.add_argument("--layers", type=int, default=96)
    a = p.parse_args()
    reader = nvml_reader()
    if reader is None or not torch.cuda.is_available():
        p.exit(2, "clock_sampler_cost.py: error: needs a CUDA GPU with NVML (nvidia-ml-py)\n")
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(a.layers)]).cuda()
    x = torch.randn(32, 256, device="cuda")

    def step() -> None:
        model(x).square().mean().backward()

    t0 = time.perf_counter()
    for _ in range(40):
        reader()
    read_us = (time.perf_counter() - t0) / 40 * 1e6
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    kinds = {"none": None, "sampler, 50 ms": 0.05, "sampler, 5 ms": 0.005}
    ratios: dict[str, list[float]] = {k: [] for k in kinds}
    ms: dict[str, list[float]] = {k: [] for k in kinds}
    order, rng = list(kinds), random.Random(0)
    for _ in range(a.rounds):
        rng.shuffle(order)
        med = {}
        for k in order:
            s = ClockSampler(reader, period_s=kinds[k]).__enter__() if kinds[k] else None
            ts = []
            for _ in range(a.block):
                t = time.perf_counter()
                step()
                ts.append((time.perf_counter() - t) * 1e3)
            torch.cuda.synchronize()  # the queue stays out of the next block
            if s is not None:
                s.__exit__(None, None, None)
            med[k] = statistics.median(ts[2:])
            ms[k] += ts[2:]
        for k in kinds:
            ratios[k].append(med[k] / med["none"])
    print(f"clock-sampler: one NVML read (clock + power) {read_us:.1f} µs in the main thread; "
          f"{a.layers} layers, step {statistics.median(ms['none']):.2f} ms with no sampler")
    for k in list(kinds)[1:]:
        m, lo, hi = median_ci([100 * (r - 1) for r in ratios[k]])
        print(f"clock-sampler: {k}: step {statistics.median(ms[k]):.2f} ms, {m:+.2f}% (95% CI {lo:+.2f}..{hi:+.2f}) "
              f"against no sampler, {a.rounds} rounds")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
