"""A Lightning DDP job on CPU (gloo; 2 processes, or argv[2]), run by tests/capture/test_distributed.py.

Rank 1's capture (or argv[4]'s) is made to fail (argv[3]): inside a hook ("hook", the default); when it stops at
the window's end ("stop"); when it pauses in the window's last step, which drops it before the end
("pause"); or when it cannot even start its warm-up ("start"). The job must finish, rank 0 must
still gather every rank's capture (the failed one's with its error), and nothing may hang. The kernels step
among the active ones runs with a stand-in recorder (no CUDA here), so the schedule is the one of a
GPU job.
"""

import sys
from pathlib import Path

import pytorch_lightning as pl
import torch
from helpers.lightning import DemoTransformer, FakeKernelProfile


def _raise(*args, **kwargs):
    raise RuntimeError("injected")


class FailOnRank(FakeKernelProfile):
    def __init__(self, mode, rank, **kw):
        super().__init__(**kw)
        self.mode, self.failing = mode, rank

    def setup(self, trainer, pl_module, stage):
        super().setup(trainer, pl_module, stage)
        if self.mode == "start" and trainer.global_rank == self.failing:
            self.schedule._new_profiler = _raise

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        super().on_train_batch_start(trainer, pl_module, batch, batch_idx)
        prof = self.schedule._prof
        if trainer.global_rank != self.failing or prof is None:
            return
        if self.mode == "hook":
            prof.recorder.fail(RuntimeError("injected on rank 1"))
        elif self.mode == "stop":
            prof.stop = _raise
        elif self.mode == "pause" and trainer.global_step == 2:  # the window's last step (wait 0, warm-up 1, active 2)
            prof.pause = _raise


if __name__ == "__main__":
    out = Path(sys.argv[1])
    devices = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    mode = sys.argv[3] if len(sys.argv) > 3 else "hook"
    failing = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    torch.manual_seed(0)
    cb = FailOnRank(mode, failing, wait=0, warmup=1, active=2, output_dir=out, verbose=False)
    trainer = pl.Trainer(max_steps=5, accelerator="cpu", devices=devices, strategy="ddp", callbacks=[cb],
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, limit_val_batches=0)
    trainer.fit(DemoTransformer())
    print(f"rank {trainer.global_rank} done after {trainer.global_step} steps", flush=True)
    torch.distributed.destroy_process_group()  # see recipes/_common.py: a gloo group left to exit can abort
