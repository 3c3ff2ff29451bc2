"""Per-GEMM GPU time from CUDA kernel activity records, with no Python instrument in the step.

A *kernels* step runs with only ``torch.profiler`` collecting CUPTI kernel activity (GPU start and
end per kernel, no host op tracing). Its GEMM kernels are joined by launch order to the GEMMs an
*instrumented* step captured: a model launches its GEMMs in the same order every step, and each
captured call (``general_gemm``, aten ``mm``) launches one GEMM kernel. The join is made only if
the counts agree; otherwise the capture says so and keeps its CUDA-event times.

Kernel durations are the GPU's own time. Unlike an event pair around a launch, they exclude idle
gaps while the host is still launching, which fill a host-bound step.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

from te_gemm_callback.capture.capture_file import KernelTimeline
from te_gemm_callback.capture.kernels import (
    breakdown_ms,
    call_kind,
    comm_overlap_ms,
    is_gemm_kernel,
    kernel_intervals,
    top_kernels_ms,
)

log = logging.getLogger("te_gemm_callback")


@dataclass
class KernelStep:
    """Kernels of one profiled step, in start order: (name, start µs, end µs).

    ``streams`` holds each kernel's CUDA stream (empty if the records lack it). ``start`` is the
    step marker's start on the same clock, from which the step's kernels are timed (None without
    a marker)."""

    kernels: list[tuple[str, float, float]] = field(default_factory=list)
    streams: list[int | None] = field(default_factory=list)
    start: float | None = None
    # The step's CUDA runtime calls in host order (name, start µs, end µs, correlation id), and
    # each kernel's correlation id (None if unknown), linking kernels to their launching call.
    calls: list[tuple[str, float, float, int]] = field(default_factory=list)
    corrs: list[int | None] = field(default_factory=list)

    def gemm_units(self) -> list[list[int]]:
        """Each GEMM's kernel indices into ``kernels``, in launch order.

        cuBLAS split-K GEMMs launch a second kernel that reduces partial sums
        (``..._execute_split_k_kernel``, ``splitKreduce_kernel``; docs/results/h200.md, facts the
        code relies on: split-K). It joins the preceding GEMM's unit instead of counting as a GEMM."""
        out: list[list[int]] = []
        for i, k in enumerate(self.kernels):
            if not is_gemm_kernel(k[0]):
                continue
            if out and _split_k_tail(k[0]):
                out[-1].append(i)
            else:
                out.append([i])
        return out

    def gemm_kernels(self) -> list[tuple[str, float, float]]:
        """One entry per GEMM (:meth:`gemm_units`), with any split-K tail's time added."""
        out: list[tuple[str, float, float]] = []
        for unit in self.gemm_units():
            name, s, e = self.kernels[unit[0]]
            out.append((name, s, e + sum(self.kernels[i][2] - self.kernels[i][1] for i in unit[1:])))
        return out

    def gemm_ms(self) -> float:
        return sum(e - s for _, s, e in self.gemm_kernels()) / 1e3

    def kernel_us(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for n, s, e in self.kernels:
            out[n] = out.get(n, 0.0) + (e - s)
        return out


# Step marker: ATen's spin kernel with 0 cycles (~2 µs GPU, one host launch), a name no model
# kernel has. Launched on the current stream at a kernels step's start, it runs after all earlier
# kernels in stream order, so the step's kernels are those after it.
MARKER = "spin_kernel"


def _split_k_tail(name: str) -> bool:
    low = name.lower()
    return "split_k_kernel" in low or "splitkreduce" in low


class KernelProfile:
    """``torch.profiler`` with CUDA kernel activity only, over one or more steps.

    Used by every kernels step (callback, sweep and plain loops alike). Call ``start()`` a step
    early (warm-up) so the measured step does not follow CUPTI's start-up idle gap: an idle GPU
    regains boost clock and its kernels would read faster than the job runs them
    (docs/step-plan.md, kernels-warmup). ``mark()`` opens each measured step; ``stop()`` returns
    one :class:`KernelStep` per mark, or one for the session without marks. If another profiler is
    already running, start fails softly: ``error`` is set and the step goes unprofiled.

    Example:
        >>> kp = KernelProfile()                                    # doctest: +SKIP
        >>> kp.start(); train_step(); kp.mark(); train_step()       # doctest: +SKIP
        >>> [step] = kp.stop(); step.gemm_ms()                      # doctest: +SKIP
    """

    def __init__(self) -> None:
        self._prof: Any = None
        self._env: str | None = None
        self._marks = 0
        self.error: str | None = None
        # Host ms the last stop() spent in its sync, finishing queued GPU work the job would wait
        # for anyway (unlike the records' read after it).
        self.sync_ms: float | None = None

    @property
    def running(self) -> bool:
        return self._prof is not None

    def start(self) -> bool:
        import torch

        from te_gemm_callback.capture.cupti import torch_profiler_running

        if torch_profiler_running():  # CUPTI has one subscriber: the job's session keeps it
            self.error = "the job's own torch.profiler is recording: CUPTI's kernel records are its"
            log.warning("te-gemm: no kernel records (%s)", self.error)
            return False
        # Kineto leaves CUPTI attached after a session unless TEARDOWN_CUPTI=1: every later kernel
        # launch of the job then costs more host time (pytorch/pytorch#144455), which a host-bound
        # job pays on every step. A user's own setting wins (CUDA graphs with CUDA < 12.6 crash on
        # re-init after a teardown).
        # The teardown is asynchronous in Kineto: a thread finalizes CUPTI from the job's next CUDA
        # call and then reads TEARDOWN_CUPTI again; unset by then, it subscribes CUPTI's callbacks
        # anew (no lazy re-init), and launches cost more from then on, as if there had been no
        # teardown (measured: docs/step-plan.md, kernels). So the variable stays set for the rest
        # of the process. A session started before the
        # previous teardown finished waits for it (up to 10 s) and may then record no GPU activity:
        # one session spans a capture's warm-up and kernels steps; a lost one is said in meta.kernel_join.
        self._env = os.environ.get("TEARDOWN_CUPTI")
        if self._env is None:
            os.environ["TEARDOWN_CUPTI"] = "1"
        try:
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
            prof.__enter__()
        except Exception as err:  # e.g. the job runs its own torch.profiler
            self._restore_env()
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
            # The step's kernels must have finished before the window closes: this sync sits
            # after the step's end boundary, so no measured step contains it.
            t0 = time.perf_counter()
            torch.cuda.synchronize()
            self.sync_ms = (time.perf_counter() - t0) * 1e3
            prof.__exit__(None, None, None)
            records = sorted(kernel_records(prof), key=lambda k: k[1])
            calls = host_calls(prof)
            if not records and self._marks:
                # Not even the step marker came back: CUPTI's activity records went to another
                # subscriber that cupti.py did not recognise (nsys attached after launch, say).
                self.error = ("no kernel came back from torch.profiler: another profiler probably holds CUPTI "
                              "(Nsight Systems, Nsight Compute, a CUPTI injection)")
                log.warning("te-gemm: no kernel records: %s", self.error)
                return None
            return split_at_marks([k[:3] for k in records], self._marks, [k[3] for k in records],
                                  [k[4] for k in records], calls)
        except Exception as err:
            self.error = f"{type(err).__name__}: {err}"
            log.warning("te-gemm: kernel records unusable: %s", self.error)
            return None

    def _restore_env(self) -> None:
        """Only where no session ran (its start failed): after one, see :meth:`start`."""
        if self._env is None:
            os.environ.pop("TEARDOWN_CUPTI", None)

    def discard(self) -> None:
        prof, self._prof = self._prof, None
        if prof is not None:
            try:
                prof.__exit__(None, None, None)
            except Exception:  # already broken: nothing of it is used
                pass


def kernel_records(prof: Any, device: str = "CUDA") -> list[tuple[str, float, float, int | None, int | None]]:
    """(name, start µs, end µs, stream, correlation id) of every ``device`` kernel in a finished
    ``torch.profiler`` session: :func:`~te_gemm_callback.capture.kernels.kernel_intervals` with each
    kernel's stream (Kineto's resource id of a GPU activity: its CUDA stream) and the id CUPTI gave
    the host call that launched it, read from the same raw records and with the same filter. Where
    they cannot be read, the parsed events without streams or ids."""
    try:
        results = prof.profiler.kineto_results
        t0 = results.trace_start_ns()
        out = []
        for e in results.events():
            if device not in str(e.device_type()) or getattr(e, "is_hidden_event", lambda: False)():
                continue
            stream = e.device_resource_id() if hasattr(e, "device_resource_id") else None
            corr = e.correlation_id() if hasattr(e, "correlation_id") else None
            out.append((e.name(), (e.start_ns() - t0) / 1e3, (e.start_ns() - t0 + e.duration_ns()) / 1e3, stream,
                        corr or None))
        return out
    except AttributeError:  # another torch: the parsed events, streams unknown
        return [(n, s, e, None, None) for n, s, e in kernel_intervals(prof, device)]


def host_calls(prof: Any) -> list[tuple[str, float, float, int]]:
    """(name, start µs, end µs, correlation id) of every CUDA runtime and driver call the host made
    in a finished ``torch.profiler`` session with CUDA activity only, in host order, on the kernels'
    clock. CUPTI records them with that activity anyway (CUDA activity in Kineto includes the
    runtime and driver API: nothing more is collected for them). A call made inside another (the
    driver's launch inside the runtime's) is part of it and left out; Kineto's own records
    ("Activity Buffer Request") are not calls of the job. Empty where the records cannot be read."""
    try:
        results = prof.profiler.kineto_results
        t0 = results.trace_start_ns()
        raw = sorted(((e.name(), (e.start_ns() - t0) / 1e3, (e.start_ns() - t0 + e.duration_ns()) / 1e3,
                       e.correlation_id()) for e in results.events()
                      if "CPU" in str(e.device_type()) and e.name().startswith("cu") and e.correlation_id()),
                     key=lambda c: c[1])
    except AttributeError:  # another torch
        return []
    out: list[tuple[str, float, float, int]] = []
    for c in raw:
        if out and c[1] < out[-1][2]:  # nested in the call before it (or on another thread meanwhile)
            continue
        out.append(c)
    return out


def split_at_marks(kernels: list[tuple[str, float, float]], marks: int,
                   streams: list[int | None] | None = None, corrs: list[int | None] | None = None,
                   calls: list[tuple[str, float, float, int]] | None = None) -> list[KernelStep]:
    """One KernelStep per step marker (kernels in start order; the markers themselves dropped);
    without markers, one step of everything. Kernels before the first marker (a warm-up step) go.
    ``streams`` and ``corrs``: each kernel's stream and correlation id, in the same order (None: not
    known), split alike. ``calls``: the host's runtime calls (:func:`host_calls`); each step keeps
    those after its marker's launch and before the next marker's (or the session's end)."""
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
    """Pair each captured GEMM call of a step (``sequence``, launch order; ``None`` marks an aten
    GEMM that ran but is counted elsewhere) with the GEMM kernel(s) it launched, in order.

    Most calls launch one GEMM kernel. TE's grouped GEMM (``general_grouped_gemm``) launches one per
    expert (docs/results/h200.md, facts the code relies on: grouped GEMM); an expert with no rows may
    launch none. ``kernels_per_call`` gives, per call, the counts to try in turn (e.g. ``(8, 7)``:
    every expert, or only those with rows; default one kernel each); the first choice whose total
    matches the step's GEMM kernels is used. A call's time is the GPU span of its kernels (first start
    to last end: the experts may run on several streams at once), as an event pair around the call
    would read it. Returns (call, ms) for the counted calls, or None when no choice of counts
    matches."""
    gemms = step.gemm_kernels()
    counts = _call_counts(sequence, len(gemms), kernels_per_call)
    if counts is None:
        return None
    out: list[tuple[Any, float]] = []
    i = 0
    for call, n in zip(sequence, counts):
        group = gemms[i:i + n]
        i += n
        if call is not None:
            ms = (max(e for _, _, e in group) - min(s for _, s, _ in group)) / 1e3 if group else 0.0
            out.append((call, ms))
    return out


def _call_counts(sequence: list[Any], gemms: int,
                 kernels_per_call: list[tuple[int, ...]] | None) -> list[int] | None:
    """GEMM kernels per call: the first choice of :func:`join_by_order`'s counts whose total is
    ``gemms``, or None."""
    if not sequence:
        return None
    options = kernels_per_call or [(1,)] * len(sequence)
    if len(options) != len(sequence):
        return None
    for choice in range(max(len(o) for o in options)):
        counts = [o[min(choice, len(o) - 1)] for o in options]
        if sum(counts) == gemms:
            return counts
    return None


def kernel_calls(sequence: list[Any], step: KernelStep,
                 kernels_per_call: list[tuple[int, ...]] | None = None) -> list[int | None] | None:
    """Per kernel of ``step``, the position in ``sequence`` of the GEMM call that launched it, by
    the same launch-order join as :func:`join_by_order` (a split-K tail, an expert's kernel: its
    call's position); None for every kernel that is no GEMM. None where the join does not match."""
    units = step.gemm_units()
    counts = _call_counts(sequence, len(units), kernels_per_call)
    if counts is None:
        return None
    out: list[int | None] = [None] * len(step.kernels)
    u = 0
    for call, n in enumerate(counts):
        for unit in units[u:u + n]:
            for i in unit:
                out[i] = call
        u += n
    return out


# Kernels a timeline keeps: a step of a large MoE model runs a few thousand; each kernel costs about
# 70 bytes in the capture file, so a timeline at the cap adds under 1.5 MB.
MAX_TIMELINE_KERNELS = 20_000
# Kernel names are C++ template signatures, some thousands of characters long; the start names the
# kernel, the rest are its template arguments.
MAX_KERNEL_NAME = 500


def kernel_timeline(index: int, step: KernelStep, calls: list[int | None], sequence: list[Any],
                    record_of: dict[Any, int], limit: int = MAX_TIMELINE_KERNELS) -> KernelTimeline:
    """The timeline of kernels step ``index``: every kernel (at most ``limit``, the first by start)
    with its start and duration in µs from the step's start, its stream, and for a GEMM kernel its
    call's position (``calls``: :func:`kernel_calls`) and the record that call was grouped into
    (``record_of``: the key of a call in ``sequence`` -> index in the capture's records)."""
    ks = step.kernels
    t0 = step.start if step.start is not None else min((s for _, s, _ in ks), default=0.0)
    # No kernel starts before the marker in start order; a clock that says otherwise is held at 0.
    t0 = min([t0, *(s for _, s, _ in ks)])
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
    """The host side of a kernels step, for the replay (:mod:`te_gemm_callback.analysis.replay`):
    one row per runtime call from the step's start boundary to its end boundary, ``[gap_us, cost_us,
    kind, [kernel indices]]`` (host µs since the call before it returned, µs in the call, the kind
    :func:`~te_gemm_callback.capture.kernels.call_kind` gives its name, the step's kernels it
    launched), and the median µs from a launch's start to its kernel's start where the kernel's
    stream was idle: the launch latency. None where the step has no host calls or no kernel ids."""
    if not step.calls or len(step.corrs) != len(step.kernels):
        return None
    # The step boundaries are event records (GemmProfiler._boundary): the step's host time runs from
    # the first call to the last event record; after it come the session's stop and its sync.
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
        rows.append([round(max(start - prev_end, 0.0), 3), round(max(end - start, 0.0), 3), call_kind(name),
                     launched])
        prev_end = end
    lags = sorted(x for x in lags if x >= 0)
    return rows, round(lags[len(lags) // 2], 3) if lags else 5.0


def breakdown_meta(steps: list[KernelStep]) -> dict[str, Any]:
    """The capture meta of the kernels steps: kernel time per category and step, the top kernels
    per category, and communication time with its part no compute kernel overlapped."""
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
    """Give each record the times of its GEMM in every kernels step (joined by launch order to
    ``ref``, the reference instrumented step's calls); returns the capture's ``kernel_join`` and
    ``gemm_time_source`` (``source``, the event timer's, where no step joined)."""
    times: dict[tuple, list[float]] = {}
    failed = []
    for i, ks in sorted(kernel_steps.items()):
        pairs = join_by_order(ref, ks, counts)
        if pairs is None:
            failed.append(f"step {i}: {len(ks.gemm_kernels())} GEMM kernels, {len(ref)} GEMM calls captured")
            continue
        for key, ms in pairs:
            times.setdefault(key, []).append(ms)
    out: dict[str, Any] = {"gemm_time_source": source}
    if times:
        for r in records:
            if r.key() in times:
                r.times_ms = times[r.key()]
        out["gemm_time_source"] = "kernel_records"
    out["kernel_join"] = "; ".join(failed) if failed else "joined by launch order"
    if failed:
        log.warning("te-gemm: per-GEMM kernel times not joined (%s): per-GEMM times left to %s",
                    out["kernel_join"], source)
    return out


__all__ = ["KernelProfile", "KernelStep", "join_by_order", "join_records", "breakdown_meta", "split_at_marks",
           "kernel_calls", "kernel_records", "kernel_timeline", "MARKER", "MAX_TIMELINE_KERNELS"]
