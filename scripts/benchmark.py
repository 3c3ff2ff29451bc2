#!/usr/bin/env python
"""Drop-in for TE's benchmarks/gemm/benchmark_gemm.py: its flags, run as ``te-gemm bench``.

    python scripts/benchmark.py --hidden_size 4096 --intermediate_size 16384 --num_attention_heads 32 \\
        --num_hidden_layers 24 --micro_batch_size 31 --sequence_length 512 [--pre-quantize] -o fig.png

What differs from TE's tool is what ``te-gemm bench`` does: dgrad and wgrad are timed as the GEMMs
te.Linear's backward really runs (not forwards with swapped sizes); every recipe this GPU supports
runs, unsupported ones are skipped with TE's reason (--no-fp8/--no-fp4 only narrow the list);
results carry median, spread, device, clocks and versions. Extra flags: --shapes,
--num_key_value_heads, --gated_mlp, --json, --flush_l2, --no_cache, --visits, --gemm_duty.
"""

from __future__ import annotations

import argparse
import sys

from te_gemm_callback.cli import main as te_gemm
from te_gemm_callback.precisions import FP8_RECIPES

# TE's flag -> te-gemm bench's (None: a flag of its own, handled below).
CONFIG = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers",
          "micro_batch_size", "sequence_length")
DEFAULTS = {"hidden_size": 4096, "intermediate_size": 16384, "num_attention_heads": 32, "num_hidden_layers": 24,
            "micro_batch_size": 31, "sequence_length": 512}  # TE's tool's defaults


def translate(argv: list[str] | None = None) -> list[str]:
    """TE's benchmark_gemm.py flags as a ``te-gemm bench`` command line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in CONFIG:
        p.add_argument(f"--{name}", default=DEFAULTS.get(name))
    p.add_argument("--gated_mlp", action="store_true")
    p.add_argument("--shapes", help="MxKxN,... instead of a config")
    p.add_argument("--pre-quantize", "--pre_quantize", dest="pre_quantize", action="store_true")
    p.add_argument("--no-fp8", "--no_fp8", dest="no_fp8", action="store_true")
    p.add_argument("--no-fp4", "--no_fp4", dest="no_fp4", action="store_true")
    p.add_argument("-o", "--output", help="figure path (PNG)")
    p.add_argument("--json")
    p.add_argument("--flush_l2", action="store_true")
    p.add_argument("--visits")
    p.add_argument("--gemm_duty")
    p.add_argument("--no_cache", action="store_true")
    a = p.parse_args(argv)
    out = ["bench"]
    if a.shapes:
        out += ["--shapes", a.shapes]
    else:
        out += [x for name in CONFIG if getattr(a, name) is not None
                for x in (f"--{name.replace('_', '-')}", str(getattr(a, name)))]
        out += ["--gated-mlp"] if a.gated_mlp else []
    precisions = ["BF16", *([] if a.no_fp8 else FP8_RECIPES), *([] if a.no_fp4 else ["NVFP4BlockScaling"])]
    out += ["--precisions", ",".join(precisions)]
    for flag, value in (("--pre-quantize", a.pre_quantize), ("--flush-l2", a.flush_l2), ("--no-cache", a.no_cache)):
        out += [flag] if value else []
    for flag, value in (("-o", a.output), ("--json", a.json), ("--visits", a.visits), ("--gemm-duty", a.gemm_duty)):
        out += [flag, value] if value is not None else []
    return out


if __name__ == "__main__":
    sys.exit(te_gemm(translate()))
