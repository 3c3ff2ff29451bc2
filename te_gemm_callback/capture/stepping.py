"""The step boundaries of a :class:`~te_gemm_callback.GemmProfiler`: what each step opens with (its
instruments, by its kind in the plan) and closes with (its times, the kernel records' session). A
part of the profiler: it writes each step's :class:`~.profiler_state.StepRecord`."""

from __future__ import annotations

import logging
from typing import Any

import torch

from te_gemm_callback.capture.clocks import ClockSampler
from te_gemm_callback.capture.host_clock import ModuleHostClock
from te_gemm_callback.capture.module_specs import TE_CLASSES
from te_gemm_callback.capture.profiler_state import Boundary, ProfilerState, StepRecord
from te_gemm_callback.capture.scope import is_te_module
from te_gemm_callback.capture.steady import activity, compiled_modules
from te_gemm_callback.capture.step_plan import CLEAN, COMPILE, INSTRUMENTED, KERNELS, SETTLE, WARMUP
from te_gemm_callback.capture.torch_adapter import GemmDispatchMode
from te_gemm_callback.files.jsonio import MAX_INT

log = logging.getLogger("te_gemm_callback")


class StepBoundaries(ProfilerState):
    """Opens and closes the profiler's steps (``_open_step``, ``_close_step``), and puts on and takes
    off the instruments each runs under (``_attach``, ``_detach``)."""

    def _boundary(self) -> Boundary:
        ev = None
        if self.recorder.timer.cuda:  # one event per step boundary: nothing per GEMM
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
        return self._clock(), ev

    def _open_step(self) -> None:
        i = self.recorder.step
        kind = self._plan_kind(i)
        j = i - self._wait.lead  # index in the plan (negative for a compile step)
        # Event pairs where no kernel records will time the GEMMs, and on the first step (already
        # the costly shape-discovery one) as a fallback should the kernels step not come or not
        # join: elsewhere the pair and its record calls would be most of the per-GEMM host cost.
        timed = self.timing == "events" or (self.timing == "auto" and self.plan.kernels == 0)
        self.recorder.timer.enabled = timed or (self.timing == "auto" and j == 0)
        # The gate (or spin) ahead of each start event (EventTimer) only where the pairs give the
        # GEMM times: a fallback pair costs the job no GPU time. Built here, before the boundary and
        # before the dispatch mode: its first build compiles a kernel.
        self.recorder.timer.lead = timed
        if timed and not self.recorder.timer.gates and not self._abandoned:  # once: the model's devices
            self.recorder.timer.prepare({p.device.index for p in self.model.parameters() if p.is_cuda})
        dispatched = False
        if kind == INSTRUMENTED and self.recorder.error is None:
            dispatch = "torch" in self.adapters and (self.plan.dispatches(j) or self._dispatch_more(j))
            by_order = False
            if self.te is not None:
                self.te.owners.begin_step(by_order=self.reuse_owners and not dispatch and not self._order_off)
                by_order = self.te.owners.by_order
            self._attach("full" if dispatch or self.te is None else "order" if by_order else "te")
            if dispatch and self._mode is None:
                self._enter_mode()
            elif not dispatch:
                self._exit_mode()
            if self._mode is not None:
                self._mode.forward_shapes.clear()
                dispatched = True
        else:
            self._detach(keep_kernels=True)
            if kind in (SETTLE, CLEAN) and self._clocks is not None and self._clocks.running:
                # A sampling thread takes the GIL 20 times a second: nothing of ours on clean steps.
                self._clocks.__exit__(None, None, None)
        host_clock = self._host_clock() if kind == SETTLE else None
        if self._sample_clocks and self._clocks is None and not self._abandoned and (
                kind in (WARMUP, KERNELS) or (kind == INSTRUMENTED and self.plan.kernels == 0)):
            # Before the boundary: not the step's time.
            self._clocks = ClockSampler(self._clock_reader, period_s=0.05).__enter__()
        if kind in (WARMUP, KERNELS):  # started before the boundary: not the step's time
            if not self.kernel_profile.running and self.kernel_profile.error is None and not self._abandoned:
                t0 = self._clock()
                self.kernel_profile.start()
                self._session_ms["start"] = (self._clock() - t0) * 1e3
        if kind == KERNELS:
            self.kernel_profile.mark()
        rec = StepRecord(kind, dispatch=dispatched, host_clock=host_clock)
        self._steps.append(rec)  # step_kind reads it from here on; the boundary comes last
        rec.seq_open = self.scope._current_seq()
        self.recorder.nvtx.push(f"step {i} ({kind})")
        rec.at_open = activity()  # dynamo's counters: a few dict reads, outside the step's time
        rec.start = self._boundary()

    def _close_step(self, micro_batches: int, last: bool = True, ran: bool = True) -> None:
        rec = self._steps[-1]
        rec.end = self._boundary()
        if rec.host_clock is not None:
            rec.module_host_us = rec.host_clock.detach()
            rec.host_clock = None
        now = activity()
        rec.moved = (now[0] - rec.at_open[0], now[1] - rec.at_open[1])
        rec.micro_batches = micro_batches
        self.recorder.nvtx.pop()
        i = self.recorder.step
        if rec.kind == COMPILE and ran:
            # The plan starts after the first compile step with no compilation and no graph capture.
            self._wait.close(i, any(rec.moved))
        if ran and self.te is not None and self._attached == "order":
            if self.te.owners.complete():
                rec.by_order = True
            else:  # another call order or other shapes: this step's owners are unknown
                rec.order_failed = True
                self._order_off = True
                log.warning("te-gemm: step %d's TE GEMMs did not follow the first instrumented step's order: "
                            "they are left out, and later instrumented steps are hooked again", i)
        # One kernel-records session over the warm-up and kernels steps; it ends (with a sync)
        # after the last kernels step, or with the capture.
        if self.kernel_profile.running and (last or self._plan_kind(i + 1) not in (WARMUP, KERNELS)):
            t0 = self._clock()
            steps = self.kernel_profile.stop()  # synchronizes: after the step's end boundary
            # Outside every step's boundaries, yet the job waits for it: the report says so.
            self._session_ms["stop"] = (self._clock() - t0) * 1e3
            sync = getattr(self.kernel_profile, "sync_ms", None)
            if sync is not None:
                self._session_ms["stop_sync"] = sync
            ids = self._step_ids(lambda s: s.kind == KERNELS)
            if steps is not None and len(steps) == len(ids):
                for j, ks in zip(ids, steps):
                    self._steps[j].kernels = ks

    def _host_clock(self) -> ModuleHostClock | None:
        """The first settle step's clock of each TE module's host time (host_clock.py); none for a
        compiled model (hooks would make dynamo compile again), or once one step has it."""
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
        """An instrumented step past the plan's dispatch steps that runs the dispatch mode anyway:
        under a profiler that owns CUPTI, where the dispatch steps recorded GEMMs the TE adapter
        does not see (a plain nn.Linear lm_head), whose only times are those steps' pairs."""
        if not self._more_dispatch or not isinstance(self.plan.dispatch, int) or \
                not self.plan.dispatch <= j < self.plan.dispatch + self._more_dispatch:
            return False
        return any(r[1] is not None and r[1].source == "torch" for r in self.recorder.raw)

    def _plan_kind(self, i: int) -> str:
        return COMPILE if self._wait.waiting else self.plan.kind(i - self._wait.lead)

    # --- instruments -----------------------------------------------------------------------
    def _attach(self, mode: str) -> None:
        """Hooks, TE interception. "full": hook every module (the dispatch mode attributes aten
        GEMMs of any module); "te": only the TE modules that own GEMMs, which is all the TE adapter
        needs and keeps the per-module cost off every other module; "order": no hooks at all, the
        TE adapter takes owners from an earlier hooked step by launch order."""
        if self._attached is not None and self._attached != mode:
            self.scope.detach()
            self._attached = None
        # Graph replays run no Python of the module, compiled code runs none of our hooks, and a
        # compiled frame must never meet the dispatch mode: instrumented steps run eager forwards.
        self._eager.enter()
        self._eager_compiled.enter()
        if self._attached is None:
            if mode != "order":
                self.scope.attach(None if mode == "full" else self.scope.te_gemm_set)
            self._attached = mode
            if self.te is not None and not self.te.installed:
                try:
                    self.te.install()
                except Exception:
                    self.scope.detach()
                    self._attached = None
                    raise
        if self.recorder.error is None:
            self.recorder.active = True
            self.scope.enabled = True

    def _detach(self, keep_kernels: bool = False) -> None:
        self.recorder.active = False
        self._eager.exit()
        self._eager_compiled.exit()
        self._exit_mode()
        self._paused_mode = False
        if self.te is not None:
            self.te.uninstall()
        if self._attached is not None:
            self.scope.detach()
            self._attached = None
        if not keep_kernels:  # a session across the warm-up and kernels steps stays open
            self.kernel_profile.discard()

    def _enter_mode(self) -> None:
        self._mode = GemmDispatchMode(self.recorder)
        self._mode.__enter__()

    def _exit_mode(self) -> None:
        if self._mode is not None:
            self._mode.__exit__(None, None, None)
            self._mode = None


def _check_micro_batches(v: Any) -> None:
    """Refuse a count the capture could not save or load back (0 divided at save; 1.5, True and
    10**30 were saved, then refused by GemmCapture.load)."""
    if type(v) is not int or not 1 <= v <= MAX_INT:
        raise ValueError(f"micro_batches must be a whole number >= 1 (the micro-batches of the step), got {v!r}")
