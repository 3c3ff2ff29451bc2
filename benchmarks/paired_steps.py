#!/usr/bin/env python
"""What an instrumented step after the first costs, step against step: in one profiler session on
the host-bound stack, steps by launch order (TE interception on, no hooks) alternate one for one
with steps that have nothing attached (interception removed, recorder off), in ABBA order, every
step timed by CUDA events (host clock on a CPU). Each pair is milliseconds apart, so the host's
drift over seconds (±10-35% between 12-step blocks on the H200 host) cancels within it: the median
of per-pair ratios, with a bootstrap 95% interval. Step kinds: docs/step-plan.md.

    python benchmarks/paired_steps.py --recipes BF16,Float8CurrentScaling --pairs 150
    python benchmarks/paired_steps.py --stand-in     # a CPU, with the TE stand-in of the tests
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _timing import event_times, hostbound_job, median_ci, stand_in_job

from te_gemm_callback import GemmProfiler


def paired(model: torch.nn.Module, train_step: Callable[[], None], pairs: int) -> dict[str, Any]:
    prof = GemmProfiler(model, instrumented_steps="all", kernel_steps=0, timing="none").start()
    train_step()  # step 0: the dispatch mode and hooks (the reference for launch order)
    prof.step()
    by_order, clean = [], []

    def instrumented() -> None:
        prof.resume()
        if not prof.te.installed:
            prof.te.install()
        by_order.append(event_times(train_step, 1)[0])  # synced after its end event
        prof.step()  # closes the step (its launch order checked) outside the timed region

    def nothing() -> None:
        prof.pause()
        prof.te.uninstall()
        clean.append(event_times(train_step, 1)[0])

    for i in range(pairs):
        for run in ((instrumented, nothing) if i % 2 == 0 else (nothing, instrumented)):
            run()
    prof.resume()
    if not prof.te.installed:
        prof.te.install()
    cap = prof.stop()
    ratios = [100 * (a / b - 1) for a, b in zip(by_order, clean)]
    m, lo, hi = median_ci(ratios)
    order = cap.meta["owners_by_launch_order"]
    return {"pairs": pairs, "by_order_ms": statistics.median(by_order), "clean_ms": statistics.median(clean),
            "pct_pair_median": m, "pct_ci95": [lo, hi], "steps_by_launch_order": len(order["steps"]),
            "failed": len(order["failed"]), "gemms_per_step": sum(r.calls_per_step for r in cap.records)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipes", default="BF16,Float8CurrentScaling")
    p.add_argument("--pairs", type=int, default=150)
    p.add_argument("--stand-in", action="store_true", help="a CPU: the TE stand-in instead of the host-bound stack")
    p.add_argument("--json")
    a = p.parse_args()
    results = {}
    for recipe in (["stand-in"] if a.stand_in else a.recipes.split(",")):
        model, train_step = stand_in_job() if a.stand_in else hostbound_job(recipe)
        res = results[recipe] = paired(model, train_step, a.pairs)
        print(f"paired {recipe}: by launch order {res['by_order_ms']:.2f} ms vs nothing attached "
              f"{res['clean_ms']:.2f} ms per step: {res['pct_pair_median']:+.2f}% (median of {res['pairs']} pairs, "
              f"95% CI "
              f"{res['pct_ci95'][0]:+.2f}..{res['pct_ci95'][1]:+.2f}%); {res['gemms_per_step']:.0f} TE GEMMs per step; "
              f"steps by launch order {res['steps_by_launch_order']}, failed {res['failed']}", flush=True)
        del model, train_step
    if a.json:
        device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
        out = {"device": device, "torch": torch.__version__, "results": results}
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
