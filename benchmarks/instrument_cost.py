#!/usr/bin/env python
"""What the capture's instruments cost the host, and where an instrumented step's time goes.

``calls``: µs per hooked module call, per intercepted TE GEMM (with and without NVTX, event pairs,
    hooks on every step), per aten op under the dispatch mode, a clean step's own work, and a
    kernels step against a clean one. Small layers, so the GPU idles and a step's wall time is the
    host's; each figure from steps of one profiler run told apart by their kind, medians over
    repetitions: (instrumented - clean) / calls per step. On a CPU: the first three.
``parts``: each part of an instrumented step (module hooks with and without the autograd tag walk,
    TE interception with and without NVTX, the profiler's instrumented step by launch order, with
    NVTX, hooked on every step) switched on alone for blocks of steps on the host-bound TE stack in
    a plain loop, parts in a shuffled order per round; wall (median over rounds of each block's
    median against the clean block of its round, bootstrap 95% interval) and process CPU per step.
    ``--stand-in``: the same on a CPU with the TE stand-in of the tests. ``--profile``: a cProfile
    of clean against instrumented steps, the functions whose own time grew most.
``wrapper``: the TE wrapper around a no-op GEMM on operands captured from one step of the
    host-bound stack, hooked-step path and by-order path per layout, and the call key per operand
    kind, timed round-robin (medians); and whether the instrumented steps after the first of a
    window ran by launch order.
``sampler``: the NVML clock-sampling thread (on during kernels steps) against no sampler, on a
    host-bound plain torch stack: every 50 ms (the profiler's) and every 5 ms, shuffled blocks.

    python benchmarks/instrument_cost.py calls --layers 32 --reps 3
    python benchmarks/instrument_cost.py parts --recipe BF16
    python benchmarks/instrument_cost.py parts --stand-in --rounds 30    # CPU
    python benchmarks/instrument_cost.py wrapper --recipes BF16,Float8CurrentScaling,DelayedScaling
    python benchmarks/instrument_cost.py sampler --rounds 12
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import gc
import importlib
import json
import logging
import pstats
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _timing import hostbound_job, median_ci, stand_in_job
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from te_gemm_callback import GemmProfiler
from te_gemm_callback.capture.instruments import EventTimer, Nvtx
from te_gemm_callback.capture.recorder import Recorder
from te_gemm_callback.capture.scope import ModuleScope, _probe_next_seq
from te_gemm_callback.capture.te_adapter import TEInterceptor
from te_gemm_callback.precisions import te_available


# --- calls --------------------------------------------------------------------------------------
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
    model = nn.Linear(4, 4)
    prof = GemmProfiler(model, instrumented_steps=0, kernel_steps=0).start()
    t0 = time.perf_counter()
    for _ in range(n):
        prof.step()
    dt = time.perf_counter() - t0
    prof.stop()
    return dt / n * 1e6


def check_calls(a: argparse.Namespace) -> dict[str, Any]:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    res: dict[str, Any] = {"module_hooks": module_hook_cost(a.layers, a.reps, device)}
    print(f"calls: module hooks {res['module_hooks']['us_per_module_call']:.1f} µs per hooked module call "
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
    print(f"calls: dispatch mode {res['dispatch']['us_per_aten_op']:.1f} µs per aten op ({c.ops} ops per step)")
    res["clean_step_us"] = clean_step_cost()
    print(f"calls: clean step {res['clean_step_us']:.1f} µs of profiler work per step")
    if not (device == "cuda" and te_available()[0]):
        print("calls: TE GEMM interception and kernels steps not measured (needs a CUDA GPU with transformer-engine)")
        return res
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
        print(f"calls: TE GEMM interception, {name}: {res['te'][name]['us_per_gemm']:.1f} µs per GEMM "
              "(hooks, where on, included)")
    if a.profile:
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
    k = per_kind_ms(model, step, a.steps, a.reps, instrumented_steps=0, kernel_steps=a.steps // 2)
    res["kernels_step"] = {**k, "pct": 100 * (k["kernels"] / k["clean"] - 1)}
    print(f"calls: kernels step {k['kernels']:.3f} ms vs clean {k['clean']:.3f} ms "
          f"({res['kernels_step']['pct']:+.1f}%)")
    return res


# --- parts --------------------------------------------------------------------------------------
class Part:
    """One instrument, switched on for a block of steps: start(), step() between steps, stop()."""

    def __init__(self, model: nn.Module, name: str) -> None:
        self.model, self.name = model, name
        self.prof: GemmProfiler | None = None
        self.scope = ModuleScope(model, on_error=lambda e: print(f"{name}: hook error {e}"))
        self.te: TEInterceptor | None = None

    def start(self) -> None:
        n = self.name
        if n.startswith("hooks"):
            if n == "hooks, no tag walk":
                self.scope._tag = lambda *a: None  # type: ignore[method-assign]
            if n == "hooks, probe node for seq":  # the sequence number as read before the getter
                probe = torch.zeros((), requires_grad=True)
                self.scope._current_seq = lambda: _probe_next_seq(probe)
            self.scope.attach(self.scope.te_gemm_set)
        elif n.startswith("interception"):
            rec = Recorder(self.scope, EventTimer(False), Nvtx(n.endswith("+ nvtx")))
            self.te = TEInterceptor(rec)
            self.te.install()
            rec.active = True
        elif n.startswith("profiler"):
            self.prof = GemmProfiler(self.model, instrumented_steps="all", dispatch_steps=0, kernel_steps=0,
                                     timing="none", nvtx=n.endswith("+ nvtx") or "auto",
                                     reuse_owners="hooked every step" not in n).start()

    def step(self) -> None:
        if self.prof is not None:
            self.prof.step()
        self.scope.release()
        if self.te is not None:
            self.te.recorder.raw.clear()
            self.te.owners.trace.clear()

    def stop(self) -> None:
        if self.prof is not None:
            self.prof.stop()
            self.prof = None
        if self.te is not None:
            self.te.uninstall()
            self.te = None
        self.scope.detach()


PARTS = ("clean", "hooks", "hooks, probe node for seq", "hooks, no tag walk", "interception",
         "interception + nvtx", "profiler", "profiler + nvtx", "profiler, hooked every step")
STAND_IN_PARTS = ("clean", "hooks", "hooks, no tag walk", "interception", "profiler", "profiler, hooked every step")


def check_parts(a: argparse.Namespace) -> dict[str, Any]:
    if a.stand_in:
        model, train_step = stand_in_job(a.layers)
        parts, label = STAND_IN_PARTS, "stand-in"
        for _ in range(20):
            train_step()
    else:
        model, train_step = hostbound_job(a.recipe)
        parts, label = PARTS, a.recipe
    cuda = torch.cuda.is_available() and not a.stand_in
    # GEMMs and hooked modules per step, as the instrumented step sees them.
    probe = Part(model, "interception")
    probe.start()
    train_step()
    gemms = len(probe.te.recorder.raw)
    probe.stop()
    hooked = len(probe.scope.te_gemm_set)

    times: dict[str, list[float]] = {n: [] for n in parts}
    ratios: dict[str, list[float]] = {n: [] for n in parts}
    cpu: dict[str, list[float]] = {n: [] for n in parts}  # process CPU ms (backward runs on another thread)
    gc_ms: dict[str, list[float]] = {n: [0.0, 0.0] for n in parts}  # ms in collections, collections
    current, gc_t0 = ["clean"], [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            gc_t0[0] = time.perf_counter()
        else:
            gc_ms[current[0]][0] += (time.perf_counter() - gc_t0[0]) * 1e3
            gc_ms[current[0]][1] += 1

    gc.callbacks.append(on_gc)
    order, rng = list(parts), random.Random(0)
    for _ in range(a.rounds):
        rng.shuffle(order)  # a fixed order would put each part at the same point of every round
        med_round = {}
        for name in order:
            part = Part(model, name)
            part.start()
            current[0] = name
            t, c = [time.perf_counter()], [time.process_time()]
            for _ in range(a.block):
                train_step()
                part.step()
                t.append(time.perf_counter())
                c.append(time.process_time())
            if cuda:
                torch.cuda.synchronize()  # the GPU idles most of a host-bound step: no queue carries over
            current[0] = "clean"
            part.stop()
            ms = [(y - x) * 1e3 for x, y in zip(t[2:], t[3:])]  # the first steps of a block carry its start
            times[name] += ms
            cpu[name] += [(y - x) * 1e3 for x, y in zip(c[2:], c[3:])]
            med_round[name] = statistics.median(ms)
        for name in parts:
            ratios[name].append(med_round[name] / med_round["clean"])
    gc.callbacks.remove(on_gc)
    clean, clean_cpu = statistics.median(times["clean"]), statistics.median(cpu["clean"])
    res: dict[str, Any] = {"job": label, "gemms_per_step": gemms, "hooked_modules": hooked, "clean_ms": clean,
                           "clean_process_cpu_ms": clean_cpu, "parts": {}}
    print(f"parts {label}: {gemms} intercepted GEMMs, {hooked} hooked modules per step; clean step {clean:.3f} ms "
          f"wall, {clean_cpu:.3f} ms process CPU")
    for name in parts[1:]:
        m, mc = statistics.median(times[name]), statistics.median(cpu[name])
        per = gemms if "interception" in name or "profiler" in name else hooked
        r = statistics.median(ratios[name])
        _, lo, hi = median_ci(ratios[name])
        res["parts"][name] = {"ms": m, "pct": 100 * (r - 1), "pct_ci95": [100 * (lo - 1), 100 * (hi - 1)],
                              "pct_per_round": [100 * (x - 1) for x in ratios[name]],
                              "us_per_step": 1e3 * clean * (r - 1), "us_per_call": 1e3 * clean * (r - 1) / per,
                              "process_cpu_ms": mc, "gc_ms": gc_ms[name]}
        print(f"parts {label}: {name:28s} {m:7.3f} ms, vs clean of its round {100 * (r - 1):+6.1f}% "
              f"(95% CI {100 * (lo - 1):+.1f}..{100 * (hi - 1):+.1f}), {1e3 * clean * (r - 1):+8.1f} µs per step, "
              f"{1e3 * clean * (r - 1) / per:6.2f} µs per {'GEMM' if per == gemms else 'hooked module'}; "
              f"process CPU {mc:.2f} ms; gc {gc_ms[name][0]:.1f} ms in {gc_ms[name][1]:.0f} collections")
    if a.profile:
        res["cprofile"] = profile_diff(model, train_step, cuda)
        for row in res["cprofile"][:25]:
            print(f"parts {label} cprofile: {row['us_per_step']:9.1f} µs/step {row['calls_per_step']:6.0f} calls  "
                  f"{row['fn']}")
    return res


def profile_diff(model: nn.Module, train_step: Any, cuda: bool, steps: int = 10) -> list[dict[str, Any]]:
    """cProfile ``steps`` clean steps and ``steps`` instrumented ones: functions by growth of own time."""
    stats = {}
    for name in ("clean", "profiler"):
        part = Part(model, name)
        part.start()
        train_step()
        part.step()
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(steps):
            train_step()
            part.step()
        pr.disable()
        if cuda:
            torch.cuda.synchronize()
        part.stop()
        stats[name] = pstats.Stats(pr).stats  # type: ignore[attr-defined]
    rows = []
    for key, (_cc, nc, tt, _ct, _) in stats["profiler"].items():
        base = stats["clean"].get(key, (0, 0, 0.0, 0.0, None))
        rows.append({"fn": f"{Path(key[0]).name}:{key[1]}({key[2]})", "us_per_step": 1e6 * (tt - base[2]) / steps,
                     "calls_per_step": (nc - base[1]) / steps})
    rows.sort(key=lambda r: -r["us_per_step"])
    return rows[:40]


# --- wrapper ------------------------------------------------------------------------------------
class Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage().splitlines()[0])


def window(model: nn.Module, train_step: Any, steps: int, **kw: Any) -> dict[str, Any]:
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
    from te_gemm_callback.capture.te_adapter import patch_te_gemms, unpatch

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
    """Median µs per call of each function, timed round-robin (one block per function reads far
    more: an artefact of the block)."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            fn()  # its first call (a cache miss) stays out
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            times[name].append((time.perf_counter() - t0) / n * 1e6)
    return {k: statistics.median(v) for k, v in times.items()}


