#!/usr/bin/env python
"""Where does a sweep's side effect on a Lightning job come from, and does TE survive recipe switches?

1. switch: one DemoLM (TE layers, no optimizer) runs DelayedScaling, then Float8CurrentScaling,
   Float8BlockScaling, then DelayedScaling again; a fresh copy runs DelayedScaling only. Same
   weights and batch, so the loss and the first FP8 scale of both DelayedScaling runs should match
   step for step if TE re-initialises its scaling state correctly on a recipe switch.
2. matrix: Lightning fits of the same model, without a sweep and with sweeps of different
   recipe sets, with and without the sweep's profiled step; max |difference| of the weights and
   AdamW moments against the fit without a sweep.

    python benchmarks/sweep_state_matrix.py --json matrix.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

os.environ.setdefault("NVTE_ALLOW_NONDETERMINISTIC_ALGO", "0")
from sweep_vs_plain_loop import max_diff, timed, train_step, training_state  # noqa: E402

from te_gemm_callback.demo import DemoLM, RandomTokens  # noqa: E402
from te_gemm_callback.models import codonfm  # noqa: E402


def first_scale(m) -> float | None:
    for mod in m.modules():
        meta = getattr(mod, "fp8_meta", None)
        st = meta.get("scaling_fwd") if isinstance(meta, dict) else None
        if st is not None and getattr(st, "scale", None) is not None:
            return float(st.scale.flatten()[0])
    return None


def run(m, batch, recipe, n):
    rows = []
    for _ in range(n):
        m.recipe = recipe
        ms, loss = timed(lambda: train_step(m, batch))
        rows.append((round(ms, 2), float(loss), first_scale(m)))
    return rows


def switch_probe(c):
    batch = RandomTokens(c, c.micro_batch_size).data.cuda()
    out = {}
    for name, plan in (("fresh", [("DelayedScaling", 6)]),
                       ("switched", [("DelayedScaling", 2), ("Float8CurrentScaling", 2), ("Float8BlockScaling", 2),
                                     ("DelayedScaling", 6)])):
        torch.manual_seed(0)
        m = DemoLM(c, use_te=True).cuda()
        m.log = lambda *a, **k: None
        rows = []
        for recipe, n in plan:
            rows = run(m, batch, recipe, n)
        out[name] = rows  # the last DelayedScaling block
        print(f"switch: {name:8s} DelayedScaling (ms, loss, first fwd scale): {rows}")
        del m
        torch.cuda.empty_cache()
    return out


def fit(c, sweep, kernels, steps=6):
    import pytorch_lightning as pl
    from torch.utils.data import DataLoader

    from te_gemm_callback import GemmProfilerCallback

    torch.manual_seed(0)
    model = DemoLM(c, use_te=True)
    cb = GemmProfilerCallback(wait=1, warmup=1, active=1, output_dir="runs/matrix", sweep=sweep, sweep_steps=2,
                              verbose=False, kernel_breakdown=kernels)
    tr = pl.Trainer(max_steps=steps, accelerator="gpu", devices=1, callbacks=[cb], logger=False,
                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    torch.manual_seed(1)
    tr.fit(model, DataLoader(RandomTokens(c, c.micro_batch_size * steps), batch_size=c.micro_batch_size))
    return training_state(model, tr)


def matrix(c):
    ref = fit(c, None, True)
    out = {}
    for name, sweep, kernels in (("no sweep, again", None, True),
                                 ("BF16 only", ["BF16"], True),
                                 ("DelayedScaling only", ["DelayedScaling"], True),
                                 ("Float8CurrentScaling only", ["Float8CurrentScaling"], True),
                                 ("all four", ["BF16", "DelayedScaling", "Float8CurrentScaling", "Float8BlockScaling"], True),
                                 ("all four, no profiled step", ["BF16", "DelayedScaling", "Float8CurrentScaling",
                                                                 "Float8BlockScaling"], False),
                                 ("no sweep, no kernel profile", None, False)):
        out[name] = max_diff(ref, fit(c, sweep, kernels))
        print(f"matrix: {name:28s} max |diff| vs fit without sweep: {out[name]:.3e}")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--json")
    a = p.parse_args()
    c = codonfm(a.layers)
    res = {"switch": switch_probe(c), "matrix": matrix(c)}
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
