"""Jobs beyond plain eager TE layers, on one GPU with TE: CUDA graphs, te.ops, torch.compile.

    python benchmarks/jobs_check.py graphs --recipes BF16,DelayedScaling   # CodonFM stack, 4 layers
    python benchmarks/jobs_check.py ops
    python benchmarks/jobs_check.py compile

graphs: the stack captured eagerly, then graphed with ``te.make_graphed_callables`` (one graph per
layer) and captured again: GEMMs per layer and shapes; per-GEMM kernel times of the replays (kernels
steps joined to the eager instrumented step by launch order) against the same GEMMs' kernel times
with the layers' forward swapped back to eager, captures alternating over rounds in one process;
the replayed clean steps against a plain loop of the graphed stack with no profiler (interleaved
blocks).
ops: ``te.ops.Sequential(LayerNorm, Linear, GELU, Linear)``: owners of its 6 GEMMs and warnings.
compile: a te.TransformerLayer stack under torch.compile: shapes as eager, dynamo's counters.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import statistics
import sys
from typing import Any

import torch
from _timing import event_times

from te_gemm_callback.capture.graphs import EagerForwards, graphed_modules
from te_gemm_callback.capture.steps import capture_steps
from te_gemm_callback.precisions import make_recipe
from te_gemm_callback.recipes.models import codonfm, stack_input, te_stack, train_step_fn


def profiled(model: torch.nn.Module, step: Any, kernel_steps: int = 3, clean: int = 3) -> Any:
    return capture_steps(model, step, clean, kernel_steps=kernel_steps)


def per_layer(cap: Any) -> dict[str, int]:
    return dict(collections.Counter(r.module.split(".")[0] for r in cap.records for _ in range(int(r.calls_per_step))))


def check_graphs(recipe: str, blocks: int = 6, block: int = 10, rounds: int = 4) -> dict:
    import transformer_engine.pytorch as te

    c = codonfm(4)
    torch.manual_seed(0)
    model = te_stack(c)
    x = stack_input(c)
    step = train_step_fn(model, x, recipe)
    for _ in range(3):
        step()
    eager = profiled(model, step)
    # One graph per layer; each layer's sample input is the previous layer's output shape.
    samples = tuple((torch.randn_like(x).requires_grad_(),) for _ in model)
    kw: dict[str, Any] = {}
    if recipe != "BF16":
        kw = {"enabled": True, "recipe": make_recipe(recipe)}
    te.make_graphed_callables(tuple(model), samples, **kw)
    for _ in range(3):
        step()
    graphed = profiled(model, step)
    # Per-GEMM times: replays against the same modules run eagerly (their forward swapped back to
    # the eager one, as the profiler's instrumented steps do), captures alternating over rounds so
    # that the GPU's clock drift over the run falls on both alike; medians over all kernels steps.
    times: dict[str, dict[tuple, list[float]]] = {"eager": {}, "graphed": {}}
    swap = EagerForwards(graphed_modules(model))
    for _ in range(rounds):
        for kind in ("graphed", "eager"):
            if kind == "eager":
                swap.enter()
            cap = graphed if kind == "graphed" and not times["graphed"] else profiled(model, step)
            swap.exit()
            for r in cap.records:
                times[kind].setdefault(r.key(), []).extend(r.times_ms)
    rows = []
    for r in eager.records:
        e, g = (statistics.median(times[k][r.key()]) if times[k].get(r.key()) else None for k in ("eager", "graphed"))
        rows.append({"gemm": r.name, "op": r.op, "mkn": r.shape.mkn, "eager_ms": e, "graphed_ms": g,
                     "ratio": g / e if g and e else None})
    ratios = [x["ratio"] for x in rows if x["ratio"] is not None]

    # Replayed clean steps against a plain loop of the graphed stack, interleaved blocks. Both are
    # GPU time between per-step CUDA events with no sync inside the block (what the profiler's
    # step boundaries read): the host runs ahead of graph replays, so host time says nothing here.
    without, with_clean = [], []
    for _ in range(blocks):
        without += event_times(step, block)
        cap = profiled(model, step, kernel_steps=1, clean=block)
        with_clean += [s.gpu_ms for s in cap.steps_of("clean")]
    return {"recipe": recipe, "graphed_modules": graphed.meta.get("graphed_modules"),
            "gemms_per_layer_eager": per_layer(eager), "gemms_per_layer_graphed": per_layer(graphed),
            "same_shapes": sorted(r.key() for r in eager.records) == sorted(r.key() for r in graphed.records),
            "kernel_join": graphed.meta.get("kernel_join"), "eager_kernel_join": eager.meta.get("kernel_join"),
            "compared": len(ratios), "within_5pct": sum(abs(r - 1) <= 0.05 for r in ratios),
            "median_ratio": statistics.median(ratios) if ratios else None,
            "max_abs_pct": 100 * max((abs(r - 1) for r in ratios), default=float("nan")),
            # From the alternating rounds, like the ratios (the first captures are minutes apart).
            "gemm_ms_per_step": {k: sum(statistics.median(times[k][r.key()]) * r.calls_per_step for r in eager.records
                                        if times[k].get(r.key())) for k in ("eager", "graphed")},
            "rounds": rounds,
            "clean_vs_plain_pct": 100 * (statistics.median(with_clean) / statistics.median(without) - 1),
            "clean_gpu_ms": statistics.median(with_clean), "plain_gpu_ms": statistics.median(without),
            "steps_each": len(without), "rows": rows}


def check_ops(recipe: str) -> dict:
    import transformer_engine.pytorch as te

    h, i = 1024, 4096
    bf16 = {"dtype": torch.bfloat16}
    model = te.ops.Sequential(te.ops.LayerNorm(h, **bf16), te.ops.Linear(h, i, **bf16), te.ops.GELU(),
                              te.ops.Linear(i, h, **bf16)).cuda()
    x = torch.randn(2048, h, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    step = train_step_fn(model, x, recipe)
    step()
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logging.getLogger("te_gemm_callback").addHandler(handler)
    cap = profiled(model, step, kernel_steps=1, clean=2)
    logging.getLogger("te_gemm_callback").removeHandler(handler)
    return {"recipe": recipe, "gemms": [(r.module, r.module_type, r.op, r.shape.mkn, r.precision) for r in cap.records],
            "never_ran": cap.coverage["never_ran"], "warnings": [r.getMessage() for r in records],
            "kernel_join": cap.meta.get("kernel_join")}


def check_compile(recipe: str) -> dict:
    import torch._dynamo.utils as du

    c = codonfm(2)
    torch.manual_seed(0)
    model = te_stack(c)
    x = stack_input(c)
    eager = profiled(model, train_step_fn(model, x, recipe), kernel_steps=0, clean=1)
    cmodel = torch.compile(model)
    step = train_step_fn(cmodel, x, recipe)
    for _ in range(3):
        step()

    def grew(run: Any) -> dict[str, int]:
        before = {k: dict(v) for k, v in du.counters.items()}
        run()
        after = {k: dict(v) for k, v in du.counters.items()}
        return {f"{k}.{n}": v - before.get(k, {}).get(n, 0) for k, d in after.items() for n, v in d.items()
                if v != before.get(k, {}).get(n, 0)}

    n = 1 + 2 + 2 + 1  # the profiled run below: instrumented, warm-up, kernels, 2 clean; one more step
    control = grew(lambda: [step() for _ in range(n)])  # the same steps without the profiler
    caps: list = []
    with_profiler = grew(lambda: (caps.append(profiled(cmodel, step, kernel_steps=1, clean=2)), step()))
    cap = caps[0]
    key = lambda r: (r.module.removeprefix("_orig_mod."), r.op, r.shape.mkn, r.precision)  # noqa: E731
    return {"recipe": recipe, "compiled": cap.meta.get("compiled"), "gemms": len(cap.records),
            "same_shapes_as_eager": sorted(map(key, eager.records)) == sorted(map(key, cap.records)),
            "dynamo_counters_grew": with_profiler, "dynamo_counters_grew_without_profiler": control,
            "kernel_join": cap.meta.get("kernel_join")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("check", choices=["graphs", "ops", "compile"])
    ap.add_argument("--recipes", default="BF16")
    ap.add_argument("--json")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        ap.exit(2, "jobs_check.py: error: needs a CUDA GPU with transformer-engine\n")
    fn = {"graphs": check_graphs, "ops": check_ops, "compile": check_compile}[a.check]
    out = []
    for r in a.recipes.split(","):
        res = fn(r)
        out.append(res)
        print(json.dumps({k: v for k, v in res.items() if k != "rows"}, default=str))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
