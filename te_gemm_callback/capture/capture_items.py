"""A capture's parts (:mod:`.capture_file`): GEMM calls, their records, step times, and the kernels step's timeline."""

from __future__ import annotations

import logging
import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from te_gemm_callback.files.jsonio import from_fields
from te_gemm_callback.shapes import GemmOp, GemmShape

log = logging.getLogger("te_gemm_callback")

# Calls of one GEMM over the captured steps: far above any job, low enough for finite FLOPs per step.
MAX_CALLS = 10**12


@dataclass
class GemmEvent:
    """One GEMM call seen in the live job."""

    step: int
    module: str  # qualified name of the owning module ("" = outside every module)
    gemm: str  # sub-GEMM of the module: "fc1"/"fc2" in LayerNormMLP, "" when only one
    op: GemmOp
    m: int
    k: int
    n: int
    batch: int = 1
    precision: str = "bf16"
    operands: tuple[str, ...] = ()
    source: str = "torch"  # "te" (general_gemm interception) or "torch" (aten dispatch)
    kernel: str = ""  # the function called: general_gemm, aten.mm, aten._grouped_mm, ...
    recompute: bool = False  # forward GEMM re-run in backward by activation checkpointing
    m_splits: tuple[int, ...] | None = None
    module_type: str = ""
    time_ms: float | None = None  # CUDA-event time; None on CPU or before read-back

    @property
    def shape(self) -> GemmShape:
        return GemmShape(self.m, self.k, self.n, self.op, self.batch)

    def key(self) -> tuple:
        return (self.module, self.gemm, str(self.op), self.m, self.k, self.n, self.batch,
                self.precision, self.recompute, self.source, self.kernel)


@dataclass
class GemmRecord:
    """Identical GEMM calls grouped over the captured steps."""

    module: str
    gemm: str
    op: str
    m: int
    k: int
    n: int
    batch: int
    precision: str
    operands: list[str]
    source: str
    kernel: str
    recompute: bool
    module_type: str
    calls: int  # over all captured steps
    calls_per_step: float
    flops: int  # of one call
    times_ms: list[float] = field(default_factory=list)  # one per call, when timed
    m_splits: list[list[int]] = field(default_factory=list)  # one per call, grouped GEMMs only

    @property
    def name(self) -> str:
        return f"{self.module}.{self.gemm}" if self.gemm else (self.module or "<top>")

    @property
    def shape(self) -> GemmShape:
        return GemmShape(self.m, self.k, self.n, GemmOp(self.op), self.batch)

    def key(self) -> tuple:
        """The grouping key: equal to :meth:`GemmEvent.key` of the calls it groups."""
        return (self.module, self.gemm, self.op, self.m, self.k, self.n, self.batch,
                self.precision, self.recompute, self.source, self.kernel)

    @property
    def median_ms(self) -> float | None:
        return statistics.median(self.times_ms) if self.times_ms else None

    @property
    def ms_per_step(self) -> float | None:
        median = self.median_ms
        return median * self.calls_per_step if median is not None else None

    @property
    def flops_per_step(self) -> float:
        return self.flops * self.calls_per_step


@dataclass
class StepTime:
    index: int
    wall_ms: float  # host clock between step boundaries
    gpu_ms: float | None = None  # CUDA events between step boundaries (stream time, gaps included)
    gemm_ms: float | None = None  # GEMM time in this step: kernel records, or the sum of event pairs
    micro_batches: int = 1
    kind: str = "instrumented"  # capture.step_plan's STEP_KINDS
    dispatch: bool = False  # instrumented step that also ran the torch dispatch mode
    round: int | None = None  # a sweep's alternating round this clean step was timed in
    fwd_bwd_ms: float | None = None  # a sweep step's forward+backward part (GPU ms on CUDA, else host ms)

    @property
    def ms(self) -> float:
        return self.gpu_ms if self.gpu_ms is not None else self.wall_ms


