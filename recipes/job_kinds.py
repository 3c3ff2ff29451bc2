#!/usr/bin/env python
"""GemmProfiler on a CUDA-graphed TE stack, a te.ops model and a torch.compile'd model.

The profiler attaches the same way to each (``with GemmProfiler(model)``, ``prof.step()`` per
optimizer step); what differs is what the capture can say, printed after the table:

- ``graphs``: TE layers graphed with ``te.make_graphed_callables``. The instrumented step runs the
  layers' eager forward (the replays run no Python, so no GEMM call could be seen there); the
  kernels and clean steps run the replays, and the replays' GEMM kernels are joined to the eager
  step's GEMMs by launch order. Records are labelled graphed (``meta.graphed_modules``).
- ``ops``: TE's fusible-ops API (``te.ops.Sequential``). Each GEMM is owned by the
  ``te.ops.Linear`` that ran it, read from the fuser's frames.
- ``compile``: ``torch.compile`` of the model. The shape-discovery step runs eagerly under a
  dispatch mode; ``meta.compiled`` says the model was compiled; dynamo's counters before and after
  the capture show whether the profiler cost a recompile.

    python recipes/job_kinds.py compile                 # CPU (aot_eager backend) or GPU
    python recipes/job_kinds.py graphs --recipe DelayedScaling   # GPU with Transformer Engine
    python recipes/job_kinds.py ops --recipe Float8CurrentScaling  # GPU with Transformer Engine
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from te_gemm_callback import GemmProfiler
from te_gemm_callback.precisions import autocast, availability, make_recipe, te_available
from te_gemm_callback.reporting import capture_table, print_table


def plain_step(model: nn.Module, x: torch.Tensor, recipe: str) -> Callable[[], None]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        with autocast(recipe):  # TE's autocast for an FP8 recipe; nothing for BF16
            y = model(x)
        y.float().square().mean().backward()  # backward outside autocast, as TE requires
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def build_graphs(recipe: str) -> tuple[nn.Module, Callable[[], None]]:
    import transformer_engine.pytorch as te

    layers = [te.TransformerLayer(1024, 4096, 16, params_dtype=torch.bfloat16, hidden_dropout=0.0,
                                  attention_dropout=0.0, self_attn_mask_type="no_mask").cuda() for _ in range(2)]
    model = nn.Sequential(*layers)
    x = torch.randn(512, 2, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    samples = tuple((torch.randn_like(x).requires_grad_(),) for _ in layers)
    kw: dict[str, Any] = {} if recipe == "BF16" else {"enabled": True, "recipe": make_recipe(recipe)}
    # One graph per layer, replacing each layer's forward in place: the model object stays the
    # same, and the profiler finds the graphed modules when it starts.
    te.make_graphed_callables(tuple(layers), samples, **kw)
    # Replays and the instrumented step's eager forward both under the recipe's autocast.
    return model, plain_step(model, x, recipe)


def build_ops(recipe: str) -> tuple[nn.Module, Callable[[], None]]:
    import transformer_engine.pytorch as te

    h, i, bf16 = 1024, 4096, {"dtype": torch.bfloat16}
    model = te.ops.Sequential(te.ops.LayerNorm(h, **bf16), te.ops.Linear(h, i, **bf16), te.ops.GELU(),
                              te.ops.Linear(i, h, **bf16)).cuda()
    x = torch.randn(2048, h, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    return model, plain_step(model, x, recipe)


def build_compile(backend: str | None) -> tuple[nn.Module, Callable[[], None]]:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256)).to(device)
    # aot_eager on a CPU: inductor would need a C++ toolchain there, and the GEMMs are the same.
    compiled = torch.compile(model, backend=backend or ("inductor" if device == "cuda" else "aot_eager"))
    x = torch.randn(64, 256, device=device, requires_grad=True)
    return compiled, plain_step(compiled, x, "BF16")


def dynamo_counts() -> dict[str, int]:
    import torch._dynamo.utils as du

    return {f"{k}.{n}": v for k, d in du.counters.items() for n, v in d.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("job", choices=("graphs", "ops", "compile"))
    p.add_argument("--recipe", default="BF16", help="TE recipe (graphs, ops): BF16, DelayedScaling, ...")
    p.add_argument("--backend", help="compile: torch.compile backend (default: inductor on CUDA, aot_eager on CPU)")
    p.add_argument("--steps", type=int, default=6, help="profiled steps")
    p.add_argument("--out", default="runs/job_kinds")
    a = p.parse_args(argv)

    if a.job != "compile":
        ok, why = te_available()
        if not ok or not torch.cuda.is_available():
            p.exit(2, f"job_kinds.py: error: '{a.job}' needs Transformer Engine on a GPU "
                      f"({why or 'no CUDA device'}); 'compile' runs anywhere\n")
        if not availability(a.recipe).ok:
            p.exit(2, f"job_kinds.py: error: {a.recipe}: {availability(a.recipe).reason}\n")
    torch.manual_seed(0)
    model, step = {"graphs": lambda: build_graphs(a.recipe), "ops": lambda: build_ops(a.recipe),
                   "compile": lambda: build_compile(a.backend)}[a.job]()
    for _ in range(3):  # initialisation, graph capture warm-up, first compilation stay out
        step()
    before = dynamo_counts()
    with GemmProfiler(model) as prof:
        for i in range(a.steps):
            step()
            if i < a.steps - 1:
                prof.step()
    cap = prof.capture
    grew = {k: v - before.get(k, 0) for k, v in dynamo_counts().items() if v != before.get(k, 0)}
    print_table(capture_table(cap))
    path = cap.save(Path(a.out) / a.job / "gemm_capture.json")
    print(f"capture: {path}; steps {', '.join(s.kind for s in cap.steps)}")
    print(f"kernel join: {cap.meta.get('kernel_join', 'no kernels step (CPU)')}")
    if a.job == "graphs":
        print(f"graphed modules: {cap.meta.get('graphed_modules')}")
    if a.job == "ops":
        print(f"owners: {sorted({r.module for r in cap.records})}; never ran: {cap.coverage['never_ran']}")
    if a.job == "compile":
        print(f"compiled: {cap.meta.get('compiled')}; dynamo counters that grew while profiling: {grew or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
