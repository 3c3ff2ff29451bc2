"""Lightning's demo Transformer on random tokens, and a callback whose kernels step runs on a CPU.
Imported by the tests and by the job scripts beside them (tests/ddp_job.py and the others)."""

import torch
from pytorch_lightning.demos import LightningTransformer
from torch.utils.data import DataLoader, TensorDataset

from te_gemm_callback import GemmProfilerCallback

VOCAB, SEQ, BATCH = 64, 12, 4


class DemoTransformer(LightningTransformer):
    """Lightning's demo model on random tokens (its WikiText2 loader downloads)."""

    def __init__(self):
        super().__init__(vocab_size=VOCAB)
        self.model = type(self.model)(vocab_size=VOCAB, ninp=32, nhead=2, nhid=48, nlayers=2, dropout=0.0)

    def prepare_data(self):
        pass

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        x = torch.randint(0, VOCAB, (64, SEQ), generator=g)
        return DataLoader(TensorDataset(x, x.roll(1, 1)), batch_size=BATCH)

    def val_dataloader(self):
        return self.train_dataloader()

    def validation_step(self, batch, batch_idx):
        inputs, target = batch
        self.log("val", torch.nn.functional.nll_loss(self(inputs, target), target.view(-1)))


class FakeKernelProfile(GemmProfilerCallback):
    """torch.profiler's CUDA activity cannot run on CPU: a stand-in kernel recorder makes the
    callback plan its kernels step as it does on a GPU."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.recorders = []
        self.schedule._kernels_possible = lambda model: True
        self.schedule.kernel_recorder = self._kernel_recorder

    def _kernel_recorder(self):
        from helpers.fakes import FakeKernels

        self.recorders.append(FakeKernels(gemms=0))
        return self.recorders[-1]
