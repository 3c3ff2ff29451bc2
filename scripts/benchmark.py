#!/usr/bin/env python
"""Drop-in for TE's benchmarks/gemm/benchmark_gemm.py: same flags, same sections, real passes.

    python scripts/benchmark.py --hidden_size 4096 --intermediate_size 16384 --num_attention_heads 32 \\
        --num_hidden_layers 24 --micro_batch_size 31 --sequence_length 512 [--pre-quantize] -o fig.png

Differences from the seed tool: dgrad and wgrad are timed as the GEMMs te.Linear's backward really
runs (not forwards with swapped sizes); every recipe this GPU supports runs (DelayedScaling and
Float8BlockScaling included in --pre-quantize), unsupported ones are skipped with TE's reason
(--no-fp8/--no-fp4 only narrow the list); results carry median, spread, device and versions.
Extra flags: --shapes, --num_key_value_heads, --gated_mlp, --json, --flush_l2, --no_cache, --visits, --gemm_duty.
"""

from __future__ import annotations

from rich.markup import escape

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from te_gemm_callback.bench.cells import ResultCache, items_from_config, items_from_shapes  # noqa: E402
from te_gemm_callback.bench.engine import run_bench  # noqa: E402
from te_gemm_callback.render.bench_tables import pass_table, run_summary, speedup_summary, totals_table  # noqa: E402
from te_gemm_callback.render.figures import stacked_gemm_figure  # noqa: E402
from te_gemm_callback.render.tables import console  # noqa: E402
from te_gemm_callback.shapes import GemmOp, ModelConfig, parse_shapes  # noqa: E402

FP8 = ["DelayedScaling", "Float8CurrentScaling", "Float8BlockScaling", "MXFP8BlockScaling"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden_size", type=int, default=4096)
    p.add_argument("--intermediate_size", type=int, default=16384)
    p.add_argument("--num_attention_heads", type=int, default=32)
    p.add_argument("--num_key_value_heads", type=int)
    p.add_argument("--gated_mlp", action="store_true")
    p.add_argument("--num_hidden_layers", type=int, default=24)
    p.add_argument("--micro_batch_size", type=int, default=31)
    p.add_argument("--sequence_length", type=int, default=512)
    p.add_argument("--shapes", help="MxKxN,... instead of a config")
    p.add_argument("--pre-quantize", "--pre_quantize", dest="pre_quantize", action="store_true")
    p.add_argument("--no-fp8", "--no_fp8", dest="no_fp8", action="store_true")
    p.add_argument("--no-fp4", "--no_fp4", dest="no_fp4", action="store_true")
    p.add_argument("-o", "--output", help="figure path (PNG)")
    p.add_argument("--json")
    p.add_argument("--flush_l2", action="store_true")
    p.add_argument("--visits", type=int, default=None, help="times each job is measured, samples pooled (default 16 on a GPU)")
    p.add_argument("--gemm_duty", type=float, default=None,
                   help="share of GPU time the timed GEMMs get (te-gemm bench --gemm-duty)")
    p.add_argument("--no_cache", action="store_true")
    a = p.parse_args(argv)
    out = console()
    try:
        if a.shapes:
            items = items_from_shapes(parse_shapes(a.shapes))
            per_layer = 1
        else:
            cfg = ModelConfig(hidden_size=a.hidden_size, intermediate_size=a.intermediate_size,
                              num_attention_heads=a.num_attention_heads, num_key_value_heads=a.num_key_value_heads,
                              gated_mlp=a.gated_mlp, num_hidden_layers=a.num_hidden_layers,
                              micro_batch_size=a.micro_batch_size, sequence_length=a.sequence_length)
            items = items_from_config(cfg)
            per_layer = cfg.num_hidden_layers
    except ValueError as err:
        p.exit(2, f"{p.prog}: error: {err}\n")
    precisions = ["BF16"] + ([] if a.no_fp8 else FP8) + ([] if a.no_fp4 else ["NVFP4BlockScaling"])
    mode = "prequantized" if a.pre_quantize else "autocast"
    res = run_bench(items, precisions, [mode], flush_l2=a.flush_l2, cache=ResultCache(enabled=not a.no_cache),
                    visits=a.visits, gemm_duty=a.gemm_duty, console=out)
    for op in GemmOp:
        out.print(pass_table(res, items, op, mode))
    layer = [type(it)(it.name, it.fprop, 1.0, it.m_splits) for it in items]  # one layer
    out.print("[b]Per layer[/b]")
    out.print(totals_table(res, layer, mode))
    out.print(f"[b]Full model ({per_layer} layers)[/b]")
    out.print(totals_table(res, items, mode))
    for prec, sp in speedup_summary(res, items, mode).items():
        if prec != "BF16":
            out.print(f"Estimated GEMM speedup over BF16 ({mode}), {prec}: " + ("n/a" if sp is None else f"{sp:.2f}x"))
    for prec, why in res.skipped.items():
        out.print(f"[yellow]{prec} skipped: {escape(why)}")
    out.print(run_summary(res))
    if a.json:
        res.save(a.json)
    if a.output:
        stacked_gemm_figure(res, layer, mode, a.output, title=f"GEMM time per layer ({mode}) — {res.meta.get('device')}")
        out.print(f"figure: {a.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
