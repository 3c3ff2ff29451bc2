"""Lightning adapter: schedule a GemmProfiler over a few optimizer steps of ``trainer.fit``.

Only adapts: all capture logic lives in :mod:`te_gemm_callback.capture`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import pytorch_lightning as pl
from pytorch_lightning.callbacks import Callback

from .capture import GemmCapture, GemmProfiler
from .render import capture_table, print_table, summary_metrics

try:
    from typing_extensions import override
except ImportError:  # pragma: no cover
    def override(f):  # type: ignore[no-redef]
        return f

if TYPE_CHECKING:
    from pytorch_lightning import LightningModule, Trainer

log = logging.getLogger("te_gemm_callback")


class GemmProfilerCallback(Callback):
    """Capture the GEMMs of a Lightning training job.

    Steps are optimizer steps (all micro-batches of gradient accumulation count as one), scheduled
    like ``torch.profiler.schedule``: ``wait`` steps untouched, ``warmup`` steps instrumented but
    discarded (first-step TE and cuBLAS initialisation stays out), then ``active`` steps recorded.
    Validation is never captured. Hooks and modes are removed when the active steps end, when
    training ends, or on an exception.

    Args:
        wait, warmup, active: the schedule, in optimizer steps.
        output_dir: where ``gemm_capture.json`` is written (rank zero only).
        nvtx: NVTX range per GEMM and per step (domain ``te_gemm``).
        nsys_capture: cudaProfilerStart/Stop around the active steps; run the job under
            ``nsys profile --capture-range=cudaProfilerApi --capture-range-end=stop``.
        adapters, dispatch_steps: see :class:`~te_gemm_callback.GemmProfiler`.
        verbose: print the capture table when done.

    Example:
        >>> trainer = pl.Trainer(callbacks=[GemmProfilerCallback(active=3)])   # doctest: +SKIP
    """

    def __init__(self, wait: int = 1, warmup: int = 1, active: int = 3, output_dir: str | Path = "te_gemm",
                 nvtx: bool = True, nsys_capture: bool = False, adapters: Sequence[str] = ("te", "torch"),
                 dispatch_steps: int | str | None = None, verbose: bool = True,
                 filename: str = "gemm_capture.json") -> None:
        for name, v in (("wait", wait), ("warmup", warmup), ("active", active)):
            if not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {v!r}")
        if active < 1:
            raise ValueError("active must be >= 1: at least one step has to be captured")
        self.wait, self.warmup, self.active = wait, warmup, active
        self.output_dir = Path(output_dir)
        self.filename = filename
        self.profiler_kwargs = dict(adapters=tuple(adapters), dispatch_steps=dispatch_steps, nvtx=nvtx)
        self.nsys_capture = nsys_capture
        self.verbose = verbose
        self.steps_seen = 0  # optimizer steps completed while this callback watched
        self.done = False
        self.capture: GemmCapture | None = None
        self.path: Path | None = None
        self._prof: GemmProfiler | None = None
        self._phase: str | None = None
        self._micro_batches = 0

    # --- schedule --------------------------------------------------------------------------
    def phase(self, step: int) -> str:
        if step < self.wait:
            return "wait"
        if step < self.wait + self.warmup:
            return "warmup"
        if step < self.wait + self.warmup + self.active:
            return "active"
        return "done"

    @staticmethod
    def _micro(trainer: "Trainer", batch_idx: int) -> tuple[bool, bool, int]:
        acc = max(int(trainer.accumulate_grad_batches), 1)
        last = (batch_idx + 1) % acc == 0 or (batch_idx + 1) == trainer.num_training_batches
        return batch_idx % acc == 0, last, acc

    # --- hooks -----------------------------------------------------------------------------
    @override
    def on_train_batch_start(self, trainer: "Trainer", pl_module: "LightningModule", batch: Any,
                             batch_idx: int) -> None:
        if self.done:
            return
        first, _, _ = self._micro(trainer, batch_idx)
        if first:
            phase = self.phase(self.steps_seen)
            if phase in ("warmup", "active") and (self._prof is None or phase != self._phase):
                self._finish(trainer, keep=False)
                # Attach now, not in setup: the precision plugin has already swapped in TE layers.
                self._prof = GemmProfiler(pl_module, nsys_capture=self.nsys_capture and phase == "active",
                                          **self.profiler_kwargs).start()
                self._phase = phase
                self._micro_batches = 1
                return
        if self._prof is not None:
            self._prof.resume()
            self._micro_batches += 1

    @override
    def on_train_batch_end(self, trainer: "Trainer", pl_module: "LightningModule", outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self.done:
            return
        _, last, _ = self._micro(trainer, batch_idx)
        if self._prof is not None:
            self._prof.pause()  # what runs between batches (validation, logging) is not ours
        if not last:
            return
        self.steps_seen += 1
        if self._prof is None:
            return
        next_phase = self.phase(self.steps_seen)
        if next_phase == self._phase:
            self._prof.resume()
            self._prof.step(micro_batches=self._micro_batches)
            self._prof.pause()
            self._micro_batches = 0
        else:
            self._finish(trainer, keep=self._phase == "active")
            self.done = next_phase == "done"

    @override
    def on_train_end(self, trainer: "Trainer", pl_module: "LightningModule") -> None:
        self._finish(trainer, keep=self._phase == "active")

    @override
    def on_exception(self, trainer: "Trainer", pl_module: "LightningModule", exception: BaseException) -> None:
        self._finish(trainer, keep=False)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"steps_seen": self.steps_seen, "done": self.done,
                "path": str(self.path) if self.path else None}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.steps_seen = int(state_dict.get("steps_seen", 0))
        self.done = bool(state_dict.get("done", False))
        self.path = Path(state_dict["path"]) if state_dict.get("path") else None

    # --- results ---------------------------------------------------------------------------
    def _finish(self, trainer: "Trainer", keep: bool) -> None:
        prof, self._prof = self._prof, None
        if prof is None:
            return
        prof.resume()  # stop() closes the open step with its boundary event
        cap = prof.stop(micro_batches=max(self._micro_batches, 1))
        self._phase = None
        if not keep or not cap.steps:
            return
        cap.meta["accumulate_grad_batches"] = int(trainer.accumulate_grad_batches)
        cap.meta["global_step_end"] = int(trainer.global_step)
        self.capture = cap
        if trainer.is_global_zero:
            self.path = cap.save(self.output_dir / self.filename)
            if self.verbose:
                print_table(capture_table(cap, limit=40))
                log.info("te-gemm: capture written to %s", self.path)
        metrics = summary_metrics(cap)
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
