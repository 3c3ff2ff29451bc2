"""Recording GEMM calls with their event pairs and NVTX ranges, and the switch that turns capture off on an error."""

from __future__ import annotations

import contextlib
import functools
import logging
import traceback
from dataclasses import dataclass
from typing import Any, cast

import torch

from te_gemm_callback.capture.capture_file import GemmEvent
from te_gemm_callback.capture.instruments import Nvtx, Timer, range_name
from te_gemm_callback.capture.scope import ModuleScope, in_backward
from te_gemm_callback.precisions import warn_once
from te_gemm_callback.printable import error_text
from te_gemm_callback.shapes import GemmOp, GemmShape

log = logging.getLogger("te_gemm_callback")


class Recorder:
    """Shared state of one capture: events, instruments, and the failure switch. Per GEMM, ``begin`` and ``end``
    only keep raw tuples (cheap); :meth:`resolve` makes events of them."""

    def __init__(self, scope: ModuleScope, timer: Timer, nvtx: Nvtx) -> None:
        self.scope, self.timer, self.nvtx = scope, timer, nvtx
        self.active = False
        self.step = 0
        self.raw: list[tuple] = []  # (step, site, recompute, m_splits, event pair), launch order
        self.events: list[GemmEvent] = []
        # Per step, each GEMM call's key in launch order (None: counted elsewhere) and its possible kernel counts.
        self.sequences: dict[int, list[tuple | None]] = {}
        self.kernel_counts: dict[int, list[tuple[int, ...]]] = {}
        self.error: str | None = None
        self.dropped: dict[int, int] = {}  # step -> its event pairs left out (Timer.read)
        self.below_floor = 0  # pairs no longer than their floor: no time
        self._sites: dict[tuple, GemmSite] = {}

    in_backward = staticmethod(in_backward)

    def reset(self) -> None:
        self.step = 0
        for kept in (self.raw, self.events, self.sequences, self.kernel_counts, self.dropped,
                     self.timer.leads, self.timer.devices):
            kept.clear()
        self.below_floor = 0

    def site(self, **fields: Any) -> GemmSite:
        """The GEMM call site of these fields, built once."""
        key = tuple(fields.values())
        s = self._sites.get(key)
        if s is None:
            s = self._sites[key] = GemmSite(**fields)
        return s

    def begin(self, site: GemmSite, recompute: bool = False, m_splits: Any = None) -> tuple:
        # The range after the timer: nsys projects it onto the GPU work launched in it, then the GEMM's alone.
        start = self.timer.start()
        try:
            handle = self.nvtx.start(site.range_recompute if recompute else site.range) if self.nvtx.enabled else None
        except Exception:
            self.timer.stop(start)  # opens the gate: a failed range must not hold the stream
            raise
        return site, recompute, m_splits, start, handle

    def end(self, token: tuple) -> None:
        site, recompute, m_splits, start, handle = token
        try:
            pair = self.timer.stop(start) if start is not None else None
            if handle is not None:
                self.nvtx.end(handle)
            self.raw.append((self.step, site, recompute, m_splits, pair))
        except Exception as err:
            self.fail(err)

    def skip(self) -> None:
        """A GEMM another adapter counts ran: keep its place in the launch order only."""
        self.raw.append((self.step, None, False, None, None))

    def defer_copy(self, t: torch.Tensor) -> torch.Tensor:
        # Async copy into pinned memory: read after the capture, never synchronising the step.
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        host.copy_(t, non_blocking=True)
        return host

    def note_inference(self) -> None:
        """A linear or matmul ran under torch.inference_mode(): said once a process."""
        warn_once("te-gemm: the model runs under torch.inference_mode(), where linear and matmul reach the capture "
                  "whole and are not recorded as GEMMs: profile training steps, or run inference under "
                  "torch.no_grad() instead", log)

    def fail(self, err: BaseException) -> None:
        """Report once, then capture turns itself off; the job goes on untouched."""
        if self.error is None:
            self.error = error_text(err)
            log.warning("te-gemm: capture turned off after an error inside a hook: %s", self.error)
            with contextlib.suppress(Exception):  # one that cannot be formatted: its type and message were said
                log.debug("te-gemm: where: %s", "".join(traceback.format_exception(err)[-3:]))
        self.active = False
        self.scope.enabled = False

    def resolve(self) -> None:
        """Read back event times and deferred splits: one synchronize, after the profiled steps."""
        paired = any(r[4] is not None for r in self.raw)
        if torch.cuda.is_available() and (paired or any(isinstance(r[3], torch.Tensor) for r in self.raw)):
            torch.cuda.synchronize()
            if paired:
                self.timer.calibrate()  # the pairs' floor, measured now that the steps are done
        for step, site, recompute, m_splits, pair in self.raw:
            seq = self.sequences.setdefault(step, [])
            counts = self.kernel_counts.setdefault(step, [])
            if site is None:
                seq.append(None)
                counts.append((1,))
                continue
            ms, why = self.timer.read(pair)
            if why == "gave up":  # its gate let the stream go first: the pair may hold host time
                self.dropped[step] = self.dropped.get(step, 0) + 1
            elif why == "below floor":
                self.below_floor += 1
            ev = GemmEvent(step=step, recompute=recompute, time_ms=ms, m_splits=m_splits, **site.fields())
            if isinstance(m_splits, torch.Tensor):
                ev.m_splits = splits_from_offs(m_splits)
                apply_splits(ev)
            if 0 in (ev.m, ev.k, ev.n):  # an empty GEMM (x[:0]) runs no kernel; the file refuses its shape
                continue
            self.events.append(ev)
            seq.append(ev.key())
            counts.append(grouped_kernel_counts(ev.m_splits) if site.kernel == "general_grouped_gemm" else (1,))
        self.raw.clear()


def splits_from_offs(offs: torch.Tensor) -> tuple[int, ...]:
    """Group sizes from ``_grouped_mm``'s cumulative offsets."""
    ends = [int(x) for x in offs.tolist()]
    return tuple(e - s for s, e in zip([0] + ends[:-1], ends))


def apply_splits(ev: GemmEvent) -> None:
    """The token dimension of a grouped GEMM is the sum of its splits (k for wgrad, else m)."""
    total = sum(cast(tuple[int, ...], ev.m_splits))  # set: a grouped GEMM's
    if ev.op is GemmOp.WGRAD:
        ev.k = total
    else:
        ev.m = total


def grouped_kernel_counts(m_splits: Any) -> tuple[int, ...]:
    """The GEMM kernels a TE grouped GEMM may launch: one per expert, or one per expert with rows."""
    splits = list(m_splits or [])
    return (len(splits), sum(1 for x in splits if x)) if splits else (1,)


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
        return self._range(recompute=False)

    @functools.cached_property
    def range_recompute(self) -> str:
        return self._range(recompute=True)

    def _range(self, recompute: bool) -> str:
        mkn = GemmShape(self.m, self.k, self.n, self.op, self.batch).mkn
        return range_name(self.module, self.gemm, str(self.op), mkn, self.precision, recompute)
