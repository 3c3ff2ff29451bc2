"""Lightning adapter: Lightning's hooks mapped onto :class:`~te_gemm_callback.schedule.GemmSchedule`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pytorch_lightning.callbacks import Callback
from typing_extensions import override

from te_gemm_callback.precisions import warn_once
from te_gemm_callback.reporting.loggers import to_lightning_logger
from te_gemm_callback.schedule import (
    GemmSchedule,
    JobStep,
    ScheduleResults,
    SweepJob,
    accumulated,
    own_batch,
    schedule_doc,
    schedule_signature,
)

if TYPE_CHECKING:
    from pytorch_lightning import LightningModule, Trainer


class GemmProfilerCallback(ScheduleResults, Callback):
    """Capture the GEMMs of a Lightning training job (``trainer.fit``).

    The window and every argument are :class:`~te_gemm_callback.schedule.GemmSchedule`'s, in
    optimizer steps; validation is never captured. The sweep's whole steps run ``training_step`` on
    the last batch, ``configure_gradient_clipping`` and every optimizer's step (no sweep for a
    manual-optimization module); ``set_recipe`` defaults to setting ``module.recipe`` where it exists.

    Example:
        >>> trainer = pl.Trainer(callbacks=[GemmProfilerCallback(active=6)])   # doctest: +SKIP
    """

    def __init__(self, **schedule: Any) -> None:
        if "name" in schedule:  # the schedule's name is the callback's own
            raise TypeError(f"{type(self).__name__}() takes no 'name': it names itself in what it logs")
        self.schedule = GemmSchedule(name=type(self).__name__, **schedule)
        self._last_batch: Any = None
        self.rank = 0  # this process's global rank, set in setup

    __init__.__signature__ = schedule_signature()  # type: ignore[attr-defined]  # help() and IDEs show the schedule's arguments

    @property
    def state_key(self) -> str:
        # One per output file: callbacks writing different captures coexist in a Trainer and its checkpoints.
        cfg = self.schedule.report_config
        return self._generate_state_key(output=str(cfg.output_dir / cfg.filename))

    @property
    def _legacy_state_key(self) -> Any:
        return type(self).__qualname__  # the key of checkpoints written before state_key named the output

    @staticmethod
    def _micro(trainer: Trainer, batch_idx: int) -> tuple[bool, bool]:
        acc = max(int(trainer.accumulate_grad_batches), 1)
        return batch_idx % acc == 0, (batch_idx + 1) % acc == 0 or (batch_idx + 1) == trainer.num_training_batches

    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self.rank = int(trainer.global_rank)

    @override
    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.schedule.fit_start(trainer.max_steps)

    @override
    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        self._last_batch = (batch, batch_idx)
        if self._micro(trainer, batch_idx)[0]:  # not in setup: the precision plugin swaps in TE layers first
            self.schedule.step_begin(pl_module)
        else:
            self.schedule.micro_batch_begin()

    @override
    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self.schedule.pause()  # what runs between batches (validation, logging) is not ours
        if self._micro(trainer, batch_idx)[1]:
            self.schedule.step_end(self._job(trainer))

    @override
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.schedule.train_end(self._job(trainer))

    @override
    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self.schedule.exception()

    @override
    def state_dict(self) -> dict[str, Any]:
        return self.schedule.state_dict()

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.schedule.load_state_dict(state_dict)

    def _job(self, trainer: Trainer) -> JobStep:
        def step() -> int:
            # The step Lightning logs the job's own metrics at (_LoggerConnector.log_metrics), so that ours
            # sit in step order among them: global_step runs one ahead at a batch's end.
            loop = getattr(trainer.fit_loop, "epoch_loop", None)
            return int(getattr(loop, "_batches_that_stepped", trainer.global_step))

        def log_metrics(metrics: dict[str, float]) -> None:
            _each(trainer.loggers, "metrics", lambda lg: lg.log_metrics(metrics, step=step()))

        def log_artifacts(files: dict) -> None:
            _each(trainer.loggers, "report files", lambda lg: to_lightning_logger(lg, files, step()))

        return JobStep(global_step=int(trainer.global_step), accumulate=int(trainer.accumulate_grad_batches),
                       writes=trainer.is_global_zero, log_metrics=log_metrics, log_artifacts=log_artifacts,
                       sweep=(lambda: self._sweep_job(trainer)) if self._last_batch is not None else None)

    def _sweep_job(self, trainer: Trainer) -> SweepJob:
        module = trainer.lightning_module
        if not module.automatic_optimization:
            # Its training_step steps the optimizers through wrappers that advance the fit's counters.
            raise ValueError("not run for a manual-optimization module: its training_step steps the optimizer "
                             "itself; time each recipe in a run of its own and compare them (te-gemm compare)")
        batch, batch_idx = self._last_batch
        batch = own_batch(batch)  # the sweep's steps may change it in place: never the job's
        set_recipe = None
        if self.schedule.sweep_config.set_recipe is None and hasattr(module, "recipe"):
            original = module.recipe

            def set_recipe(m: Any, r: Any) -> None:
                m.recipe = original if r is None else r

        def step() -> Any:
            # Sweep steps log nothing, through self.log or a logger's log_metrics.
            had = [(o, n, n in o.__dict__, o.__dict__.get(n)) for o, n in
                   [(module, "log"), *((lg, "log_metrics") for lg in trainer.loggers)]]
            for o, n, _, _ in had:
                setattr(o, n, lambda *a, **k: None)
            try:
                return module.training_step(batch, batch_idx)
            finally:
                for o, n, was, fn in reversed(had):
                    if was:
                        setattr(o, n, fn)
                    else:  # the class's method was in use: an instance attribute left here would shadow it
                        delattr(o, n)

        optimizers = list(trainer.optimizers)

        def optimizer_step() -> None:
            # Automatic optimization's clipping and step; not through LightningOptimizer, whose hooks
            # advance the fit's step counters.
            for opt in optimizers:
                module.configure_gradient_clipping(opt, gradient_clip_val=trainer.gradient_clip_val,
                                                   gradient_clip_algorithm=trainer.gradient_clip_algorithm)
                opt.step()

        plugin = getattr(trainer.strategy, "precision_plugin", None)
        step = accumulated(step, max(int(trainer.accumulate_grad_batches), 1) if optimizers else 1)
        loaders = [getattr(trainer, "train_dataloader", None), getattr(trainer, "datamodule", None)]
        return SweepJob(module, step, optimizers, optimizer_step if optimizers else None,
                        context=getattr(plugin, "forward_context", None), set_recipe=set_recipe,
                        rng_objects=[o for o in loaders if o is not None])


def _each(loggers: Any, what: str, send: Any) -> None:
    """Hand each logger its part on its own: one that raises is said once per kind and skipped."""
    for logger in loggers:
        try:
            send(logger)
        except Exception as err:
            warn_once(f"te-gemm: {type(logger).__name__} could not take the te_gemm {what} "
                      f"({type(err).__name__}: {err}); the other loggers still get them")


GemmProfilerCallback.__doc__ = schedule_doc(GemmProfilerCallback.__doc__ or "")
