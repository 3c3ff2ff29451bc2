"""Hugging Face ``transformers.Trainer`` adapter: the Trainer's events mapped onto
:class:`~te_gemm_callback.schedule.GemmSchedule`.

Only adapts: the schedule, the capture and the sweep live in the framework-free core.
``transformers`` stays an optional dependency: this module is the only one that imports it.
"""

from __future__ import annotations

from typing import Any

from te_gemm_callback.schedule import (
    GemmSchedule,
    JobStep,
    ScheduleResults,
    SweepJob,
    accumulated,
    schedule_doc,
    schedule_signature,
)

try:
    from transformers import TrainerCallback
except ImportError as err:  # pragma: no cover - exercised where transformers is absent
    raise ImportError("te_gemm_callback.adapters.hf needs transformers: pip install transformers") from err


class GemmProfilerTrainerCallback(ScheduleResults, TrainerCallback):
    """Capture the GEMMs of a ``transformers.Trainer`` job.

    The window, the step plan inside it and every argument are
    :class:`~te_gemm_callback.schedule.GemmSchedule`'s, in optimizer steps (all micro-batches of
    gradient accumulation are one step). ``output_dir/gemm_capture.json`` is written on the main
    process (every rank's under ``ranks/`` in a multi-process job), then benchmarked and reported
    there (``report``); metrics, figures and the verdict table go to the integrations in the job's
    ``report_to`` (TensorBoard, W&B, MLflow). With ``sweep``, each recipe is timed on the job's model
    once training ends: whole steps on a batch of its training data
    (forward, backward, clipping to ``max_grad_norm``, the optimizer's step; model, optimizer and
    TE state, gradients and RNG put back), written to ``output_dir/sweep/<recipe>/``, so
    ``te-gemm report output_dir`` gives the verdicts. Nothing here can stop training.

    Example:
        >>> trainer = Trainer(model, args, train_dataset=ds,                    # doctest: +SKIP
        ...                   callbacks=[GemmProfilerTrainerCallback(active=6)])
    """

    def __init__(self, **schedule: Any) -> None:
        self.schedule = GemmSchedule(name=type(self).__name__, **schedule)
        self._logging_dir: str | None = None  # the Trainer's TensorBoard run, found when training begins

    __init__.__signature__ = schedule_signature()  # type: ignore[attr-defined]  # help() and IDEs show the schedule's arguments

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        import time

        from te_gemm_callback.reporting.loggers import hf_logging_dir

        self.schedule.fit_start(state.max_steps if state.max_steps > 0 else None)
        # The Trainer's TensorBoard run for this job: its callback made it just now, before ours.
        self._logging_dir = hf_logging_dir(args, since=time.time() - 60)

    def on_step_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self.schedule.step_begin(model)

    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.schedule.micro_batch_begin()  # another micro-batch of the same optimizer step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.schedule.step_end(self._job(args, state, kwargs, sweep=False, logging_dir=self._logdir(args)))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # The sweep waits for the end of training: the Trainer hands its callbacks the model, the
        # optimizer and the training data at every event, and none of it is the job's any more.
        self.schedule.train_end(self._job(args, state, kwargs, sweep=True, logging_dir=self._logdir(args)))

    def _logdir(self, args: Any) -> str:
        from te_gemm_callback.reporting.loggers import hf_logging_dir

        if self._logging_dir is None:  # events before on_train_begin
            self._logging_dir = hf_logging_dir(args)
        return self._logging_dir

    @staticmethod
    def _job(args: Any, state: Any, kwargs: dict, sweep: bool, logging_dir: str) -> JobStep:
        from te_gemm_callback.reporting.loggers import to_report_to

        def log(metrics: dict, files: dict) -> None:  # to every integration in the job's report_to
            to_report_to(args.report_to, logging_dir, metrics, files, int(state.global_step))

        return JobStep(global_step=int(state.global_step), accumulate=int(args.gradient_accumulation_steps),
                       writes=bool(state.is_world_process_zero), log_metrics=lambda m: log(m, {}),
                       log_artifacts=lambda files: log({}, files),
                       sweep=(lambda: _sweep_job(args, kwargs)) if sweep else None)


GemmProfilerTrainerCallback.__doc__ = schedule_doc(GemmProfilerTrainerCallback.__doc__ or "")


def _sweep_job(args: Any, kwargs: dict) -> SweepJob:
    import torch

    model, loader = kwargs.get("model"), kwargs.get("train_dataloader")
    if model is None or loader is None:
        raise ValueError("the Trainer passed no model or train_dataloader to its callbacks")
    # A batch of the job's own data; a fresh iterator draws from the RNGs (torch's, a sampler's own
    # generator), which are put back.
    from te_gemm_callback.sweep.host_state import HostState

    drawn = HostState(torch.nn.Module(), [loader, getattr(loader, "sampler", None)])
    batch = next(iter(loader))
    drawn.restore()
    device = next(model.parameters()).device
    batch = {k: v.to(device) if hasattr(v, "to") else v for k, v in batch.items()}
    dtype = torch.bfloat16 if args.bf16 else torch.float16 if args.fp16 else None
    context = (lambda: torch.autocast(device.type, dtype=dtype)) if dtype is not None else None
    opt = kwargs.get("optimizer")
    optimizers = [getattr(opt, "optimizer", opt)] if opt is not None else []  # accelerate wraps it

    def optimizer_step() -> None:
        # What the Trainer runs after backward: clipping to args.max_grad_norm, then the optimizer's
        # step (the scheduler is not stepped: the sweep's steps are not the job's).
        if args.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        optimizers[0].step()

    model.train()
    # A whole step holds as many micro-batches as the job's (one batch of its data, each time).
    step = accumulated(lambda: model(**batch), max(int(args.gradient_accumulation_steps), 1))
    return SweepJob(model, step, optimizers, optimizer_step if optimizers else None, context,
                    rng_objects=[loader, getattr(loader, "sampler", None)])
