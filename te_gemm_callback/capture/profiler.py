"""GemmProfiler: framework-free live capture, usable as a context manager in any training loop."""

from __future__ import annotations

import functools
import logging
import platform
import time
import traceback
from datetime import datetime, timezone
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import nn

from ..clocks import ClockSampler
from ..precisions import te_version
from ..shapes import GemmOp, GemmShape
from .instruments import EventTimer, Nvtx, range_name
from .record import GemmCapture, GemmEvent, StepTime, aggregate
from .scope import ModuleScope, in_backward, is_te_module
from .te_adapter import TEInterceptor
from .torch_adapter import GemmDispatchMode, apply_splits, splits_from_offs

log = logging.getLogger("te_gemm_callback")


class Recorder:
    """Shared state of one capture: events, instruments, and the failure switch.

    The hot path (one call per GEMM) does two dict look-ups in the adapters, then ``begin`` and
    ``end`` here: no dataclass is built and no string formatted per call; events are tuples turned
    into :class:`GemmEvent` after the capture.
    """

    def __init__(self, scope: ModuleScope, timer: EventTimer, nvtx: Nvtx) -> None:
        self.scope, self.timer, self.nvtx = scope, timer, nvtx
        self.active = False
        self.step = 0
        self.raw: list[tuple] = []  # (step, site, recompute, m_splits, event pair)
        self.events: list[GemmEvent] = []
        self.error: str | None = None
        self._sites: dict[tuple, GemmSite] = {}

    in_backward = staticmethod(in_backward)

    def site(self, **fields: Any) -> "GemmSite":
        """The static description of a GEMM call site, built once per distinct site."""
        key = tuple(fields.values())
        s = self._sites.get(key)
        if s is None:
            s = self._sites[key] = GemmSite(**fields)
        return s

    def begin(self, site: "GemmSite", recompute: bool = False, m_splits: Any = None) -> tuple:
        handle = self.nvtx.start(site.range_recompute if recompute else site.range) if self.nvtx.enabled else None
        # Start event last, end event first: the pair brackets the GEMM launch tightly.
        return site, recompute, m_splits, self.timer.start(), handle

    def end(self, token: tuple) -> None:
        site, recompute, m_splits, start, handle = token
        try:
            pair = self.timer.stop(start) if start is not None else None
            if handle is not None:
                self.nvtx.end(handle)
            self.raw.append((self.step, site, recompute, m_splits, pair))
        except Exception as err:
            self.fail(err)

    def defer_copy(self, t: torch.Tensor) -> torch.Tensor:
        # Async copy into pinned memory: read after the capture, never synchronising the step.
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        host.copy_(t, non_blocking=True)
        return host

    def fail(self, err: BaseException) -> None:
        """Report once, then capture turns itself off; the job goes on untouched."""
        if self.error is None:
            self.error = f"{type(err).__name__}: {err}"
            log.warning("te-gemm: capture turned off after an error inside a hook: %s\n%s",
                        self.error, "".join(traceback.format_exception(err)[-3:]))
        self.active = False
        self.scope.enabled = False

    def resolve(self) -> None:
        """Read back event times and deferred splits: one synchronize, after the profiled steps."""
        if torch.cuda.is_available() and any(r[4] is not None or isinstance(r[3], torch.Tensor) for r in self.raw):
            torch.cuda.synchronize()
        for step, site, recompute, m_splits, pair in self.raw:
            ev = GemmEvent(step=step, recompute=recompute, time_ms=EventTimer.elapsed_ms(pair),
                           m_splits=m_splits, **site.fields())
            if isinstance(m_splits, torch.Tensor):
                ev.m_splits = splits_from_offs(m_splits)
                apply_splits(ev)
            self.events.append(ev)
        self.raw.clear()


@dataclass(frozen=True)
class GemmSite:
    """Everything about a GEMM call that does not change from call to call."""

    module: str
    gemm: str
    op: GemmOp
    m: int
    k: int
    n: int
    precision: str
    operands: tuple[str, ...]
    source: str
    kernel: str
    module_type: str
    batch: int = 1

    def fields(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}

    @functools.cached_property
    def range(self) -> str:
        return range_name(self.module, self.gemm, str(self.op), GemmShape(self.m, self.k, self.n, self.op, self.batch).mkn,
                          self.precision, False)

    @functools.cached_property
    def range_recompute(self) -> str:
        return range_name(self.module, self.gemm, str(self.op), GemmShape(self.m, self.k, self.n, self.op, self.batch).mkn,
                          self.precision, True)


