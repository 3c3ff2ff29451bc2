"""The capture's schedule over a job's optimizer steps, which every adapter (or a plain loop) drives:
the window, the step plan (docs/step-plan.md), publishing and the sweep. Nothing it does stops the job."""

from __future__ import annotations

import inspect
import logging
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils._pytree import tree_map_only

from te_gemm_callback.capture import GemmCapture, GemmProfiler
from te_gemm_callback.capture.config import CaptureConfig
from te_gemm_callback.capture.distributed import world
from te_gemm_callback.options import refuse_unknown
from te_gemm_callback.precisions import warn_once
from te_gemm_callback.printable import error_text, follow_job_logging, plain
from te_gemm_callback.reporting.config import ReportConfig
from te_gemm_callback.schedule.publish import Publishing, ScheduleResults, guard, sweep_metrics
from te_gemm_callback.sweep.config import SweepConfig
from te_gemm_callback.sweep.engine import step_loss

__all__ = ["CONFIGS", "GemmSchedule", "JobStep", "ScheduleResults", "SweepJob", "guard", "kernel_steps", "phase",
           "schedule_signature", "sweep_metrics"]

log = logging.getLogger("te_gemm_callback")


@dataclass
class SweepJob:
    """What the sweep needs from the job: ``step`` runs one forward and returns the loss;
    ``rng_objects`` hold generators the job draws from (its DataLoader), put back after the sweep."""

    module: Any
    step: Callable[[], Any]
    optimizers: Sequence[Any] = ()
    optimizer_step: Callable[[], Any] | None = None  # runs after backward (default: step ``optimizers``)
    context: Callable[[], Any] | None = None  # an outer context per step (Lightning's precision plugin)
    set_recipe: Callable[[Any, Any], Any] | None = None
    rng_objects: Sequence[Any] = ()


def own_batch(batch: Any) -> Any:
    """``batch`` with its tensors copied: a step that changes its batch in place changes the sweep's copy."""
    return tree_map_only(torch.Tensor, lambda t: t.detach().clone(), batch)


def accumulated(step: Callable[[], Any], micro_batches: int) -> Callable[[], Any]:
    """A sweep step of ``micro_batches`` micro-batches, the last one's loss returned; each loss divided
    by ``micro_batches``, as Lightning and the HF Trainer do."""
    if micro_batches <= 1:
        return step

    def run() -> Any:
        for _ in range(micro_batches - 1):
            (step_loss(step()) / micro_batches).backward()
        return step_loss(step()) / micro_batches

    return run


@dataclass
class JobStep:
    """Where the job is when a step ends, in the adapter's words."""

    global_step: int = 0
    accumulate: int = 1  # micro-batches per optimizer step
    writes: bool = True  # this process writes the run folder (rank zero)
    log_metrics: Callable[[dict[str, float]], Any] | None = None
    log_artifacts: Callable[[dict[str, Path]], Any] | None = None
    sweep: Callable[[], SweepJob] | None = None  # None: the sweep waits for a later step or train_end


# The options the schedule and the callbacks take, each a field of one stage's config (options.py).
CONFIGS = (CaptureConfig, SweepConfig, ReportConfig)


def schedule_doc(adapter_doc: str) -> str:
    """``adapter_doc`` followed by the schedule's arguments, from the configs' fields."""
    return adapter_doc.rstrip() + "\n\n    Args:\n" + "\n".join(c.doc() for c in CONFIGS) + "\n"


def schedule_signature() -> inspect.Signature:
    """The schedule's keyword arguments (the configs' fields), for ``help()`` and IDEs."""
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    params += [inspect.Parameter(kw, inspect.Parameter.KEYWORD_ONLY, default=default)
               for c in CONFIGS for kw, default in c.defaults().items()]
    return inspect.Signature(params, return_annotation=None)


def phase(step: int, wait: int, warmup: int, active: int) -> str:
    """The schedule of ``torch.profiler.schedule``: untouched, warm-up (discarded), active, done."""
    if step < wait:
        return "wait"
    if step < wait + warmup:
        return "warmup"
    return "active" if step < wait + warmup + active else "done"


def kernel_steps(kernels: bool, active: int, instrumented: int) -> dict[str, int]:
    """GemmProfiler's kernel arguments for an active window (docs/step-plan.md): the kernels step,
    then a settle step and a kernel warm-up where the window has room beside one clean step."""
    if not kernels or active <= instrumented:
        return {"kernel_steps": 0}
    room = active - instrumented - 2  # after the kernels step and one clean step
    return {"kernel_steps": 1, "settle_steps": 1 if room >= 1 else 0, "kernel_warmup_steps": 1 if room >= 2 else 0}


