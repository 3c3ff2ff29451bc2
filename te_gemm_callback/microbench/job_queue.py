"""How a run's jobs are measured: each built once, then every visit of a batch queued back to back with
one synchronize (:class:`JobQueue`)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from te_gemm_callback.capture.clocks import ClockSampler
from te_gemm_callback.microbench.cells import BenchResult
from te_gemm_callback.microbench.items import WorkItem
from te_gemm_callback.microbench.jobs import Collect
from te_gemm_callback.microbench.timing import HEAT_LOG, StreamClock, spend_boost
from te_gemm_callback.shapes import GemmOp

PassMode = tuple[GemmOp, str]  # one cell of a job: (pass, mode)

# Jobs left queued on the GPU while the host queues the next: one covers the host's time; more fill
# CUDA's launch queue, where a blocked launch inflates the host-time estimate that sizes a hold.
_JOBS_QUEUED = 1
# Jobs are built (and kept for all their visits) until they hold this share of the GPU's memory.
_MEMORY_SHARE = 0.5


class MeasuredCell(NamedTuple):
    """A cell as one measurement of its job left it."""

    result: BenchResult
    samples: list[float] | None  # every sample (ms), pooled over the visits; None if none was read
    clocks: list[float]  # the SM clock (MHz) over each visit of the job


@dataclass(eq=False)
class PlannedJob:
    """A work item in one recipe: each cell's cache key, cached result and quietest measurement."""

    item: WorkItem
    precision: str
    keys: dict[PassMode, str] = field(default_factory=dict)
    cached: dict[PassMode, BenchResult | None] = field(default_factory=dict)
    measured: dict[PassMode, MeasuredCell] = field(default_factory=dict)

    @property
    def label(self) -> str:
        it = self.item
        return it.fprop.mkn + (f" groups={len(it.m_splits)}" if it.m_splits else "")

    @property
    def todo(self) -> bool:
        """A cell the cache could not give: the job is measured, every cell of it (one build times all)."""
        return not all(self.cached.values())

    @property
    def noisy(self) -> bool:
        return any(c.result.noisy for c in self.measured.values())


@dataclass(eq=False)
class JobVisits:
    """One measurement of a job: the job built once (``runner``), then what each of its visits gathered."""

    job: PlannedJob
    runner: Any = None  # the built jobs.TeJob / TorchJob, released once the batch has run
    times: dict[PassMode, list[float]] = field(default_factory=dict)  # samples (ms), pooled over the visits
    clocks: list[float] = field(default_factory=list)  # the SM clock (MHz) over each visit; none without NVML
    error: str | None = None  # why it could not be built, queued or read back: its later visits are skipped


class _Queued(NamedTuple):
    """A visit queued on the GPU, read back after the one synchronize."""

    visits: JobVisits
    entry: dict[str, Any]  # its timeline entry
    collect: Collect | None  # reads its samples (None: queueing it failed)
    start: Any  # StreamClock marks around it
    end: Any


