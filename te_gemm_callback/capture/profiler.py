"""GemmProfiler: framework-free live capture, usable as a context manager in any training loop."""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from te_gemm_callback.capture.attach import Instruments
from te_gemm_callback.capture.capture_file import GemmCapture
from te_gemm_callback.capture.clocks import ClockSampler
from te_gemm_callback.capture.config import ProfilerConfig
from te_gemm_callback.capture.cupti import NONE, CuptiOwner, cupti_owner
from te_gemm_callback.capture.graphs import EagerForwards, graphed_modules
from te_gemm_callback.capture.guards import ForwardGuard
from te_gemm_callback.capture.host_clock import ModuleHostClock
from te_gemm_callback.capture.instruments import Nvtx, gemm_timer
from te_gemm_callback.capture.kernel_profile import KernelProfile, KernelStep
from te_gemm_callback.capture.module_specs import TE_CLASSES
from te_gemm_callback.capture.recorder import Recorder
from te_gemm_callback.capture.results import build_capture
from te_gemm_callback.capture.scope import ModuleScope, is_te_module
from te_gemm_callback.capture.steady import EagerCompiled, GraphCaptures, SteadyWait, activity, compiled_modules
from te_gemm_callback.capture.step_plan import CLEAN, COMPILE, INSTRUMENTED, KERNELS, SETTLE, WARMUP, StepPlan
from te_gemm_callback.capture.te_adapter import TEInterceptor
from te_gemm_callback.files.jsonio import MAX_INT
from te_gemm_callback.precisions import warn_once
from te_gemm_callback.printable import follow_job_logging

log = logging.getLogger("te_gemm_callback")

Boundary = tuple[float, Any]  # (host clock in s, CUDA event or None) at a step boundary


@dataclass
class StepRecord:
    """One step: opened with it, completed when it closes, dropped whole if it never ran."""

    kind: str  # StepPlan's kind; results.py retags unsteady and partial steps once all are known
    dispatch: bool = False  # the torch dispatch mode ran on it
    start: Boundary = (0.0, None)
    end: Boundary | None = None
    seq_open: int = 0  # autograd's next sequence number at the open: unchanged at the close -> it never ran
    at_open: tuple[int, int] = (0, 0)  # steady.activity() at the open
    moved: tuple[int, int] = (0, 0)  # ... and how much it moved during the step
    micro_batches: int = 1
    by_order: bool = False  # its TE GEMM owners came by launch order from a hooked step
    order_failed: bool = False  # ... tried, but its calls did not match: its TE GEMMs are left out
    kernels: KernelStep | None = None  # a kernels step's kernel records, once the session returned them
    host_clock: Any = None  # a settle step's ModuleHostClock while it runs
    module_host_us: dict[str, dict[str, float]] | None = None  # ... and what it read
    paused_s: float = 0.0  # host time between the job's pause() and resume() (its evaluation, logging)


