#!/usr/bin/env python
"""Does the profiler change what it measures? Each check against a measurement without it.

``fit``: Lightning fits of a model, with GemmProfilerCallback and without, alternating in one
    process (W C W C ... W). An independent timer callback (a CUDA event at every batch start)
    times every step of all fits; each fit's clean steps are compared with the same steps of the
    two fits without the callback around it, and its instrumented steps likewise (medians).
``interleaved``: in one fit, profiled windows (the step plan: docs/step-plan.md) alternate with
    blocks of plain steps; each window's steps against the same positions of the plain blocks on
    either side, the median over windows with a bootstrap 95% interval.
``kernels``: per-GEMM in-job times from the kernels step (kernel records joined by launch order)
    against torch.profiler's kernel times for the same GEMMs, attributed through a torch.profiler
    range per GEMM on separate instrumented steps.
``teardown``: host µs per launch of a tiny kernel before one kernels-only session and at times
    after it (run each variant in a fresh process): torch.profiler as is (``plain``), with
    TEARDOWN_CUPTI=1 unset at the session's end (``restored``), KernelProfile (``ours``), no
    session (``none``: the host's own drift).

    python benchmarks/undisturbed.py interleaved --model hostbound --recipes BF16,Float8CurrentScaling \\
        --blocks 100 --block 6 --instrumented 1
    python benchmarks/undisturbed.py fit --model codonfm --recipes BF16 --reps 2 --clean 10 --instrumented 4
    python benchmarks/undisturbed.py kernels --model hostbound --model codonfm
    python benchmarks/undisturbed.py teardown ours --until 30
    python benchmarks/undisturbed.py interleaved --model tiny --blocks 2 --block 6     # CPU smoke run
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from _timing import HOSTBOUND, med, median_ci
from torch.utils.data import DataLoader

from te_gemm_callback import GemmProfiler, GemmProfilerCallback, capture_steps
from te_gemm_callback.precisions import te_available
from te_gemm_callback.recipes.demo import DemoConfig, DemoLM, HFLlama, RandomTokens
from te_gemm_callback.recipes.models import codonfm

# --- the jobs -------------------------------------------------------------------------------
TINY = DemoConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                  num_hidden_layers=2, vocab_size=64, sequence_length=16, micro_batch_size=2)


class FusedAdamLM(DemoLM):
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-4, fused=self.device.type == "cuda")


class StepTimer(pl.Callback):
    """A CUDA event (host clock on CPU) at every batch start: step i = start i -> start i+1."""

    def __init__(self) -> None:
        self.marks: list[Any] = []
        # Process CPU time (all threads: backward runs on autograd's device thread) at the same
        # boundaries: a host-bound step's cost without the time its threads were not running.
        self.cpu_marks: list[float] = []
        # Host time in Python's garbage collector per step (gc.callbacks), so a step kind that
        # leaves more objects behind shows where its collections fall.
        self.gc_ms: list[float] = []
        self._gc_t0 = 0.0

    def _gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_t0 = time.perf_counter()
        elif self.gc_ms:
            self.gc_ms[-1] += (time.perf_counter() - self._gc_t0) * 1e3

    def on_train_start(self, trainer, pl_module) -> None:
        gc.callbacks.append(self._gc)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._mark()
        self.gc_ms.append(0.0)

    def on_train_end(self, trainer, pl_module) -> None:
        self._mark()  # the last step's end (not a batch start: subclasses act on those)
        if self._gc in gc.callbacks:
            gc.callbacks.remove(self._gc)

    def _mark(self) -> None:
        self.cpu_marks.append(time.process_time())
        if torch.cuda.is_available():
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.marks.append(ev)
        else:
            self.marks.append(time.perf_counter())

    def steps_ms(self) -> list[float]:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            return [a.elapsed_time(b) for a, b in zip(self.marks, self.marks[1:])]
        return [(b - a) * 1e3 for a, b in zip(self.marks, self.marks[1:])]

    def cpu_steps_ms(self) -> list[float]:
        return [(b - a) * 1e3 for a, b in zip(self.cpu_marks, self.cpu_marks[1:])]


def build(name: str, recipe: str) -> tuple[pl.LightningModule, DemoConfig, dict]:
    """(module, data config, Trainer kwargs) of a named model."""
    use_te = torch.cuda.is_available() and te_available()[0]
    if name in ("hostbound", "codonfm", "tiny"):
        c = {"hostbound": HOSTBOUND, "codonfm": codonfm(4), "tiny": TINY}[name]
        return FusedAdamLM(c, use_te=use_te and name != "tiny", recipe=recipe), c, {}
    if name == "hf":
        import transformers

        cfg = transformers.LlamaConfig(hidden_size=2048, intermediate_size=8192, num_attention_heads=32,
                                       num_key_value_heads=8, num_hidden_layers=16, vocab_size=32000)
        c = DemoConfig(vocab_size=32000, sequence_length=2047, micro_batch_size=4)
        return HFLlama(cfg), c, {"precision": "transformer-engine" if use_te else "bf16-mixed"}
    if name == "moe":  # recipes/moe.py's job: 8 experts top-2, hidden 4096, expert intermediate 14336
        from te_gemm_callback.recipes.moe import MoELM

        c = DemoConfig(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                       num_hidden_layers=1, vocab_size=1024, sequence_length=2048, micro_batch_size=2)
        return MoELM(c, 8, 2, use_te, recipe), c, {}
    raise SystemExit(f"unknown model {name!r}: hostbound, codonfm, hf, moe or tiny")


def trainer(steps: int, callbacks: list, **kw: Any) -> pl.Trainer:
    return pl.Trainer(max_steps=steps, accelerator="gpu" if torch.cuda.is_available() else "cpu", devices=1,
                      callbacks=callbacks, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0, **kw)


# --- fit ------------------------------------------------------------------------------------
def check_fit(model_name: str, recipe: str, reps: int, clean: int, instrumented: int, out: Path,
              kernels: bool = True) -> dict:
    wait, warmup = 2, 1
    # kernels: a warm-up step, the kernels step, then the untimed settle step
    active = instrumented + (3 if kernels else 0) + clean
    steps = wait + warmup + active
    torch.manual_seed(0)
    module, c, kw = build(model_name, recipe)
    loader = DataLoader(RandomTokens(c, c.micro_batch_size * steps), batch_size=c.micro_batch_size)
    trainer(3, [], **kw).fit(module, loader)  # first fit of the process: compile, cuBLAS, TE init
    # W C W C ... W: every fit with the callback (C) sits between two fits without it (W), and is
    # compared with their mean, so the host's drift over a run (steps of this job wandered 41-98 ms
    # within one fit on the H200 host) cancels to first order. The control: each inner W against
    # the mean of its own neighbours, the floor this comparison can reach.
    fits: list[tuple[bool, list[float]]] = []
    caps = []
    for i in range(2 * reps + 1):
        on = i % 2 == 1
        timer = StepTimer()
        cbs: list = [timer]
        if on:
            cbs.append(GemmProfilerCallback(wait=wait, warmup=warmup, active=active, instrumented_steps=instrumented,
                                            output_dir=out / f"{model_name}-{recipe}-{i // 2}", verbose=False,
                                            kernel_breakdown=kernels, report=False))
        trainer(steps, cbs, **kw).fit(module, loader)
        fits.append((on, timer.steps_ms()))
        if on:
            caps.append(cbs[1].capture)
    kinds = [s.kind for s in caps[0].steps]
    first = wait + warmup
    idx = {k: [first + i for i, kk in enumerate(kinds) if kk == k] for k in ("instrumented", "clean")}
    disp = {first + s.index for s in caps[0].steps if s.dispatch}
    res: dict[str, Any] = {"model": model_name, "recipe": recipe, "reps": reps, "step_kinds": kinds,
                           "kernels_step": kernels, "series": [{"callback": on, "steps_ms": t} for on, t in fits]}

    def bracketed(i: int, ids: list[int]) -> float | None:
        mid = med([fits[i][1][j] for j in ids])
        sides = [med([fits[n][1][j] for j in ids]) for n in (i - 1, i + 1)]
        return None if mid is None or None in sides else 100 * (mid / (sum(sides) / 2) - 1)

    for k in ("clean", "instrumented"):
        ids = [i for i in idx[k] if i not in disp]
        with_cb = [bracketed(i, ids) for i in range(1, 2 * reps, 2)]
        control = [bracketed(i, ids) for i in range(2, 2 * reps - 1, 2)]
        res[k] = {"steps_per_fit": len(ids), "pct_per_fit": with_cb, "pct": med([x for x in with_cb if x is not None]),
                  "control_pct_per_fit": control, "control_pct": med([x for x in control if x is not None]),
                  "with_callback_ms": med([fits[i][1][j] for i in range(1, 2 * reps, 2) for j in ids]),
                  "without_ms": med([fits[i][1][j] for i in range(0, 2 * reps + 1, 2) for j in ids])}
    res["dispatch_step_ms"] = med([fits[i][1][j] for i in range(1, 2 * reps, 2) for j in sorted(disp)])
    res["capture_step_ms"] = [cap.step_ms() for cap in caps]
    res["capture_instrument_cost"] = [cap.instrument_cost() for cap in caps]
    res["capture_gemm_ms"] = [cap.gemm_ms_per_step() for cap in caps]
    res["kernel_join"] = [cap.meta.get("kernel_join") for cap in caps]
    return res


class Alternating(StepTimer):
    """In one fit, blocks of ``block`` steps alternate between nothing attached and a GemmProfiler
    window (instrumented; kernels warm-up, kernels and settle steps on CUDA; then clean steps), after
    ``start`` steps untouched. Every step is timed by CUDA events (host clock on CPU) recorded
    before the profiler's own transition, so a profiler's start/stop cost falls on a step it
    belongs to (the window's first step, or the first step of the next plain block)."""

    def __init__(self, start: int, block: int, instrumented: int = 1, **profiler_kw: Any) -> None:
        super().__init__()
        self.start, self.block, self.instrumented, self.profiler_kw = start, block, instrumented, profiler_kw
        self.prof: Any = None
        self.caps: list = []
        self.windows: list[int] = []  # global step of each window's first step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        super().on_train_batch_start(trainer, pl_module, batch, batch_idx)
        i = trainer.global_step
        if i < self.start:
            return
        b, j = divmod(i - self.start, self.block)
        if j == 0 and self.prof is not None:
            self.caps.append(self.prof.stop())
            self.prof = None
        if b % 2 == 1:
            if j == 0:
                self.prof = GemmProfiler(pl_module, instrumented_steps=self.instrumented, **self.profiler_kw).start()
                self.windows.append(i)
            else:
                self.prof.step()

    def on_train_end(self, trainer, pl_module) -> None:
        super().on_train_end(trainer, pl_module)
        if self.prof is not None:
            self.caps.append(self.prof.stop())
            self.prof = None


def window_stats(t: list[float], windows: list[int], kinds: list[str], block: int) -> dict[str, Any]:
    """Per step kind of a profiled window: its steps against the plain blocks on either side, as
    pooled medians and as the median over windows of each window's ratio (with a 95% interval);
    and the instrumented steps against the same window's clean steps."""
    res: dict[str, Any] = {}
    for kind in ("clean", "clean-first", "instrumented", "dispatch"):
        pos = [j for j, k in enumerate(kinds) if k == kind]
        # Plain-block steps at the same positions (clean), or all but the first, which carries the
        # previous window's stop (a window's first step carries its start).
        side_pos = pos if kind.startswith("clean") else list(range(1, block))
        ratios, with_cb, without = [], [], []
        for w in windows:
            mid = [t[w + j] for j in pos if w + j < len(t)]
            sides = [t[w + d + j] for d in (-block, block) for j in side_pos if w + d + j < len(t) and j > 0]
            if mid and sides:
                ratios.append(med(mid) / med(sides))
                with_cb += mid
                without += sides
        res[kind] = {"steps": len(with_cb), "with_ms": med(with_cb), "without_ms": med(without),
                     "pct": None if not with_cb else 100 * (med(with_cb) / med(without) - 1),
                     "pct_per_window": [100 * (r - 1) for r in ratios]}
        if ratios:  # drift-free: each window against its own neighbours, then the median over windows
            res[kind]["pct_window_median"], lo, hi = median_ci(res[kind]["pct_per_window"])
            res[kind]["pct_ci95"] = [lo, hi]
    # Instrumented against the clean steps of the same window (seconds apart, no plain block in
    # between): what the instruments cost, without the window-to-block comparison.
    ins = [j for j, k in enumerate(kinds) if k == "instrumented"]
    cln = [j for j, k in enumerate(kinds) if k == "clean"]
    within = [100 * (med([t[w + j] for j in ins]) / med([t[w + j] for j in cln]) - 1)
              for w in windows if ins and cln and w + block <= len(t)]
    if within:
        m, lo, hi = median_ci(within)
        res["instrumented_vs_window_clean"] = {"pct_per_window": within, "pct_window_median": m, "pct_ci95": [lo, hi]}
    return res


def check_fit_interleaved(model_name: str, recipe: str, blocks: int, block: int, instrumented: int = 3,
                          **profiler_kw: Any) -> dict:
    """Clean and instrumented steps against the same positions of the plain blocks on either side
    (one fit, interleaved: the host's drift over the fit falls on both alike). A window's first
    instrumented step also runs the torch dispatch mode and the profiler's start: it is reported
    apart ("dispatch"), the others as "instrumented"."""
    start = 3  # TE/cuBLAS initialisation stays out
    steps = start + (2 * blocks + 1) * block
    torch.manual_seed(0)
    module, c, kw = build(model_name, recipe)
    loader = DataLoader(RandomTokens(c, c.micro_batch_size * steps), batch_size=c.micro_batch_size)
    alt = Alternating(start, block, instrumented, **profiler_kw)
    trainer(steps, [alt], **kw).fit(module, loader)
    t = alt.steps_ms()
    kinds = [s.kind for s in alt.caps[0].steps]
    kinds[0] = "dispatch"
    # The first step with nothing attached (on CUDA the profiler's untimed settle step) follows the
    # end of the kernel-records session (a sync, the records read), which this external timer puts
    # in that step; the profiler's own step boundaries leave it out. It is reported apart
    # ("clean-first"), the clean steps after it as "clean".
    first = "settle" if "settle" in kinds else "clean"
    if first in kinds:
        kinds[kinds.index(first)] = "clean-first"
    res: dict[str, Any] = {"model": model_name, "recipe": recipe, "blocks": blocks, "block": block,
                           "step_kinds": kinds, "steps_ms": t}
    # Every position of a window against the same position of the plain blocks around it.
    res["per_position"] = []
    for j, kind in enumerate(kinds):
        r = [100 * (t[w + j] / med([t[w + d + j] for d in (-block, block) if w + d + j < len(t)]) - 1)
             for w in alt.windows if w + block + j < len(t)]
        m, lo, hi = median_ci(r) if r else (None, None, None)
        res["per_position"].append({"kind": kind, "pct_window_median": m, "pct_ci95": [lo, hi] if r else None})
    res.update(window_stats(t, alt.windows, kinds, block))
    # The same on process CPU time: a host-bound step's cost without the time no thread ran.
    res["cpu"] = window_stats(alt.cpu_steps_ms(), alt.windows, kinds, block)
    # Garbage-collector time per step, by kind (plain: the plain blocks' steps after their first).
    gc_by_kind: dict[str, list[float]] = {"plain": []}
    for w in alt.windows:
        for j, kind in enumerate(kinds):
            if w + j < len(alt.gc_ms):
                gc_by_kind.setdefault(kind, []).append(alt.gc_ms[w + j])
        gc_by_kind["plain"] += [alt.gc_ms[w - block + j] for j in range(1, block) if w - block + j >= 0]
    res["gc_ms"] = {k: {"mean": statistics.fmean(v), "max": max(v), "steps_with_gc": sum(x > 0 for x in v),
                        "steps": len(v)} for k, v in gc_by_kind.items() if v}
    res["profiler_kw"] = profiler_kw
    res["kernel_join"] = [cap.meta.get("kernel_join") for cap in alt.caps]
    res["owners_by_launch_order"] = [cap.meta.get("owners_by_launch_order") for cap in alt.caps]
    return res


# --- kernels ----------------------------------------------------------------------------------
def check_kernels(model_name: str, recipe: str, steps: int, rounds: int = 4) -> dict:
    from te_gemm_callback.capture.instruments import ProfilerRanges, range_name
    from te_gemm_callback.recipes.models import stack_input, te_stack, train_step_fn

    c = {"hostbound": HOSTBOUND, "codonfm": codonfm(4)}[model_name]
    torch.manual_seed(0)
    model = te_stack(c)
    step = train_step_fn(model, stack_input(c), recipe)
    for _ in range(3):  # TE/cuBLAS initialisation and the FP8 amax history stay out
        step()
    from te_gemm_callback.capture.clocks import ClockSampler

    caps, oracle_runs, clocks = [], [], {"ours": [], "profiler": []}
    # The oracle's own torch.profiler sessions must not leave CUPTI attached either: seen on the
    # H200, a KernelProfile session after an oracle session without the teardown got no records.
    os.environ.setdefault("TEARDOWN_CUPTI", "1")
    for _ in range(rounds):  # interleaved rounds: the GPU's clock drifts under its power limit
        with ClockSampler(period_s=0.02) as ck:
            caps.append(capture_steps(model, step, 0, kernel_steps=steps, instrumented_steps=1))
        clocks["ours"].append(ck.summary())
        # Oracle: torch.profiler with a range per GEMM on instrumented steps; a kernel belongs to the
        # range whose GPU-side span holds it (cuBLASLt launches are not tied to a CPU op by CUPTI).
        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with ClockSampler(period_s=0.02) as ck, torch.profiler.profile(activities=acts) as tp:
            p2 = GemmProfiler(model, instrumented_steps="all", timing="none", dispatch_steps=0,
                              nvtx_backend=ProfilerRanges()).start()
            for i in range(steps):
                step()
                if i < steps - 1:
                    p2.step()
            p2.stop()
            torch.cuda.synchronize()
        clocks["profiler"].append(ck.summary())
        oracle_runs.append(tp)
    cap = caps[0]
    for other in caps[1:]:
        by = {r.key(): r for r in other.records}
        for r in cap.records:
            r.times_ms += by[r.key()].times_ms if r.key() in by else []
    oracle: dict[str, list[float]] = {}
    gemm_total = 0.0
    for tp in oracle_runs:
        t, o = _attribute(tp)
        gemm_total += t
        for k, v in o.items():
            oracle.setdefault(k, []).extend(v)
    rows = []
    for r in cap.records:
        name = range_name(r.module, r.gemm, r.op, r.shape.mkn, r.precision, r.recompute)
        ours, ref = r.median_ms, med(oracle.get(name, []))
        rows.append({"gemm": name, "ours_ms": ours, "profiler_ms": ref,
                     "ratio": None if not (ours and ref) else ours / ref})
    ratios = [x["ratio"] for x in rows if x["ratio"] is not None]
    total_ref = gemm_total / len(oracle_runs) / steps
    return {"model": model_name, "recipe": recipe, "kernel_join": cap.meta.get("kernel_join"), "clocks": clocks,
            "records": len(rows), "compared": len(ratios),
            "within_3pct": sum(abs(x - 1) <= 0.03 for x in ratios),
            "max_abs_pct": 100 * max((abs(x - 1) for x in ratios), default=float("nan")),
            "median_ratio": med(ratios), "gemm_ms_per_step": cap.gemm_ms_per_step(),
            "profiler_gemm_ms_per_step": total_ref, "rows": rows}


def _attribute(tp: Any) -> tuple[float, dict[str, list[float]]]:
    """(GEMM kernel µs in the trace, {range name: [ms per range]})."""
    from te_gemm_callback.capture.kernels import is_gemm_kernel

    events = [e for e in tp.events() if "CUDA" in str(getattr(e, "device_type", ""))]
    ranges = [e for e in events if e.name.startswith("te_gemm: ")]
    gemms = sorted((e.time_range.start, e.time_range.end) for e in events
                   if not e.name.startswith("te_gemm: ") and is_gemm_kernel(e.name))
    oracle: dict[str, list[float]] = {}
    for r in ranges:
        us = sum(e - s for s, e in gemms if s >= r.time_range.start - 1 and e <= r.time_range.end + 1)
        oracle.setdefault(r.name[len("te_gemm: "):], []).append(us / 1e3)
    return sum(e - s for s, e in gemms) / 1e3, oracle


# --- teardown --------------------------------------------------------------------------------
def launch_us(n: int = 2000, reps: int = 15) -> float:
    """Median host µs per launch of a tiny CUDA kernel (the host side of every kernel in a step)."""
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


def check_teardown(which: str, until: float) -> dict:
    """Launch cost before one kernels-only session of ``which`` kind and at 0 s .. ``until`` s after it:
    an asynchronous CUPTI teardown shows as a launch cost that falls back over time."""
    from te_gemm_callback.capture.kernel_profile import KernelProfile

    before = launch_us()
    n = 0
    if which == "none":  # the same probes with no session: what idling between probes does alone
        launch_us(200, 1)
    elif which == "ours":
        kp = KernelProfile()
        kp.start()
        launch_us(200, 1)
        n = sum(len(st.kernels) for st in kp.stop() or [])
    else:
        if which == "restored":
            os.environ["TEARDOWN_CUPTI"] = "1"
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            launch_us(200, 1)
        if which == "restored":
            del os.environ["TEARDOWN_CUPTI"]
        n = sum("CUDA" in str(getattr(e, "device_type", "")) for e in prof.events())
    t0 = time.perf_counter()
    timeline = []
    for wait in [w for w in (0.0, 0.2, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0, 120.0) if w <= until]:
        time.sleep(max(0.0, t0 + wait - time.perf_counter()))
        timeline.append((time.perf_counter() - t0, launch_us(1000, 5)))
    return {"session": which, "before_us": before, "after_us": timeline, "kernels_recorded": n,
            "teardown_cupti": os.environ.get("TEARDOWN_CUPTI")}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("check", choices=("fit", "interleaved", "kernels", "teardown"))
    p.add_argument("session", nargs="?", default="ours", choices=("ours", "plain", "restored", "none"),
                   help="teardown: the kind of kernels-only session (one per process)")
    p.add_argument("--until", type=float, default=8.0, help="teardown: last probe, seconds after the session")
    p.add_argument("--rounds", type=int, default=4, help="kernels: interleaved rounds")
    p.add_argument("--blocks", type=int, default=6, help="interleaved: profiled windows (plain blocks around each)")
    p.add_argument("--block", type=int, default=10, help="interleaved: steps per block")
    p.add_argument("--model", action="append", help="hostbound (default), codonfm, hf, moe, tiny")
    p.add_argument("--recipes", default="BF16,Float8CurrentScaling")
    p.add_argument("--reps", type=int, default=3, help="fit: fits with and without the callback, each")
    p.add_argument("--clean", type=int, default=30, help="fit: clean steps per fit")
    p.add_argument("--instrumented", type=int, default=11,
                   help="fit: instrumented steps per fit; interleaved: per window (the first: dispatch)")
    p.add_argument("--steps", type=int, default=5, help="kernels: kernels steps")
    p.add_argument("--dispatch-steps", type=int, help="interleaved: the profiler's dispatch_steps (default: its own)")
    p.add_argument("--no-kernels", action="store_true",
                   help="fit: the callback without its kernels step; interleaved: windows without kernels steps "
                        "(do clean steps inherit anything from the kernel-records session before them?)")
    p.add_argument("--out", default="runs/undisturbed")
    p.add_argument("--json")
    a = p.parse_args()
    recipes = a.recipes.split(",")
    out = Path(a.out)
    results = []
    pct = lambda x: "-" if x is None else f"{x:+.2f}%"  # noqa: E731
    ms = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731  (a kind the window lacks)
    ci = lambda x: "" if "pct_ci95" not in x else (  # noqa: E731
        f" [median of windows {pct(x['pct_window_median'])}, 95% CI {pct(x['pct_ci95'][0])}..{pct(x['pct_ci95'][1])}]")
    if a.check == "teardown":
        if not torch.cuda.is_available():
            p.exit(2, "undisturbed.py teardown: error: needs a CUDA GPU\n")
        res = check_teardown(a.session, a.until)
        results.append(res)
        after = ", ".join(f"{us:.2f} at {t:.2f} s" for t, us in res["after_us"])
        print(f"teardown {a.session}: host µs per launch {res['before_us']:.2f} before; after the session: {after} "
              f"({res['kernels_recorded']} kernels recorded; TEARDOWN_CUPTI now {res['teardown_cupti']!r})")
    for name in (a.model or ["hostbound"]) if a.check != "teardown" else []:
        for r in recipes:
            if a.check == "fit":
                res = check_fit(name, r, a.reps, a.clean, a.instrumented, out, kernels=not a.no_kernels)
                results.append(res)
                cl, ins = res["clean"], res["instrumented"]
                print(f"fit {name} {r}: clean steps vs the fits around them {pct(cl['pct'])} (per fit "
                      f"{', '.join(map(pct, cl['pct_per_fit']))}; control {pct(cl['control_pct'])}); instrumented "
                      f"{pct(ins['pct'])} (control {pct(ins['control_pct'])}); capture's own step "
                      f"{med(res['capture_step_ms']):.2f} ms; join: {res['kernel_join'][0]}", flush=True)
            elif a.check == "interleaved":
                kw = {} if a.dispatch_steps is None else {"dispatch_steps": a.dispatch_steps}
                if a.no_kernels:
                    kw["kernel_steps"] = 0
                res = check_fit_interleaved(name, r, a.blocks, a.block, a.instrumented, **kw)
                results.append(res)
                print_interleaved(name, r, res, pct, ms, ci)
            else:
                res = check_kernels(name, r, a.steps, a.rounds)
                results.append(res)
                print(f"kernels {name} {r}: {res['within_3pct']}/{res['compared']} GEMMs within 3% of torch.profiler "
                      f"(max {res['max_abs_pct']:.2f}%, median ratio {res['median_ratio']:.4f}); GEMM ms/step "
                      f"{res['gemm_ms_per_step']:.3f} vs {res['profiler_gemm_ms_per_step']:.3f}; {res['kernel_join']}",
                      flush=True)
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps({"device": torch.cuda.get_device_name() if torch.cuda.is_available()
                                            else "cpu", "torch": torch.__version__, "results": results}, indent=1))
    return 0


