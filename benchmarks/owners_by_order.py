"""Do instrumented steps after the first one really run by launch order, and what does the TE
GEMM wrapper cost per call on each operand kind?

1. A ``GemmProfiler`` window as ``undisturbed.py interleaved`` opens it (4 instrumented steps, the
   first with the dispatch mode, a kernels step, clean steps) and one with every step
   instrumented, on the host-bound stack: which steps ran by launch order, which failed, and
   the profiler's own wall time per step kind.
2. The wrapper around a no-op GEMM on operands captured from one step, hooked-step path and
   by-order path, per layout; and the call key alone per operand (a plain tensor, an
   ``nn.Parameter``, a quantized tensor), in round-robin rounds, medians.

    python benchmarks/owners_by_order.py --recipes BF16,Float8CurrentScaling
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import logging
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from instrument_breakdown import hostbound_job

from te_gemm_callback import GemmProfiler
from te_gemm_callback.capture.instruments import EventTimer, Nvtx
from te_gemm_callback.capture.recorder import Recorder
from te_gemm_callback.capture.scope import ModuleScope
from te_gemm_callback.capture.te_adapter import TEInterceptor, _call_key, patch_te_gemms, unpatch


class Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage().splitlines()[0])


def window(model: torch.nn.Module, train_step: Any, steps: int, **kw: Any) -> dict[str, Any]:
    prof = GemmProfiler(model, **kw).start()
    for i in range(steps):
        train_step()
        if i < steps - 1:
            prof.step()
    cap = prof.stop()
    kinds: dict[str, list[float]] = {}
    for s in cap.steps:
        kinds.setdefault(s.kind + (" (dispatch)" if s.dispatch else ""), []).append(s.wall_ms)
    return {"owners_by_launch_order": cap.meta.get("owners_by_launch_order"),
            "kernel_join": cap.meta.get("kernel_join"),
            "wall_ms_by_kind": {k: statistics.median(v) for k, v in kinds.items()}}


def grab_calls(train_step: Any) -> dict[str, tuple]:
    """The first call of each layout of one step: (args, kwargs)."""
    gm = importlib.import_module("transformer_engine.pytorch.cpp_extensions.gemm")

    calls: dict[str, tuple] = {}
    orig = gm.general_gemm

    @functools.wraps(orig)
    def grab(*args: Any, **kwargs: Any) -> Any:
        calls.setdefault(kwargs.get("layout", args[3] if len(args) > 3 else "TN"), (args, kwargs))
        return orig(*args, **kwargs)

    # The grouped entry point gets a pass-through (the original itself would be marked as wrapped).
    patched = patch_te_gemms(lambda o, g: grab if not g else functools.wraps(o)(lambda *a, **k: o(*a, **k)))
    try:
        train_step()
    finally:
        unpatch(patched)
    return calls


def per_call_us(fns: dict[str, Any], n: int = 4000, rounds: int = 7) -> dict[str, float]:
    """Median µs per call of each function, timed round-robin."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            fn()  # its first call (a cache miss) stays out
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            times[name].append((time.perf_counter() - t0) / n * 1e6)
    return {k: statistics.median(v) for k, v in times.items()}


def wrapper_costs(model: torch.nn.Module, calls: dict[str, tuple]) -> dict[str, float]:
    gm = importlib.import_module("transformer_engine.pytorch.cpp_extensions.gemm")

    rec = Recorder(ModuleScope(model, on_error=print), EventTimer(False), Nvtx(False))
    te = TEInterceptor(rec)
    noop = functools.wraps(gm.general_gemm)(lambda *a, **k: None)
    wrapped = te._wrap(noop, False)
    rec.active = True
    args0, kwargs0 = next(iter(calls.values()))
    fns: dict[str, Any] = {"no-op alone": lambda: noop(*args0, **kwargs0)}
    for layout, (args, kwargs) in calls.items():
        def hooked(args=args, kwargs=kwargs) -> None:
            te.owners.by_order = False
            wrapped(*args, **kwargs)
            if len(rec.raw) > 1000:
                rec.raw.clear()
                te.owners.trace.clear()

        def by_order(args=args, kwargs=kwargs) -> None:
            o = te.owners
            if not o.by_order or o._pos >= len(o.reference):  # a reference of this one call, 1000 long
                o.by_order, o.trace = False, []
                wrapped(*args, **kwargs)
                o.reference, o.trace, o.by_order, o._pos = o.trace * 1000, [], True, 0
            wrapped(*args, **kwargs)
            if len(rec.raw) > 1000:
                rec.raw.clear()

        fns[f"wrapper hooked {layout}"] = hooked
        fns[f"wrapper by order {layout}"] = by_order
        for i, x in enumerate(args[:2]):
            fns[f"call key {layout} operand {i} {type(x).__name__}"] = functools.partial(_call_key, x)
    return per_call_us(fns)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipes", default="BF16,Float8CurrentScaling")
    p.add_argument("--json")
    a = p.parse_args()
    warn = Warnings()
    logging.getLogger("te_gemm_callback").addHandler(warn)
    res: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "recipes": {}}
    for recipe in a.recipes.split(","):
        model, train_step = hostbound_job(recipe)
        r: dict[str, Any] = {}
        warn.messages.clear()
        r["window"] = window(model, train_step, 12, instrumented_steps=4)
        r["every step instrumented"] = window(model, train_step, 8, instrumented_steps="all", dispatch_steps=0,
                                              kernel_steps=0, timing="none")
        r["warnings"] = list(warn.messages)
        r["us_per_call"] = wrapper_costs(model, grab_calls(train_step))
        res["recipes"][recipe] = r
        for k in ("window", "every step instrumented"):
            print(f"owners {recipe} {k}: {json.dumps(r[k])}")
        for m in r["warnings"]:
            print(f"owners {recipe} warning: {m}")
        for k, v in r["us_per_call"].items():
            print(f"owners {recipe} {k}: {v:.2f} µs")
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
