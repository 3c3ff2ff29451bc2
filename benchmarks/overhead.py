#!/usr/bin/env python
"""Step-time overhead of capturing, side by side in one run (the bar: <= 1%).

Alternates blocks of steps without a profiler and with one (TE GEMM interception, module hooks,
a CUDA-event pair and an NVTX range per GEMM; no dispatch mode, which only runs on the first
shape-discovery step), so clock drift and thermal state hit both alike. Each step is timed with its
own CUDA-event pair; the synchronize that reads it back happens after the step's end event, so it
is never inside a measured step. Also reports the cost of one shape-discovery (dispatch) step, and
checks that no hook or wrapper is left once capture stops.

    python benchmarks/overhead.py --layers 4 --reps 6 --block 5 --recipes BF16,DelayedScaling
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

from te_gemm_callback import GemmProfiler  # noqa: E402
from te_gemm_callback.models import DemoConfig, codonfm, stack_input, te_stack, train_step_fn  # noqa: E402


def timed(step) -> float:
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    step()
    e.record()
    e.synchronize()  # after the end event: not part of the measured step
    return s.elapsed_time(e)


def hooks_left(model) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks) for m in model.modules())


def te_wrapped() -> bool:
    import transformer_engine.pytorch.module.linear as lin
    return hasattr(lin.general_gemm, "__te_gemm_wrapped__")


def run(recipe: str, c: DemoConfig, reps: int, block: int) -> dict:
    torch.manual_seed(0)
    model = te_stack(c)
    step = train_step_fn(model, stack_input(c), recipe)
    for _ in range(5):
        step()
    off, on = [], []
    for _ in range(reps):
        off += [timed(step) for _ in range(block)]
        prof = GemmProfiler(model, dispatch_steps=0).start()
        for _ in range(block):
            on.append(timed(step))
            prof.step()
        prof.stop()
    # One shape-discovery step (TorchDispatchMode on) against plain steps.
    prof = GemmProfiler(model, dispatch_steps=1).start()
    dispatch_ms = timed(step)
    prof.stop()
    m_off, m_on = statistics.median(off), statistics.median(on)
    return {
        "recipe": recipe, "steps_each": len(off), "median_ms_without": m_off, "median_ms_with": m_on,
        "overhead_pct": 100 * (m_on / m_off - 1),
        "iqr_ms_without": statistics.quantiles(off, n=4)[2] - statistics.quantiles(off, n=4)[0],
        "iqr_ms_with": statistics.quantiles(on, n=4)[2] - statistics.quantiles(on, n=4)[0],
        "dispatch_step_ms": dispatch_ms, "dispatch_step_overhead_pct": 100 * (dispatch_ms / m_off - 1),
        "hooks_left": hooks_left(model), "te_gemm_still_wrapped": te_wrapped(),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--reps", type=int, default=6)
    p.add_argument("--block", type=int, default=5)
    p.add_argument("--recipes", default="BF16,DelayedScaling")
    p.add_argument("--json")
    a = p.parse_args()
    c = codonfm(a.layers)
    out = []
    for recipe in a.recipes.split(","):
        r = run(recipe, c, a.reps, a.block)
        out.append(r)
        print(f"{recipe:22s} without {r['median_ms_without']:.2f} ms  with {r['median_ms_with']:.2f} ms  "
              f"overhead {r['overhead_pct']:+.2f}% (n={r['steps_each']} each, IQR {r['iqr_ms_without']:.2f}/"
              f"{r['iqr_ms_with']:.2f} ms) | dispatch step {r['dispatch_step_ms']:.2f} ms "
              f"({r['dispatch_step_overhead_pct']:+.1f}%) | hooks left {r['hooks_left']}, "
              f"wrapper left {r['te_gemm_still_wrapped']}")
    if a.json:
        Path(a.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "config": c.__dict__,
                                            "results": out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
