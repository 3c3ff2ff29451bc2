"""Per-GEMM GPU time from CUDA kernel records: a *kernels* step runs with only ``torch.profiler`` collecting
CUPTI kernel activity (the GPU's own durations, without a host-bound step's gaps). A model launches its GEMMs
in the same order every step: its GEMM kernels join an instrumented step's GEMMs by launch order."""

from __future__ import annotations

import itertools
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

from te_gemm_callback.capture.capture_file import KernelTimeline
from te_gemm_callback.capture.cupti import torch_profiler_running
from te_gemm_callback.capture.kernels import (
    breakdown_ms,
    call_kind,
    comm_overlap_ms,
    is_gemm_kernel,
    kernel_intervals,
    raw_events,
    top_kernels_ms,
)
from te_gemm_callback.printable import error_text

log = logging.getLogger("te_gemm_callback")


@dataclass
class KernelStep:
    """The kernels of one profiled step, in start order, and the step's CUDA runtime calls in host order."""

    kernels: list[tuple[str, float, float]] = field(default_factory=list)  # (name, start µs, end µs)
    streams: list[int | None] = field(default_factory=list)  # per kernel
    start: float | None = None  # the step marker's start, on the kernels' clock; None without a marker
    calls: list[tuple[str, float, float, int]] = field(default_factory=list)  # (name, start, end, correlation id)
    corrs: list[int | None] = field(default_factory=list)  # per kernel, its launch's correlation id

    def gemm_units(self) -> list[list[int]]:
        """Each GEMM's kernel indices, in launch order. A cuBLAS split-K reduction kernel joins the
        GEMM before it (docs/results/h200.md, facts the code relies on: split-K)."""
        out: list[list[int]] = []
        for i, (name, _, _) in enumerate(self.kernels):
            low = name.lower()
            if not is_gemm_kernel(low):
                continue
            if out and ("split_k_kernel" in low or "splitkreduce" in low):
                out[-1].append(i)
            else:
                out.append([i])
        return out

    def gemm_kernels(self) -> list[tuple[str, float, float]]:
        """One entry per GEMM (:meth:`gemm_units`), with any split-K tail's time added."""
        ks = self.kernels
        return [(ks[f][0], ks[f][1], ks[f][2] + sum(ks[i][2] - ks[i][1] for i in tail))
                for f, *tail in self.gemm_units()]

    def gemm_ms(self) -> float:
        return sum(e - s for _, s, e in self.gemm_kernels()) / 1e3

    def kernel_us(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for n, s, e in self.kernels:
            out[n] = out.get(n, 0.0) + (e - s)
        return out


# Step marker: ATen's spin kernel with 0 cycles, a name no model kernel has. Launched on the current
# stream at a kernels step's start, it runs after all earlier kernels: the step's kernels follow it.
MARKER = "spin_kernel"


class KernelProfile:
    """``torch.profiler`` with CUDA kernel activity only: ``start()`` a step early, past CUPTI's start-up idle gap
    (docs/step-plan.md, kernels-warmup); ``mark()`` opens each measured step; ``stop()`` returns one
    :class:`KernelStep` per mark (one without marks). A failed start sets ``error``."""

    def __init__(self) -> None:
        self._prof: Any = None
        self._env: str | None = None
        self._marks = 0
        self.error: str | None = None
        self.sync_ms: float | None = None  # host ms of the last stop()'s sync (GPU work the job waits for anyway)

    @property
    def running(self) -> bool:
        return self._prof is not None

    def start(self) -> bool:
        import torch

        if torch_profiler_running():  # CUPTI has one subscriber: the job's session keeps it
            self.error = "the job's own torch.profiler is recording: CUPTI's kernel records are its"
            log.warning("te-gemm: no kernel records (%s)", self.error)
            return False
        # Without TEARDOWN_CUPTI=1 Kineto leaves CUPTI attached and every later launch costs more host
        # time (pytorch/pytorch#144455). Its teardown thread reads the variable again later, so it
        # stays set for the rest of the process (docs/step-plan.md, kernels). A user's setting wins.
        self._env = os.environ.get("TEARDOWN_CUPTI")
        if self._env is None:
            os.environ["TEARDOWN_CUPTI"] = "1"
        try:
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
            prof.__enter__()
        except Exception as err:  # e.g. the job runs its own torch.profiler
            if self._env is None:  # no session ran: leave the environment as it was
                os.environ.pop("TEARDOWN_CUPTI", None)
            self.error = f"torch.profiler could not start: {type(err).__name__}: {err}"
            log.warning("te-gemm: no kernel records (%s)", self.error)
            return False
        self._prof = prof
        self._marks = 0
        return True

    def mark(self) -> None:
        """A measured step starts here (kernels launched after this call belong to it)."""
        import torch

        if self._prof is not None:
            torch.cuda._sleep(0)
            self._marks += 1

    def stop(self) -> list[KernelStep] | None:
        import torch

        prof, self._prof = self._prof, None
        if prof is None:
            return None
        try:
            # The kernels must finish before the window closes; after the step's end boundary.
            t0 = time.perf_counter()
            torch.cuda.synchronize()
            self.sync_ms = (time.perf_counter() - t0) * 1e3
            prof.__exit__(None, None, None)
            records = sorted(kernel_records(prof), key=lambda k: k[1])
            calls = host_calls(prof)
            if not records and self._marks:  # not even the marker: CUPTI's records went elsewhere
                self.error = ("no kernel came back from torch.profiler: another profiler probably holds CUPTI "
                              "(Nsight Systems, Nsight Compute, a CUPTI injection)")
                log.warning("te-gemm: no kernel records: %s", self.error)
                return None
            return split_at_marks([k[:3] for k in records], self._marks, [k[3] for k in records],
                                  [k[4] for k in records], calls)
        except Exception as err:
            self.error = error_text(err)
            log.warning("te-gemm: kernel records unusable: %s", self.error)
            return None

    def discard(self) -> None:
        prof, self._prof = self._prof, None
        if prof is not None:
            try:
                prof.__exit__(None, None, None)
            except Exception:  # already broken: nothing of it is used
                pass


def kernel_records(prof: Any, device: str = "CUDA") -> list[tuple[str, float, float, int | None, int | None]]:
    """(name, start µs, end µs, stream, correlation id) of every ``device`` kernel of a finished session:
    :func:`~.kernels.kernel_intervals` with each kernel's stream and the id of its launch."""
    try:
        return [(e.name(), s, t, e.device_resource_id() if hasattr(e, "device_resource_id") else None,
                 (e.correlation_id() if hasattr(e, "correlation_id") else None) or None)
                for e, s, t in raw_events(prof, device)]
    except AttributeError:  # another torch: the parsed events, streams unknown
        return [(n, s, e, None, None) for n, s, e in kernel_intervals(prof, device)]


def host_calls(prof: Any) -> list[tuple[str, float, float, int]]:
    """(name, start µs, end µs, correlation id) of a finished session's CUDA runtime and driver calls, in host
    order, on the kernels' clock; nested calls left out; empty where the records cannot be read."""
    try:
        raw = sorted(((e.name(), s, t, e.correlation_id()) for e, s, t in raw_events(prof)
                      if "CPU" in str(e.device_type()) and e.name().startswith("cu") and e.correlation_id()),
                     key=lambda c: c[1])
    except AttributeError:  # another torch
        return []
    out: list[tuple[str, float, float, int]] = []
    for c in raw:
        if not out or c[1] >= out[-1][2]:  # else nested in the call before it (or on another thread)
            out.append(c)
    return out


def split_at_marks(kernels: list[tuple[str, float, float]], marks: int,
                   streams: list[int | None] | None = None, corrs: list[int | None] | None = None,
                   calls: list[tuple[str, float, float, int]] | None = None) -> list[KernelStep]:
    """One KernelStep per step marker, markers and kernels before the first one dropped; without
    markers, one step of everything. ``streams``, ``corrs``: per kernel, split alike. ``calls``
    (:func:`host_calls`): each step keeps those between its marker's launch and the next one's."""
    st = list(streams) if streams is not None and len(streams) == len(kernels) else []
    co = list(corrs) if corrs is not None and len(corrs) == len(kernels) else []
    calls = calls or []

    def part(a: int, b: int, start: float | None) -> KernelStep:
        return KernelStep(kernels[a:b], st[a:b] if st else [], start, corrs=co[a:b] if co else [])

    if marks == 0:
        return [part(0, len(kernels), None)]
    at = [i for i, k in enumerate(kernels) if MARKER in k[0]]
    if len(at) != marks:
        raise RuntimeError(f"{marks} step marker(s) launched, {len(at)} among the {len(kernels)} kernel records")
    steps = [part(a + 1, b, kernels[a][1]) for a, b in zip(at, at[1:] + [len(kernels)])]
    if co and calls:
        launched: dict[int | None, int] = {c[3]: j for j, c in enumerate(calls)}
        where = [launched.get(co[a]) for a in at]
        found = [w for w in where if w is not None]
        if len(found) == len(where):  # every marker's launch is among the calls
            for k, (w, nxt) in enumerate(zip(found, found[1:] + [len(calls)])):
                steps[k].calls = calls[w + 1:nxt]
    return steps


def join_by_order(sequence: list[Any], step: KernelStep,
                  kernels_per_call: list[tuple[int, ...]] | None = None) -> list[tuple[Any, float]] | None:
    """(call, ms) for each counted call of ``sequence`` (a step's GEMM calls in launch order; None: an aten GEMM
    counted elsewhere) paired in order with its GEMM kernels, or None; ms: their GPU span, as an event pair reads it.
    ``kernels_per_call``: per call, the kernel counts to try in turn, default one each (a grouped GEMM
    launches one per expert: docs/results/h200.md, facts the code relies on: grouped GEMM)."""
    gemms = step.gemm_kernels()
    groups = _call_groups(sequence, len(gemms), kernels_per_call)
    if groups is None:
        return None
    out: list[tuple[Any, float]] = []
    for call, r in zip(sequence, groups):
        group = gemms[r.start:r.stop]
        if call is not None:
            out.append((call, (max(e for _, _, e in group) - min(s for _, s, _ in group)) / 1e3 if group else 0.0))
    return out


def _call_groups(sequence: list[Any], gemms: int, kernels_per_call: list[tuple[int, ...]] | None) -> list[range] | None:
    """Per call, the range of the step's GEMMs it launched (the first choice of counts totalling ``gemms``), or None."""
    if not sequence:
        return None
    options = kernels_per_call or [(1,)] * len(sequence)
    if len(options) != len(sequence):
        return None
    for choice in range(max(len(o) for o in options)):
        counts = [o[min(choice, len(o) - 1)] for o in options]
        if sum(counts) == gemms:
            return [range(end - n, end) for n, end in zip(counts, itertools.accumulate(counts))]
    return None


def kernel_calls(sequence: list[Any], step: KernelStep,
                 kernels_per_call: list[tuple[int, ...]] | None = None) -> list[int | None] | None:
    """Per kernel of ``step``, the position in ``sequence`` of the GEMM call that launched it (the
    join of :func:`join_by_order`); None for a kernel that is no GEMM, or None where no join matches."""
    units = step.gemm_units()
    groups = _call_groups(sequence, len(units), kernels_per_call)
    if groups is None:
        return None
    out: list[int | None] = [None] * len(step.kernels)
    for call, r in enumerate(groups):
        for u in r:
            for i in units[u]:
                out[i] = call
    return out


# A large MoE step runs a few thousand kernels; at ~70 bytes each, a full timeline adds under 1.5 MB.
MAX_TIMELINE_KERNELS = 20_000
MAX_KERNEL_NAME = 500  # kernel names are C++ template signatures; the start names the kernel


def kernel_timeline(index: int, step: KernelStep, calls: list[int | None], sequence: list[Any],
                    record_of: dict[Any, int], limit: int = MAX_TIMELINE_KERNELS) -> KernelTimeline:
    """The timeline of kernels step ``index``: its first ``limit`` kernels with start and duration in
    µs from the step's start, stream, and for a GEMM kernel its call's position (``calls``:
    :func:`kernel_calls`) and record (``record_of``: key of a call in ``sequence`` -> record index)."""
    ks = step.kernels
    t0 = step.start if step.start is not None else min((s for _, s, _ in ks), default=0.0)
    t0 = min([t0, *(s for _, s, _ in ks)])  # no kernel starts before the marker: a clock that says so is held at 0
    names: dict[str, int] = {}
    rows: list[list[Any]] = []
    for i, (name, s, e) in enumerate(ks[:limit]):
        at = names.setdefault(name[:MAX_KERNEL_NAME], len(names))
        call = calls[i]
        key = sequence[call] if call is not None else None
        rows.append([at, round(s - t0, 3), round(max(e - s, 0.0), 3),
                     step.streams[i] if i < len(step.streams) else None,
                     record_of.get(key) if key is not None else None, call])
    span = max((e for _, _, e in ks), default=t0) - t0
    host = host_rows(step) if len(ks) <= limit else None
    return KernelTimeline(step=index, span_us=round(span, 3), names=list(names), kernels=rows, total=len(ks),
                          calls=host[0] if host else None, latency_us=host[1] if host else None)


def host_rows(step: KernelStep) -> tuple[list[list[Any]], float] | None:
    """A kernels step's host side (:mod:`te_gemm_callback.analysis.replay`), None without host calls or kernel ids:
    ``[gap_us, cost_us, kind, [kernel indices]]`` per runtime call up to the step's end boundary, and the launch
    latency (median µs from a launch to its kernel's start on an idle stream)."""
    if not step.calls or len(step.corrs) != len(step.kernels):
        return None
    # The step's host time ends at its end boundary, the last event record; the session's stop follows.
    ends = [j for j, c in enumerate(step.calls) if c[0].startswith("cudaEventRecord")]
    calls = step.calls[:ends[-1] + 1] if ends else step.calls
    of_corr: dict[int, list[int]] = {}
    for i, corr in enumerate(step.corrs):
        if corr is not None:
            of_corr.setdefault(corr, []).append(i)
    rows: list[list[Any]] = []
    lags: list[float] = []
    free: dict[Any, float] = {}
    prev_end = calls[0][1]
    for name, start, end, corr in calls:
        launched = of_corr.get(corr, [])
        for i in launched:
            stream = step.streams[i] if i < len(step.streams) else None
            if free.get(stream, -1.0) <= start:  # its stream idle when the launch began
                lags.append(step.kernels[i][1] - start)
            free[stream] = step.kernels[i][2]
        rows.append([round(max(start - prev_end, 0.0), 3), round(max(end - start, 0.0), 3), call_kind(name), launched])
        prev_end = end
    lags = sorted(x for x in lags if x >= 0)
    return rows, round(lags[len(lags) // 2], 3) if lags else 5.0


def breakdown_meta(steps: list[KernelStep]) -> dict[str, Any]:
    """The capture meta of the kernels steps: kernel time per category, top kernels, communication overlap."""
    n = len(steps)
    us: dict[str, float] = {}
    intervals: list[tuple[str, float, float]] = []
    for st in steps:
        for name, t in st.kernel_us().items():
            us[name] = us.get(name, 0.0) + t
        intervals += st.kernels
    return {"kernel_breakdown_ms": breakdown_ms(us, n), "kernel_top_ms": top_kernels_ms(us, n),
            "kernel_breakdown_steps": n, "kernel_breakdown_window": "the capture's kernels steps",
            **comm_overlap_ms(intervals, n)}


def join_records(records: list[Any], ref: list[Any], counts: list[tuple[int, ...]] | None,
                 kernel_steps: dict[int, KernelStep], source: str) -> dict[str, Any]:
    """Give each record its GEMM's time in every kernels step (joined by launch order to ``ref``);
    returns the capture's ``kernel_join`` and ``gemm_time_source`` (``source`` where none joined)."""
    times: dict[tuple, list[float]] = {}
    failed = []
    for i, ks in sorted(kernel_steps.items()):
        pairs = join_by_order(ref, ks, counts)
        if pairs is None:
            failed.append(f"step {i}: {len(ks.gemm_kernels())} GEMM kernels, {len(ref)} GEMM calls captured")
            continue
        for key, ms in pairs:
            times.setdefault(key, []).append(ms)
    for r in records:
        if r.key() in times:
            r.times_ms = times[r.key()]
    join = "; ".join(failed) if failed else "joined by launch order"
    if failed:
        log.warning("te-gemm: per-GEMM kernel times not joined (%s): per-GEMM times left to %s", join, source)
    return {"gemm_time_source": "kernel_records" if times else source, "kernel_join": join}


__all__ = ["KernelProfile", "KernelStep", "join_by_order", "join_records", "breakdown_meta", "split_at_marks",
           "kernel_calls", "kernel_records", "kernel_timeline", "MARKER", "MAX_TIMELINE_KERNELS"]
