#!/usr/bin/env python
"""Host cost of each capture instrument: µs per hooked module call, per intercepted TE GEMM, per
aten op under the dispatch mode, and what a kernels step costs per kernel launch.

Small layers, so the GPU idles and a step's wall time is the host's work. Each figure comes from
steps of one profiler run told apart by their kind (GemmProfiler's StepPlan: instrumented,
kernels, clean), medians over interleaved repetitions: (instrumented - clean) / calls per step.

    python benchmarks/instrument_cost.py --layers 32 --reps 7 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Callable

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from te_gemm_callback import GemmProfiler
from te_gemm_callback.capture.scope import ModuleScope
from te_gemm_callback.precisions import te_available


class _CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def per_kind_ms(model: nn.Module, step: Callable[[], None], steps: int, reps: int, **kw) -> dict[str, float]:
    """Median wall ms of each step kind over ``reps`` profiler runs of ``steps`` steps."""
    out: dict[str, list[float]] = {}
    for _ in range(reps):
        prof = GemmProfiler(model, **kw).start()
        for i in range(steps):
            step()
            if torch.cuda.is_available():
                torch.cuda.synchronize()  # the GPU idles anyway; the host's time is what is measured
            if i < steps - 1:
                prof.step()
        cap = prof.stop()
        for s in cap.steps[1:]:  # the first step of a run pays one-time costs (site tables)
            key = s.kind + (" (dispatch)" if s.dispatch else "")
            out.setdefault(key, []).append(s.wall_ms)
    return {k: statistics.median(v) for k, v in out.items()}


def module_hook_cost(layers: int, reps: int, device: str) -> dict[str, float]:
    """µs per hooked module forward (pre + post hook, with its autograd tag walk)."""
    model = nn.Sequential(*[nn.Linear(16, 16) for _ in range(layers)]).to(device)
    x = torch.randn(8, 16, device=device, requires_grad=True)

    def step() -> None:
        model(x).sum().backward()

    bare, hooked = [], []
    import time

    for _ in range(reps):
        for attach in (False, True):
            scope = ModuleScope(model, on_error=lambda e: None)
            if attach:
                scope.attach()
            step()  # warm
            t0 = time.perf_counter()
            for _ in range(20):
                step()
            if device == "cuda":
                torch.cuda.synchronize()
            (hooked if attach else bare).append((time.perf_counter() - t0) / 20 * 1e3)
            scope.detach()
    calls = layers + 1  # every Linear and the Sequential
    return {"calls_per_step": calls, "bare_ms": statistics.median(bare), "hooked_ms": statistics.median(hooked),
            "us_per_module_call": 1e3 * (statistics.median(hooked) - statistics.median(bare)) / calls}


def clean_step_cost(n: int = 2000) -> float:
    """µs of GemmProfiler.step() between two clean steps: the whole of what a clean step carries
    (two boundary reads, an NVTX push/pop), measured with no work in the step."""
    import time

    model = nn.Linear(4, 4)
    prof = GemmProfiler(model, instrumented_steps=0, kernel_steps=0).start()
    t0 = time.perf_counter()
    for _ in range(n):
        prof.step()
    dt = time.perf_counter() - t0
    prof.stop()
    return dt / n * 1e6


def launch_cost_us(n: int = 2000, reps: int = 15) -> float:
    """Median host µs per launch of a tiny CUDA kernel (the host side of every kernel in a step)."""
    import time

    x = torch.zeros(16, device="cuda")
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            x.add_(1.0)
        out.append((time.perf_counter() - t0) / n * 1e6)
    torch.cuda.synchronize()
    return statistics.median(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--profile", action="store_true", help="cProfile the TE instrumented steps: where the host time goes")
    p.add_argument("--json")
    a = p.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    res = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
           "module_hooks": module_hook_cost(a.layers, a.reps, device)}
    print(f"module hooks: {res['module_hooks']['us_per_module_call']:.1f} µs per hooked module call "
          f"({res['module_hooks']['calls_per_step']} calls per step)")

    # The dispatch mode: µs per aten op of a plain torch model's step.
    model = nn.Sequential(*[nn.Linear(16, 16) for _ in range(a.layers)]).to(device)
    x = torch.randn(8, 16, device=device, requires_grad=True)
    step = lambda: model(x).sum().backward()  # noqa: E731
    with _CountOps() as c:
        step()
    k = per_kind_ms(model, step, a.steps, a.reps, instrumented_steps=3, kernel_steps=0)
    res["dispatch"] = {"aten_ops_per_step": c.ops, **k,
                       "us_per_aten_op": 1e3 * (k["instrumented (dispatch)"] - k["clean"]) / c.ops}
    print(f"dispatch mode: {res['dispatch']['us_per_aten_op']:.1f} µs per aten op ({c.ops} ops per step)")

    res["clean_step_us"] = clean_step_cost()
    print(f"clean step: {res['clean_step_us']:.1f} µs of profiler work per step")
    if device == "cuda":
        from te_gemm_callback.capture.kernel_records import KernelProfile

        before = launch_cost_us()
        kp = KernelProfile()
        kp.start()
        launch_cost_us(200, 1)
        kp.stop()
        after = launch_cost_us()
        res["launch_us"] = {"before_any_kernels_step": before, "after_a_kernels_step": after}
        print(f"host µs per kernel launch: {before:.2f} before any kernels step, {after:.2f} after one")

    if device == "cuda" and te_available()[0]:
        import transformer_engine.pytorch as te

        model = nn.Sequential(*[te.Linear(64, 64, params_dtype=torch.bfloat16) for _ in range(a.layers)]).cuda()
        x = torch.randn(32, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        step = lambda: model(x).float().sum().backward()  # noqa: E731
        gemms = 3 * a.layers
        # Without kernels steps the profiler times every GEMM with events, so the default's
        # instrumented steps (no event pair where kernels steps time the GEMMs) need timing="none".
        variants = {"default (owners by launch order after the first step, NVTX only under a tool)": dict(timing="none"),
                    "hooks on every step": dict(timing="none", reuse_owners=False),
                    "hooks on every step + NVTX": dict(timing="none", reuse_owners=False, nvtx=True),
                    "hooks on every step + NVTX + event pairs": dict(timing="events", reuse_owners=False, nvtx=True)}
        res["te"] = {"gemms_per_step": gemms}
        for name, kw in variants.items():
            k = per_kind_ms(model, step, a.steps, a.reps, instrumented_steps=a.steps, dispatch_steps=0,
                            kernel_steps=0, **kw)
            clean = per_kind_ms(model, step, a.steps, a.reps, instrumented_steps=1, dispatch_steps=0,
                                kernel_steps=0)["clean"]
            res["te"][name] = {"instrumented_ms": k["instrumented"], "clean_ms": clean,
                               "us_per_gemm": 1e3 * (k["instrumented"] - clean) / gemms}
            print(f"TE GEMM interception, {name}: {res['te'][name]['us_per_gemm']:.1f} µs per GEMM "
                  "(hooks, where on, included)")
        if a.profile:
            import cProfile
            import pstats

            prof = GemmProfiler(model, instrumented_steps="all", dispatch_steps=0, kernel_steps=0, timing="none").start()
            step()
            prof.step()
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(10):
                step()
                prof.step()
            pr.disable()
            prof.stop()
            pstats.Stats(pr).sort_stats("tottime").print_stats(30)
            pstats.Stats(pr).sort_stats("cumulative").print_stats(30)
        k = per_kind_ms(model, step, a.steps, a.reps, instrumented_steps=0, kernel_steps=a.steps // 2)
        res["kernels_step"] = {**k, "pct": 100 * (k["kernels"] / k["clean"] - 1)}
        print(f"kernels step: {k['kernels']:.3f} ms vs clean {k['clean']:.3f} ms ({res['kernels_step']['pct']:+.1f}%)")
    else:
        print("TE GEMM interception and kernels steps: not measured (needs a CUDA GPU with transformer-engine)")
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
