#!/usr/bin/env python
"""Two questions about the in-job sweep, answered on a GPU host with TE.

1. state: does a sweep change what the next training step computes? Two identical DemoLM (TE
   layers) train 3 steps; one then runs ``run_sweep`` over one recipe. Right after the sweep,
   parameters and gradients are compared bitwise; then both take step 4 and the first module
   whose forward output differs is named (forward hooks), with the loss and gradient difference.
2. nesting: what does our te.autocast inside a precision plugin's fp8_autocast cost? An HF
   Llama converted by Lightning's TransformerEnginePrecision is timed (median of CUDA-event
   forward+backward steps) under the plugin's context alone, the plugin's context with our
   DelayedScaling autocast inside it, and our autocast alone.

    python benchmarks/sweep_probe.py --json probe.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

from sweep_vs_plain_loop import timed  # noqa: E402

from te_gemm_callback.demo import DemoLM, RandomTokens  # noqa: E402
from te_gemm_callback.models import codonfm  # noqa: E402
from te_gemm_callback.precisions import autocast  # noqa: E402
from te_gemm_callback.sweep import run_sweep  # noqa: E402

HOPPER = ["BF16", "DelayedScaling", "Float8CurrentScaling", "Float8BlockScaling"]


def make(c):
    torch.manual_seed(0)
    m = DemoLM(c, use_te=True).cuda()
    m.log = lambda *a, **k: None  # no Lightning loop here
    return m, torch.optim.AdamW(m.parameters(), lr=1e-3)


def train(m, opt, batches):
    for b in batches:
        m.training_step(b, 0).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def outputs_of_step(m, batch):
    """Forward outputs of every module in step 4 (in call order), the loss, and the gradients."""
    outs, hooks = [], []
    for name, mod in m.named_modules():
        def hook(_mod, _inp, out, name=name):
            if isinstance(out, torch.Tensor):
                outs.append((name, out.detach().float().clone()))
        hooks.append(mod.register_forward_hook(hook))
    loss = m.training_step(batch, 0)
    loss.backward()
    for h in hooks:
        h.remove()
    grads = {n: p.grad.detach().float().clone() for n, p in m.named_parameters() if p.grad is not None}
    return outs, float(loss), grads


def state_probe(c, recipes):
    batches = RandomTokens(c, 4 * c.micro_batch_size).data.cuda().split(c.micro_batch_size)
    ref, ref_opt = make(c)
    train(ref, ref_opt, batches[:3])
    ref_outs, ref_loss, ref_grads = outputs_of_step(ref, batches[3])
    del ref, ref_opt
    rows = []
    for r in recipes:
        m, opt = make(c)
        train(m, opt, batches[:3])
        before = {n: p.detach().clone() for n, p in m.named_parameters()}

        def set_recipe(mod, rec, original=m.recipe):
            mod.recipe = original if rec is None else rec

        run_sweep(m, lambda m=m: m.training_step(batches[2], 0), [r], steps=2, set_recipe=set_recipe,
                  profile_kernels=False)
        params_same = all(torch.equal(p, before[n]) for n, p in m.named_parameters())
        grads_none = all(p.grad is None for p in m.parameters())
        outs, loss, grads = outputs_of_step(m, batches[3])
        first = next((n for (n, a), (_, b) in zip(outs, ref_outs) if not torch.equal(a, b)), None)
        gdiff = max((grads[n] - ref_grads[n]).abs().max().item() for n in grads)
        rows.append({"recipe": r, "params_bitwise_restored": params_same, "grads_restored": grads_none,
                     "loss_diff": loss - ref_loss, "max_grad_diff": gdiff, "first_differing_module": first})
        print(f"state: sweep {r:22s} params restored {params_same}, grads restored {grads_none}, step-4 loss "
              f"diff {loss - ref_loss:+.3e}, max grad diff {gdiff:.3e}, first differing module {first}")
        del m, opt
        torch.cuda.empty_cache()
    return rows


def time_steps(step, n=12, warmup=3):
    for _ in range(warmup):
        step()
    return statistics.median(timed(step)[0] for _ in range(n))


def nesting_probe():
    import contextlib

    import transformers
    from lightning_fabric.plugins.precision.transformer_engine import TransformerEnginePrecision

    cfg = transformers.LlamaConfig(hidden_size=2048, intermediate_size=8192, num_attention_heads=32,
                                   num_key_value_heads=8, num_hidden_layers=4, vocab_size=32000)
    torch.manual_seed(0)
    plugin = TransformerEnginePrecision(weights_dtype=torch.bfloat16)
    model = plugin.convert_module(transformers.LlamaForCausalLM(cfg)).cuda()
    ids = torch.randint(0, 32000, (4, 2048), device="cuda")

    def step(outer, inner):
        def run():
            for p in model.parameters():
                p.grad = None
            with outer(), inner():
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
        return run

    none = contextlib.nullcontext
    cases = {"plugin context alone": (plugin.forward_context, none),
             "plugin context + our DelayedScaling": (plugin.forward_context, lambda: autocast("DelayedScaling")),
             "our DelayedScaling alone": (none, lambda: autocast("DelayedScaling")),
             "plugin context + our BF16": (plugin.forward_context, lambda: autocast("BF16"))}
    out = {}
    for name, (o, i) in cases.items():
        out[name] = time_steps(step(o, i))
        print(f"nesting: {name:38s} {out[name]:8.2f} ms/step (median of 12)")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--recipes", default=",".join(HOPPER))
    p.add_argument("--json")
    a = p.parse_args()
    res = {"state": state_probe(codonfm(a.layers), a.recipes.split(",")), "nesting": nesting_probe()}
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
