"""Lightning adapter: schedule a GemmProfiler over a few optimizer steps of ``trainer.fit``.

Only adapts: all capture logic lives in :mod:`te_gemm_callback.capture`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from pytorch_lightning.callbacks import Callback

from .capture import GemmCapture, GemmProfiler
from .capture.distributed import gather_captures, rank_summary
from .jsonio import write_json
from .render import capture_table, print_table, summary_metrics
from .render.tables import ranks_table

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
        sweep: recipes to time on the job's own model and last batch once the active steps end
            (forward+backward, ``sweep_steps`` each after ``sweep_warmup`` untimed ones, no optimizer step; model
            state, gradients and RNG put back), written to ``output_dir/sweep/<recipe>/``. The
            observed step speedups in the report come from here.
        set_recipe: ``f(module, recipe_or_None)`` for models that enter te.autocast themselves
            (default: set ``module.recipe`` when the module has that attribute).
        kernel_breakdown: on CUDA, run torch.profiler (kernels only) over the one step after the
            active ones (steady state, no capture instruments) and store kernel time per category
            (GEMM, attention, quantization/cast, norm, communication, optimizer, other) and the
            communication time no compute kernel overlapped in the capture's meta; the capture is
            written when that step ends. Also one extra profiled step per swept recipe, for the
            verdicts' "where the time went".
        verbose: print the capture table when done.

    Example:
        >>> trainer = pl.Trainer(callbacks=[GemmProfilerCallback(active=3)])   # doctest: +SKIP
    """

    def __init__(self, wait: int = 1, warmup: int = 1, active: int = 3, output_dir: str | Path = "te_gemm",
                 nvtx: bool = True, nsys_capture: bool = False, adapters: Sequence[str] = ("te", "torch"),
                 dispatch_steps: int | str | None = None, verbose: bool = True,
                 filename: str = "gemm_capture.json", sweep: Sequence[str] | None = None,
                 sweep_steps: int = 3, set_recipe: Any = None, kernel_breakdown: bool = True,
                 sweep_warmup: int = 2) -> None:
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
        if sweep is not None:
            from .precisions import canonical

            sweep = [canonical(r) for r in sweep]  # bad names fail here, not after training
        if sweep_steps < 1:
            raise ValueError("sweep_steps must be >= 1")
        if sweep_warmup < 0:
            raise ValueError("sweep_warmup must be >= 0")
        self.sweep_warmup = sweep_warmup
        self.sweep, self.sweep_steps, self.set_recipe = sweep, sweep_steps, set_recipe
        self.sweep_result: Any = None
        self.rank_summary: list[dict] | None = None
        self.rank = 0  # this process's global rank, known once the trainer is set up
        self._last_batch: Any = None
        self.steps_seen = 0  # optimizer steps completed while this callback watched
        self.done = False
        self.capture: GemmCapture | None = None
        self.path: Path | None = None
        self._prof: GemmProfiler | None = None
        self._phase: str | None = None
        self._micro_batches = 0
        self.kernel_breakdown = kernel_breakdown
        self._kprof: Any = None  # torch.profiler over the step after the active ones
        self._pending: GemmCapture | None = None  # captured, waiting for its kernel-profiled step
        self._kstart: Any = None  # CUDA event at the start of the profiled step

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
    def setup(self, trainer: "Trainer", pl_module: "LightningModule", stage: str) -> None:
        self.rank = int(trainer.global_rank)

    @override
    def on_train_batch_start(self, trainer: "Trainer", pl_module: "LightningModule", batch: Any,
                             batch_idx: int) -> None:
        if self.done:
            return
        first, _, _ = self._micro(trainer, batch_idx)
        self._last_batch = (batch, batch_idx)
        if first and self._pending is not None and self._kprof is None:
            # The step after the active ones starts: profile it from here, not from the end of the
            # last active step, so validation run between the two stays out of the window.
            self._start_kernel_profile()
            return
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
        if self._pending is not None:  # the kernel-profiled step after the active ones just ended
            self._stop_kernel_profile(steps=1)
            self._publish(trainer)
            self.done = True
            return
        if self._prof is None:
            return
        next_phase = self.phase(self.steps_seen)
        if next_phase == self._phase:
            self._prof.resume()
            self._prof.step(micro_batches=self._micro_batches)
            self._prof.pause()
            self._micro_batches = 0
        elif self._phase == "active" and self._profile_next_step(pl_module):
            # Same decision on every rank (it depends on flags and CUDA only), so the collective
            # gather in _publish runs at the same step everywhere, profiler started or not. The
            # profiler starts with the next step (on_train_batch_start).
            self._pending = self._stop()
        else:
            self._finish(trainer, keep=self._phase == "active")
            self.done = next_phase == "done"

    @override
    def on_train_end(self, trainer: "Trainer", pl_module: "LightningModule") -> None:
        if self._pending is not None:  # training ended before the profiled step: publish without it
            self._discard_kernel_profile()
            self._publish(trainer)
            self.done = True
            return
        self._finish(trainer, keep=self._phase == "active")

    @override
    def on_exception(self, trainer: "Trainer", pl_module: "LightningModule", exception: BaseException) -> None:
        self._discard_kernel_profile()
        self._pending = None
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
    def _profile_next_step(self, pl_module: "LightningModule") -> bool:
        # The model's device, not the host's: a CPU job on a machine with a GPU has no kernels.
        return self.kernel_breakdown and getattr(pl_module.device, "type", "cpu") == "cuda"

    def _start_kernel_profile(self) -> None:
        import torch

        try:
            # The step's own GPU time too: it runs without capture instruments, so it is the step
            # time to set against steps captured under the torch dispatch mode.
            self._kstart = torch.cuda.Event(enable_timing=True)
            self._kprof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
            self._kprof.__enter__()
            self._kstart.record()
        except Exception as err:  # e.g. another profiler is already running in this job
            self._kprof = None
            log.warning("te-gemm: no kernel breakdown (torch.profiler could not start: %s)", err)

    def _stop_kernel_profile(self, steps: int) -> None:
        import torch

        from .kernels import breakdown_ms, comm_overlap_ms, kernel_intervals, kernel_times_us, top_kernels_ms

        kp, self._kprof = self._kprof, None
        if kp is None or self._pending is None:
            return
        try:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            torch.cuda.synchronize()  # the profiled step's kernels must finish inside the window
            kp.__exit__(None, None, None)
            self._pending.meta["profiled_step_ms"] = self._kstart.elapsed_time(end)
            us = kernel_times_us(kp)
            self._pending.meta.update({"kernel_breakdown_ms": breakdown_ms(us, steps),
                                       "kernel_top_ms": top_kernels_ms(us, steps), "kernel_breakdown_steps": steps,
                                       "kernel_breakdown_window": "the step after the active ones",
                                       **comm_overlap_ms(kernel_intervals(kp), steps)})
        except Exception as err:
            log.warning("te-gemm: no kernel breakdown: %s: %s", type(err).__name__, err)

    def _discard_kernel_profile(self) -> None:
        kp, self._kprof = self._kprof, None
        if kp is not None:
            try:
                kp.__exit__(None, None, None)
            except Exception:  # already broken: nothing of it is used
                pass

    def _stop(self) -> GemmCapture | None:
        prof, self._prof = self._prof, None
        if prof is None:
            return None
        prof.resume()  # stop() closes the open step with its boundary event
        cap = prof.stop(micro_batches=max(self._micro_batches, 1))
        self._phase = None
        return cap

    def _finish(self, trainer: "Trainer", keep: bool) -> None:
        cap = self._stop()
        if cap is not None and keep:
            self._pending = cap
            self._publish(trainer)

    def _publish(self, trainer: "Trainer") -> None:
        """Gather (collective), save, print, sweep and log the active steps' capture."""
        cap, self._pending = self._pending, None
        if cap is None:
            return
        cap.meta["accumulate_grad_batches"] = int(trainer.accumulate_grad_batches)
        cap.meta["global_step_end"] = int(trainer.global_step)
        # Collective, on every rank whatever its capture holds: a rank that skipped it would hang.
        gathered = gather_captures(cap)
        if not cap.steps:
            return
        self.capture = cap
        if trainer.is_global_zero:
            self.path = cap.save(self.output_dir / self.filename)
            if gathered is not None and len(gathered) > 1:
                self._write_ranks(gathered)
            if self.verbose:
                print_table(capture_table(cap, limit=40))
                log.info("te-gemm: capture written to %s", self.path)
        metrics = summary_metrics(cap)
        if self.sweep and self._last_batch is not None:
            metrics.update(self._run_sweep(trainer, cap))
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)

    def _write_ranks(self, caps: list[GemmCapture]) -> None:
        for c in caps:
            c.save(self.output_dir / "ranks" / f"rank{c.meta.get('rank')}.json")
        summary = rank_summary(caps)
        write_json(self.output_dir / "ranks" / "summary.json", summary)
        self.rank_summary = summary
        if self.verbose:
            print_table(ranks_table(summary))

    def _run_sweep(self, trainer: "Trainer", cap: GemmCapture) -> dict[str, float]:
        from .analysis import analyze, capture_recipe
        from .sweep import run_sweep

        module = trainer.lightning_module
        batch, batch_idx = self._last_batch
        set_recipe = self.set_recipe
        if set_recipe is None and hasattr(module, "recipe"):
            original = module.recipe

            def set_recipe(m: Any, r: Any) -> None:
                m.recipe = original if r is None else r

        def step() -> Any:
            log_fn = module.log
            module.log = lambda *a, **k: None  # sweep steps are not training steps: log nothing
            try:
                return module.training_step(batch, batch_idx)
            finally:
                module.log = log_fn

        plugin = getattr(trainer.strategy, "precision_plugin", None)
        context = getattr(plugin, "forward_context", None)
        out_dir = self.output_dir / "sweep" if trainer.is_global_zero else None
        try:
            res = self.sweep_result = run_sweep(module, step, self.sweep, steps=self.sweep_steps,
                                                warmup=self.sweep_warmup, profile_kernels=self.kernel_breakdown,
                                                set_recipe=set_recipe, context=context, out_dir=out_dir,
                                                job_recipe=capture_recipe(cap),
                                                nvtx=self.profiler_kwargs["nvtx"])
        except Exception as err:  # the sweep is extra: never fail the job for it
            log.warning("te-gemm: recipe sweep failed and was skipped: %s: %s", type(err).__name__, err)
            return {}
        for r, why in res.skipped.items():
            log.warning("te-gemm: sweep skipped %s: %s", r, why)
        if not res.captures:
            return {}
        caps = list(res.captures.values())
        try:
            rep = analyze(caps[0], None, caps[1:])
        except ValueError:
            return {}
        out = {}
        for a in rep.recipes:
            if a.observed_step_speedup is not None:
                out[f"te_gemm/observed_step_speedup/{a.recipe}"] = a.observed_step_speedup
            if a.observed_step_ms is not None:
                out[f"te_gemm/sweep_step_ms/{a.recipe}"] = a.observed_step_ms
        return out
