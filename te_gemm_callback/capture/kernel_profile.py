"""Per-GEMM GPU time without a Python instrument in the step: kernel activity records.

A *kernels* step runs with nothing of ours in it but ``torch.profiler`` collecting CUDA kernel
activity (CUPTI: each kernel's start and end on the GPU, no host-side op tracing). Its GEMM
kernels are then joined to the GEMMs an *instrumented* step captured, by launch order: within one
step a model launches its GEMMs in the same order every step, and each captured call
(``general_gemm``, aten ``mm``) launches one GEMM kernel. The join is only made when the two
counts agree; otherwise the capture says so and keeps its CUDA-event times.

Kernel durations are the GPU's own time for each kernel: unlike an event pair around a launch
they hold no idle gap while the host is still launching, which is what a host-bound step is full of.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

from te_gemm_callback.capture.kernels import (
    breakdown_ms,
    comm_overlap_ms,
    is_gemm_kernel,
    kernel_intervals,
    top_kernels_ms,
)

log = logging.getLogger("te_gemm_callback")


@dataclass
class KernelStep:
    """Kernels of one profiled step, in start order: (name, start µs, end µs)."""

    kernels: list[tuple[str, float, float]] = field(default_factory=list)

    def gemm_kernels(self) -> list[tuple[str, float, float]]:
        """One entry per GEMM call. cuBLAS's split-K GEMMs launch a second kernel that reduces
        the partial sums (``..._execute_split_k_kernel``, ``splitKreduce_kernel``; H200, fp32
        nn.Linear backward): it is the tail of the GEMM before it, so its time is added there and
        it does not count as a GEMM of its own."""
        out: list[tuple[str, float, float]] = []
        for k in self.kernels:
            if not is_gemm_kernel(k[0]):
                continue
            if out and _split_k_tail(k[0]):
                name, s, e = out[-1]
                out[-1] = (name, s, e + (k[2] - k[1]))
            else:
                out.append(k)
        return out

    def gemm_ms(self) -> float:
        return sum(e - s for _, s, e in self.gemm_kernels()) / 1e3

    def kernel_us(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for n, s, e in self.kernels:
            out[n] = out.get(n, 0.0) + (e - s)
        return out


# The step marker: ATen's spin kernel with 0 cycles (about 2 µs on the GPU, one launch on the host),
# a name no model kernel has. Launched on the current stream at a kernels step's start, it follows
# every kernel of the steps before it in stream order, so the step's kernels are those after it.
MARKER = "spin_kernel"


def _split_k_tail(name: str) -> bool:
    low = name.lower()
    return "split_k_kernel" in low or "splitkreduce" in low


class KernelProfile:
    """``torch.profiler`` with CUDA kernel activity only, over one or more steps.

    Used the same way by the profiler's kernels steps (callback, sweep and plain loops alike).
    ``start()`` may come a step early (a warm-up step): the GPU then runs the measured step in the
    same state as the job's other steps, not after an idle gap while CUPTI starts: an idle GPU
    regains boost clock, and kernels timed right after it would read faster than the job runs them
    (measured: docs/step-plan.md, kernels-warmup).
    ``mark()`` opens each measured step; ``stop()`` returns one :class:`KernelStep` per mark (or one
    for the whole session without marks). Starting fails softly: another profiler already running
    in the job leaves ``error`` set and the step simply unprofiled.

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
        # Host ms the last stop() waited in its sync: the GPU finishing work the host had queued
        # ahead, which the job would wait for anyway, unlike the records' read after it.
        self.sync_ms: float | None = None

    @property
    def running(self) -> bool:
        return self._prof is not None

    def start(self) -> bool:
        import torch

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
            return split_at_marks(sorted(kernel_intervals(prof), key=lambda k: k[1]), self._marks)
        except Exception as err:
            self.error = f"{type(err).__name__}: {err}"
            log.warning("te-gemm: kernel records lost: %s", self.error)
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


def split_at_marks(kernels: list[tuple[str, float, float]], marks: int) -> list[KernelStep]:
    """One KernelStep per step marker (kernels in start order; the markers themselves dropped);
    without markers, one step of everything. Kernels before the first marker (a warm-up step) go."""
    if marks == 0:
        return [KernelStep(kernels)]
    at = [i for i, k in enumerate(kernels) if MARKER in k[0]]
    if len(at) != marks:
        raise RuntimeError(f"{marks} step marker(s) launched, {len(at)} among the {len(kernels)} kernel records")
    return [KernelStep(kernels[a + 1:b]) for a, b in zip(at, at[1:] + [len(kernels)])]


def join_by_order(sequence: list[Any], step: KernelStep,
                  kernels_per_call: list[tuple[int, ...]] | None = None) -> list[tuple[Any, float]] | None:
    """Pair each captured GEMM call of a step (``sequence``, launch order; ``None`` marks an aten
    GEMM that ran but is counted elsewhere) with the GEMM kernel(s) it launched, in order.

    Most calls launch one GEMM kernel. TE's grouped GEMM (``general_grouped_gemm``) launches one per
    expert (H200, TE 2.20: 60 GEMM kernels for 12 plain and 6 grouped calls of 8 experts); an
    expert with no rows may launch none. ``kernels_per_call`` gives, per call, the counts to try in
    turn (e.g. ``(8, 7)``: every expert, or only those with rows; default one kernel each); the
    first choice whose total matches the step's GEMM kernels is used. A call's time is the GPU span
    of its kernels (first start to last end: the experts may run on several streams at once), as
    an event pair around the call would read it. Returns (call, ms) for the counted calls, or None
    when no choice of counts matches."""
    gemms = step.gemm_kernels()
    if not sequence:
        return None
    options = kernels_per_call or [(1,)] * len(sequence)
    if len(options) != len(sequence):
        return None
    depth = max(len(o) for o in options)
    for choice in range(depth):
        counts = [o[min(choice, len(o) - 1)] for o in options]
        if sum(counts) == len(gemms):
            break
    else:
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
           "MARKER"]
