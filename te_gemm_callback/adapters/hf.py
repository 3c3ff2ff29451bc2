"""Hugging Face ``transformers.Trainer`` adapter: the Trainer's events mapped onto
:class:`~te_gemm_callback.schedule.GemmSchedule` (the only module that imports ``transformers``)."""

from __future__ import annotations

from typing import Any

from te_gemm_callback.capture.scope import compiled_wrapper
from te_gemm_callback.precisions import warn_once
from te_gemm_callback.printable import error_text
from te_gemm_callback.reporting.loggers import hf_logging_dir, to_report_to
from te_gemm_callback.schedule import (
    GemmSchedule,
    JobStep,
    ScheduleResults,
    SweepJob,
    accumulated,
    guard,
    own_batch,
    schedule_doc,
    schedule_signature,
)
from te_gemm_callback.sweep.host_state import HostState

try:
    from transformers import TrainerCallback
except ImportError as err:  # pragma: no cover - exercised where transformers is absent
    raise ImportError("te_gemm_callback.adapters.hf needs transformers: pip install transformers") from err


class GemmProfilerTrainerCallback(ScheduleResults, TrainerCallback):
    """Capture the GEMMs of a ``transformers.Trainer`` job.

    The window and every argument are :class:`~te_gemm_callback.schedule.GemmSchedule`'s, in
    optimizer steps. Metrics, figures and the verdict table go to the job's ``report_to``
    integrations. With ``sweep``, each recipe is timed once training ends: whole steps on a batch of
    the training data (clipping to ``max_grad_norm``, the optimizer's step; all state put back).

    Example:
        >>> trainer = Trainer(model, args, train_dataset=ds,                    # doctest: +SKIP
        ...                   callbacks=[GemmProfilerTrainerCallback(active=6)])
    """

    def __init__(self, **schedule: Any) -> None:
        if "name" in schedule:  # the schedule's name is the callback's own
            raise TypeError(f"{type(self).__name__}() takes no 'name': it names itself in what it logs")
        self.schedule = GemmSchedule(name=type(self).__name__, **schedule)
        self._logging_dir: str | None = None  # the Trainer's TensorBoard run
        self._running: Any = None  # the compiled wrapper the Trainer runs (torch_compile=True)

    __init__.__signature__ = schedule_signature()  # type: ignore[attr-defined]  # help() and IDEs show the schedule's arguments

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        import time

        if int(state.global_step) > 0 and not self.schedule.steps_seen:
            self._resumed(int(state.global_step))
        self.schedule.fit_start(state.max_steps if state.max_steps > 0 else None)
        # The Trainer's TensorBoard callback made its run just now, before ours.
        self._logging_dir = _logging_dir(args, since=time.time() - 60)

    def _resumed(self, step: int) -> None:
        """A run resumed from a checkpoint at ``step``: the Trainer keeps no callback state by default, so
        the window is placed against the job's step and an earlier capture in output_dir is kept."""
        sched, cfg = self.schedule, self.schedule.report_config
        earlier = cfg.output_dir / cfg.filename
        if step >= sched._window()[1] and not earlier.is_file():
            return  # past the window with no capture of it: this process's own window, as in a fresh run
        sched.load_state_dict({"steps_seen": step, "done": step >= sched._window()[1],
                               "path": str(earlier) if earlier.is_file() else None})

    def on_step_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if getattr(args, "torch_compile", False) and model is not None and self._running is not False:
            # The Trainer hands its callbacks the model it was given, and runs a compiled wrapper of it.
            known = self._running  # False once searched in vain (a failure said once): not searched again
            found = guard(lambda: compiled_wrapper(model, known), "the compiled model was not found")
            self._running = False if found is None else found
            if self._running is not False:
                model = self._running
        self.schedule.step_begin(model)

    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.schedule.micro_batch_begin()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.schedule.step_end(self._job(args, state, kwargs, sweep=False))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # The sweep waits for the end of training, when the model, optimizer and data are no longer the job's.
        self.schedule.train_end(self._job(args, state, kwargs, sweep=True))

    def _job(self, args: Any, state: Any, kwargs: dict, sweep: bool) -> JobStep:
        if self._logging_dir is None:  # events before on_train_begin
            self._logging_dir = _logging_dir(args)
        logging_dir = self._logging_dir

        def log(metrics: dict, files: dict) -> None:  # to every integration in the job's report_to
            to_report_to(args.report_to, logging_dir, metrics, files, int(state.global_step))

        return JobStep(global_step=int(state.global_step), accumulate=int(args.gradient_accumulation_steps),
                       writes=bool(state.is_world_process_zero), log_metrics=lambda m: log(m, {}),
                       log_artifacts=lambda files: log({}, files),
                       sweep=(lambda: _sweep_job(args, kwargs, self._running)) if sweep else None)


GemmProfilerTrainerCallback.__doc__ = schedule_doc(GemmProfilerTrainerCallback.__doc__ or "")


def _logging_dir(args: Any, since: float | None = None) -> str | None:
    """The Trainer's TensorBoard run (:func:`hf_logging_dir`); None, said once, where it cannot be told."""
    try:
        return hf_logging_dir(args, since=since)
    except Exception as err:  # at the hook boundary: the job's training goes on
        warn_once(f"te-gemm: the Trainer's TensorBoard folder could not be found ({error_text(err)}): "
                  "metrics and figures go to its other integrations only")
        return None


def _sweep_job(args: Any, kwargs: dict, running: Any = None) -> SweepJob:
    """The sweep's steps: ``running`` (the compiled wrapper the job ran, where found) on a batch of the job's data."""
    import torch
    model = running if running is not None and running is not False else kwargs.get("model")
    loader = kwargs.get("train_dataloader")
    if model is None or loader is None:
        raise ValueError("the Trainer passed no model or train_dataloader to its callbacks")
    # A batch of the job's own data; a fresh iterator draws from the RNGs, which are put back.
    drawn = HostState(torch.nn.Module(), [loader, getattr(loader, "sampler", None)])
    it = iter(loader)
    batch = next(it)
    drawn.restore()
    if callable(end := getattr(loader, "end", None)):
        # accelerate's loader registered itself with the GradientState as it began; this iteration
        # ends here, unfinished, so it never leaves on its own.
        end()
    del it
    device = next(model.parameters()).device
    # Copied: .to() of a tensor already there is the tensor, and the sweep's steps may change it in place.
    batch = own_batch({k: v.to(device) if hasattr(v, "to") else v for k, v in batch.items()})
    dtype = torch.bfloat16 if args.bf16 else torch.float16 if args.fp16 else None
    context = (lambda: torch.autocast(device.type, dtype=dtype)) if dtype is not None else None
    opt = kwargs.get("optimizer")
    optimizers = [getattr(opt, "optimizer", opt)] if opt is not None else []  # accelerate wraps it

    def optimizer_step() -> None:
        # What the Trainer runs after backward; not the scheduler: the sweep's steps are not the job's.
        if args.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        optimizers[0].step()

    one = accumulated(lambda: model(**batch), max(int(args.gradient_accumulation_steps), 1))

    def step() -> Any:
        # In train mode like the job's steps; the sweep puts back the mode the job left (eval after an evaluation).
        model.train()
        return one()

    return SweepJob(model, step, optimizers, optimizer_step if optimizers else None, context,
                    rng_objects=[loader, getattr(loader, "sampler", None)])
