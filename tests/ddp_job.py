"""A Lightning DDP job on CPU (gloo; 2 processes, or argv[2]), run by tests/capture/test_distributed.py.

Rank 1's capture is made to fail inside a hook: the job must finish, rank 0 must still gather
both captures (rank 1's with its error), and nothing may hang. The kernels step among the active
ones runs with a stand-in recorder (no CUDA here), so the schedule is the one of a GPU job.
"""

import sys
from pathlib import Path

import pytorch_lightning as pl
import torch
from helpers.lightning import DemoTransformer, FakeKernelProfile


class FailOnRank1(FakeKernelProfile):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        super().on_train_batch_start(trainer, pl_module, batch, batch_idx)
        if trainer.global_rank == 1 and self.schedule._prof is not None:
            self.schedule._prof.recorder.fail(RuntimeError("injected on rank 1"))


if __name__ == "__main__":
    out = Path(sys.argv[1])
    devices = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    torch.manual_seed(0)
    cb = FailOnRank1(wait=0, warmup=1, active=2, output_dir=out, verbose=False)
    trainer = pl.Trainer(max_steps=5, accelerator="cpu", devices=devices, strategy="ddp", callbacks=[cb],
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, limit_val_batches=0)
    trainer.fit(DemoTransformer())
    print(f"rank {trainer.global_rank} done after {trainer.global_step} steps", flush=True)
    torch.distributed.destroy_process_group()  # see recipes/_common.py: a gloo group left to exit can abort