class GemmProfiler:
    """Record every GEMM a model runs: shapes, pass, precision, GPU time, owning module.

    Args:
        model: the module to profile (after any precision plugin has swapped in TE layers).
        adapters: "te" (intercept TE's general_gemm), "torch" (aten dispatch), or both.
        dispatch_steps: steps on which the torch dispatch mode runs (it costs Python time on every
            aten op): "all", or the first N steps. Default: all steps for plain torch models, the
            first step for models with TE modules (TE's own GEMMs are timed cheaply on every step).
        nvtx: push an NVTX range per GEMM (domain ``te_gemm``) and per step.
        timing: CUDA-event pairs per GEMM (ignored on CPU).
        nsys_capture: call cudaProfilerStart/Stop around the profiled steps, for
            ``nsys profile --capture-range=cudaProfilerApi``.
        clock_reader: reads (SM clock MHz, board power W) on a background thread while capturing
            (default: NVML on a CUDA host, nothing elsewhere); the summary goes to
            ``meta["clocks_during_capture"]``, so a report can set the job's clock against the
            microbenchmark's (GEMM times scale with it).

    Example:
        >>> with GemmProfiler(model) as prof:          # doctest: +SKIP
        ...     model(batch).loss.backward()
        >>> prof.capture.save("gemm_capture.json")     # doctest: +SKIP
    """

    def __init__(self, model: nn.Module, *, adapters: Sequence[str] = ("te", "torch"),
                 dispatch_steps: int | str | None = None, nvtx: bool = True, timing: bool = True,
                 nsys_capture: bool = False, nvtx_backend: Any = None,
                 clock_reader: Callable[[], tuple[float, float]] | None = None) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"GemmProfiler needs a torch.nn.Module, got {type(model).__name__}")
        bad = set(adapters) - {"te", "torch"}
        if bad or not adapters:
            raise ValueError(f"adapters must be 'te' and/or 'torch', got {sorted(adapters)}")
        self.model = model
        self.adapters = tuple(adapters)
        has_te = any(is_te_module(m) for m in model.modules())
        if dispatch_steps is None:
            dispatch_steps = 1 if has_te else "all"
        if dispatch_steps != "all" and (not isinstance(dispatch_steps, int) or dispatch_steps < 0):
            raise ValueError("dispatch_steps must be 'all' or a non-negative integer")
        self.dispatch_steps = dispatch_steps
        self.nsys_capture = nsys_capture
        self.scope = ModuleScope(model, on_error=lambda e: self.recorder.fail(e))
        self.recorder = Recorder(self.scope, EventTimer(timing), Nvtx(nvtx, nvtx_backend))
        self.te = TEInterceptor(self.recorder) if "te" in self.adapters else None
        self._mode: GemmDispatchMode | None = None
        self._boundaries: list[tuple[float, Any]] = []
        self._dispatch_step_ids: set[int] = set()
        self.micro_batches: list[int] = []
        self._capture: GemmCapture | None = None
        self._started = False
        self._clock_reader = clock_reader
        self._clocks: ClockSampler | None = None

    # --- lifecycle -------------------------------------------------------------------------
    def start(self) -> "GemmProfiler":
        if self._started:
            raise RuntimeError("GemmProfiler already started")
        self._started = True
        self.scope.attach()
        try:
            if self.te is not None:
                self.te.install()
        except Exception:
            self.scope.detach()
            raise
        if self.nsys_capture and torch.cuda.is_available():
            torch.cuda.profiler.start()
        if self._clock_reader is not None or torch.cuda.is_available():
            # 20 reads a second on a background thread (NVML ~10-50 us each): the median over a
            # few steps, at no cost the step can feel. Never raises into the job.
            self._clocks = ClockSampler(self._clock_reader, period_s=0.05).__enter__()
        self.recorder.active = True
        self._open_step()
        return self

    def step(self, micro_batches: int = 1) -> None:
        """Close the current step and open the next (call once per optimizer step)."""
        self._close_step(micro_batches)
        self.scope.release()
        self.recorder.step += 1
        self._open_step()

    def stop(self, micro_batches: int = 1) -> GemmCapture:
        if not self._started:
            raise RuntimeError("GemmProfiler was not started")
        empty_tail = self.recorder.step > 0 and not any(
            r[0] == self.recorder.step for r in self.recorder.raw)
        self._close_step(micro_batches)
        if empty_tail:  # step() was called after the last step: nothing ran in the open one
            self._boundaries.pop()
            self.micro_batches.pop()
            self._dispatch_step_ids.discard(self.recorder.step)
        self.recorder.active = False
        self._exit_mode()
        if self.nsys_capture and torch.cuda.is_available():
            torch.cuda.profiler.stop()
        if self._clocks is not None:
            self._clocks.__exit__(None, None, None)
        if self.te is not None:
            self.te.uninstall()
        self.scope.detach()
        self._started = False
        self.recorder.resolve()
        self._capture = self._build()
        return self._capture

    def pause(self) -> None:
        """Stop recording without detaching (between training batches: validation, logging)."""
        if self._started and self.recorder.error is None:
            self.recorder.active = False
            self.scope.enabled = False
            if self._mode is not None:
                self._exit_mode()
                self._paused_mode = True

    def resume(self) -> None:
        if self._started and self.recorder.error is None:
            self.scope.enabled = True
            self.recorder.active = True
            if getattr(self, "_paused_mode", False):
                self._paused_mode = False
                self._mode = GemmDispatchMode(self.recorder)
                self._mode.__enter__()

    def __enter__(self) -> "GemmProfiler":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def capture(self) -> GemmCapture:
        if self._capture is None:
            raise RuntimeError("no capture yet: stop() the profiler (or leave its with-block) first")
        return self._capture

    @property
    def error(self) -> str | None:
        return self.recorder.error

    # --- steps -----------------------------------------------------------------------------
    def _boundary(self) -> tuple[float, Any]:
        ev = None
        if self.recorder.timer.enabled and self.recorder.timer.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
        return time.perf_counter(), ev

    def _open_step(self) -> None:
        i = self.recorder.step
        dispatch = "torch" in self.adapters and self.recorder.active and (
            self.dispatch_steps == "all" or i < self.dispatch_steps)
        if dispatch and self._mode is None:
            self._mode = GemmDispatchMode(self.recorder)
            self._mode.__enter__()
        elif not dispatch and self._mode is not None:
            self._exit_mode()
        if self._mode is not None:
            self._mode.forward_shapes.clear()
            self._dispatch_step_ids.add(i)
        self.recorder.nvtx.push(f"step {i}")
        self._boundaries.append(self._boundary())

    def _close_step(self, micro_batches: int) -> None:
        self._boundaries.append(self._boundary())
        self.micro_batches.append(micro_batches)
        self.recorder.nvtx.pop()

    def _exit_mode(self) -> None:
        if self._mode is not None:
            self._mode.__exit__(None, None, None)
            self._mode = None

    # --- results ---------------------------------------------------------------------------
    def _build(self) -> GemmCapture:
        rec = self.recorder
        n_steps = len(self.micro_batches)
        bounds = self._boundaries
        steps = []
        for i in range(n_steps):
            (t0, e0), (t1, e1) = bounds[2 * i], bounds[2 * i + 1]
            evs = [e for e in rec.events if e.step == i]
            times = [e.time_ms for e in evs if e.time_ms is not None]
            steps.append(StepTime(
                index=i, wall_ms=(t1 - t0) * 1e3,
                gpu_ms=float(e0.elapsed_time(e1)) if e0 is not None and e1 is not None else None,
                gemm_ms=sum(times) if times else None, micro_batches=self.micro_batches[i]))
        per_source = {"te": n_steps, "torch": max(len(self._dispatch_step_ids), 1)}
        records = aggregate(rec.events, per_source)
        return GemmCapture(records=records, steps=steps, meta=self._meta(), coverage=self._coverage(records))

    def _coverage(self, records: list) -> dict[str, Any]:
        gemm_modules = [n for n, m in self.model.named_modules() if _bears_gemm(m)]
        never_ran = [n for n in gemm_modules if n not in self.scope.ran and n not in self.scope.weights_used]
        if never_ran and self.recorder.error is None:
            log.warning("te-gemm: %d GEMM-bearing module(s) never ran while capturing: %s",
                        len(never_ran), ", ".join(never_ran[:8]) + (" ..." if len(never_ran) > 8 else ""))
        return {
            "gemm_modules": len(gemm_modules),
            "never_ran": never_ran,
            "captured_flops_per_step": sum(r.flops_per_step for r in records),
            "dispatch_steps": sorted(self._dispatch_step_ids),
            "error": self.recorder.error,
        }

    def _meta(self) -> dict[str, Any]:
        cuda = torch.cuda.is_available()
        return {
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "device": torch.cuda.get_device_name() if cuda else f"CPU ({platform.processor() or platform.machine()})",
            "compute_capability": ".".join(map(str, torch.cuda.get_device_capability())) if cuda else None,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "transformer_engine": te_version() if self.te is not None and self.te.te_loaded() else None,
            "python": platform.python_version(),
            "adapters": list(self.adapters),
            "timing": self.recorder.timer.kind,
            "model": type(self.model).__name__,
            "clocks_during_capture": self._clocks.summary() if self._clocks is not None else None,
        }


def _bears_gemm(m: nn.Module) -> bool:
    if isinstance(m, nn.Linear) or type(m).__name__ == "Conv1D":
        return True
    if is_te_module(m):
        return any(p.dim() >= 2 for _, p in m.named_parameters(recurse=False))
    return any(p.dim() >= 3 for _, p in m.named_parameters(recurse=False))
