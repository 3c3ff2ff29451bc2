"""The jobs the undisturbed checks run: the host-bound stack and the other named models as Lightning
modules, an independent step timer (a CUDA event at every batch start), a bare Trainer."""

from __future__ import annotations

import gc
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch

from te_gemm_callback.demo import DemoConfig, DemoLM, HFLlama
from te_gemm_callback.models import codonfm
from te_gemm_callback.precisions import te_available

# The host-bound stack: the GPU works a few ms of a ~60 ms step on the H200.
HOSTBOUND = DemoConfig(hidden_size=1024, intermediate_size=4096, num_attention_heads=16, num_key_value_heads=16,
                       num_hidden_layers=12, vocab_size=128, sequence_length=256, micro_batch_size=2,
                       gated_mlp=False, normalization="LayerNorm")
TINY = DemoConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                  num_hidden_layers=2, vocab_size=64, sequence_length=16, micro_batch_size=2)


class FusedAdamLM(DemoLM):
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-4, fused=self.device.type == "cuda")


class StepTimer(pl.Callback):
    """A CUDA event (host clock on CPU) at every batch start: step i = start i -> start i+1."""

    def __init__(self) -> None:
        self.marks: list[Any] = []
        # Process CPU time (all threads: backward runs on autograd's device thread) at the same
        # boundaries: a host-bound step's cost without the time its threads were not running.
        self.cpu_marks: list[float] = []
        # Host time in Python's garbage collector per step (gc.callbacks), so a step kind that
        # leaves more objects behind shows where its collections fall.
        self.gc_ms: list[float] = []
        self._gc_t0 = 0.0

    def _gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_t0 = time.perf_counter()
        elif self.gc_ms:
            self.gc_ms[-1] += (time.perf_counter() - self._gc_t0) * 1e3

    def on_train_start(self, trainer, pl_module) -> None:
        gc.callbacks.append(self._gc)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._mark()
        self.gc_ms.append(0.0)

    def on_train_end(self, trainer, pl_module) -> None:
        self._mark()  # the last step's end (not a batch start: subclasses act on those)
        if self._gc in gc.callbacks:
            gc.callbacks.remove(self._gc)

    def _mark(self) -> None:
        self.cpu_marks.append(time.process_time())
        if torch.cuda.is_available():
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.marks.append(ev)
        else:
            self.marks.append(time.perf_counter())

    def steps_ms(self) -> list[float]:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            return [a.elapsed_time(b) for a, b in zip(self.marks, self.marks[1:])]
        return [(b - a) * 1e3 for a, b in zip(self.marks, self.marks[1:])]

    def cpu_steps_ms(self) -> list[float]:
        return [(b - a) * 1e3 for a, b in zip(self.cpu_marks, self.cpu_marks[1:])]


def build(name: str, recipe: str) -> tuple[pl.LightningModule, DemoConfig, dict]:
    """(module, data config, Trainer kwargs) of a named model."""
    use_te = torch.cuda.is_available() and te_available()[0]
    if name in ("hostbound", "codonfm", "tiny"):
        c = {"hostbound": HOSTBOUND, "codonfm": codonfm(4), "tiny": TINY}[name]
        return FusedAdamLM(c, use_te=use_te and name != "tiny", recipe=recipe), c, {}
    if name == "hf":
        import transformers

        cfg = transformers.LlamaConfig(hidden_size=2048, intermediate_size=8192, num_attention_heads=32,
                                       num_key_value_heads=8, num_hidden_layers=16, vocab_size=32000)
        c = DemoConfig(vocab_size=32000, sequence_length=2047, micro_batch_size=4)
        return HFLlama(cfg), c, {"precision": "transformer-engine" if use_te else "bf16-mixed"}
    if name == "moe":  # recipes/moe.py's job: 8 experts top-2, hidden 4096, expert intermediate 14336
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "recipes"))
        from moe import MoELM

        c = DemoConfig(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                       num_hidden_layers=1, vocab_size=1024, sequence_length=2048, micro_batch_size=2)
        return MoELM(c, 8, 2, use_te, recipe), c, {}
    raise SystemExit(f"unknown model {name!r}: hostbound, codonfm, hf, moe or tiny")


def trainer(steps: int, callbacks: list, **kw: Any) -> pl.Trainer:
    return pl.Trainer(max_steps=steps, accelerator="gpu" if torch.cuda.is_available() else "cpu", devices=1,
                      callbacks=callbacks, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0, **kw)


def med(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None
