#!/usr/bin/env python
"""The report's observed whole-step speedups against a plain loop with its optimizer step, in one run.

A model family the recipes do not use (HF transformers Qwen2, built from a config, no download),
trained through Lightning's TE plugin (``precision="transformer-engine"``: nn.Linear -> te.Linear,
DelayedScaling), alternated with an independent measurement of the same thing:

1. a fit with ``GemmProfilerCallback(sweep=<Hopper recipes>)``: the report's observed step speedup
   per recipe over BF16 and its 95% interval (``analysis.analyze`` over the sweep's captures);
2. a plain loop outside Lightning: one fresh copy of the model per recipe (each with its own TE
   state and AdamW, so no recipe switch touches another's state), whole steps (zero_grad, forward
   under the plugin's context and the recipe's autocast, backward, clipping, AdamW step) timed
   with CUDA events between step boundaries, recipes alternated in ABBA rounds; per round the
   ratio BF16 / recipe, then the median and its 95% interval over rounds.

Fits and plain loops alternate ``--fits`` times. GPU-bound model: the report's median should be
within 3% of the plain loop's; host-bound: the plain loop's median inside the report's interval
for a rerun (the CI widened by sqrt(2), ``stats.Estimate.rerun``), and, printed beside it, its CI.

    python benchmarks/observed_vs_plain.py --model gpu --json gpu.json
    python benchmarks/observed_vs_plain.py --model host --json host.json
    python benchmarks/observed_vs_plain.py --model tiny            # CPU: BF16 only, a smoke run
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

HOPPER = ["BF16", "DelayedScaling", "Float8CurrentScaling", "Float8BlockScaling"]
# (layers, hidden, intermediate, heads, kv heads, seq, micro-batch): GPU-bound (the GPU works
# through nearly all of a step) and host-bound (small hidden size and micro-batch, many layers).
MODELS = {"gpu": (4, 4096, 11008, 32, 8, 2048, 2), "host": (12, 1024, 2816, 16, 4, 256, 1),
          "tiny": (2, 64, 128, 4, 2, 16, 2)}
VOCAB = 32000


def build(name: str):
    import pytorch_lightning as pl
    import transformers

    layers, hidden, inter, heads, kv, seq, mb = MODELS[name]
    cfg = transformers.Qwen2Config(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                                   num_attention_heads=heads, num_key_value_heads=kv,
                                   vocab_size=VOCAB if name != "tiny" else 256, max_position_embeddings=seq)

    class Job(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = transformers.Qwen2ForCausalLM(cfg)

        def training_step(self, batch, i):
            return self.model(input_ids=batch, labels=batch).loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-5)

    g = torch.Generator().manual_seed(0)
    data = [torch.randint(0, cfg.vocab_size, (mb, seq), generator=g) for _ in range(16)]
    return Job, data


def trainer(steps: int, callbacks: list, cuda: bool):
    import pytorch_lightning as pl

    return pl.Trainer(max_steps=steps, accelerator="gpu" if cuda else "cpu", devices=1,
                      precision="transformer-engine" if cuda else "32-true", callbacks=callbacks, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      gradient_clip_val=1.0)


def report_speedups(res) -> dict[str, dict]:
    from te_gemm_callback.analysis import verdicts as analysis

    caps = res.captures
    rep = analysis.analyze(caps["BF16"], None, [c for r, c in caps.items() if r != "BF16"])
    return {a.recipe: {"median": a.observed_step_speedup, "ci95": a.observed_ci, "rerun": a.observed_rerun,
                       "rounds": a.observed_rounds, "step_ms": a.observed_step_ms}
            for a in rep.recipes if a.observed_step_speedup}


def plain_loop(Job, batch: torch.Tensor, recipes: list[str], tr, rounds: int, block: int) -> dict[str, dict]:
    """Whole steps of one fresh model copy per recipe, alternated in ABBA rounds (module docstring)."""
    from te_gemm_callback.capture.instruments import boundary_times
    from te_gemm_callback.precisions import autocast
    from te_gemm_callback.sweep.intervals import estimate

    plugin = tr.strategy.precision_plugin
    cuda = torch.cuda.is_available()
    jobs = {}
    for r in recipes:
        torch.manual_seed(0)
        with torch.device("cuda" if cuda else "cpu"):  # built in place: a CPU init of 1B parameters takes long
            m = plugin.convert_module(Job())  # the plugin's own layer swap, as in the fit
        jobs[r] = (m, torch.optim.AdamW(m.parameters(), lr=1e-5))
    batch = batch.cuda() if cuda else batch

    def step_of(r):
        m, opt = jobs[r]

        def step():
            opt.zero_grad(set_to_none=True)
            with plugin.forward_context(), autocast(r):
                loss = m.training_step(batch, 0)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            opt.step()

        return step

    for r in recipes:  # warm-up: quantizers, cuBLAS plans, AdamW state
        for _ in range(3):
            step_of(r)()
    per_round: list[dict[str, float]] = []
    for k in range(rounds):
        ms = {}
        for r in (recipes if k % 2 == 0 else recipes[::-1]):
            step = step_of(r)
            step()  # the switch: not a steady-state step
            ms[r] = statistics.median(g if g is not None else w for w, g in boundary_times(step, block, cuda))
        per_round.append(ms)
    jobs.clear()  # the copies' memory back before the next fit
    out = {}
    for r in recipes[1:]:
        est = estimate([x["BF16"] / x[r] for x in per_round])
        out[r] = {"median": est.value, "ci95": (est.low, est.high) if est.low is not None else None,
                  "rounds": est.rounds, "step_ms": statistics.median(x[r] for x in per_round)}
    out["BF16"] = {"step_ms": statistics.median(x["BF16"] for x in per_round)}
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=sorted(MODELS), default="gpu")
    p.add_argument("--fits", type=int, default=2, help="fits with the callback, each followed by a plain loop")
    p.add_argument("--loop-rounds", type=int, default=10, help="plain loop: ABBA rounds after each fit")
    p.add_argument("--steps", type=int, default=3, help="timed steps per recipe per round (both sides)")
    p.add_argument("--budget", type=float, default=20.0, help="the callback's sweep_budget_s")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    from te_gemm_callback import GemmProfilerCallback
    from te_gemm_callback.precisions import availability

    cuda = torch.cuda.is_available()
    recipes = [r for r in HOPPER if r == "BF16" or (cuda and availability(r).ok)]
    Job, data = build(a.model)
    fits = []
    for i in range(a.fits):
        torch.manual_seed(0)
        with torch.device("cuda" if cuda else "cpu"):
            module = Job()
        with tempfile.TemporaryDirectory() as out:
            cb = GemmProfilerCallback(wait=1, warmup=1, active=6, output_dir=out, sweep=recipes, verbose=False,
                                      sweep_steps=a.steps, sweep_budget_s=a.budget, report=False)
            tr = trainer(9, [cb], cuda)
            tr.fit(module, torch.utils.data.DataLoader(data, batch_size=None))
        report = report_speedups(cb.sweep_result) if cb.sweep_result else {}
        loop = plain_loop(Job, data[0], recipes, tr, a.loop_rounds, a.steps) if len(recipes) > 1 else {}
        fits.append({"report": report, "plain_loop": loop, "sweep_rounds": cb.sweep_result.rounds,
                     "stopped": cb.sweep_result.stopped})
        for r in recipes[1:]:
            rep, pl_ = report[r], loop[r]
            ci = rep["ci95"]
            inside = ci is not None and ci[0] <= pl_["median"] <= ci[1]
            rr = rep["rerun"]
            in_rerun = rr is not None and rr[0] <= pl_["median"] <= rr[1]
            print(f"{a.model} fit {i}: {r}: report {rep['median']:.3f}x "
                  f"(CI {ci[0]:.3f}-{ci[1]:.3f}, {rep['rounds']} rounds)" if ci else
                  f"{a.model} fit {i}: {r}: report {rep['median']:.3f}x (no CI, {rep['rounds']} rounds)",
                  f"| plain loop {pl_['median']:.3f}x ({pl_['rounds']} rounds) | report/plain "
                  f"{100 * (rep['median'] / pl_['median'] - 1):+.1f}% | plain inside CI: {inside} "
                  f"| inside the rerun range: {in_rerun}", flush=True)
        del module
        if cuda:
            torch.cuda.empty_cache()
    res = {"model": a.model, "config": dict(zip(("layers", "hidden", "intermediate", "heads", "kv_heads", "seq",
                                                "micro_batch"), MODELS[a.model])),
           "device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__, "fits": fits}
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
