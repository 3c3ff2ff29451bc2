"""Two-rank tensor-parallel TE job for tests/test_gpu.py (run with torch.distributed.run, NCCL).

Each rank builds one te.TransformerLayer over the world group (column-parallel qkv and fc1,
row-parallel proj and fc2), with and without sequence parallelism, trains two steps, captures one
with GemmProfiler and writes its capture: OUT/tp_sp{0,1}_{recipe}_rank{r}.json.
"""

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from te_gemm_callback import GemmProfiler
from te_gemm_callback.precisions import autocast
from te_gemm_callback.recipes.models import DemoConfig, te_layers

C = DemoConfig(hidden_size=1024, intermediate_size=4096, num_attention_heads=16, num_key_value_heads=16,
               num_hidden_layers=1, sequence_length=512, micro_batch_size=4, gated_mlp=False,
               normalization="LayerNorm")


def step(layer: torch.nn.Module, x: torch.Tensor, recipe: str) -> None:
    """One training step of ``layer`` on ``x`` under ``recipe``. The arguments are passed, not
    closed over: a closure defined in the loop would hold the loop's names (ruff B023), and
    default-argument binding would keep each layer alive past its ``del``."""
    with autocast(recipe):
        y = layer(x)
    y.float().pow(2).mean().backward()


if __name__ == "__main__":
    out = Path(sys.argv[1])
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    for recipe in ("BF16", "Float8CurrentScaling"):
        for sp in (False, True):
            torch.manual_seed(0)
            layer = te_layers(C, causal=True, bias=False, tp_group=dist.group.WORLD, sequence_parallel=sp)[0]
            # Sequence parallel: each rank holds its slice of the sequence between the layers.
            seq = C.sequence_length // dist.get_world_size() if sp else C.sequence_length
            x = torch.randn(seq, C.micro_batch_size, C.hidden_size, device="cuda", dtype=torch.bfloat16,
                            requires_grad=True)
            for _ in range(2):
                step(layer, x, recipe)
            with GemmProfiler(layer, nvtx=False) as prof:
                step(layer, x, recipe)
            prof.capture.meta["tp_input_rows"] = seq * C.micro_batch_size
            prof.capture.save(out / f"tp_sp{int(sp)}_{recipe}_rank{rank}.json")
            del layer
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank} done", flush=True)