def wrapper_costs(model: nn.Module, calls: dict[str, tuple]) -> dict[str, float]:
    from te_gemm_callback.capture.te_adapter import _call_key

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


def check_wrapper(a: argparse.Namespace) -> dict[str, Any]:
    warn = Warnings()
    logging.getLogger("te_gemm_callback").addHandler(warn)
    res: dict[str, Any] = {}
    for recipe in a.recipes.split(","):
        model, train_step = hostbound_job(recipe)
        warn.messages.clear()
        r: dict[str, Any] = {"window": window(model, train_step, 12, instrumented_steps=4),
                             "every step instrumented": window(model, train_step, 8, instrumented_steps="all",
                                                               dispatch_steps=0, kernel_steps=0, timing="none")}
        r["warnings"] = list(warn.messages)
        r["us_per_call"] = wrapper_costs(model, grab_calls(train_step))
        res[recipe] = r
        for k in ("window", "every step instrumented"):
            print(f"wrapper {recipe} {k}: {json.dumps(r[k])}")
        for m in r["warnings"]:
            print(f"wrapper {recipe} warning: {m}")
        for k, v in r["us_per_call"].items():
            print(f"wrapper {recipe} {k}: {v:.2f} µs")
        del model, train_step
    return res


# --- sampler ------------------------------------------------------------------------------------
def check_sampler(a: argparse.Namespace) -> dict[str, Any]:
    from te_gemm_callback.capture.clocks import ClockSampler, nvml_reader

    reader = nvml_reader()
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(256, 256) for _ in range(a.layers)]).cuda()
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
    res: dict[str, Any] = {"nvml_read_us": read_us, "step_ms": statistics.median(ms["none"]), "samplers": {}}
    print(f"sampler: one NVML read (clock + power) {read_us:.1f} µs in the main thread; "
          f"{a.layers} layers, step {res['step_ms']:.2f} ms with no sampler")
    for k in list(kinds)[1:]:
        m, lo, hi = median_ci([100 * (r - 1) for r in ratios[k]])
        res["samplers"][k] = {"step_ms": statistics.median(ms[k]), "pct": m, "pct_ci95": [lo, hi]}
        print(f"sampler: {k}: step {statistics.median(ms[k]):.2f} ms, {m:+.2f}% (95% CI {lo:+.2f}..{hi:+.2f}) "
              f"against no sampler, {a.rounds} rounds")
    return res


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("check", choices=("calls", "parts", "wrapper", "sampler"))
    p.add_argument("--layers", type=int, help="calls: layers of the small stacks (32); parts --stand-in: stand-in "
                   "te.Linear layers (36); sampler: plain torch layers (96)")
    p.add_argument("--reps", type=int, default=7, help="calls: profiler runs per figure")
    p.add_argument("--steps", type=int, default=8, help="calls: steps per profiler run")
    p.add_argument("--recipe", default="BF16", help="parts: the host-bound stack's recipe")
    p.add_argument("--recipes", default="BF16,Float8CurrentScaling", help="wrapper: recipes")
    p.add_argument("--stand-in", action="store_true", help="parts: a CPU with the TE stand-in of the tests")
    p.add_argument("--rounds", type=int, help="parts: rounds of shuffled blocks (12; --stand-in 30); sampler (12)")
    p.add_argument("--block", type=int, help="parts, sampler: steps per block, the first two dropped (parts 8; "
                   "--stand-in and sampler 12)")
    p.add_argument("--profile", action="store_true", help="calls, parts: cProfile the instrumented steps")
    p.add_argument("--json")
    a = p.parse_args()
    cuda = torch.cuda.is_available()
    if a.check in ("wrapper", "sampler") or (a.check == "parts" and not a.stand_in):
        if not cuda or (a.check != "sampler" and not te_available()[0]):
            p.exit(2, f"instrument_cost.py {a.check}: error: needs a CUDA GPU"
                      f"{'' if a.check == 'sampler' else ' with transformer-engine (parts: or --stand-in)'}\n")
    if a.check == "sampler":
        from te_gemm_callback.capture.clocks import nvml_reader

        if nvml_reader() is None:
            p.exit(2, "instrument_cost.py sampler: error: needs NVML (nvidia-ml-py)\n")
    a.layers = a.layers or {"calls": 32, "parts": 36, "sampler": 96}.get(a.check, 32)
    a.rounds = a.rounds or (30 if a.stand_in else 12)
    a.block = a.block or (8 if a.check == "parts" and not a.stand_in else 12)
    fn = {"calls": check_calls, "parts": check_parts, "wrapper": check_wrapper, "sampler": check_sampler}[a.check]
    res = fn(a)
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps({"device": torch.cuda.get_device_name() if cuda else "cpu",
                                            "torch": torch.__version__, "check": a.check, "results": res}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
