#!/usr/bin/env python
"""The callback's in-job sweep against a plain loop, side by side in one run.

1. Lightning fit of the dense model with GemmProfilerCallback(sweep=recipes): observed step time
   per recipe (forward+backward, no optimizer) from the sweep captures.
2. The same model and batch timed in a plain PyTorch loop outside Lightning, per recipe:
   median of N forward+backward steps, each bracketed by CUDA events (host clock on CPU).
3. Ratio of the observed speedups (sweep / plain loop), and whether the job's training state after
   the fit (weights and AdamW moments) equals that of the same fit without a sweep: once with one
   fit per process (each its process's first, as a user's job is), once as the 2nd and 3rd fit of
   this process (after a throwaway first fit: the first fit in a process is not bitwise
   reproducible by later ones on the H200).

    python benchmarks/sweep_vs_plain_loop.py --layers 4 --steps 8 --json out.json
    python benchmarks/sweep_vs_plain_loop.py --tiny          # CPU: BF16 only
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

# Deterministic kernels where TE offers a choice (fused-attention backward): the training-state
# comparison below needs two identical fits to be bitwise equal.
os.environ.setdefault("NVTE_ALLOW_NONDETERMINISTIC_ALGO", "0")
import pytorch_lightning as pl  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from te_gemm_callback import GemmProfilerCallback  # noqa: E402
from te_gemm_callback.demo import TINY, DemoLM, RandomTokens  # noqa: E402
from te_gemm_callback.models import codonfm  # noqa: E402
from te_gemm_callback.precisions import availability, te_available  # noqa: E402

HOPPER = ["BF16", "DelayedScaling", "Float8CurrentScaling", "Float8BlockScaling"]


def fit(c, steps, out, sweep, use_te):
    torch.manual_seed(0)
    model = DemoLM(c, use_te=use_te)
    cb = GemmProfilerCallback(wait=1, warmup=1, active=2, output_dir=out, sweep=sweep, sweep_steps=8,
                              verbose=False)
    trainer = pl.Trainer(max_steps=steps, accelerator="gpu" if torch.cuda.is_available() else "cpu", devices=1,
                         callbacks=[cb], logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    torch.manual_seed(1)
    trainer.fit(model, DataLoader(RandomTokens(c, c.micro_batch_size * steps), batch_size=c.micro_batch_size))
    return model, cb, trainer


def training_state(model, trainer) -> dict[str, torch.Tensor]:
    """Weights and optimizer state (AdamW moments, step counts): what the next step depends on."""
    st = {f"param/{n}": p.detach() for n, p in model.named_parameters()}
    for i, opt in enumerate(trainer.optimizers):
        for j, (p, s) in enumerate(opt.state.items()):
            st.update({f"opt{i}/{j}/{k}": v for k, v in s.items() if isinstance(v, torch.Tensor)})
    return st


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    if a.keys() != b.keys():
        return float("inf")
    return max((x.float() - y.float()).abs().max().item() if x.numel() else 0.0 for x, y in zip(a.values(), b.values()))


def fresh_copy(c, fitted, use_te):
    """The fitted weights in a new model: each recipe starts from TE's initial FP8 state, as a
    job launched in that recipe would, not from whatever the previous recipe left behind."""
    m = DemoLM(c, use_te=use_te).to(next(fitted.parameters()).device)
    with torch.no_grad():
        for (n, p), (_, q) in zip(m.named_parameters(), fitted.named_parameters()):
            p.copy_(q)
    return m


def timed(fn):
    """(milliseconds, fn's result): GPU time by a CUDA-event pair, host time on CPU."""
    if not torch.cuda.is_available():
        t0 = time.perf_counter()
        out = fn()
        return (time.perf_counter() - t0) * 1e3, out
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    out = fn()
    e.record()
    e.synchronize()
    return s.elapsed_time(e), out


def train_step(model, batch):
    """One forward and backward, no optimizer step; returns the loss."""
    for p in model.parameters():
        p.grad = None
    loss = model.training_step(batch, 0)
    loss.backward()
    return loss


def plain_loop(models: dict, batch, rounds=6, per_round=3, warmup=3) -> dict[str, float]:
    """Median forward+backward step per recipe, one model copy per recipe (TE keeps per-module FP8
    state that a recipe switch breaks), recipes interleaved in rounds so that clock and power drift
    over the run falls on every recipe alike."""
    times: dict[str, list[float]] = {r: [] for r in models}
    for r, m in models.items():
        m.recipe = r
        m.log = lambda *a, **k: None  # outside Lightning's loop: nothing to log into
        for _ in range(warmup):  # quantizers and delayed-scaling history settle
            train_step(m, batch)
    for _ in range(rounds):
        for r, m in models.items():
            times[r] += [timed(lambda: train_step(m, batch))[0] for _ in range(per_round)]
    return {r: statistics.median(t) for r, t in times.items()}


def separate_processes(a: argparse.Namespace) -> float:
    """The same check as a user's job sees it: one fit per process (each its process's first),
    with and without the sweep; max |difference| of the training states."""
    states = []
    for mode in ("sweep", "plain"):
        path = Path(a.out) / f"state_{mode}.pt"
        cmd = [sys.executable, __file__, "--fit-only", mode, "--state-out", str(path), "--layers", str(a.layers),
               "--steps", str(a.steps), "--out", str(Path(a.out) / f"process_{mode}")] + (["--tiny"] if a.tiny else [])
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        states.append(torch.load(path))
    return max_diff(*states)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--out", default="runs/sweep_check")
    p.add_argument("--json")
    p.add_argument("--fit-only", choices=["sweep", "plain"], help=argparse.SUPPRESS)  # one fit, state to --state-out
    p.add_argument("--state-out", help=argparse.SUPPRESS)
    a = p.parse_args()
    use_te = torch.cuda.is_available() and te_available()[0]
    c = TINY if (a.tiny or not use_te) else codonfm(a.layers)
    recipes = [r for r in HOPPER if availability(r).ok and (r == "BF16" or use_te)]
    if a.fit_only:
        m, _, t = fit(c, a.steps, Path(a.out), recipes if a.fit_only == "sweep" else None, use_te)
        torch.save({k: v.detach().cpu() for k, v in training_state(m, t).items()}, a.state_out)
        return 0
    diff_processes = separate_processes(a)
    print(f"max |difference| in training state, with vs without sweep, one fit per process: {diff_processes:.3e}")
    # The first fit in a process differs from later identical ones (measured on the H200: 9.8e-3
    # in the weights after 6 steps, first-use initialisation), so a throwaway fit goes first and
    # the two compared fits are the second and third.
    fit(c, a.steps, Path(a.out) / "warm_up_fit", None, use_te)
    model, cb, tr = fit(c, a.steps, Path(a.out) / "with_sweep", recipes, use_te)
    plain_model, _, plain_tr = fit(c, a.steps, Path(a.out) / "without_sweep", None, use_te)
    diff = max_diff(training_state(model, tr), training_state(plain_model, plain_tr))
    same = diff == 0.0 and diff_processes == 0.0
    print(f"max |difference| in training state, with vs without sweep, 2nd and 3rd fit of one process: {diff:.3e}")
    del plain_model, plain_tr
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model.to(dev)  # Lightning moves the module back to the CPU when fit ends
    batch = RandomTokens(c, c.micro_batch_size).data.to(dev)
    sweep_ms = {r: cap.step_ms() for r, cap in cb.sweep_result.captures.items()}
    loop_ms = plain_loop({r: fresh_copy(c, model, use_te) for r in recipes}, batch)
    rows = []
    for r in recipes:
        s_sweep, s_loop = sweep_ms["BF16"] / sweep_ms[r], loop_ms["BF16"] / loop_ms[r]
        rows.append({"recipe": r, "sweep_step_ms": sweep_ms[r], "plain_loop_step_ms": loop_ms[r],
                     "sweep_speedup": s_sweep, "plain_loop_speedup": s_loop, "ratio": s_sweep / s_loop})
        print(f"{r:22s} sweep {sweep_ms[r]:8.2f} ms ({s_sweep:.3f}x)  plain loop {loop_ms[r]:8.2f} ms "
              f"({s_loop:.3f}x)  speedup ratio {s_sweep / s_loop:.4f}")
    print(f"training state (weights, optimizer moments) after the fit identical with and without the sweep: {same}")
    if a.json:
        Path(a.json).write_text(json.dumps({"rows": rows, "state_unchanged": same, "state_max_abs_diff": diff,
                                            "state_max_abs_diff_separate_processes": diff_processes,
                                            "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"},
                                           indent=1))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