class JobQueue:
    """Builds jobs in batches that fit in memory and queues every visit of a batch, waiting once."""

    def __init__(self, make_job: Callable[[WorkItem, str], Any], visits: int, sampler: ClockSampler, prog: Any,
                 task: Any, timeline: dict[str, Any]) -> None:
        self.make_job, self.visits, self.sampler = make_job, visits, sampler
        self.prog, self.task, self.timeline = prog, task, timeline
        # The first error that left the CUDA context unusable, and its cell: nothing runs after it.
        self.stopped: str | None = None

    def measure(self, jobs: list[PlannedJob]) -> list[JobVisits]:
        """Build and visit ``jobs``, a fresh :class:`JobVisits` each; after a lost CUDA context
        (:attr:`stopped`), only those of the batches before it."""
        out: list[JobVisits] = []
        pending = [JobVisits(job) for job in jobs]
        while pending and self.stopped is None:
            batch = self.build(pending)
            pending = pending[len(batch):]  # a job that did not fit is first in the next batch
            built = [v for v in batch if v.error is None]
            # Every visit in one queue, so a cell's samples average the power limiter's swings as a
            # training job's steps do; every other visit reversed, so no job always runs at one end.
            sequence = [(n, v) for n in range(self.visits) for v in (built if n % 2 == 0 else built[::-1])]
            if self.stopped is None:
                self.timeline["jobs"] += self.run(sequence)
            self.prog.advance(self.task, (len(batch) - len(built)) * self.visits)
            for v in batch:  # frees their memory for the next batch
                v.runner = None
            if self.stopped is None:
                out += batch
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
        return out

    def _failed(self, v: JobVisits, err: Exception) -> None:
        """Record why a job failed; an error that lost the CUDA context stops the queue."""
        v.error = _reason(err)
        if self.stopped is None and context_lost(v.error):
            self.stopped = f"{v.job.precision} {v.job.label}: {v.error}"

    def build(self, pending: list[JobVisits]) -> list[JobVisits]:
        """Build the next batch before any timing; out of memory with jobs built ends the batch."""
        limit = None
        if torch.cuda.is_available():
            limit = _MEMORY_SHARE * torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        batch: list[JobVisits] = []
        for v in pending:
            job = v.job
            self.prog.update(self.task, description=f"setting up {job.precision} {job.item.fprop.mkn}")
            try:
                v.runner = self.make_job(job.item, job.precision)
            except Exception as err:  # a shape or kernel the recipe cannot run: record and go on
                if isinstance(err, torch.cuda.OutOfMemoryError):
                    torch.cuda.empty_cache()
                    if batch:  # the built jobs hold the memory: this one goes in the next batch
                        break
                self._failed(v, err)
            batch.append(v)
            if self.stopped is not None:
                break
            if v.runner is None:
                continue
            self.timeline.setdefault("setup", []).append({"item": job.label, "precision": job.precision,
                                                          "s": v.runner.setup_s})
            if limit is not None and torch.cuda.memory_allocated() > limit:
                break
        return batch

    def run(self, sequence: list[tuple[int, JobVisits]]) -> list[dict[str, Any]]:
        """Queue every (visit, job) back to back, wait once, pool samples; a timeline entry per visit."""
        try:
            return self._run(sequence)
        except RuntimeError as err:  # a wait or an event met the lost context: the batch is lost
            if not context_lost(str(err)):
                raise
            self.stopped = self.stopped or _reason(err)
            return []

    def _run(self, sequence: list[tuple[int, JobVisits]]) -> list[dict[str, Any]]:
        clock = StreamClock()
        if clock.cuda:  # the GPU idled while the host built the jobs: spend its boost before the first
            spend_boost()
        queued: list[_Queued] = []
        for visit, v in sequence:
            if self.stopped is not None:
                return [q.entry for q in queued]  # no wait: it would raise the same error again
            job = v.job
            self.prog.update(self.task, description=f"{job.precision} {job.item.fprop.mkn}")
            if v.error is not None:  # failed in an earlier visit
                self.prog.advance(self.task)
                continue
            if len(queued) > _JOBS_QUEUED:  # wait for an older job; the newer ones keep the GPU busy meanwhile
                clock.wait_for(queued[-_JOBS_QUEUED - 1].end)
            entry = {"item": job.label, "precision": job.precision, "visit": visit}
            heat0, t_job = HEAT_LOG["heat_s"], time.perf_counter()
            start = clock.mark()
            collect = None
            try:
                collect = v.runner.queue()
            except Exception as err:  # OOM, kernel or shape error: record and go on
                self._failed(v, err)
            entry.update(host_s=time.perf_counter() - t_job, heat_s=HEAT_LOG["heat_s"] - heat0)
            queued.append(_Queued(v, entry, collect, start, clock.mark()))
            self.prog.advance(self.task)
        clock.wait()  # the one synchronize, after the last timed call
        for q in queued:
            v = q.visits
            if q.collect is not None and v.error is None:
                try:
                    for cell, ts in q.collect().items():
                        v.times.setdefault(cell, []).extend(ts)
                except Exception as err:  # an error the GPU reported late
                    self._failed(v, err)
            t0, t1 = clock.at(q.start), clock.at(q.end)
            q.entry["s"] = t1 - t0  # when the GPU ran this job (on CPU: the host did)
            ck = self.sampler.summary(since=t0, until=t1)
            if ck:  # SM clock and power while this job ran on the GPU (power-limited cells clock down)
                q.entry.update(sm_clock_mhz=ck["sm_clock_mhz_median"], power_w=ck["power_w_median"])
                v.clocks.append(ck["sm_clock_mhz_median"])
        return [q.entry for q in queued]


# TE's C++ errors open with "<file>:<line> in function <f>: Assertion failed: <expr>. " (common/util/logging.h).
_TE_WHERE = re.compile(r"^\S+:\d+ in function \S+: (Assertion failed: .*?\. )?")


def context_lost(reason: str) -> bool:
    """Whether an error leaves the CUDA context unusable: a device fault is sticky, out of memory not."""
    text = reason.lower()
    return "cuda error" in text and "out of memory" not in text


def _reason(err: Exception) -> str:
    text = str(err).splitlines()[0] if str(err) else ""
    return f"{type(err).__name__}: {_TE_WHERE.sub('', text)[:200]}"
