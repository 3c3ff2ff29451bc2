"""The step boundaries of a :class:`~te_gemm_callback.capture.profiler.GemmProfiler`: what each
step opens with (its instruments, by its kind in the plan) and closes with (its times, the kernel
records' session). A mixin of the profiler: it reads and writes the profiler's per-step state."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch

from ..clocks import ClockSampler
from .steady import activity
from .steps import CLEAN, COMPILE, INSTRUMENTED, KERNELS, SETTLE, WARMUP

if TYPE_CHECKING:
    from .profiler import GemmProfiler

log = logging.getLogger("te_gemm_callback")


class StepBoundaries:
    """Opens and closes the profiler's steps (``_open_step``, ``_close_step``)."""

    def _boundary(self: "GemmProfiler") -> tuple[float, Any]:
        ev = None
        if self.recorder.timer.cuda:  # one event per step boundary: nothing per GEMM
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
        return self._clock(), ev

    def _open_step(self: "GemmProfiler") -> None:
        i = self.recorder.step
        kind = self._plan_kind(i)
        j = i - self._wait.lead  # index in the plan (negative for a compile step)
        # Event pairs where no kernel records will time the GEMMs, and on the first step (already
        # the costly shape-discovery one) as a fallback should the kernels step not come or not
        # join: elsewhere the pair and its record calls would be most of the per-GEMM host cost.
        self.recorder.timer.enabled = self.timing == "events" or (
            self.timing == "auto" and (self.plan.kernels == 0 or j == 0))
        if kind == INSTRUMENTED and self.recorder.error is None:
            dispatch = "torch" in self.adapters and self.plan.dispatches(j)
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
                self._dispatch_step_ids.add(i)
        else:
            self._detach(keep_kernels=True)
            if kind in (SETTLE, CLEAN) and self._clocks is not None and self._clocks.running:
                # A sampling thread takes the GIL 20 times a second: nothing of ours on clean steps.
                self._clocks.__exit__(None, None, None)
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
        self._kinds.append(kind)
        self._seq_open = self.scope._current_seq()
        self.recorder.nvtx.push(f"step {i} ({kind})")
        self._at_open = activity()  # dynamo's counters: a few dict reads, outside the step's time
        self._boundaries.append(self._boundary())

    def _close_step(self: "GemmProfiler", micro_batches: int, last: bool = True, ran: bool = True) -> None:
        self._boundaries.append(self._boundary())
        now = activity()
        self._moved.append((now[0] - self._at_open[0], now[1] - self._at_open[1]))
        self.micro_batches.append(micro_batches)
        self.recorder.nvtx.pop()
        i = self.recorder.step
        if self._kinds[-1] == COMPILE and ran:
            # The plan starts after the first compile step with no compilation and no graph capture.
            self._wait.close(i, any(self._moved[-1]))
        if ran and self.te is not None and self._attached == "order":
            if self.te.owners.complete():
                self._order_steps.add(i)
            else:  # another call order or other shapes: this step's owners are unknown
                self._order_failed.add(i)
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
            ids = [j for j, k in enumerate(self._kinds) if k == KERNELS]
            if steps is not None and len(steps) == len(ids):
                self._kernel_steps.update(zip(ids, steps))


def _check_micro_batches(v: Any) -> None:
    """Refuse a count the capture could not save or load back (0 divided at save; 1.5, True and
    10**30 were saved, then refused by GemmCapture.load)."""
    from ..jsonio import MAX_INT

    if type(v) is not int or not 1 <= v <= MAX_INT:
        raise ValueError(f"micro_batches must be a whole number >= 1 (the micro-batches of the step), got {v!r}")