class GemmProfiler:
    """Record every GEMM a model runs: shapes, pass, precision, GPU time and owning module.

    Steps follow a :class:`StepPlan` (docs/step-plan.md); a ``torch.compile`` model first runs
    compile steps (:mod:`.steady`). An exception through the model's forward removes everything at
    once (:mod:`.guards`). The options below are :class:`ProfilerConfig`'s fields, given as keywords
    or as one ``config``.

    Example:
        >>> with GemmProfiler(model) as prof:          # doctest: +SKIP
        ...     for batch in batches:
        ...         model(batch).loss.backward(); opt.step(); prof.step()
        >>> prof.capture.save("gemm_capture.json")     # doctest: +SKIP
    """

    def __init__(self, model: nn.Module, config: ProfilerConfig | None = None, **options: Any) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"GemmProfiler needs a torch.nn.Module, got {type(model).__name__}")
        self.config = c = ProfilerConfig.given("GemmProfiler", config, options)
        follow_job_logging()
        timing, dispatch_steps, kernel_steps, nsys_capture = c.timing, c.dispatch_steps, c.kernel_steps, c.nsys_capture
        # A meta-device model runs nothing: host-clock pairs would time only the dispatch.
        self.on_meta = next((p.is_meta for p in model.parameters()), False)
        if self.on_meta:
            warn_once("te-gemm: the model is on the meta device: nothing runs there, so nothing can be timed; "
                      "the capture holds its GEMMs' shapes only", log)
            timing = "none"
        self.model = model
        self.adapters = tuple(c.adapters)
        if dispatch_steps is None:
            dispatch_steps = 1 if any(is_te_module(m) for m in model.modules()) else "all"
        # Kernel records need the model's kernels on a GPU: a CPU model on a GPU host has none.
        on_gpu = torch.cuda.is_available() and next((p.is_cuda for p in model.parameters()), True)
        self._cuda = cuda = on_gpu or c.kernel_profile is not None
        if kernel_steps is None:
            kernel_steps = 1 if cuda and timing != "none" else 0
        self._base_plan = self.plan = StepPlan(instrumented=c.instrumented_steps, kernels=kernel_steps if cuda else 0,
                                               dispatch=dispatch_steps, kernels_warmup=c.kernel_warmup_steps,
                                               settle=c.settle_steps)
        self.max_compile_steps = max(c.max_compile_steps, 1)
        if self.plan.instrumented == 0 and self.plan.kernels == 0:
            log.warning("te-gemm: no instrumented or kernels step planned: the capture will hold step times only")
        self.nsys_capture = nsys_capture
        self._range_api: Any = torch.cuda.profiler if nsys_capture and torch.cuda.is_available() else None
        self.scope = ModuleScope(model, on_error=lambda e: self.recorder.fail(e))
        self.timing = self._base_timing = timing
        nvtx_on = True if c.nvtx == "auto" and nsys_capture else c.nvtx  # nsys will listen
        self.recorder = Recorder(self.scope, gemm_timer(timing != "none"), Nvtx(nvtx_on, c.nvtx_backend))
        self.cupti: CuptiOwner | None = None
        self._follow_cupti()
        self.te = TEInterceptor(self.recorder) if "te" in self.adapters else None
        self.reuse_owners = c.reuse_owners
        self.kernel_profile = c.kernel_profile or KernelProfile()
        self._clock = c.clock
        self._paused_at: float | None = None
        self.instruments = Instruments(self.scope, self.recorder, self.te)
        self._reset()
        self._clock_reader = c.clock_reader
        self._clocks: ClockSampler | None = None
        self._sample_clocks = False
        self._guard: ForwardGuard | None = None
        self._held = False  # start()'s process-wide pieces (graph counter, nsys range) are on
        self._range_open = False  # cudaProfilerStart called, Stop not yet

    def _follow_cupti(self) -> None:
        """Under another CUPTI owner (:mod:`.cupti`), the kernels steps become instrumented ones, timed by events."""
        owner = cupti_owner() if self._cuda else None
        self.cupti, base = owner, self._base_plan
        self.plan, self.timing = base, self._base_timing
        self._more_dispatch = 0
        if owner is not None:
            warn_once(owner.line(), log)
            if base.kernels and base.instrumented != "all":
                self.plan = StepPlan(instrumented=base.instrumented + base.kernels_warmup + base.kernels + base.settle,
                                     kernels=0, dispatch=base.dispatch)
                if isinstance(base.dispatch, int) and base.dispatch and base.settle and owner.timing != NONE \
                        and self._base_timing != "none":
                    # GEMMs outside TE modules are timed on dispatch steps only: one more takes the settle slot.
                    self._more_dispatch = 1
            if owner.timing == NONE:
                self.timing = "none"
        self.recorder.timer.kind = self.recorder.timer.kind_for(self.timing != "none")

    def _reset(self) -> None:
        self._steps: list[StepRecord] = []  # index = step number
        self._order_off = False  # no TE owners by launch order (compiled model, or a step mismatched)
        if self.te is not None:
            self.te.owners.reset()
        self._session_ms: dict[str, float] = {}  # host ms to start and stop the kernel-records session
        self.instruments.eager = EagerForwards({})
        self.instruments.eager_compiled = EagerCompiled({})
        self._wait = SteadyWait(self.max_compile_steps)
        self.kernel_profile.error = None  # a new capture tries the kernel records again
        self._capture: GemmCapture | None = None
        self._started = False
        self._abandoned = False  # the forward raised: never attach again
        self.recorder.reset()

    def _boundary(self) -> Boundary:
        ev = None
        if self.recorder.timer.cuda:  # one event per boundary, none per GEMM
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
        return self._clock(), ev

    def _open_step(self) -> None:
        i = self.recorder.step
        kind = self._plan_kind(i)
        j = i - self._wait.lead  # index in the plan (negative for a compile step)
        # Event pairs (most of the per-GEMM host cost) only where no kernel records time the GEMMs, and on the
        # first step in case the kernels step fails.
        timed = self.timing == "events" or (self.timing == "auto" and self.plan.kernels == 0)
        timer = self.recorder.timer
        timer.enabled = timed or (self.timing == "auto" and j == 0)
        # Gates built before the boundary: their first build compiles a kernel.
        timer.lead = timed
        if timed and not timer.gates and not self._abandoned:
            timer.prepare({p.device.index for p in self.model.parameters() if p.is_cuda})
        dispatched = False
        if kind == INSTRUMENTED and self.recorder.error is None:
            dispatch = "torch" in self.adapters and (self.plan.dispatches(j) or self._dispatch_more(j))
            by_order = False
            if self.te is not None:
                self.te.owners.begin_step(by_order=self.reuse_owners and not dispatch and not self._order_off)
                by_order = self.te.owners.by_order
            self.instruments.attach("full" if dispatch or self.te is None else "order" if by_order else "te")
            if dispatch and self.instruments.mode is None:
                self.instruments.enter_mode()
            elif not dispatch:
                self.instruments.exit_mode()
            if self.instruments.mode is not None:
                self.instruments.mode.forward_shapes.clear()
                dispatched = True
        else:
            self.instruments.detach()  # a kernel-records session spans the warm-up and kernels steps
            if kind in (SETTLE, CLEAN):
                self._stop_clocks()  # the sampler takes the GIL 20 times a second: not on clean steps
        host_clock = self._host_clock() if kind == SETTLE else None
        if self._sample_clocks and self._clocks is None and not self._abandoned and (
                kind in (WARMUP, KERNELS) or (kind == INSTRUMENTED and self.plan.kernels == 0)):
            self._clocks = ClockSampler(self._clock_reader, period_s=0.05).__enter__()
        # Started before the boundary, so not in the step's time.
        if kind in (WARMUP, KERNELS) and not self.kernel_profile.running and self.kernel_profile.error is None \
                and not self._abandoned:
            t0 = self._clock()
            self.kernel_profile.start()
            self._session_ms["start"] = (self._clock() - t0) * 1e3
        if kind == KERNELS:
            self.kernel_profile.mark()
        rec = StepRecord(kind, dispatch=dispatched, host_clock=host_clock)
        self._steps.append(rec)  # step_kind reads it from now on; the boundary comes last
        rec.seq_open = self.scope._current_seq()
        self.recorder.nvtx.push(f"step {i} ({kind})")
        rec.at_open = activity()  # outside the step's time
        rec.start = self._boundary()

    def _close_step(self, micro_batches: int, last: bool = True, ran: bool = True) -> None:
        rec = self._steps[-1]
        rec.end = self._boundary()
        if rec.host_clock is not None:
            rec.module_host_us, rec.host_clock = rec.host_clock.detach(), None
        now = activity()
        rec.moved = (now[0] - rec.at_open[0], now[1] - rec.at_open[1])
        rec.micro_batches = micro_batches
        self.recorder.nvtx.pop()
        i = self.recorder.step
        if rec.kind == COMPILE and ran:
            self._wait.close(i, any(rec.moved))
        if ran and self.te is not None and self.instruments.attached == "order":
            if self.te.owners.complete():
                rec.by_order = True
            else:  # different call order or shapes: this step's owners are unknown
                rec.order_failed = self._order_off = True
                log.warning("te-gemm: step %d's TE GEMMs did not follow the first instrumented step's order: "
                            "they are left out, and later instrumented steps are hooked again", i)
        if self.kernel_profile.running and (last or self._plan_kind(i + 1) not in (WARMUP, KERNELS)):
            t0 = self._clock()
            steps = self.kernel_profile.stop()  # synchronizes, so it comes after the end boundary
            self._session_ms["stop"] = (self._clock() - t0) * 1e3  # outside every step, but the job waits
            sync = getattr(self.kernel_profile, "sync_ms", None)
            if sync is not None:
                self._session_ms["stop_sync"] = sync
            ids = self._step_ids(lambda s: s.kind == KERNELS)
            if steps is not None and len(steps) == len(ids):
                for j, ks in zip(ids, steps):
                    self._steps[j].kernels = ks

    def _host_clock(self) -> ModuleHostClock | None:
        """Clock each TE module's host time on the first settle step; not on a compiled model (dynamo recompiles)."""
        if self._abandoned or compiled_modules(self.model) or \
                any(s.module_host_us is not None or s.host_clock is not None for s in self._steps):
            return None
        mods = {n: m for n, m in self.model.named_modules() if type(m).__name__ in TE_CLASSES and is_te_module(m)}
        if not mods:
            return None
        clock = ModuleHostClock(mods, self._clock)
        clock.attach()
        return clock

    def _dispatch_more(self, j: int) -> bool:
        """Whether step ``j`` runs one more dispatch step (see :meth:`_follow_cupti`): only if there are torch GEMMs."""
        if not self._more_dispatch or not isinstance(self.plan.dispatch, int) or \
                not self.plan.dispatch <= j < self.plan.dispatch + self._more_dispatch:
            return False
        return any(r[1] is not None and r[1].source == "torch" for r in self.recorder.raw)

    def _plan_kind(self, i: int) -> str:
        return COMPILE if self._wait.waiting else self.plan.kind(i - self._wait.lead)

    def _step_ids(self, test: Callable[[StepRecord], bool]) -> list[int]:
        return [i for i, s in enumerate(self._steps) if test(s)]

    def _kernel_steps(self) -> dict[int, KernelStep]:
        return {i: s.kernels for i, s in enumerate(self._steps) if s.kernels is not None}

    def _stop_clocks(self) -> None:
        if self._clocks is not None and self._clocks.running:
            self._clocks.__exit__(None, None, None)

    def start(self) -> GemmProfiler:
        """Begin the first profiled step. Each start, including one after :meth:`stop`, begins a new capture."""
        if self._started:
            raise RuntimeError("GemmProfiler already started")
        self._reset()
        self._follow_cupti()
        self._started = True
        self._thread = self.scope.owner_thread = threading.get_ident()
        self.scope.ran.clear()
        self.scope.weights_used.clear()
        # Looked up at each start, so graphs and compiles made after construction count too.
        self.instruments.eager = EagerForwards(graphed_modules(self.model))
        self.instruments.eager_compiled = EagerCompiled(compiled_modules(self.model))
        # Compile steps first, so no compile time lands in a timed step.
        self._wait.waiting = bool(self.instruments.eager_compiled.modules)
        GraphCaptures.install()
        self._held = True
        # The only thing on the model for the whole window: a try/except around its forward.
        self._guard = ForwardGuard.install(self.model, self.abandon)
        # A compiled model stays hooked: launch-order owners are checked on eager models only.
        self._order_off = bool(self.instruments.eager_compiled.modules)
        if self._range_api is not None:
            # Stopped once the capture is built (or, "held", saved): nsys's default range end ends the job there
            # (docs/results/h200.md, facts the code relies on: nsys capture range).
            self._range_api.start()
            self._range_open = True
        # The SM clock is sampled over the steps whose GEMM times are reported (_open_step).
        self._clocks = None
        self._sample_clocks = self._clock_reader is not None or torch.cuda.is_available()
        try:
            self._open_step()
        except Exception:
            self._release()
            self._started = False
            raise
        return self

    def step(self, micro_batches: int = 1) -> None:
        """Close the current step and open the next (call once per optimizer step)."""
        if not self._started:
            raise RuntimeError("GemmProfiler.step() before start(): start the profiler first")
        _check_micro_batches(micro_batches)
        self._close_step(micro_batches, last=False)
        self.scope.release()
        self.recorder.step += 1
        self._open_step()

    def stop(self, micro_batches: int = 1) -> GemmCapture:
        if not self._started:
            raise RuntimeError("GemmProfiler was not started")
        _check_micro_batches(micro_batches)  # before anything closes, so a corrected stop() still works
        if threading.get_ident() != self._thread:
            # The dispatch mode is thread-local: only the starting thread can remove it.
            raise RuntimeError("GemmProfiler.stop() must be called from the thread that called start()")
        i = self.recorder.step
        # stop() right after step(): that step never ran if no forward with grad made a node since it opened.
        empty_tail = i > 0 and self.scope._current_seq() <= self._steps[-1].seq_open + 1 and \
            not any(r[0] == i for r in self.recorder.raw)
        self._close_step(micro_batches, ran=not empty_tail)
        if empty_tail:
            self._steps.pop()
        self._release()
        self._started = False
        if any(b is not None and b[1] is not None for s in self._steps for b in (s.start, s.end)):
            torch.cuda.synchronize()  # the last boundary event must complete; after every step
        self.recorder.resolve()
        self._capture = build_capture(self)
        if self.nsys_capture != "held":
            self.end_nsys_range()
        return self._capture

    def end_nsys_range(self) -> None:
        """cudaProfilerStop for ``nsys_capture``: once, and only after start() began the range."""
        if self._range_open:
            self._range_open = False
            self._range_api.stop()

    def _release(self) -> None:
        """Remove everything start() installed (idempotent); the nsys range stays open (:meth:`stop`)."""
        self.instruments.detach()
        self.kernel_profile.discard()
        if self._guard is not None:
            self._guard.remove()
            self._guard = None
        if self._held:
            self._held = False
            GraphCaptures.uninstall()
        self._stop_clocks()

    def abandon(self, err: BaseException, where: str = "the model's forward") -> None:
        """Turn capture off after ``where`` raised: everything of ours comes off; the job's exception goes on."""
        if not self._started or self._abandoned:
            return
        self._abandoned = True
        if self.recorder.error is None:
            self.recorder.error = f"{where} raised {type(err).__name__} inside the capture window"
            log.warning("te-gemm: capture turned off: %s (%s); its hooks and dispatch mode are off the model",
                        self.recorder.error, str(err).splitlines()[0][:200] if str(err) else "no message")
        self.recorder.active = False
        self.scope.enabled = False
        if threading.get_ident() == self._thread:  # the dispatch mode is thread-local: only its thread can pop it
            self._release()

    def pause(self) -> None:
        """Stop recording without detaching (between training batches: validation, logging)."""
        if self._started:
            self.instruments.pause()
            self._paused_at = self._clock()

    def resume(self) -> None:
        if self._started:
            self.instruments.resume()
            if self._paused_at is not None and self._steps:
                # How long the job was away tells an evaluation from a step.
                self._steps[-1].paused_s += self._clock() - self._paused_at
            self._paused_at = None

    def __enter__(self) -> GemmProfiler:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        if self._started:
            self.stop()

    @property
    def capture(self) -> GemmCapture:
        if self._capture is None:
            raise RuntimeError("no capture yet: stop() the profiler (or leave its with-block) first")
        return self._capture

    @property
    def error(self) -> str | None:
        return self.recorder.error

    @property
    def micro_batches(self) -> list[int]:
        """The micro-batches of each closed step, in step order."""
        return [s.micro_batches for s in self._steps if s.end is not None]

    @property
    def step_kind(self) -> str | None:
        """The kind of the step now open (:class:`StepPlan`), or None when not started."""
        return self._steps[-1].kind if self._started and self._steps else None

    @property
    def plan_index(self) -> int | None:
        """The open step's index in the :class:`StepPlan`; None during compile steps or when not started."""
        if not self._started or self._wait.waiting:
            return None
        return self.recorder.step - self._wait.lead


def _check_micro_batches(v: Any) -> None:
    """Refuse a count the capture cannot save and load back (0, 1.5, True, 10**30)."""
    if type(v) is not int or not 1 <= v <= MAX_INT:
        raise ValueError(f"micro_batches must be a whole number >= 1 (the micro-batches of the step), got {v!r}")


GemmProfiler.__doc__ = (GemmProfiler.__doc__ or "").replace(
    "    Example:", "    Args:\n" + ProfilerConfig.doc() + "\n\n    Example:", 1)
# help() and IDEs show the options by name, from the config's fields.
GemmProfiler.__init__.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in ("self", "model")]
    + [inspect.Parameter("config", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None)]
    + [inspect.Parameter(kw, inspect.Parameter.KEYWORD_ONLY, default=d) for kw, d in ProfilerConfig.defaults().items()],
    return_annotation=None)
