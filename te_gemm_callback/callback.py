"""Lightning adapter: schedule a GemmProfiler over a few optimizer steps of ``trainer.fit``.

Only adapts: all capture logic lives in :mod:`te_gemm_callback.capture`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from pytorch_lightning.callbacks import Callback

from .adapting import (LiveState, check_arguments, clear_stale_sweep, drop_profiler, finish_profiler, guard,
                       kernel_steps, new_run_id, phase, save_capture, sweep_metrics, write_ranks)
from .capture import GemmCapture, GemmProfiler
from .capture.distributed import gather_captures
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



class GemmProfilerCallback(LiveState, Callback):
    """Capture the GEMMs of a Lightning training job.

    Steps are optimizer steps (all micro-batches of gradient accumulation count as one), scheduled
    like ``torch.profiler.schedule``: ``wait`` steps untouched, ``warmup`` steps instrumented but
    discarded (first-step TE and cuBLAS initialisation stays out), then ``active`` steps recorded.
    The active steps are, in order: ``instrumented_steps`` with the capture instruments attached
    (shapes, owners, precisions), on CUDA a kernels warm-up step, one kernels step (kernel records
    only: per-GEMM GPU time and the kernel breakdown) and an untimed settle step (the records' sync
    drained the GPU queue; warm-up and settle where the window leaves room for a clean step), and
    clean steps with nothing attached, whose median is the step time (see
    :class:`~te_gemm_callback.capture.steps.StepPlan`). Validation is never captured.
    Hooks and modes are removed when the active steps end, when training ends, or on an exception.
    Nothing the callback does can stop the fit: a failure of ours is logged once and skipped.

    Args:
        wait, warmup, active: the schedule, in optimizer steps.
        instrumented_steps: how many of the active steps run instrumented.
        output_dir: where ``gemm_capture.json`` is written (rank zero only).
        nvtx: NVTX range per GEMM and per step (domain ``te_gemm``): True, False, or "auto"
            (only when an NVTX tool such as ``nsys profile`` is listening).
        nsys_capture: cudaProfilerStart/Stop around the active steps; run the job under
            ``nsys profile --capture-range=cudaProfilerApi --capture-range-end=stop``.
        adapters, dispatch_steps: see :class:`~te_gemm_callback.GemmProfiler`.
        sweep: recipes to time on the job's own model and last batch once the active steps end:
            whole training steps (forward, backward, the module's gradient clipping with the
            Trainer's settings, every optimizer's step; ``sweep_steps`` clean steps each after
            ``sweep_warmup`` untimed ones), then everything put back (parameters, optimizer state,
            gradients, TE's FP8 state, RNG), written to ``output_dir/sweep/<recipe>/``. The observed
            step speedups in the report come from here. Manual optimization: forward+backward only.
        sweep_rounds: after the sweep's captures, at least this many rounds in which the recipes
            alternate, ``sweep_steps`` clean steps each; the observed speedup is the median of the
            rounds' ratios, so the host's drift over the sweep cancels, with a 95% interval
            (:func:`~te_gemm_callback.sweep.run_sweep`). 0: none.
        sweep_budget_s: after ``sweep_rounds``, more rounds until every observed speedup's interval
            is within +-2%, for at most this many seconds of rounds.
        set_recipe: ``f(module, recipe_or_None)`` for models that enter te.autocast themselves
            (default: set ``module.recipe`` when the module has that attribute).
        sweep_plan: a precision plan (``te-gemm plan``'s ``precision_plan.json``, or a
            :class:`~te_gemm_callback.plan.PrecisionPlan`) swept after the recipes as ``"plan"``,
            observed against its predicted speedup and the best single recipe (BF16 and the
            plan's recipe are added to ``sweep``).
        kernel_breakdown: on CUDA, the kernels step among the active ones (and one per swept
            recipe): per-GEMM kernel times, kernel time per category (GEMM, attention,
            quantization/cast, norm, communication, optimizer, other) and the communication time
            no compute kernel overlapped, in the capture's meta.
        verbose: print the capture table when done.

    Example:
        >>> trainer = pl.Trainer(callbacks=[GemmProfilerCallback(active=6)])   # doctest: +SKIP
    """

    def __init__(self, wait: int = 1, warmup: int = 1, active: int = 6, output_dir: str | Path = "te_gemm",
                 nvtx: bool | str = "auto", nsys_capture: bool = False, adapters: Sequence[str] = ("te", "torch"),
                 dispatch_steps: int | str | None = None, verbose: bool = True,
                 filename: str = "gemm_capture.json", sweep: Sequence[str] | None = None,
                 sweep_steps: int = 3, set_recipe: Any = None, kernel_breakdown: bool = True,
                 sweep_warmup: int = 2, instrumented_steps: int = 1, sweep_plan: Any = None,
                 sweep_rounds: int = 6, sweep_budget_s: float = 20.0) -> None:
        sweep, self.sweep_plan = check_arguments(
            wait=wait, warmup=warmup, active=active, instrumented_steps=instrumented_steps, sweep_warmup=sweep_warmup,
            sweep_steps=sweep_steps, dispatch_steps=dispatch_steps, adapters=adapters, filename=filename, sweep=sweep,
            sweep_plan=sweep_plan, sweep_rounds=sweep_rounds, sweep_budget_s=sweep_budget_s, set_recipe=set_recipe,
            output_dir=output_dir)
        self.sweep_rounds, self.sweep_budget_s = sweep_rounds, sweep_budget_s
        self.wait, self.warmup, self.active = wait, warmup, active
        self.instrumented_steps = instrumented_steps
        self.run_id: str | None = None  # meta["run_id"] of this fit's capture and of its sweep's
        self.output_dir = Path(output_dir)
        self.filename = filename
        self.profiler_kwargs = dict(adapters=tuple(adapters), dispatch_steps=dispatch_steps, nvtx=nvtx)
        self.nsys_capture = nsys_capture
        self.verbose = verbose
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
        self.kernel_breakdown = kernel_breakdown
        self._prof: GemmProfiler | None = None
        self._phase: str | None = None
        self._micro_batches = 0
        self._resumed = False

    @property
    def state_key(self) -> str:
        # One per output file: two callbacks writing different captures coexist in one Trainer (and
        # in its checkpoints); two writing the same file are refused by Lightning at Trainer(...).
        # A resumed fit finds its state by the same output path.
        return self._generate_state_key(output=str(self.output_dir / self.filename))

    @property
    def _legacy_state_key(self) -> Any:
        return type(self).__qualname__  # the key of checkpoints written before state_key named the output

    # --- schedule --------------------------------------------------------------------------
    def phase(self, step: int) -> str:
        return phase(step, self.wait, self.warmup, self.active)

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
    def on_fit_start(self, trainer: "Trainer", pl_module: "LightningModule") -> None:
        end = self.wait + self.warmup + self.active
        if self.done and not self._resumed:
            log.warning("te-gemm: this GemmProfilerCallback already captured a fit (%s): it captures nothing in this one; "
                        "give each fit its own callback", self.path or "its capture")
        elif trainer.max_steps is not None and 0 <= trainer.max_steps < end:
            log.warning("te-gemm: max_steps=%d ends before the capture window (steps %d-%d): %s", trainer.max_steps,
                        self.wait + self.warmup + 1, end,
                        "nothing will be captured" if trainer.max_steps <= self.wait + self.warmup else
                        f"only {trainer.max_steps - self.wait - self.warmup} of {self.active} active step(s) will be")

    @override
    def on_train_batch_start(self, trainer: "Trainer", pl_module: "LightningModule", batch: Any,
                             batch_idx: int) -> None:
        if self.done:
            return
        first, _, _ = self._micro(trainer, batch_idx)
        self._last_batch = (batch, batch_idx)
        if first:
            phase = self.phase(self.steps_seen)
            if phase in ("warmup", "active") and (self._prof is None or phase != self._phase):
                self._finish(trainer, keep=False)
                # guard() gives False on a failure: no profiler then, not a False one.
                self._prof = self._guard(lambda: self._new_profiler(pl_module, phase),
                                         "could not start capturing") or None
                self._phase = phase if self._prof is not None else None
                # Reported once: capture turns itself off rather than retry (and warn) every step.
                self.done = self._prof is None
                self._micro_batches = 1
                return
        if self._prof is not None:
            self._prof.resume()
            self._micro_batches += 1

    def _new_profiler(self, pl_module: "LightningModule", phase: str) -> GemmProfiler:
        # Attach now, not in setup: the precision plugin has already swapped in TE layers.
        active = phase == "active"
        kernels = active and self.kernel_breakdown and self._kernels_possible(pl_module)
        return GemmProfiler(pl_module, nsys_capture=self.nsys_capture and active,
                            instrumented_steps=self.instrumented_steps if active else "all",
                            **kernel_steps(kernels, self.active, self.instrumented_steps),
                            kernel_profile=self._kernel_recorder() if kernels else None,
                            **self.profiler_kwargs).start()

    @staticmethod
    def _kernels_possible(pl_module: "LightningModule") -> bool:
        # The model's device, not the host's: a CPU job on a machine with a GPU has no kernels.
        return getattr(pl_module.device, "type", "cpu") == "cuda"

    @staticmethod
    def _kernel_recorder() -> Any:
        return None  # GemmProfiler's own KernelProfile; tests put a stand-in here

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
            prof = self._prof

            def advance() -> None:
                prof.resume()
                prof.step(micro_batches=self._micro_batches)
                prof.pause()

            if self._guard(advance, "capture stopped") is False:
                self._drop()
            self._micro_batches = 0
        else:
            self._finish(trainer, keep=self._phase == "active")
            self.done = next_phase == "done"

    @override
    def on_train_end(self, trainer: "Trainer", pl_module: "LightningModule") -> None:
        if self._prof is None and not self.done and self.capture is None:
            self._warn_incomplete(trainer)
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
        self._resumed = True
        if not self.done and self.wait <= self.steps_seen < self.wait + self.warmup + self.active:
            # Resumed inside the window: the new process has neither warmed up nor captured the
            # window's first steps. Start the window again from here, warm-up first.
            log.warning("te-gemm: resumed at step %d, inside the capture window: capturing again from here "
                        "(warm-up first)", self.steps_seen)
            self.wait = self.steps_seen

    # --- results ---------------------------------------------------------------------------
    _guard = staticmethod(guard)

    def _drop(self) -> None:
        prof, self._prof, self._phase = self._prof, None, None
        if prof is not None:
            drop_profiler(prof)

    def _warn_incomplete(self, trainer: "Trainer") -> None:
        first = self.wait + self.warmup
        log.warning("te-gemm: training ended after %d step(s), before the capture window (steps %d-%d): nothing "
                    "was captured; lower wait/warmup or train longer", self.steps_seen, first + 1, first + self.active)

    def _stop(self) -> GemmCapture | None:
        prof, self._prof = self._prof, None
        if prof is None:
            return None
        self._phase = None
        return finish_profiler(prof, self._micro_batches)

    def _finish(self, trainer: "Trainer", keep: bool) -> None:
        phase = self._phase
        cap = self._stop()
        if cap is not None and keep and phase == "active":
            if len(cap.steps) < self.active:
                log.warning("te-gemm: training ended inside the capture window: %d of %d active step(s) captured "
                            "(kinds: %s)", len(cap.steps), self.active, ", ".join(s.kind for s in cap.steps))
            self._publish(trainer, cap)
            self.done = True

    def _publish(self, trainer: "Trainer", cap: GemmCapture) -> None:
        """Gather (collective), save, print, sweep and log the active steps' capture."""
        cap.meta["accumulate_grad_batches"] = int(trainer.accumulate_grad_batches)
        cap.meta["global_step_end"] = int(trainer.global_step)
        cap.meta["run_id"] = self.run_id = new_run_id()
        # Collective, on every rank whatever its capture holds: a rank that skipped it would hang.
        gathered = self._guard(lambda: gather_captures(cap), "captures of the other ranks not gathered")
        if not cap.steps:
            return
        self.capture = cap
        if trainer.is_global_zero:
            self._guard(lambda: self._save(cap, gathered or None), f"capture not written to {self.output_dir}")
        metrics = self._guard(lambda: summary_metrics(cap), "no summary metrics") or {}
        if self.sweep and self._last_batch is not None:
            metrics.update(self._guard(lambda: self._run_sweep(trainer, cap), "recipe sweep failed and was skipped")
                           or {})
        for logger in trainer.loggers:
            self._guard(lambda: logger.log_metrics(metrics, step=trainer.global_step), "metrics not logged")

    def _save(self, cap: GemmCapture, gathered: list[GemmCapture] | None) -> None:
        # Written before anything is printed: a table that cannot be printed never costs the capture.
        self.path = save_capture(cap, self.output_dir, self.filename, keep_existing=self._resumed)
        if gathered is not None and len(gathered) > 1:
            self.rank_summary = write_ranks(gathered, self.output_dir)
        log.info("te-gemm: capture written to %s", self.path)
        if not self._resumed:  # a resumed job's folder keeps the first process's run beside this one
            self._guard(lambda: clear_stale_sweep(self.output_dir, self.run_id), "stale sweep captures not removed")
        if self.verbose:
            def show() -> None:
                print_table(capture_table(cap, limit=40))
                if self.rank_summary is not None:
                    print_table(ranks_table(self.rank_summary))

            self._guard(show, "capture table not printed")

    def _run_sweep(self, trainer: "Trainer", cap: GemmCapture) -> dict[str, float]:
        from .analysis import capture_recipe
        from .sweep import run_sweep

        module = trainer.lightning_module
        batch, batch_idx = self._last_batch
        set_recipe = self.set_recipe
        if set_recipe is None and hasattr(module, "recipe"):
            original = module.recipe

            def set_recipe(m: Any, r: Any) -> None:
                m.recipe = original if r is None else r

        def step() -> Any:
            had = "log" in module.__dict__
            log_fn = module.__dict__.get("log")
            module.log = lambda *a, **k: None  # sweep steps are not training steps: log nothing
            try:
                return module.training_step(batch, batch_idx)
            finally:
                if had:
                    module.log = log_fn
                else:  # the class's log was in use: an instance attribute left here would shadow it forever
                    del module.log

        optimizers = list(trainer.optimizers) if module.automatic_optimization else []

        def optimizer_step() -> None:
            # What Lightning's automatic optimization runs after backward: the module's clipping hook
            # with the Trainer's settings, then each optimizer's step. Not through LightningOptimizer,
            # whose step hooks advance the fit's step counters.
            for opt in optimizers:
                module.configure_gradient_clipping(opt, gradient_clip_val=trainer.gradient_clip_val,
                                                   gradient_clip_algorithm=trainer.gradient_clip_algorithm)
                opt.step()

        plugin = getattr(trainer.strategy, "precision_plugin", None)
        context = getattr(plugin, "forward_context", None)
        out_dir = self.output_dir / "sweep" if trainer.is_global_zero else None
        if out_dir is not None and out_dir.is_symlink():  # run_sweep checks only the folders below it
            raise ValueError(f"{out_dir} is a symbolic link: the sweep writes only into real folders")
        res = self.sweep_result = run_sweep(module, step, self.sweep, steps=self.sweep_steps,
                                            warmup=self.sweep_warmup, profile_kernels=self.kernel_breakdown,
                                            set_recipe=set_recipe, context=context, out_dir=out_dir,
                                            job_recipe=capture_recipe(cap), nvtx=self.profiler_kwargs["nvtx"],
                                            plan=self.sweep_plan, rounds=self.sweep_rounds,
                                            budget_s=self.sweep_budget_s, optimizers=optimizers,
                                            optimizer_step=optimizer_step if optimizers else None,
                                            run_id=self.run_id)
        return sweep_metrics(res)
