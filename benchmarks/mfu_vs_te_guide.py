#!/usr/bin/env python
"""Precision-aware MFU of the 5B layer on the H200, beside the GEMM throughput TE's GEMM profiling
guide publishes for the same layer on a B300 (no GPU needed).

Per recipe, from the README main command's committed run folder (docs/results/h200/replay/main:
four layers of TE's 5B configuration, M = 15872 tokens, a BF16 job with every Hopper recipe swept):

- the in-job GEMM throughput of one layer: the four GEMMs' FLOPs (QKV, attention output, MLP up
  and down; 2*M*K*N each, forward, dgrad and wgrad) over their kernel time in the sweep's kernels
  step of that recipe, as a fraction of the H200's public dense peak for the format the GEMMs ran
  in (projection/gpus.py);
- the microbenchmark's throughput of the same GEMMs (pre-quantized cells), likewise;
- the whole step's precision-aware MFU of that recipe's sweep run (projection/mfu.py, as the
  report's ``meta.mfu``).

Beside them, TE's B300 per-layer GEMM times (benchmarks/projection_vs_te_guide.py, TE_B300: the
guide's docs/recipes/gemm_profiling, B300 SXM6 AC, benchmark_gemm.py) as TFLOP/s and as a
fraction of the B300's public dense peak for the format.

    python benchmarks/mfu_vs_te_guide.py [--run DIR] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from projection_vs_te_guide import TE_B300  # noqa: E402

from te_gemm_callback.capture.capture_file import GemmCapture  # noqa: E402
from te_gemm_callback.microbench.results import BenchResults  # noqa: E402
from te_gemm_callback.projection.gpus import gpu  # noqa: E402
from te_gemm_callback.projection.mfu import precision_mfu, record_format  # noqa: E402

M, HIDDEN, FFN = 15872, 4096, 16384
LAYER = ((HIDDEN, 3 * HIDDEN), (HIDDEN, HIDDEN), (HIDDEN, FFN), (FFN, HIDDEN))  # (K, N) per GEMM
PASS_FLOPS = sum(2 * M * k * n for k, n in LAYER)  # one pass (fprop, dgrad or wgrad) of one layer
FORMAT = {"BF16": "bf16", "DelayedScaling": "fp8", "Float8CurrentScaling": "fp8", "Float8BlockScaling": "fp8",
          "MXFP8BlockScaling": "fp8", "NVFP4BlockScaling": "fp4"}


def in_layer(r) -> bool:
    return r.m == M or r.k == M  # the lm_head's GEMMs (N = 128 vocabulary) are not the layer's
    # (wgrad records carry M as their K)


def job_layer_ms(cap: GemmCapture) -> float | None:
    """Kernel ms of one layer's twelve GEMMs in the capture's kernels step (mean over its layers)."""
    recs = [r for r in cap.records if in_layer(r) and 128 not in (r.m, r.k, r.n) and r.times_ms]
    layers = {r.module.split(".")[1] for r in recs if r.module.startswith("blocks.")}
    if not recs or not layers:
        return None
    return sum(sum(r.times_ms) / len(r.times_ms) * r.calls_per_step for r in recs) / len(layers)


def bench_layer_ms(bench: BenchResults, recipe: str) -> float | None:
    """The pre-quantized cells' ms for one layer's twelve GEMMs."""
    total = 0.0
    for res in bench.results:
        if res.precision != recipe or res.mode != "prequantized" or 128 in (res.m, res.k, res.n):
            continue
        if not res.ok or res.median_ms is None:
            return None
        total += res.median_ms
    return total or None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", default=str(ROOT / "docs/results/h200/replay/main"))
    p.add_argument("--json", default=None)
    a = p.parse_args()
    run = Path(a.run)
    h200, b300 = gpu("H200"), gpu("B300")
    bench = BenchResults.load(run / "bench.json")
    rows = []
    for recipe in ("BF16", "DelayedScaling", "Float8CurrentScaling", "Float8BlockScaling", "MXFP8BlockScaling",
                   "NVFP4BlockScaling"):
        fmt = FORMAT[recipe]
        row = {"recipe": recipe, "format": fmt}
        cap_path = run / "sweep" / recipe / "gemm_capture.json"
        if cap_path.exists():
            cap = GemmCapture.load(cap_path)
            ran = {record_format(r.precision) for r in cap.records if in_layer(r) and 128 not in (r.m, r.k, r.n)}
            ms = job_layer_ms(cap)
            if ms and ran == {fmt}:
                tf = 3 * PASS_FLOPS / ms / 1e9
                row["h200_job_tflops"], row["h200_job_of_peak"] = round(tf, 1), round(tf / h200.peaks[fmt], 3)
        ms = bench_layer_ms(bench, recipe)
        if ms:
            tf = 3 * PASS_FLOPS / ms / 1e9
            row["h200_bench_tflops"], row["h200_bench_of_peak"] = round(tf, 1), round(tf / h200.peaks[fmt], 3)
            step_mfu = precision_mfu(cap)
            if step_mfu is not None:
                row["h200_step_mfu"] = round(step_mfu, 3)
        for mode in ("prequantized", "autocast"):
            te = TE_B300[mode].get(recipe)
            if te:
                tf = 3 * PASS_FLOPS / sum(te) / 1e9
                row[f"te_b300_{mode}_tflops"] = round(tf, 1)
                row[f"te_b300_{mode}_of_peak"] = round(tf / b300.peaks[fmt], 3)
        rows.append(row)

    def cell(row: dict, key: str) -> str:
        tf, frac = row.get(f"{key}_tflops"), row.get(f"{key}_of_peak")
        return f"{tf:.0f} ({100 * frac:.0f}%)" if tf is not None else "-"

    print(f"5B layer (M {M}, hidden {HIDDEN}, FFN {FFN}): {3 * PASS_FLOPS / 1e12:.2f} TFLOP per layer per step")
    print("| recipe | H200 in job, TFLOP/s (of peak) | H200 bench | H200 step MFU | TE B300 pre-quantized "
          "| TE B300 autocast |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        step = f"{100 * row['h200_step_mfu']:.0f}%" if "h200_step_mfu" in row else "-"
        print(f"| {row['recipe']} | {cell(row, 'h200_job')} | {cell(row, 'h200_bench')} | {step} | "
              f"{cell(row, 'te_b300_prequantized')} | {cell(row, 'te_b300_autocast')} |")
    if a.json:
        Path(a.json).write_text(json.dumps({"layer_tflop": 3 * PASS_FLOPS / 1e12, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
