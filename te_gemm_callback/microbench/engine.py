"""Offline microbenchmarks of a job's GEMMs in every recipe this machine runs: one job per work item
and recipe, cached cells reused, the rest measured (job_queue.JobQueue), summarised and cached."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

import torch

from te_gemm_callback.capture.clocks import ClockSampler
from te_gemm_callback.microbench.cache import ResultCache
from te_gemm_callback.microbench.cells import MAX_VISITS, MIN_GEMM_DUTY, MODES, SPREAD_LIMIT, BenchResult, cell_key
from te_gemm_callback.microbench.items import WorkItem, merged, passes_of
from te_gemm_callback.microbench.job_queue import JobQueue, JobVisits, MeasuredCell, PassMode, PlannedJob
from te_gemm_callback.microbench.jobs import job_factory
from te_gemm_callback.microbench.rates import set_rate_model
from te_gemm_callback.microbench.results import BenchResults, summarise
from te_gemm_callback.microbench.timing import (
    GEMM_DUTY,
    HEAT_LOG,
    L2Flush,
    device_conditions,
    measure_peaks,
    warm_up_gpu,
)
from te_gemm_callback.precisions import (
    availability,
    canonical,
    padded_splits,
    recipe_config,
    recipe_environment,
    te_available,
)
from te_gemm_callback.shapes import GemmShape

log = logging.getLogger("te_gemm_callback")

Samples = tuple[list[float], list[float]]  # a measured cell's samples (ms) and the SM clock of each visit

# How many times a job with a cell above cells.SPREAD_LIMIT is measured again: a host-starved or
# shared device is quiet again within seconds.
REMEASURES = 2


class BenchStopped(RuntimeError, ValueError):
    """A run stopped by a lost CUDA context, with the cells ``results`` before it (a ValueError: one line)."""

    def __init__(self, message: str, results: BenchResults) -> None:
        super().__init__(message)
        self.results = results


def run_bench(items: list[WorkItem], precisions: Iterable[str] = ("BF16",), modes: Iterable[str] = ("autocast",),
              *, flush_l2: bool = False, cache: ResultCache | None = None, progress: bool = True,
              console: Any = None, visits: int | None = None, gemm_duty: float | None = None,
              visits_of: int | None = None) -> BenchResults:
    """Time every (work item, pass, precision, mode); a failing cell records its error, one that
    loses the CUDA context raises :class:`BenchStopped`.

    ``visits_of``: a multi-GPU run's visits over all GPUs when this run is one GPU's share;
    ``gemm_duty``: the share of GPU time the timed calls get (default timing.GEMM_DUTY)."""
    return BenchRun(precisions, modes, flush_l2=flush_l2, cache=cache, visits=visits, gemm_duty=gemm_duty,
                    visits_of=visits_of).execute(items, progress, console)


def default_visits(cuda: bool) -> int:
    """16 on a GPU: enough power-limiter swings for cold runs to agree (docs/benchmark-methodology.md)."""
    return 16 if cuda else 1


class BenchRun:
    """One :func:`run_bench` call: its settings, device conditions (``cond``) and ``timeline``."""

    def __init__(self, precisions: Iterable[str], modes: Iterable[str], *, flush_l2: bool = False,
                 cache: ResultCache | None = None, visits: int | None = None, gemm_duty: float | None = None,
                 visits_of: int | None = None) -> None:
        self.t_start = time.perf_counter()
        self.modes = [m for m in MODES if m in set(modes)]
        if not self.modes:
            raise ValueError(f"modes must be among {MODES}")
        self.gemm_duty = GEMM_DUTY if gemm_duty is None else gemm_duty
        if not MIN_GEMM_DUTY <= self.gemm_duty <= 1.0:  # NaN too
            raise ValueError(f"gemm_duty must be in [{MIN_GEMM_DUTY:g}, 1], got {self.gemm_duty}")
        self.cache = cache or ResultCache(enabled=False)
        self.cuda = torch.cuda.is_available()
        self.use_te = self.cuda and te_available()[0]
        self.backend = "te" if self.use_te else "torch"
        self.recipes, self.skipped = _runnable(precisions, self.use_te)
        # te_available() imports TE, seconds of a cold start: counted here, not in a job's setup.
        self.timeline: dict[str, Any] = {"jobs": [], "import_and_checks": time.perf_counter() - self.t_start}
        self.heat0 = dict(HEAT_LOG)
        t = time.perf_counter()
        self.cond = device_conditions()
        self.timeline["conditions"] = time.perf_counter() - t
        self.visits = default_visits(self.cuda) if visits is None else visits
        if type(self.visits) is not int or not 1 <= self.visits <= MAX_VISITS:  # bool is an int subclass: refused
            raise ValueError(f"visits must be an integer from 1 to {MAX_VISITS}, got {self.visits!r}")
        self.visits_of = visits_of
        self.flush = L2Flush() if (flush_l2 and self.cuda) else None
        self.cond.update(flush_l2=bool(self.flush), backend=self.backend, gemm_duty=self.gemm_duty,
                         timing=self._timing())
        # What a TE recipe's cells ran under (cells.cell_key keys them on it).
        if te_recipes := [p for p in self.recipes if p != "BF16"]:
            self.cond["recipe_config"] = {p: recipe_config(p) for p in te_recipes}
        self.cond["recipe_env"] = recipe_environment()
        self.peaks: dict[str, float] = {}
        self.rate_model: dict[str, float] = {}  # the planning rates (TFLOP/s) once the peaks are known

    def _timing(self) -> str:
        if not self.cuda:
            return "host clock per call (CPU)"
        of = (f" on this GPU of {self.visits_of} over all GPUs of a --devices run"
              if self.visits_of and self.visits_of != self.visits else "")
        return ("CUDA-event pair per call, launches queued behind dense GEMMs; each job built once, then "
                f"visited {self.visits} times{of} (every other visit in reverse order), all visits queued back to "
                f"back with one synchronize, samples pooled; timed GEMMs at {self.gemm_duty:g} of the GPU's time")

    def plan(self, items: list[WorkItem]) -> list[PlannedJob]:
        """One job per item key and recipe (repeated layers share it), with each cell's cached result."""
        jobs: dict[tuple, PlannedJob] = {}
        for it in items:
            for p in self.recipes:
                job = jobs.setdefault((it.key, p), PlannedJob(it, p))
                job.item = merged(job.item, it)  # every pass any item of the key runs, none other
        for job in jobs.values():
            job.keys = {(s.op, mo): cell_key(self.cond, s, job.item.m_splits, job.precision, mo)
                        for s in passes_of(job.item) for mo in self.modes}
            job.cached = {c: self.cache.get(k) for c, k in job.keys.items()}
        return list(jobs.values())

    def execute(self, items: list[WorkItem], progress: bool = True, console: Any = None) -> BenchResults:
        jobs = self.plan(items)
        # Stored but refused (spread above SPREAD_LIMIT): measured again below, and the file heals.
        refused = sum(job.cached[c] is None and k in self.cache.data["results"]
                      for job in jobs for c, k in job.keys.items())
        todo = [job for job in jobs if job.todo]
        self.peaks = self.cache.data["peaks"].get(self.cond["device"], {})
        if self.cuda and todo:  # nothing to measure (all cached): no warm-up either
            t = time.perf_counter()
            warm_up_gpu()  # initialisation, and the idle boost spent before the first cell
            self.timeline["warm_up"] = time.perf_counter() - t
            t = time.perf_counter()
            self.peaks = measure_peaks(self.cache.data["peaks"], self.cond["device"])
            self.timeline["peaks"] = time.perf_counter() - t
        self.cond["peaks_tflops"] = self.peaks
        self.rate_model = set_rate_model(self.peaks)  # each recipe's rests sized for this GPU's rates
        prog = _progress(progress, console)
        sampler = ClockSampler()  # no NVML (CPU): no samples, clocks_during_run None
        share = 1 / (self.visits_of or self.visits)
        with prog, sampler, job_factory(self.use_te, self.modes, self.flush, share, self.gemm_duty) as make_job:
            task = prog.add_task("GEMM cells", total=max(len(todo) * self.visits, 1))
            queue = JobQueue(make_job, self.visits, sampler, prog, task, self.timeline)
            for v in queue.measure(todo):
                v.job.measured = self._cells(v)
            if queue.stopped is None:
                self._remeasure(queue, todo)
        if queue.stopped is not None:
            self._stop(jobs, queue.stopped)
        results, samples = self._collect(jobs)
        self.cache.save()
        _warn_noisy(results)
        tl = self.timeline
        tl["jobs_total"] = sum(j["s"] for j in tl["jobs"])  # GPU seconds, heat and holds included
        tl["host_total"] = sum(j["host_s"] for j in tl["jobs"])  # host seconds to build and queue them
        tl["setup_total"] = sum(j["s"] for j in tl.get("setup", []))
        tl["heat"] = {k: v - self.heat0[k] for k, v in HEAT_LOG.items()}  # what timing at the sustained clock cost
        meta = dict(self.cond, wall_s=time.perf_counter() - self.t_start, modes=self.modes, precisions=self.recipes,
                    visits=self.visits, clocks_during_run=sampler.summary(), timeline_s=tl,
                    spread_limit=SPREAD_LIMIT, cache_refused_noisy=refused, rate_model_tflops=self.rate_model)
        return BenchResults(results, self.skipped, meta, samples)

    def _remeasure(self, queue: JobQueue, measured: list[PlannedJob]) -> None:
        """Measure jobs with a noisy cell again (up to REMEASURES times), keeping the quieter cells."""
        total = max(len(measured) * self.visits, 1)
        for attempt in range(2, REMEASURES + 2):
            noisy = [job for job in measured if job.noisy]
            if not noisy or queue.stopped is not None:
                return
            total += len(noisy) * self.visits
            queue.prog.update(queue.task, total=total)
            first = len(self.timeline["jobs"])
            again = queue.measure(noisy)
            for entry in self.timeline["jobs"][first:]:
                entry["attempt"] = attempt  # the timeline says which visits were re-measurements
            for v in again:
                new_cells = self._cells(v)
                for c, old in v.job.measured.items():
                    new = new_cells[c]
                    old.result.attempts = new.result.attempts = attempt
                    if new.result.ok and (not old.result.ok or (new.result.spread or 0.0) < (old.result.spread or 0.0)):
                        v.job.measured[c] = new

    def _stop(self, jobs: list[PlannedJob], why: str) -> None:
        """After a lost CUDA context: cache the cells measured before it and raise them."""
        kept = [job for job in jobs if not job.todo or job.measured]
        results, _ = self._collect(kept)
        self.cache.save()
        where = " (in the cache too)" if self.cache.enabled and not self.cache.read_only else ""
        meta = dict(self.cond, precisions=self.recipes, modes=self.modes, stopped=why)
        raise BenchStopped(f"stopped after a CUDA error, which leaves this process's GPU context unusable: {why}; "
                           f"{sum(r.ok for r in results)} cell(s) measured or cached before it are kept{where}, "
                           "a run in a new process measures the rest", BenchResults(results, self.skipped, meta))

    def _cells(self, v: JobVisits) -> dict[PassMode, MeasuredCell]:
        """Each cell of a job as one measurement left it (failed, with the job's error, if it did)."""
        out = {}
        for s in passes_of(v.job.item):
            for mo in self.modes:
                ts = v.times.get((s.op, mo))
                out[(s.op, mo)] = MeasuredCell(self._result(s, v.job, mo, ts, v.clocks, v.error), ts, v.clocks)
        return out

    def _result(self, s: GemmShape, job: PlannedJob, mode: str, times: list[float] | None, clocks: list[float],
                error: str | None) -> BenchResult:
        it = job.item
        # A GEMM no recipe runs (batched, weightless) is a torch matmul whatever the backend.
        backend = self.backend if it.runs_recipe else "torch"
        r = BenchResult(s.m, s.k, s.n, str(s.op), job.precision, mode, list(it.m_splits) if it.m_splits else None,
                        backend=backend, conditions=self.cond, batch=s.batch)
        padded = padded_splits(it.m_splits, job.precision) if it.m_splits and backend == "te" else None
        if padded is not None and padded != tuple(it.m_splits or ()):
            r.padded_m_splits = list(padded)
        if error or not times:
            r.error = error or "no timing recorded for this pass"
            return r
        return summarise(r, s.flops, times, clocks, self.peaks)

    def _collect(self, jobs: list[PlannedJob]) -> tuple[list[BenchResult], dict[tuple, Samples]]:
        """Every cell in plan order and the samples of those measured, which go into the cache."""
        results: list[BenchResult] = []
        samples: dict[tuple, Samples] = {}
        for job in jobs:
            for c, key in job.keys.items():
                r = job.cached[c]
                if job.todo:
                    m = job.measured[c]
                    r = m.result
                    if r.ok and m.samples is not None:  # an ok cell was read: it has samples
                        samples[r.cell] = (m.samples, m.clocks)
                    self.cache.put(key, r)
                if r is not None:  # a cached job's every cell is cached (plan: a job is todo otherwise)
                    results.append(r)
        return results, samples


def _runnable(precisions: Iterable[str], use_te: bool) -> tuple[list[str], dict[str, str]]:
    """The recipes this machine runs, in the order asked, and each other one with why it does not."""
    wanted, skipped = [], {}
    for p in dict.fromkeys(canonical(p) for p in precisions):
        av = availability(p)
        if not av.ok:
            skipped[p] = av.reason
        elif p != "BF16" and not use_te:
            skipped[p] = te_available()[1] or "transformer-engine not installed"
        else:
            wanted.append(p)
    return wanted, skipped


def _warn_noisy(results: list[BenchResult]) -> None:
    if noisy := [r for r in results if r.noisy]:
        log.warning("te-gemm: %d cell(s) kept a spread (IQR/median) above %.0f%% after %d measurements, e.g. %s %s "
                    "%s: marked noisy, not cached", len(noisy), 100 * SPREAD_LIMIT, REMEASURES + 1, noisy[0].precision,
                    noisy[0].op, noisy[0].shape.mkn)


def _progress(enabled: bool, console: Any) -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    if not enabled:
        # A disabled Progress on rich's default console still wrote a line break to the job's stdout.
        import io

        from rich.console import Console
        console = Console(file=io.StringIO())
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console, disable=not enabled, transient=True)