def print_interleaved(name: str, r: str, res: dict, pct: Any, ms: Any, ci: Any) -> None:
    cl, ins, dis, first = res["clean"], res["instrumented"], res["dispatch"], res["clean-first"]
    order = [o for o in res["owners_by_launch_order"] if o]
    print(f"interleaved {name} {r}: clean steps {pct(cl['pct'])}{ci(cl)} against the plain blocks around "
          f"them (n={cl['steps']}, {ms(cl['with_ms'])} vs {ms(cl['without_ms'])} ms; per window "
          f"{', '.join(map(pct, cl['pct_per_window']))}); instrumented {pct(ins['pct'])}{ci(ins)} "
          f"(n={ins['steps']}, {ms(ins['with_ms'])} ms); window's first step with dispatch mode "
          f"{pct(dis['pct'])}{ci(dis)} (n={dis['steps']}); first clean step (the transition into clean "
          f"steps; on CUDA the kernel-records session end) {pct(first['pct'])}{ci(first)}; "
          f"join: {res['kernel_join'][0]}; steps by launch order {sum(len(o['steps']) for o in order)}, "
          f"failed {sum(len(o['failed']) for o in order)}", flush=True)
    if "instrumented_vs_window_clean" in res:
        w = res["instrumented_vs_window_clean"]
        print(f"interleaved {name} {r}: instrumented against the same window's clean steps "
              f"{pct(w['pct_window_median'])} (95% CI {pct(w['pct_ci95'][0])}..{pct(w['pct_ci95'][1])})", flush=True)
    cpu = res["cpu"]
    print(f"interleaved {name} {r}: process CPU time per step (all threads), median of windows: clean "
          f"{pct(cpu['clean'].get('pct_window_median'))}{ci(cpu['clean'])}, {ms(cpu['clean']['with_ms'])} vs "
          f"{ms(cpu['clean']['without_ms'])} ms; instrumented {pct(cpu['instrumented'].get('pct_window_median'))}"
          f"{ci(cpu['instrumented'])}; dispatch {pct(cpu['dispatch'].get('pct_window_median'))}", flush=True)
    print(f"interleaved {name} {r}: garbage collector per step, mean ms (steps with a collection): " + ", ".join(
        f"{k} {v['mean']:.2f} ({v['steps_with_gc']}/{v['steps']})" for k, v in res["gc_ms"].items()), flush=True)
    print(f"interleaved {name} {r}: per position, median of windows: " + ", ".join(
        f"{p['kind']} {pct(p['pct_window_median'])}" for p in res["per_position"]), flush=True)


if __name__ == "__main__":
    sys.exit(main())
