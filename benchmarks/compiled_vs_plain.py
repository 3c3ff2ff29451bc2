#!/usr/bin/env python
"""A torch.compile job: the report's predicted and observed step speedups against a plain loop of
the same compiled model, in one run.

A te.TransformerLayer stack under ``torch.compile`` (``--size gpu``: 2 CodonFM-5B layers;
``host``: 12 layers of hidden 1024, the host-bound stack of benchmarks/_timing.py), trained in a
plain loop with AdamW and :class:`GemmSchedule` ``(sweep=<Hopper recipes>)`` attached: the report's
replay prediction and the sweep's observed median with its 95% interval. Then the independent
measurement: one fresh compiled copy per recipe (its own TE state and AdamW), whole steps timed
with CUDA events between step boundaries, recipes alternated in ABBA rounds; per round BF16 /
recipe, the median and its 95% interval. ``--eager`` runs the same without torch.compile.

    python benchmarks/compiled_vs_plain.py --size gpu --json compiled_gpu.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import torch
from _timing import HOSTBOUND

from te_gemm_callback import GemmSchedule, JobStep, SweepJob
from te_gemm_callback.capture.instruments import boundary_times
from te_gemm_callback.precisions import autocast
from te_gemm_callback.recipes.models import codonfm, stack_input, te_stack
from te_gemm_callback.sweep.intervals import estimate

HOPPER = ["BF16", "DelayedScaling", "Float8CurrentScaling", "Float8BlockScaling"]
SIZES = {"gpu": replace(codonfm(2), micro_batch_size=8), "host": HOSTBOUND}


def build(size: str, compiled: bool, recipe: str = "BF16") -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = te_stack(SIZES[size])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    if compiled:
        # One eager forward first: TE's attention picks its backend outside dynamo (under dynamo that
        # choice raises in TE 2.20 with torch 2.11), and the compiled forward finds it made.
        with autocast(recipe):
            loss_of(model, stack_input(SIZES[size])).backward()
        model.zero_grad(set_to_none=True)
    return (torch.compile(model) if compiled else model), opt


def loss_of(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x).float().square().mean()


def fit(size: str, compiled: bool, out: Path, steps: int) -> dict:
    """The job with the schedule attached; report.json's rows per recipe."""
    model, opt = build(size, compiled)
    x = stack_input(SIZES[size])
    sched = GemmSchedule(wait=1, warmup=2, active=6, output_dir=str(out), sweep=HOPPER, verbose=False)
    for i in range(steps):
        sched.step_begin(model)
        with autocast("BF16"):  # the job's own recipe, as train_step_fn runs it
            loss = loss_of(model, x)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step_end(JobStep(global_step=i + 1, sweep=lambda: SweepJob(model, lambda: loss_of(model, x), [opt])))
    report = json.loads((out / "report.json").read_text())
    return {r["recipe"]: {k: r.get(k) for k in ("predicted_step_speedup", "predicted_band", "predicted_bound",
                                                 "predicted_gemms_alone", "observed_step_speedup", "observed_ci")}
            for r in report["recipes"]} | {"skipped": report.get("skipped")}


def plain_loop(size: str, compiled: bool, rounds: int, block: int) -> dict:
    """Whole steps of one fresh copy per recipe, alternated in ABBA rounds (module docstring)."""
    x = stack_input(SIZES[size])
    jobs = {r: build(size, compiled, r) for r in HOPPER}

    def step_of(r: str):
        model, opt = jobs[r]

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            with autocast(r):
                loss = loss_of(model, x)
            loss.backward()
            opt.step()

        return step

    failed = {}
    for r in HOPPER:  # warm-up: the compile, quantizers, cuBLAS plans, AdamW state
        try:
            for _ in range(3):
                step_of(r)()
        except Exception as err:  # a recipe dynamo cannot compile: said, not timed
            failed[r] = f"{type(err).__name__}: {str(err).strip().splitlines()[0][:200]}"
    ran = [r for r in HOPPER if r not in failed]
    if "BF16" in failed:  # no base: nothing to time against
        return {r: {"median": None, "ci95": None, "failed": failed.get(r, "not timed: BF16 failed")} for r in HOPPER}
    per_round = []
    for k in range(rounds):
        ms = {}
        for r in (ran if k % 2 == 0 else ran[::-1]):
            step = step_of(r)
            step()  # the switch: not a steady-state step
            ms[r] = statistics.median(g for _, g in boundary_times(step, block, True))
        per_round.append(ms)
    out: dict = {"BF16": {"step_ms": statistics.median(x["BF16"] for x in per_round)}}
    out |= {r: {"median": None, "ci95": None, "failed": why} for r, why in failed.items()}
    for r in ran[1:]:
        est = estimate([x["BF16"] / x[r] for x in per_round])
        out[r] = {"median": est.value, "ci95": (est.low, est.high),
                  "step_ms": statistics.median(x[r] for x in per_round)}
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", choices=sorted(SIZES), default="gpu")
    p.add_argument("--eager", action="store_true", help="the same job without torch.compile")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--block", type=int, default=8)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    if not torch.cuda.is_available():
        print("needs a GPU with Transformer Engine", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        report = fit(a.size, not a.eager, Path(tmp), a.steps)
    torch.cuda.empty_cache()
    plain = plain_loop(a.size, not a.eager, a.rounds, a.block)
    rows = []
    for r in HOPPER[1:]:
        rep, pl = report.get(r) or {}, plain[r]
        pred, obs = rep.get("predicted_step_speedup"), rep.get("observed_step_speedup")
        if pl["median"] is None:
            print(f"{r}: plain loop failed ({pl['failed']}); report: {rep or report['skipped'].get(r)}")
            rows.append({"recipe": r, "plain_failed": pl["failed"], "report": rep or report["skipped"].get(r)})
            continue
        rows.append({"recipe": r, "predicted": pred, "band": rep.get("predicted_band"),
                     "bound": rep.get("predicted_bound"), "gemms_alone": rep.get("predicted_gemms_alone"),
                     "observed": obs, "observed_ci": rep.get("observed_ci"),
                     "plain": pl["median"], "plain_ci": pl["ci95"],
                     "observed_vs_plain": obs / pl["median"] - 1 if obs else None,
                     "predicted_vs_plain": pred / pl["median"] - 1 if pred else None})
        print(f"{r}: predicted {pred or float('nan'):.3f} ({rep.get('predicted_bound')}), observed "
              f"{obs or float('nan'):.3f} {rep.get('observed_ci')}, plain loop {pl['median']:.3f} {pl['ci95']}")
    if plain["BF16"].get("failed"):
        print(f"BF16: plain loop failed ({plain['BF16']['failed']})")
    res = {"size": a.size, "compiled": not a.eager, "skipped": report.get("skipped"),
           "device": torch.cuda.get_device_name(), "bf16_plain_step_ms": plain["BF16"].get("step_ms"),
           "plain_bf16_failed": plain["BF16"].get("failed"), "rows": rows}
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
