"""A Lightning DDP job on CPU (gloo, 2 processes) whose process group times out collectives after
8 s, while rank 0's benchmarks take 15 s (a stand-in for a long bench), run by
tests/capture/test_distributed.py. Mid-training, the other rank would wait for rank 0 at its next
all-reduce and the job would die of the timeout; the report must wait for the end of training.

The 8 s are set once the group is up, not at its rendezvous: on a loaded machine the second
process can take longer than that to start and reach rank 0's store.
"""

import sys
import time
from datetime import timedelta
from pathlib import Path

import pytorch_lightning as pl
import torch
from helpers.lightning import DemoTransformer
from pytorch_lightning.strategies import DDPStrategy
from torch.distributed.distributed_c10d import _set_pg_timeout

from te_gemm_callback import GemmProfilerCallback
from te_gemm_callback.reporting import run as run_folder

if __name__ == "__main__":
    out = Path(sys.argv[1])

    def slow_bench(run_dir, *args, **kwargs):
        time.sleep(15.0)
        (Path(run_dir) / "bench_ran").write_text(str(torch.distributed.get_rank()))
        return {}

    run_folder.bench_and_report = slow_bench

    class ShortTimeout(pl.Callback):
        def setup(self, trainer, pl_module, stage):  # after the process group's rendezvous
            _set_pg_timeout(timedelta(seconds=8))

    torch.manual_seed(0)
    cb = GemmProfilerCallback(wait=0, warmup=1, active=2, output_dir=out, verbose=False, kernel_breakdown=False)
    trainer = pl.Trainer(max_steps=8, accelerator="cpu", devices=2, strategy=DDPStrategy(),
                         callbacks=[ShortTimeout(), cb], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)
    trainer.fit(DemoTransformer())
    print(f"rank {trainer.global_rank} done after {trainer.global_step} steps", flush=True)
    torch.distributed.destroy_process_group()
