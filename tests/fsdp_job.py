"""A 2-process Lightning job under ModelParallelStrategy with FSDP2 (fully_shard) on CPU (gloo), run
by tests/capture/test_distributed.py in a subprocess. Parameters are sharded DTensors between steps and
all-gathered for the GEMMs; each rank must still capture the full per-layer shapes."""

import sys

import pytorch_lightning as pl
import torch
from helpers.lightning import DemoTransformer
from pytorch_lightning.strategies import ModelParallelStrategy
from torch.distributed.fsdp import fully_shard

from te_gemm_callback import GemmProfilerCallback


class Sharded(DemoTransformer):
    def configure_model(self) -> None:
        mesh = self.device_mesh["data_parallel"]
        for m in self.model.modules():
            if isinstance(m, (torch.nn.TransformerEncoderLayer, torch.nn.TransformerDecoderLayer)):
                fully_shard(m, mesh=mesh)
        fully_shard(self.model, mesh=mesh)


if __name__ == "__main__":
    torch.manual_seed(0)
    cb = GemmProfilerCallback(wait=0, warmup=1, active=2, output_dir=sys.argv[1], verbose=False)
    trainer = pl.Trainer(max_steps=4, accelerator="cpu", devices=2, strategy=ModelParallelStrategy(),
                         callbacks=[cb], logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, limit_val_batches=0)
    trainer.fit(Sharded())
    print(f"rank {trainer.global_rank} done", flush=True)
    torch.distributed.destroy_process_group()  # see recipes/_common.py: a gloo group left to exit can abort
