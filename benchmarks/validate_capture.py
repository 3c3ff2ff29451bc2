#!/usr/bin/env python
"""Check a capture of the CodonFM-layer TE stack against torch.profiler, per recipe.

For each recipe: N steady steps, every one instrumented with a CUDA-event pair and a torch.profiler
range per GEMM, while torch.profiler records the same steps; checks that every layer ran its 12
GEMMs with the expected shapes and the recipe's operand precision, and compares the per-step GEMM
time of both.

    python benchmarks/validate_capture.py --layers 4 --steps 10 --json out.json
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

import torch
from _timing import profiled_steps

from te_gemm_callback.capture.kernels import is_gemm_kernel, kernel_times_us
from te_gemm_callback.precisions import availability
from te_gemm_callback.recipes.models import DemoConfig, codonfm
from te_gemm_callback.shapes import GemmShape, gemm_passes

EXPECTED_FAMILY = {"BF16": "bf16", "DelayedScaling": "fp8_delayed",
                   "Float8CurrentScaling": "fp8_current", "Float8BlockScaling": "fp8_block"}


def _device_us(evt) -> float:
    t = getattr(evt, "device_time_total", None)
    return float(t if t is not None else getattr(evt, "cuda_time_total", 0.0))


def expected_shapes(c: DemoConfig) -> collections.Counter:
    m, h, i = c.sequence_length * c.micro_batch_size, c.hidden_size, c.intermediate_size
    fprops = [GemmShape(m, h, 3 * h), GemmShape(m, h, h), GemmShape(m, h, i), GemmShape(m, i, h)]
    return collections.Counter((str(s.op), s.m, s.k, s.n) for f in fprops for s in gemm_passes(f))


def validate(recipe: str, c: DemoConfig, steps: int, warmup: int) -> dict:
    cap, tp = profiled_steps(recipe, c, steps, warmup)
    kernels = kernel_times_us(tp)
    gemm_kernels = {k: v for k, v in kernels.items() if is_gemm_kernel(k)}
    # Kernel time under our ranges (device time of the children of each "te_gemm: ..." op).
    prof_ms = sum(_device_us(e) for e in tp.key_averages() if e.key.startswith("te_gemm: ")) / 1e3 / steps
    cap_ms = sum(s.gemm_ms for s in cap.steps) / len(cap.steps)
    per_layer = collections.Counter()
    shapes = collections.Counter()
    for r in cap.records:
        layer = r.module.split(".")[0]
        per_layer[layer] += r.calls_per_step
        shapes[(r.op, r.m, r.k, r.n)] += r.calls_per_step
    want = expected_shapes(c)
    families = sorted({r.precision for r in cap.records})
    return {
        "recipe": recipe,
        "gemms_per_layer": dict(per_layer),
        "shapes_ok": shapes == collections.Counter({k: v * c.num_hidden_layers for k, v in want.items()}),
        "precisions": families,
        "precision_ok": families == [EXPECTED_FAMILY[recipe]],
        "operands": sorted({" x ".join(r.operands) for r in cap.records}),
        "capture_gemm_ms_per_step": cap_ms,
        "profiler_gemm_kernel_ms_per_step": prof_ms,
        "capture_over_profiler": cap_ms / prof_ms if prof_ms else None,
        "step_ms_median": cap.step_ms(),
        "gemm_named_kernels": sorted(gemm_kernels),
        "records": [(r.name, r.op, r.shape.mkn, r.precision, r.median_ms) for r in cap.records[:12]],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--recipes", default="BF16,DelayedScaling,Float8CurrentScaling,Float8BlockScaling")
    p.add_argument("--json")
    a = p.parse_args()
    if not torch.cuda.is_available():
        p.exit(2, "validate_capture.py: error: needs a CUDA GPU with transformer-engine\n")
    c = codonfm(a.layers)
    results = []
    for recipe in a.recipes.split(","):
        av = availability(recipe)
        if not av.ok:
            print(f"{recipe}: skipped: {av.reason}")
            continue
        r = validate(recipe, c, a.steps, a.warmup)
        results.append(r)
        print(f"{recipe:22s} GEMMs/layer {sorted(set(r['gemms_per_layer'].values()))} shapes_ok={r['shapes_ok']} "
              f"precision={r['precisions']} ok={r['precision_ok']} | GEMM ms/step capture "
              f"{r['capture_gemm_ms_per_step']:.3f} profiler {r['profiler_gemm_kernel_ms_per_step']:.3f} "
              f"ratio {r['capture_over_profiler']:.4f} | step {r['step_ms_median']:.2f} ms")
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "config": c.__dict__,
            "steps": a.steps}
    if a.json:
        Path(a.json).write_text(json.dumps({"meta": meta, "results": results}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
