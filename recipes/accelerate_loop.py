#!/usr/bin/env python
"""A Hugging Face Accelerate training loop with GemmProfiler: one ``prof.step()`` per optimizer step.

With gradient accumulation, ``accelerator.accumulate`` runs several micro-batches per optimizer
step; the profiler's step boundary goes where Accelerate syncs the gradients, so all of them count
as one step. An HF Llama built from a config (no download); Accelerate's own TE FP8 backend, where
configured, converts its Linear layers and the capture shows their precision.

    python recipes/accelerate_loop.py --tiny           # CPU, seconds
    python recipes/accelerate_loop.py --steps 8        # GPU
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from te_gemm_callback import GemmProfiler


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="a tiny model that runs on CPU in seconds")
    p.add_argument("--steps", type=int, default=6, help="optimizer steps")
    p.add_argument("--accumulate", type=int, default=2, help="micro-batches per optimizer step")
    p.add_argument("--out", default="runs/accelerate")
    a = p.parse_args(argv)
    try:
        import transformers
        from accelerate import Accelerator
    except ImportError:
        p.exit(2, "accelerate_loop.py: error: needs transformers and accelerate (pip install 'te-gemm-callback[hf]')\n")

    size = dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                num_hidden_layers=2) if a.tiny else dict(hidden_size=2048, intermediate_size=8192,
                                                         num_attention_heads=32, num_key_value_heads=8,
                                                         num_hidden_layers=4)
    seq, mb, vocab = (16, 2, 128) if a.tiny else (2048, 2, 32000)
    torch.manual_seed(0)
    acc = Accelerator(gradient_accumulation_steps=a.accumulate)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(vocab_size=vocab, **size))
    model, opt = acc.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-4))
    batches = torch.randint(0, vocab, (a.steps * a.accumulate, mb, seq))
    with GemmProfiler(model) as prof:
        for ids in batches:
            with acc.accumulate(model):
                ids = ids.to(acc.device)
                acc.backward(model(input_ids=ids, labels=ids).loss)
                opt.step()
                opt.zero_grad()
            if acc.sync_gradients:  # the optimizer really stepped: one profiled step ends here
                prof.step(micro_batches=a.accumulate)
    path = prof.capture.save(Path(a.out) / "gemm_capture.json")
    print(f"capture: {path} ({len(prof.capture.steps)} steps: "
          f"{', '.join(s.kind for s in prof.capture.steps)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
