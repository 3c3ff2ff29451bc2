"""Hugging Face ``transformers.Trainer`` adapter: the Lightning callback's schedule and outputs.

Only adapts: the capture is :class:`~te_gemm_callback.GemmProfiler`, what the two adapters share
is in :mod:`te_gemm_callback.adapting`. ``transformers`` stays an optional dependency: this module
is the only one that imports it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Sequence

from .adapting import (LiveState, check_arguments, clear_stale_sweep, drop_profiler, finish_profiler, guard,
                       kernel_steps, new_run_id, phase, save_capture, sweep_metrics, write_ranks)
from .capture import GemmCapture, GemmProfiler
from .capture.distributed import gather_captures
from .render import capture_table, print_table, summary_metrics

try:
    from transformers import TrainerCallback
except ImportError as err:  # pragma: no cover - exercised where transformers is absent
    raise ImportError("te_gemm_callback.hf needs transformers: pip install transformers") from err

log = logging.getLogger("te_gemm_callback")


class GemmProfilerTrainerCallback(LiveState, TrainerCallback):
    """Capture the GEMMs of a ``transformers.Trainer`` job.

    The schedule is the Lightning callback's, in optimizer steps (all micro-batches of gradient
    accumulation are one step): ``wait`` untouched, ``warmup`` instrumented and discarded, then
    ``active`` steps: ``instrumented_steps`` instrumented, on CUDA a kernels warm-up and one kernels step, the rest clean
    (nothing attached: the step time). ``output_dir/gemm_capture.json`` is written on the main
    process (every rank's under ``ranks/`` in a multi-process job); with ``sweep``, each recipe is
    timed on the job's model once training ends (whole steps on a batch of its training data:
    forward, backward, clipping to ``max_grad_norm``, the optimizer's step; model, optimizer and
    TE state, gradients and RNG put back) and written to ``output_dir/sweep/<recipe>/``, so
    ``te-gemm report output_dir`` gives the verdicts. Nothing here can stop training.

    Args: as :class:`~te_gemm_callback.GemmProfilerCallback`.

    Example:
        >>> trainer = Trainer(model, args, train_dataset=ds,                    # doctest: +SKIP
        ...                   callbacks=[GemmProfilerTrainerCallback(active=6)])
    """

    def __init__(self, wait: int = 1, warmup: int = 1, active: int = 6, output_dir: str | Path = "te_gemm",
                 nvtx: bool | str = "auto", adapters: Sequence[str] = ("te", "torch"), dispatch_steps: int | str | None = None,
                 verbose: bool = True, filename: str = "gemm_capture.json", sweep: Sequence[str] | None = None,
                 sweep_steps: int = 3, sweep_warmup: int = 2, kernel_breakdown: bool = True,
                 instrumented_steps: int = 1, sweep_plan: Any = None, sweep_rounds: int = 6,
                 sweep_budget_s: float = 20.0) -> None:
        self.sweep, self.sweep_plan = check_arguments(
            wait=wait, warmup=warmup, active=active, instrumented_steps=instrumented_steps, sweep_warmup=sweep_warmup,
            sweep_steps=sweep_steps, dispatch_steps=dispatch_steps, adapters=adapters, filename=filename, sweep=sweep,
            sweep_plan=sweep_plan, sweep_rounds=sweep_rounds, sweep_budget_s=sweep_budget_s,
            output_dir=output_dir)
        self.sweep_rounds, self.sweep_budget_s = sweep_rounds, sweep_budget_s
        self.wait, self.warmup, self.active = wait, warmup, active
        self.instrumented_steps, self.kernel_breakdown = instrumented_steps, kernel_breakdown
        self.output_dir, self.filename, self.verbose = Path(output_dir), filename, verbose
        self.sweep_steps, self.sweep_warmup = sweep_steps, sweep_warmup
        self.profiler_kwargs = dict(adapters=tuple(adapters), dispatch_steps=dispatch_steps, nvtx=nvtx)
        self.steps_seen = 0
        self.done = False
        self.capture: GemmCapture | None = None
        self.path: Path | None = None
        self.sweep_result: Any = None
        self.metrics: dict[str, float] = {}
        self.run_id: str | None = None  # meta["run_id"] of this run's capture and of its sweep's
        self._prof: GemmProfiler | None = None
        self._phase: str | None = None
        self._micro_batches = 0

    # --- hooks -----------------------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        end = self.wait + self.warmup + self.active
        if self._prof is not None:
            # The Trainer has no exception hook: an earlier train() that raised inside the window left
            # its capture open (GemmProfiler already took its instruments off when the exception went
            # through the model's forward). Dropped here; the window starts again, warm-up first.
            log.warning("te-gemm: an earlier train() ended inside the capture window: its capture is dropped, "
                        "capturing again from step %d (warm-up first)", self.steps_seen + 1)
            self._drop()
            self.wait = self.steps_seen
        if self.done:
            log.warning("te-gemm: this GemmProfilerTrainerCallback already captured a run (%s): it captures nothing "
                        "in this one; give each run its own callback", self.path or "its capture")
        elif 0 < state.max_steps < end:
            log.warning("te-gemm: max_steps=%d ends before the capture window (steps %d-%d)", state.max_steps,
                        self.wait + self.warmup + 1, end)

    def on_step_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if self.done:
            return
        ph = phase(self.steps_seen, self.wait, self.warmup, self.active)
        if ph in ("warmup", "active") and (self._prof is None or ph != self._phase):
            self._finish(args, state, kwargs, keep=False)
            self._prof = guard(lambda: self._new_profiler(model, ph), "could not start capturing") or None
            self._phase = ph if self._prof is not None else None
            # Reported once: capture turns itself off rather than retry (and warn) every step.
            self.done = self._prof is None
        elif self._prof is not None:
            guard(self._prof.resume, "capture stopped")
        self._micro_batches = 1

    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._micro_batches += 1  # another micro-batch of the same optimizer step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.done:
            return
        self.steps_seen += 1
        if self._prof is None:
            return
        nxt = phase(self.steps_seen, self.wait, self.warmup, self.active)
        if nxt == self._phase:
            prof = self._prof

            def advance() -> None:
                prof.step(micro_batches=self._micro_batches)
                prof.pause()  # logging, evaluation and saving between steps are not ours

            if guard(advance, "capture stopped") is False:
                self._drop()
        else:
            self._finish(args, state, kwargs, keep=self._phase == "active")
            self.done = nxt == "done"

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._prof is None and not self.done and self.capture is None:
            log.warning("te-gemm: training ended after %d step(s), before the capture window: nothing was captured; "
                        "lower wait/warmup or train longer", self.steps_seen)
        self._finish(args, state, kwargs, keep=self._phase == "active")
        if self.capture is not None and self.sweep and self.sweep_result is None:
            self.metrics.update(guard(lambda: self._run_sweep(args, kwargs), "recipe sweep failed and was skipped") or {})

    # --- results ---------------------------------------------------------------------------
    def _new_profiler(self, model: Any, ph: str) -> GemmProfiler:
        active = ph == "active"
        on_cuda = any(p.is_cuda for p in model.parameters())
        return GemmProfiler(model, instrumented_steps=self.instrumented_steps if active else "all",
                            **kernel_steps(active and self.kernel_breakdown and on_cuda, self.active,
                                           self.instrumented_steps),
                            **self.profiler_kwargs).start()

    def _drop(self) -> None:
        prof, self._prof, self._phase = self._prof, None, None
        if prof is not None:
            drop_profiler(prof)

    def _finish(self, args: Any, state: Any, kwargs: dict, keep: bool) -> None:
        prof, ph = self._prof, self._phase
        self._prof, self._phase = None, None
        cap = finish_profiler(prof, self._micro_batches) if prof is not None else None
        if cap is None:
            return
        if keep and ph == "active":
            if len(cap.steps) < self.active:
                log.warning("te-gemm: training ended inside the capture window: %d of %d active step(s) captured",
                            len(cap.steps), self.active)
            self._publish(args, state, cap)
            self.done = True

    def _publish(self, args: Any, state: Any, cap: GemmCapture) -> None:
        cap.meta["accumulate_grad_batches"] = int(args.gradient_accumulation_steps)
        cap.meta["global_step_end"] = int(state.global_step)
        cap.meta["run_id"] = self.run_id = new_run_id()
        # Collective on every rank whatever its capture holds: a rank that skipped it would hang.
        gathered = guard(lambda: gather_captures(cap), "captures of the other ranks not gathered")
        if not cap.steps:
            return
        self.capture = cap
        if state.is_world_process_zero:
            def save() -> None:
                # Written before anything is printed: a table that cannot be printed never costs the capture.
                self.path = save_capture(cap, self.output_dir, self.filename)
                if gathered and len(gathered) > 1:
                    write_ranks(gathered, self.output_dir)

            if guard(save, f"capture not written to {self.output_dir}") is not False:
                guard(lambda: clear_stale_sweep(self.output_dir, self.run_id), "stale sweep captures not removed")
                if self.verbose:
                    guard(lambda: print_table(capture_table(cap, limit=40)), "capture table not printed")
        self.metrics.update(guard(lambda: summary_metrics(cap), "no summary metrics") or {})

    def _run_sweep(self, args: Any, kwargs: dict) -> dict[str, float]:
        import torch

        from .analysis import capture_recipe
        from .sweep import run_sweep

        model, loader = kwargs.get("model"), kwargs.get("train_dataloader")
        if model is None or loader is None:
            raise ValueError("the Trainer passed no model or train_dataloader to its callbacks")
        # A batch of the job's own data; a fresh iterator draws from the RNG, which is put back.
        rng = torch.get_rng_state()
        batch = next(iter(loader))
        torch.set_rng_state(rng)
        device = next(model.parameters()).device
        batch = {k: v.to(device) if hasattr(v, "to") else v for k, v in batch.items()}

        def step() -> Any:
            return model(**batch)

        dtype = torch.bfloat16 if args.bf16 else torch.float16 if args.fp16 else None
        context = (lambda: torch.autocast(device.type, dtype=dtype)) if dtype is not None else None
        out = self.output_dir / "sweep" if args.process_index == 0 else None
        opt = kwargs.get("optimizer")
        optimizers = [getattr(opt, "optimizer", opt)] if opt is not None else []  # accelerate wraps it

        def optimizer_step() -> None:
            # What the Trainer runs after backward: clipping to args.max_grad_norm, then the
            # optimizer's step (the scheduler is not stepped: the sweep's steps are not the job's).
            if args.max_grad_norm:
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
            optimizers[0].step()

        model.train()
        self.sweep_result = run_sweep(model, step, self.sweep, steps=self.sweep_steps, warmup=self.sweep_warmup,
                                      profile_kernels=self.kernel_breakdown, context=context, out_dir=out,
                                      job_recipe=capture_recipe(self.capture), nvtx=self.profiler_kwargs["nvtx"],
                                      plan=self.sweep_plan, rounds=self.sweep_rounds, budget_s=self.sweep_budget_s,
                                      optimizers=optimizers, optimizer_step=optimizer_step if optimizers else None,
                                      run_id=self.run_id)
        return sweep_metrics(self.sweep_result)
