#!/usr/bin/env python
"""Where an instrumented step's extra host time goes, on the host-bound TE stack (plain loop).

Each part of an instrumented step is switched on alone, in interleaved blocks of steps, and its
step time compared with clean blocks of the same run (medians; the first steps of a block are
dropped): module hooks (with and without the autograd tag walk), TE GEMM interception (with and
without NVTX), and the whole instrumented step as GemmProfiler runs it (owners by launch order
after a block's first step; hooked on every step; NVTX forced on). Then the wrapper alone, on
operands captured from the job with a no-op GEMM behind it (owners_by_order.py's round-robin
timing: pure Python cost per GEMM), and a cProfile of clean against instrumented steps: the
functions whose own time grew most.

    python benchmarks/instrument_breakdown.py --recipe BF16 --json out.json
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import pstats
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from _timing import median_ci
from undisturbed import HOSTBOUND

from te_gemm_callback import GemmProfiler
from te_gemm_callback.capture.instruments import EventTimer, Nvtx
from te_gemm_callback.capture.recorder import Recorder
from te_gemm_callback.capture.scope import ModuleScope, _probe_next_seq
from te_gemm_callback.capture.te_adapter import TEInterceptor
from te_gemm_callback.demo import DemoLM, next_token_loss


class Part:
    """One instrument, switched on for a block of steps: start(), step() between steps, stop()."""

    def __init__(self, model: torch.nn.Module, name: str) -> None:
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


def hostbound_job(recipe: str) -> tuple[torch.nn.Module, Any]:
    """The host-bound stack in a plain loop with fused AdamW, warmed up: (model, train_step)."""
    torch.manual_seed(0)
    c = HOSTBOUND
    model = DemoLM(c, use_te=True, recipe=recipe).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    batch = torch.randint(0, c.vocab_size, (c.micro_batch_size, c.sequence_length + 1), device="cuda")

    def train_step() -> None:
        next_token_loss(model, batch).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(5):  # TE/cuBLAS initialisation and the FP8 amax history stay out
        train_step()
    torch.cuda.synchronize()
    return model, train_step


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipe", default="BF16")
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--block", type=int, default=8)
    p.add_argument("--json")
    a = p.parse_args()
    model, train_step = hostbound_job(a.recipe)

    # GEMMs and hooked modules per step, as the instrumented step sees them.
    probe = Part(model, "interception")
    probe.start()
    train_step()
    gemms = len(probe.te.recorder.raw)
    probe.stop()
    hooked = len(probe.scope.te_gemm_set)

    times: dict[str, list[float]] = {n: [] for n in PARTS}
    ratios: dict[str, list[float]] = {n: [] for n in PARTS}
    cpu: dict[str, list[float]] = {n: [] for n in PARTS}  # process CPU ms (backward runs on another thread)
    gc_ms: dict[str, list[float]] = {n: [0.0, 0.0] for n in PARTS}  # ms in collections, collections
    current = ["clean"]
    gc_t0 = [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            gc_t0[0] = time.perf_counter()
        else:
            gc_ms[current[0]][0] += (time.perf_counter() - gc_t0[0]) * 1e3
            gc_ms[current[0]][1] += 1

    gc.callbacks.append(on_gc)
    order = list(PARTS)
    rng = random.Random(0)
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
            torch.cuda.synchronize()  # the GPU idles most of a host-bound step: no queue carries over
            current[0] = "clean"
            part.stop()
            ms = [(y - x) * 1e3 for x, y in zip(t[2:], t[3:])]
            times[name] += ms
            cpu[name] += [(y - x) * 1e3 for x, y in zip(c[2:], c[3:])]
            med_round[name] = statistics.median(ms)
        for name in PARTS:
            ratios[name].append(med_round[name] / med_round["clean"])
    gc.callbacks.remove(on_gc)
    clean = statistics.median(times["clean"])
    clean_cpu = statistics.median(cpu["clean"])
    res: dict[str, Any] = {"recipe": a.recipe, "gemms_per_step": gemms, "hooked_modules": hooked,
                           "device": torch.cuda.get_device_name(), "torch": torch.__version__, "parts": {}}
    print(f"breakdown {a.recipe}: {gemms} intercepted GEMMs, {hooked} hooked modules per step; "
          f"clean step {clean:.2f} ms")
    for name in PARTS[1:]:
        m = statistics.median(times[name])
        per = gemms if "interception" in name or "profiler" in name else hooked
        r = statistics.median(ratios[name])
        _, lo, hi = median_ci(ratios[name])
        res["parts"][name] = {"ms": m, "pct_pooled": 100 * (m / clean - 1), "pct": 100 * (r - 1),
                              "pct_per_round": [100 * (x - 1) for x in ratios[name]],
                              "pct_ci95": [100 * (lo - 1), 100 * (hi - 1)],
                              "us_per_call": 1e3 * clean * (r - 1) / per, "gc_ms": gc_ms[name],
                              "process_cpu_ms": statistics.median(cpu[name]),
                              "process_cpu_us_per_call": 1e3 * (statistics.median(cpu[name]) - clean_cpu) / per}
        print(f"breakdown {a.recipe}: {name:28s} {m:7.2f} ms, vs clean of its round {100 * (r - 1):+6.1f}% "
              f"(95% CI {100 * (lo - 1):+.1f}..{100 * (hi - 1):+.1f}) "
              f"{1e3 * clean * (r - 1) / per:6.1f} µs per {'GEMM' if per == gemms else 'hooked module'}; "
              f"gc {gc_ms[name][0]:.1f} ms in {gc_ms[name][1]:.0f} collections; process CPU "
              f"{statistics.median(cpu[name]):.2f} ms vs clean {clean_cpu:.2f} ms: "
              f"{1e3 * (statistics.median(cpu[name]) - clean_cpu) / per:.1f} µs per call")
    print(f"breakdown {a.recipe}: clean gc {gc_ms['clean'][0]:.1f} ms in {gc_ms['clean'][1]:.0f} collections")
    res["clean_ms"] = clean

    from owners_by_order import grab_calls, wrapper_costs  # here: that script imports this one

    res["wrapper_us"] = wrapper_costs(model, grab_calls(train_step))
    print(f"breakdown {a.recipe}: wrapper alone (no-op GEMM behind it): " +
          ", ".join(f"{k} {v:.2f} µs" for k, v in res["wrapper_us"].items()))

    res["cprofile"] = profile_diff(model, train_step)
    for row in res["cprofile"][:25]:
        print(f"cprofile {a.recipe}: {row['us_per_step']:9.1f} µs/step {row['calls_per_step']:6.0f} calls  {row['fn']}")
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(res, indent=1))
    return 0


def profile_diff(model: torch.nn.Module, train_step: Any, steps: int = 10) -> list[dict[str, Any]]:
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
        torch.cuda.synchronize()
        part.stop()
        stats[name] = pstats.Stats(pr).stats  # type: ignore[attr-defined]
    rows = []
    for key, (cc, nc, tt, ct, _) in stats["profiler"].items():
        base = stats["clean"].get(key, (0, 0, 0.0, 0.0, None))
        grew = tt - base[2]
        rows.append({"fn": f"{Path(key[0]).name}:{key[1]}({key[2]})", "us_per_step": 1e6 * grew / steps,
                     "calls_per_step": (nc - base[1]) / steps})
    rows.sort(key=lambda r: -r["us_per_step"])
    return rows[:40]


if __name__ == "__main__":
    sys.exit(main())
