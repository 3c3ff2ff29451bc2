#!/usr/bin/env python
"""An HF transformers Llama built from a config (no download), trained through Lightning.

With --precision transformer-engine, Lightning's TransformerEnginePrecision swaps the model's
nn.Linear layers for te.Linear (GPU host with TE); with bf16-mixed (default) it stays plain torch.
Either way the callback captures a model this project did not write.

    python recipes/hf.py --precision transformer-engine --sweep BF16,DelayedScaling
    python recipes/hf.py --tiny
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from te_gemm_callback.recipes._common import add_shape_flags, base_parser, finish, fit, run
from te_gemm_callback.recipes.demo import DemoConfig, HFLlama, RandomTokens


def main(argv: list[str] | None = None) -> int:
    p = base_parser(__doc__.splitlines()[0], te_layers=False)  # TE layers come from --precision
    p.add_argument("--precision", default=None, help="Lightning precision: bf16-mixed (default on GPU), "
                                                      "transformer-engine, 32-true (default on CPU)")
    add_shape_flags(p, layers=16, hidden=2048, heads=32, kv_heads=8, seq_len=2048, micro_batch_size=4)
    p.add_argument("--intermediate-size", type=int, default=8192)
    a = p.parse_args(argv)
    try:
        import transformers
    except ImportError:
        p.exit(2, "hf.py: error: needs transformers (pip install 'te-gemm-callback[test]')\n")
    if a.tiny:
        cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4,
                                       num_key_value_heads=2, num_hidden_layers=2, vocab_size=128)
        seq, mb = 16, 2
    else:
        cfg = transformers.LlamaConfig(hidden_size=a.hidden_size, intermediate_size=a.intermediate_size,
                                       num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
                                       num_hidden_layers=a.layers, vocab_size=32000)
        seq, mb = a.seq_len, a.micro_batch_size
    precision = a.precision or ("bf16-mixed" if torch.cuda.is_available() else "32-true")
    out = Path(a.out or f"runs/hf-{precision}")
    data = DemoConfig(vocab_size=cfg.vocab_size, sequence_length=seq - 1, micro_batch_size=mb)
    loader = DataLoader(RandomTokens(data, mb * a.steps * a.devices), batch_size=mb)
    cb = fit(HFLlama(cfg), loader, a, out, precision=precision)
    return finish(a, cb, out)


if __name__ == "__main__":
    sys.exit(run(main))