@dataclass
class KernelTimeline:
    """Every kernel of one kernels step as the GPU ran them (:mod:`te_gemm_callback.reporting.trace`). ``kernels``:
    one ``ROW`` per kernel in start order; ``name`` indexes ``names``, ``start_us`` is from the step's start; a GEMM
    kernel has its launch position (``call``) and the ``record`` it joined. ``total``: the kernels the step ran, more
    than the rows where the timeline was cut."""

    step: int  # index in the capture's steps
    span_us: float  # from the step's start to its last kernel's end
    names: list[str]
    kernels: list[list[Any]]
    total: int
    # The step's host side (kernel_profile.host_rows): [gap_us, cost_us, kind, [kernel rows]] per CUDA call.
    calls: list[list[Any]] | None = None
    latency_us: float | None = None

    ROW = ("name", "start_us", "dur_us", "stream", "record", "call")
    CALL_KINDS = ("launch", "sync_device", "sync_stream", "other")

    def problem(self, records: int, steps: int) -> str | None:
        """What makes this timeline not fit a capture of ``records`` records and ``steps`` steps, or None."""
        def num(x: Any) -> bool:
            return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0

        def index(x: Any, n: int | None) -> bool:
            return isinstance(x, int) and not isinstance(x, bool) and 0 <= x and (n is None or x < n)

        if not index(self.step, steps):
            return f"step {self.step!r} is not one of the capture's {steps} steps"
        if not num(self.span_us) or not index(self.total, None) or self.total < len(self.kernels):
            return "its span or kernel count is damaged"
        for i, row in enumerate(self.kernels):
            if not isinstance(row, (list, tuple)) or len(row) != len(self.ROW):
                return f"kernel {i} is not a row of {len(self.ROW)} ({', '.join(self.ROW)})"
            name, start, dur, stream, record, call = row
            if not index(name, len(self.names)) or not num(start) or not num(dur):
                return f"kernel {i} has a name index past the names, or a negative or non-finite time"
            if (record is not None and not index(record, records)) or (call is not None and not index(call, None)) \
                    or (stream is not None and (isinstance(stream, bool) or not isinstance(stream, int))):
                return f"kernel {i} names a record, call or stream that is not one"
        return self._calls_problem(num, index)

    def _calls_problem(self, num: Any, index: Any) -> str | None:
        if self.calls is None:
            return None
        if not num(self.latency_us):
            return "its launch latency is damaged"
        for i, row in enumerate(self.calls):
            if not isinstance(row, (list, tuple)) or len(row) != 4:
                return f"host call {i} is not a row of 4 (gap_us, cost_us, kind, kernels)"
            gap, cost, kind, ops = row
            if not num(gap) or not num(cost) or kind not in self.CALL_KINDS or not isinstance(ops, list) \
                    or not all(index(k, len(self.kernels)) for k in ops):
                return f"host call {i} has a negative time, an unknown kind or a kernel that is not one"
        return None

    @classmethod
    def read(cls, d: Any, records: int, steps: int) -> KernelTimeline | None:
        """The timeline a capture file holds, or None; one that does not fit is dropped with a warning."""
        if d is None:
            return None
        try:
            tl = from_fields(cls, d)
            why = tl.problem(records, steps)
        except (TypeError, AttributeError) as err:
            why = f"{type(err).__name__}: {err}"
        if why is None:
            return tl
        log.warning("te-gemm: the capture's kernel timeline is dropped (%s); the rest of the capture loads", why)
        return None


def aggregate(events: list[GemmEvent], num_steps: dict[str, float]) -> list[GemmRecord]:
    """Group events into records, in first-seen order; ``num_steps``: the full steps each source recorded on."""
    groups: dict[tuple, list[GemmEvent]] = {}
    for e in events:
        groups.setdefault(e.key(), []).append(e)
    records = []
    for evs in groups.values():
        e = evs[0]
        records.append(GemmRecord(
            module=e.module, gemm=e.gemm, op=str(e.op), m=e.m, k=e.k, n=e.n, batch=e.batch,
            precision=e.precision, operands=list(e.operands), source=e.source, kernel=e.kernel,
            recompute=e.recompute, module_type=e.module_type, calls=len(evs),
            calls_per_step=len(evs) / (num_steps.get(e.source) or 1), flops=e.shape.flops,
            times_ms=[x.time_ms for x in evs if x.time_ms is not None],
            m_splits=[list(x.m_splits) for x in evs if x.m_splits is not None],
        ))
    return records