class GemmSchedule(Publishing):
    """Capture the GEMMs of a training job over a window of its optimizer steps; the arguments are
    the fields of CaptureConfig, SweepConfig and ReportConfig."""

    def __init__(self, name: str = "GemmSchedule", **options: Any) -> None:
        refuse_unknown(name, options, [kw for c in CONFIGS for kw in c.keywords()])  # with the nearest known one
        follow_job_logging()
        self.capture_config = CaptureConfig.take(options)  # each takes its keywords out of options
        self.sweep_config = SweepConfig.take(options)
        self.report_config = ReportConfig.take(options)
        self.name = name
        self.wait = self.capture_config.wait  # moved on by a resume inside the window
        self.kernel_recorder: Callable[[], Any] | None = None  # a KernelProfile factory (default: the profiler's)
        self.steps_seen = 0  # optimizer steps completed while this schedule watched
        self.done = False
        self.metrics: dict[str, float] = {}
        self._logged_metrics: dict[str, float] = {}
        self.report_files: dict[str, Path] = {}
        self._prof: GemmProfiler | None = None
        self._phase: str | None = None
        self._micro_batches = 0
        self._in_step = False  # between step_begin and step_end
        self._job_refused = False
        # A rank of a multi-process job owes the others its part of the gather at the window's end from
        # its first captured step until it published, even when its own capture failed before.
        self._owed = False

    def __enter__(self) -> GemmSchedule:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        """A loop that raised: everything of ours comes off (:meth:`exception`), as Lightning's on_exception; one
        that ended with the window open: :meth:`train_end`, as if the loop had called it."""
        if exc_type is not None:
            self.exception()
        elif self._prof is not None:
            self.train_end()

    def __getstate__(self) -> dict[str, Any]:
        # The live capture (thread-local state, hooks, a dispatch mode) belongs to the running job.
        return {**self.__dict__, "_prof": None, "_phase": None}

    def phase(self, step: int) -> str:
        return phase(step, self.wait, self.capture_config.warmup, self.capture_config.active)

    def _window(self) -> tuple[int, int]:
        """The steps before the first active one, and before the first after the window."""
        first = self.wait + self.capture_config.warmup
        return first, first + self.capture_config.active

    def fit_start(self, max_steps: int | None = None) -> None:
        """Training starts (again): say what this run will capture."""
        if self._prof is not None:
            # An earlier run raised inside the window without telling us (the HF Trainer has no
            # exception hook): its instruments came off with the exception.
            log.warning("te-gemm: an earlier run ended inside the capture window: its capture is dropped, "
                        "capturing again from step %d (warm-up first)", self.steps_seen + 1)
            self._drop()
            self.wait = self.steps_seen
        first, end = self._window()
        if self.done and not self.resumed:
            log.warning("te-gemm: this %s already captured a run (%s): it captures nothing in this one; give each "
                        "run its own", self.name, self.path or "its capture")
        elif max_steps is not None and 0 <= max_steps < end:
            log.warning("te-gemm: max_steps=%d ends before the capture window (steps %d-%d): %s", max_steps,
                        first + 1, end, "nothing will be captured" if max_steps <= first else
                        f"only {max_steps - first} of {self.capture_config.active} active step(s) will be captured")

    def step_begin(self, model: Any) -> None:
        """An optimizer step's first micro-batch begins; ``model`` is the module the job trains."""
        if self._in_step:
            self._misuse("step_begin called twice without step_end: call step_end(...) when each optimizer step ends")
        self._in_step = True
        if self.done:
            return
        if not isinstance(model, torch.nn.Module):
            self._misuse(f"step_begin(model) needs the torch.nn.Module the job trains, got {type(model).__name__}: "
                         "capture turned off")
            self._turn_off()  # a rank of a multi-process job still meets the others
            return
        ph = self.phase(self.steps_seen)
        if ph in ("warmup", "active") and (self._prof is None or ph != self._phase):
            self._finish(JobStep(), keep=False)
            self._owed = self._owed or world()[1] > 1
            self._prof = guard(lambda: self._new_profiler(model, ph), "could not start capturing") or None
            self._phase = ph if self._prof is not None else None
            self.done = self._prof is None  # said once: capture turns itself off rather than retry every step
        else:
            self._guarded("resume")
        self._micro_batches = 1

    def micro_batch_begin(self) -> None:
        """Another micro-batch of the same optimizer step begins (gradient accumulation)."""
        self._guarded("resume")
        self._micro_batches += 1

    def pause(self) -> None:
        """The job leaves its training step (validation, logging): what runs now is not ours."""
        self._guarded("pause")

    def step_end(self, job: JobStep | None = None) -> None:
        """The optimizer step ended."""
        if not self._in_step:
            self._misuse("step_end called without step_begin: call step_begin(model) when each optimizer step begins")
        self._in_step = False
        if self._owed and self._prof is None:
            # Our capture failed inside the window: this rank still meets the others at its end.
            self.steps_seen += 1
            if self.phase(self.steps_seen) == "done":
                self._settle(job)
            return
        if self.done or not self._job_ok(job, "step_end"):
            return
        self.steps_seen += 1
        if self._prof is None:
            return
        if getattr(getattr(self._prof, "recorder", None), "error", None) is not None and world()[1] == 1:
            self._turn_off()  # an error inside a hook, said once by the recorder
            return
        if self.phase(self.steps_seen) == self._phase:
            prof = self._prof

            def advance() -> None:
                prof.resume()
                prof.step(micro_batches=self._micro_batches)
                prof.pause()  # logging, evaluation and saving between steps are not ours

            if guard(advance, "capture stopped") is False:
                self._turn_off()
            self._micro_batches = 0
        else:
            self._finish(job or JobStep(), keep=self._phase == "active")
            self.done = self.done or self.phase(self.steps_seen) == "done"

    def train_end(self, job: JobStep | None = None) -> None:
        """Training ended: finish an open window, and run a sweep still owed."""
        if not self._job_ok(job, "train_end"):
            return
        job = job or JobStep()
        if self._prof is None and not self.done and self.capture is None:
            first, end = self._window()
            log.warning("te-gemm: training ended after %d step(s), before the capture window (steps %d-%d): nothing "
                        "was captured; lower wait/warmup or train longer", self.steps_seen, first + 1, end)
        self._finish(job, keep=self._phase == "active")
        self._settle(job)
        if self.capture is not None:
            self._sweep_and_log(job)
            self._report(job, at_end=True)

    def exception(self) -> None:
        """The job raised: take everything off, publish nothing."""
        self._in_step = False  # the step it raised in never ends: a next fit's first step is not "twice"
        self._owed = False  # no collective after the job raised: the other ranks may be gone
        if self._prof is not None:
            if self._phase == "active":
                log.warning("te-gemm: the job raised inside the capture window: its capture is not written "
                            "(nothing of ours is left on the model); a later run captures from its own window")
            self.wait = self.steps_seen  # a later run's window: warm-up first, from its own first step
        self._finish(JobStep(), keep=False)

    def _job_ok(self, job: Any, hook: str) -> bool:
        """Whether ``job`` is a JobStep the publishing can read; a bad one is said once and the
        capture turns itself off (it raised into the job's loop when the window ended)."""
        why = _bad_job(job)
        if why is None:
            return True
        if not self._job_refused:
            log.warning("te-gemm: %s: %s got %s: capture turned off (training goes on)", self.name, hook, why)
        self._job_refused = True
        self._drop()
        self.done = True
        return False

    def _misuse(self, what: str) -> None:
        warn_once(f"te-gemm: {self.name}: {what}")

    def state_dict(self) -> dict[str, Any]:
        return {"steps_seen": self.steps_seen, "done": self.done, "path": str(self.path) if self.path else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The state :meth:`state_dict` saved; a damaged one is said and the capture starts afresh."""
        steps, done, path = (state.get(k) for k in ("steps_seen", "done", "path")) if isinstance(state, dict) \
            else (None, None, None)
        if not (isinstance(steps, int) and not isinstance(steps, bool) and steps >= 0 and isinstance(done, bool)
                and (path is None or (isinstance(path, str) and "\x00" not in path))):
            log.warning("te-gemm: the checkpoint's te-gemm state is damaged (%s): ignored, the capture starts "
                        "afresh", _short_repr(state))
            return
        self.steps_seen, self.done = steps, done
        self.path = Path(path) if path else None
        self.resumed = True
        first, end = self._window()
        if self.done or self.steps_seen >= end:
            # steps_seen stops counting once the capture is done: it is not the step resumed at.
            where = f", written to {plain(str(self.path))}" if self.path else ""
            log.info("te-gemm: resumed after the capture window (steps %d-%d): the capture was taken before the "
                     "checkpoint%s; nothing is captured again (another output_dir captures afresh)",
                     first + 1, end, where)
        elif self.wait <= self.steps_seen:
            # The new process has neither warmed up nor captured the window's first steps.
            log.warning("te-gemm: resumed at step %d, inside the capture window: capturing again from here "
                        "(warm-up first)", self.steps_seen)
            self.wait = self.steps_seen

    def _new_profiler(self, model: Any, ph: str) -> GemmProfiler:
        cfg = self.capture_config
        active = ph == "active"
        kernels = active and cfg.kernel_breakdown and self._kernels_possible(model)
        recorder = self.kernel_recorder() if kernels and self.kernel_recorder is not None else None
        # "held": the nsys range ends once the capture file is written (_publish), not at stop().
        return GemmProfiler(model, nsys_capture="held" if cfg.nsys_capture and active else False,
                            instrumented_steps=cfg.instrumented_steps if active else "all",
                            **kernel_steps(kernels, cfg.active, cfg.instrumented_steps),
                            kernel_profile=recorder, **cfg.handed_to("profiler")).start()

    @staticmethod
    def _kernels_possible(model: Any) -> bool:
        # The model's device, not the host's: a CPU job on a machine with a GPU has no kernels.
        return next((p.device.type for p in model.parameters()), "cpu") == "cuda"

    def _guarded(self, method: str) -> None:
        """Resume or pause the open capture; a failure drops it."""
        if self._prof is not None and guard(getattr(self._prof, method), "capture stopped") is False:
            self._turn_off()

    def _turn_off(self) -> None:
        """After a failure (already said): capture off for the rest of the run. Not in a multi-process
        job, whose other ranks would wait for this one at the gather."""
        self._drop()
        if world()[1] == 1:
            self.done = True

    def _drop(self) -> None:
        """Take everything a failed profiler put on off; it is not used again."""
        prof, self._prof, self._phase = self._prof, None, None
        if prof is not None:
            try:
                prof._release()
                prof.end_nsys_range()
            except Exception:  # already broken: nothing of it is used
                pass

    def _settle(self, job: Any) -> None:
        """Take part in the gather this rank owes (:attr:`_owed`) with an empty capture that says why."""
        if not self._owed:
            return
        job = job if job is not None and _bad_job(job) is None else JobStep()
        cap = GemmCapture(records=[], steps=[], coverage={"error": "capture failed on this rank (see its log)"})
        self._publish(job, cap)
        self.done = True

    def _finish(self, job: JobStep, keep: bool) -> None:
        """Stop the open capture; with ``keep`` (an active window's end), publish it."""
        prof = self._prof
        if prof is None:
            return
        self._prof, self._phase = None, None

        def stop() -> GemmCapture:
            prof.resume()  # stop() closes the open step with its boundary event
            return prof.stop(micro_batches=max(self._micro_batches, 1))

        cap = guard(stop, "capture could not be finished")
        if cap is False:
            self._prof = prof
            self._turn_off()
            if keep:
                self._settle(job)
            return
        if keep:
            if len(cap.steps) < self.capture_config.active:
                log.warning("te-gemm: training ended inside the capture window: %d of %d active step(s) captured "
                            "(kinds: %s)", len(cap.steps), self.capture_config.active,
                            ", ".join(s.kind for s in cap.steps))
            self._publish(job, cap, prof)
            self.done = True
        guard(prof.end_nsys_range, "nsys capture range not ended")


def _bad_job(job: Any) -> str | None:
    """What is wrong with an adapter's ``job`` (None: nothing; None is JobStep())."""
    if job is None:
        return None
    try:
        if not isinstance(job, JobStep):
            return f"{_short_repr(job)}, not a JobStep"
        for name, least in (("global_step", 0), ("accumulate", 1)):
            v = getattr(job, name)
            try:  # int, numpy's and torch's integers; not a float, a string or a bool
                ok = not isinstance(v, bool) and operator.index(v) >= least
            except TypeError:
                ok = False
            if not ok:
                return f"JobStep({name}={_short_repr(v)}): it must be an integer >= {least}"
        if job.writes not in (True, False):
            return f"JobStep(writes={_short_repr(job.writes)}): it must be True or False"
        for name in ("log_metrics", "log_artifacts", "sweep"):
            v = getattr(job, name)
            if v is not None and not callable(v):
                return f"JobStep({name}={_short_repr(v)}): it must be a function or None"
    except Exception as err:  # a field that cannot even be compared (an array for writes)
        return f"a JobStep that cannot be read ({error_text(err)})"
    return None


def _short_repr(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 120 else text[:117] + "..."


GemmSchedule.__doc__ = schedule_doc(GemmSchedule.__doc__ or "")
GemmSchedule.__init__.__signature__ = schedule_signature()  # type: ignore[attr-defined]
