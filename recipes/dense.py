#!/usr/bin/env python
"""Dense Llama-style transformer from TE layers (te.TransformerLayer), trained with the callback.

Default: the CodonFM-5B layer of TE's benchmark_gemm.py (hidden 4096, intermediate 16384, 32 heads, MHA, GELU MLP,
LayerNorm; micro-batch 31 x 512 tokens) with --layers layers. --kv-heads and --gated select GQA and
a SwiGLU MLP. On a machine without TE the same architecture is built from torch layers (BF16).

    python recipes/dense.py --layers 4 --sweep all          # GPU host with TE
    python recipes/dense.py --tiny --out runs/dense-tiny    # CPU, seconds
    python recipes/dense.py --devices 2 --strategy tp       # TE tensor parallel over 2 GPUs
"""

from __future__ import annotations

import sys
from pathlib import Path

from torch.utils.data import DataLoader

from te_gemm_callback.precisions import canonical
from te_gemm_callback.recipes._common import add_shape_flags, base_parser, finish, fit, run, use_te
from te_gemm_callback.recipes.demo import TINY, DemoConfig, DemoLM, RandomTokens


def main(argv: list[str] | None = None) -> int:
    p = base_parser(__doc__.splitlines()[0], strategies=("ddp", "fsdp", "tp"))
    add_shape_flags(p, layers=4, hidden=4096, heads=32, kv_heads=None, seq_len=512, micro_batch_size=31)
    p.add_argument("--intermediate-size", type=int, default=16384)
    p.add_argument("--gated", action="store_true", help="SwiGLU MLP (gate+up fused, 2I) instead of GELU")
    p.add_argument("--vocab-size", type=int, default=128)
    a = p.parse_args(argv)
    if a.tiny:
        c = TINY
    else:
        c = DemoConfig(hidden_size=a.hidden_size, intermediate_size=a.intermediate_size,
                       num_attention_heads=a.heads, num_key_value_heads=a.kv_heads or a.heads,
                       num_hidden_layers=a.layers, vocab_size=a.vocab_size, sequence_length=a.seq_len,
                       micro_batch_size=a.micro_batch_size, gated_mlp=a.gated,
                       normalization="RMSNorm" if a.gated else "LayerNorm")
    recipe = canonical(a.recipe)
    if recipe != "BF16" and not use_te(a):  # said before training, not after it at the benchmark
        p.error(f"--recipe {recipe} needs TE layers: transformer-engine on a CUDA host, without --no-te")
    out = Path(a.out or f"runs/dense-{recipe}")
    tp = a.devices > 1 and a.strategy == "tp"
    if tp and not use_te(a):
        p.error("--strategy tp needs TE layers: transformer-engine on a CUDA host, without --no-te")
    model = DemoLM(c, use_te=use_te(a), recipe=recipe, tensor_parallel=tp)
    loader = DataLoader(RandomTokens(c, c.micro_batch_size * a.steps * a.devices), batch_size=c.micro_batch_size)
    cb = fit(model, loader, a, out)
    return finish(a, cb, out)


if __name__ == "__main__":
    sys.exit(run(main))
