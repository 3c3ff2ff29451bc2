#!/usr/bin/env python
"""Does the profiler change what it measures? Three checks, each against a measurement without it.

``fit``: Lightning fits of a model, with GemmProfilerCallback and without, alternating in one
    process (W C W C ... W). An independent timer callback (a CUDA event at every batch start)
    times every step of all fits; each fit's clean steps are compared with the same steps of the
    two fits without the callback around it, and its instrumented steps likewise (medians).
``kernels``: per-GEMM in-job times from the kernels step (kernel records joined by launch order)
    against torch.profiler's kernel times for the same GEMMs, attributed through a torch.profiler
    range per GEMM on separate instrumented steps.
``sweep``: the callback's in-job sweep (observed step speedup per recipe, clean steps) against a
    plain loop of the same module and batch with no profiler at all (forward+backward, as the sweep
    steps are; interleaved blocks per recipe, CUDA events at step boundaries, no sync inside).

    python benchmarks/undisturbed.py fit --model hostbound --recipes BF16,Float8CurrentScaling
    python benchmarks/undisturbed.py kernels --model hostbound --model codonfm
    python benchmarks/undisturbed.py sweep --model hf --recipes BF16,DelayedScaling
    python benchmarks/undisturbed.py sweep --model moe --recipes BF16,DelayedScaling,Float8CurrentScaling
    python benchmarks/undisturbed.py fit --model tiny --reps 1 --recipes BF16      # CPU smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

from _kernel_checks import check_cupti, check_kernels
from _lightning_jobs import StepTimer, build, med, trainer
from _timing import event_times, median_ci

from te_gemm_callback import GemmProfiler, GemmProfilerCallback
from te_gemm_callback.demo import RandomTokens
from te_gemm_callback.precisions import autocast


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
                                            kernel_breakdown=kernels))
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


# --- sweep ----------------------------------------------------------------------------------
def plain_loop(module: pl.LightningModule, batch: Any, recipes: list[str], context: Any, block: int,
               reps: int) -> tuple[dict[str, float], dict[str, float]]:
    """The sweep's own step (grads cleared, forward under the recipe, backward) with no profiler, in
    ``reps`` rounds of one block per recipe (forward then reversed order, as the sweep's rounds):
    (median step per recipe, speedup over the first recipe as the median of the rounds' ratios)."""
    has_recipe = hasattr(module, "recipe")
    original = getattr(module, "recipe", None)
    times: dict[str, list[float]] = {r: [] for r in recipes}
    per_rep: list[dict[str, float]] = []

    def one(recipe: str) -> None:
        for p in module.parameters():
            p.grad = None
        with context() if context is not None else contextlib.nullcontext():
            if has_recipe:
                module.recipe = recipe
                out = module.training_step(batch, 0)
            else:
                with autocast(recipe):
                    out = module.training_step(batch, 0)
        out.backward()

    log = module.log
    module.log = lambda *a, **k: None
    try:
        for r in recipes:  # warm each recipe once, as the sweep does
            for _ in range(2):
                one(r)
        for k in range(reps):
            rep = {}
            for r in (recipes if k % 2 == 0 else recipes[::-1]):
                one(r)  # the switch, untimed (as in the sweep's rounds)
                ts = event_times(lambda: one(r), block)
                times[r] += ts
                rep[r] = statistics.median(ts)
            per_rep.append(rep)
    finally:
        module.log = log
        if has_recipe:
            module.recipe = original
    base = recipes[0]
    return ({r: statistics.median(v) for r, v in times.items()},
            {r: statistics.median(x[base] / x[r] for x in per_rep) for r in recipes})


def check_sweep(model_name: str, recipes: list[str], sweep_steps: int, out: Path, rounds: int = 3,
                kernels: bool = True, sweep_rounds: int = 3) -> dict:
    """Rounds of (a fit whose callback sweeps the recipes, then a plain loop of the same steps), so
    the host's drift over minutes (host-bound steps wandered 41-98 ms on the H200 host) falls on
    both alike; the speedups compared are per round, then the median over rounds. The sweep's
    speedups are the report's (with ``sweep_rounds``, medians of its alternating rounds' ratios);
    the plain loop alternates the recipes in as many rounds."""
    from te_gemm_callback.adapting import sweep_metrics

    torch.manual_seed(0)
    module, c, kw = build(model_name, recipes[0])
    steps = 8
    loader = DataLoader(RandomTokens(c, c.micro_batch_size * steps), batch_size=c.micro_batch_size)
    base = recipes[0]
    per_round: list[dict] = []
    for i in range(rounds):
        cb = GemmProfilerCallback(wait=1, warmup=1, active=5, output_dir=out / f"sweep-{model_name}-{i}",
                                  verbose=False, sweep=recipes, sweep_steps=sweep_steps,
                                  kernel_breakdown=kernels, sweep_rounds=sweep_rounds)
        tr = trainer(steps, [cb], **kw)
        tr.fit(module, loader)
        sweep_ms = {r: cap.step_ms() for r, cap in cb.sweep_result.captures.items()}
        observed = sweep_metrics(cb.sweep_result)
        if torch.cuda.is_available():
            module.cuda()  # Lightning moves the module back to the CPU when the fit ends
        plugin = getattr(tr.strategy, "precision_plugin", None)
        batch = cb._last_batch[0].to(module.device)
        loop_ms, loop_speedup = plain_loop(module, batch, list(sweep_ms), getattr(plugin, "forward_context", None),
                                           block=sweep_steps, reps=max(sweep_rounds, 1))
        per_round.append({"sweep_step_ms": sweep_ms, "plain_loop_step_ms": loop_ms,
                          "speedups": {r: {"sweep": observed.get(f"te_gemm/observed_step_speedup/{r}",
                                                                 sweep_ms[base] / sweep_ms[r]),
                                           "plain_loop": loop_speedup[r]} for r in sweep_ms}})
    res: dict[str, Any] = {"model": model_name, "recipes": recipes, "sweep_rounds": sweep_rounds,
                           "rounds": per_round, "skipped": cb.sweep_result.skipped, "speedups": {}}
    for r in per_round[0]["speedups"]:
        sw = med([x["speedups"][r]["sweep"] for x in per_round if r in x["speedups"]])
        pl_ = med([x["speedups"][r]["plain_loop"] for x in per_round if r in x["speedups"]])
        res["speedups"][r] = {"sweep": sw, "plain_loop": pl_, "pct": 100 * (sw / pl_ - 1),
                              "per_round_pct": [100 * (x["speedups"][r]["sweep"] / x["speedups"][r]["plain_loop"] - 1)
                                                for x in per_round if r in x["speedups"]]}
        m, lo, hi = median_ci(res["speedups"][r]["per_round_pct"])
        res["speedups"][r].update(pct_round_median=m, pct_ci95=[lo, hi])
    res["sweep_step_ms"] = {r: med([x["sweep_step_ms"][r] for x in per_round]) for r in per_round[0]["sweep_step_ms"]}
    res["plain_loop_step_ms"] = {r: med([x["plain_loop_step_ms"][r] for x in per_round])
                                 for r in per_round[0]["plain_loop_step_ms"]}
    return res


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("check", choices=("fit", "interleaved", "kernels", "sweep", "cupti"))
    p.add_argument("--rounds", type=int, default=4, help="kernels, cupti, sweep: interleaved rounds")
    p.add_argument("--blocks", type=int, default=6, help="interleaved: profiled windows (plain blocks around each)")
    p.add_argument("--block", type=int, default=10, help="interleaved: steps per block")
    p.add_argument("--model", action="append", help="hostbound (default), codonfm, hf, moe, tiny")
    p.add_argument("--recipes", default="BF16,Float8CurrentScaling")
    p.add_argument("--reps", type=int, default=3, help="fit: fits with and without the callback, each")
    p.add_argument("--clean", type=int, default=30, help="fit: clean steps per fit")
    p.add_argument("--instrumented", type=int, default=11, help="fit: instrumented steps per fit; interleaved: per window (first: dispatch)")
    p.add_argument("--steps", type=int, default=5, help="kernels: kernels steps; sweep: clean steps per recipe")
    p.add_argument("--sweep-rounds", type=int, default=3, help="sweep: the callback's sweep_rounds (0: none)")
    p.add_argument("--dispatch-steps", type=int, help="interleaved: the profiler's dispatch_steps (default: its own)")
    p.add_argument("--no-kernels", action="store_true",
                   help="fit, sweep: the callback without its kernels step; interleaved: windows without kernels steps "
                        "(do clean steps inherit anything from the kernel-records session before them?)")
    p.add_argument("--out", default="runs/undisturbed")
    p.add_argument("--json")
    a = p.parse_args()
    recipes = a.recipes.split(",")
    out = Path(a.out)
    results = []
    for name in a.model or ["hostbound"]:
        if a.check == "fit":
            for r in recipes:
                res = check_fit(name, r, a.reps, a.clean, a.instrumented, out, kernels=not a.no_kernels)
                results.append(res)
                cl, ins = res["clean"], res["instrumented"]
                pct = lambda x: "-" if x is None else f"{x:+.2f}%"  # noqa: E731
                print(f"fit {name} {r}: clean steps vs the fits around them {pct(cl['pct'])} (per fit "
                      f"{', '.join(map(pct, cl['pct_per_fit']))}; control {pct(cl['control_pct'])}); instrumented "
                      f"{pct(ins['pct'])} (control {pct(ins['control_pct'])}); capture's own step "
                      f"{med(res['capture_step_ms']):.2f} ms; join: {res['kernel_join'][0]}", flush=True)
        elif a.check == "interleaved":
            for r in recipes:
                kw = {} if a.dispatch_steps is None else {"dispatch_steps": a.dispatch_steps}
                if a.no_kernels:
                    kw["kernel_steps"] = 0
                res = check_fit_interleaved(name, r, a.blocks, a.block, a.instrumented, **kw)
                results.append(res)
                pct = lambda x: "-" if x is None else f"{x:+.2f}%"  # noqa: E731
                cl, ins, dis, first = res["clean"], res["instrumented"], res["dispatch"], res["clean-first"]
                ms = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731  (a kind the window lacks)
                ci = lambda x: "" if "pct_ci95" not in x else (  # noqa: E731
                    f" [median of windows {pct(x['pct_window_median'])}, 95% CI {pct(x['pct_ci95'][0])}.."
                    f"{pct(x['pct_ci95'][1])}]")
                print(f"interleaved {name} {r}: clean steps {pct(cl['pct'])}{ci(cl)} against the plain blocks around "
                      f"them (n={cl['steps']}, {ms(cl['with_ms'])} vs {ms(cl['without_ms'])} ms; per window "
                      f"{', '.join(map(pct, cl['pct_per_window']))}); instrumented {pct(ins['pct'])}{ci(ins)} "
                      f"(n={ins['steps']}, {ms(ins['with_ms'])} ms); window's first step with dispatch mode "
                      f"{pct(dis['pct'])}{ci(dis)} (n={dis['steps']}); first clean step (the transition into clean "
                      f"steps; on CUDA the kernel-records session end) {pct(first['pct'])}{ci(first)}; join: {res['kernel_join'][0]}; "
                      f"steps by launch order {sum(len(o['steps']) for o in res['owners_by_launch_order'] if o)}, "
                      f"failed {sum(len(o['failed']) for o in res['owners_by_launch_order'] if o)}", flush=True)
                if "instrumented_vs_window_clean" in res:
                    w = res["instrumented_vs_window_clean"]
                    print(f"interleaved {name} {r}: instrumented against the same window's clean steps "
                          f"{pct(w['pct_window_median'])} (95% CI {pct(w['pct_ci95'][0])}..{pct(w['pct_ci95'][1])})",
                          flush=True)
                cpu = res["cpu"]
                print(f"interleaved {name} {r}: process CPU time per step (all threads), median of windows: clean "
                      f"{pct(cpu['clean'].get('pct_window_median'))}{ci(cpu['clean'])}, {ms(cpu['clean']['with_ms'])} vs "
                      f"{ms(cpu['clean']['without_ms'])} ms; instrumented {pct(cpu['instrumented'].get('pct_window_median'))}"
                      f"{ci(cpu['instrumented'])}; dispatch {pct(cpu['dispatch'].get('pct_window_median'))}", flush=True)
                print(f"interleaved {name} {r}: garbage collector per step, mean ms (steps with a collection): " + ", ".join(
                    f"{k} {v['mean']:.2f} ({v['steps_with_gc']}/{v['steps']})" for k, v in res["gc_ms"].items()), flush=True)
                print(f"interleaved {name} {r}: per position, median of windows: " + ", ".join(
                    f"{p['kind']} {pct(p['pct_window_median'])}" for p in res["per_position"]), flush=True)
        elif a.check == "cupti":
            for r in recipes:
                res = check_cupti(name, r, a.steps, a.rounds)
                results.append(res)
                print(f"cupti {name} {r}: plain steps after each window, median (first 3 steps | later): " + "; ".join(
                    f"{k} {v:.2f} ms ({res['first_steps_median_ms'][k]:.2f} | {res['later_median_ms'][k]:.2f})"
                    for k, v in res["median_ms"].items()), flush=True)
        elif a.check == "kernels":
            for r in recipes:
                res = check_kernels(name, r, a.steps, a.rounds)
                results.append(res)
                print(f"kernels {name} {r}: {res['within_3pct']}/{res['compared']} GEMMs within 3% of torch.profiler "
                      f"(max {res['max_abs_pct']:.2f}%, median ratio {res['median_ratio']:.4f}); GEMM ms/step "
                      f"{res['gemm_ms_per_step']:.3f} vs {res['profiler_gemm_ms_per_step']:.3f}; {res['kernel_join']}",
                      flush=True)
        else:
            res = check_sweep(name, recipes, a.steps, out, rounds=a.rounds, kernels=not a.no_kernels,
                              sweep_rounds=a.sweep_rounds)
            results.append(res)
            for r, s in res["speedups"].items():
                print(f"sweep {name} {r}: sweep {res['sweep_step_ms'][r]:.2f} ms, plain loop "
                      f"{res['plain_loop_step_ms'][r]:.2f} ms; speedup {s['sweep']:.3f}x vs {s['plain_loop']:.3f}x "
                      f"({s['pct']:+.2f}%; median of rounds {s['pct_round_median']:+.2f}%, 95% CI "
                      f"{s['pct_ci95'][0]:+.2f}..{s['pct_ci95'][1]:+.2f}%, rounds "
                      f"{', '.join(f'{x:+.1f}' for x in s['per_round_pct'])})", flush=True)
            for r, why in res["skipped"].items():
                print(f"sweep {name} {r}: skipped: {why}")
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps({"device": torch.cuda.get_device_name() if torch.cuda.is_available()
                                            else "cpu", "torch": torch.__version__, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
