"""Offline microbenchmarks of a job's GEMMs in every precision: run every job (bench/jobs.py) on
every requested recipe, pool, summarise, cache (the results and their totals: bench/results.py).

Unsupported recipes are skipped with TE's reason. On a GPU each job is built once, then visited
several times, all visits queued back to back with one synchronize (see run_bench), its timed
GEMMs given a training step's share of the GPU's time (timing.GEMM_DUTY), so they run at the clock
a training job's GEMMs get; ``meta`` says where the time went and at what clocks.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Iterable

import torch

from ..clocks import ClockSampler
from ..precisions import availability, canonical, padded_splits, te_available
from ..shapes import GemmOp, GemmShape, gemm_passes
from .cells import MAX_VISITS, MIN_GEMM_DUTY, MODES, SPREAD_LIMIT, BenchResult, ResultCache, WorkItem, cell_key
from .jobs import job_factory
from .results import BenchResults, summarise
from .timing import (GEMM_DUTY, HEAT_LOG, L2Flush, StreamClock, device_conditions, measure_peaks, spend_boost,
                     warm_up_gpu)

log = logging.getLogger("te_gemm_callback")


def run_bench(items: list[WorkItem], precisions: Iterable[str] = ("BF16",), modes: Iterable[str] = ("autocast",),
              *, flush_l2: bool = False, cache: ResultCache | None = None, progress: bool = True,
              console: Any = None, visits: int | None = None, gemm_duty: float | None = None,
              visits_of: int | None = None) -> BenchResults:
    """Time every (work item, pass, precision, mode). Unsupported precisions are skipped with the
    reason TE gives; a failing cell records its error and the run goes on.

    ``visits``: how many times each job is measured, samples pooled (default ``default_visits()``).
    ``visits_of``: when this run is one GPU's share of a multi-GPU run (bench/parallel.py), the
    visits of all GPUs together: each visit then takes that share of a cell's samples, so the pooled
    cell has as many as one GPU would time and each GPU does its share of the work.
    ``gemm_duty``: the share of GPU time the timed calls get, the rest a low-power rest between them
    (timing.between_calls): a training step's GEMM share, for the clock its GEMMs run at (default
    timing.GEMM_DUTY).
    ``meta["timeline_s"]`` says where the wall time went (conditions, warm-up, peaks, each job's
    setup and total), so a slow run can be explained from its JSON."""
    t_start = time.perf_counter()
    modes = [m for m in MODES if m in set(modes)]
    if not modes:
        raise ValueError(f"modes must be among {MODES}")
    gemm_duty = GEMM_DUTY if gemm_duty is None else gemm_duty
    if not MIN_GEMM_DUTY <= gemm_duty <= 1.0:  # NaN too
        raise ValueError(f"gemm_duty must be in [{MIN_GEMM_DUTY:g}, 1], got {gemm_duty}")
    cache = cache or ResultCache(enabled=False)
    cuda = torch.cuda.is_available()
    use_te = cuda and te_available()[0]
    backend = "te" if use_te else "torch"
    wanted, skipped = [], {}
    for p in dict.fromkeys(canonical(p) for p in precisions):
        av = availability(p)
        if not av.ok:
            skipped[p] = av.reason
        elif p != "BF16" and not use_te:
            skipped[p] = te_available()[1] or "transformer-engine not installed"
        else:
            wanted.append(p)
    # TE's import (about 6 s on the H200 host, most of it torch._dynamo) happens in te_available().
    timeline: dict[str, Any] = {"jobs": [], "import_and_checks": time.perf_counter() - t_start}
    heat0 = dict(HEAT_LOG)
    t = time.perf_counter()
    cond = device_conditions()
    timeline["conditions"] = time.perf_counter() - t
    # Every job is built once and visited ``visits`` times, all visits queued back to back (every
    # other one in reverse order), samples pooled: the power limiter swings the clock a few times a
    # second, and a cell's samples spread over the run average it as a training job's steps do.
    # Measured on the H200 (docs/results/h200.md), three cold runs of the CodonFM-5B config,
    # cells within 2% autocast / pre-quantized: at GEMM duty 1, 40 / 30 of 48 with four visits, 45 /
    # 39 with eight; at duty 0.75 (the default), 32 / 31 with eight, 41 / 44 with sixteen.
    visits = default_visits(cuda) if visits is None else visits
    if type(visits) is not int or not 1 <= visits <= MAX_VISITS:  # bool is an int subclass: refused too
        raise ValueError(f"visits must be an integer from 1 to {MAX_VISITS}, got {visits!r}")
    flush = L2Flush() if (flush_l2 and cuda) else None
    timing = "host clock per call (CPU)"
    if cuda:
        of = f" on this GPU of {visits_of} over all GPUs of a --devices run" if visits_of and visits_of != visits else ""
        timing = ("CUDA-event pair per call, launches queued behind dense GEMMs; each job built once, then "
                  f"visited {visits} times{of} (every other visit in reverse order), all visits queued back to back "
                  f"with one synchronize, samples pooled; timed GEMMs at {gemm_duty:g} of the GPU's time")
    cond.update(flush_l2=bool(flush), backend=backend, gemm_duty=gemm_duty, timing=timing)
    # One job per (shape, splits) and recipe: repeated layers share their measurement.
    unique = {}
    for it in items:
        for p in wanted:
            unique.setdefault((it.key, p), it)
    keys = {jk: {(s.op, mo): cell_key(cond, s, it.m_splits, jk[1], mo) for s in gemm_passes(it.fprop) for mo in modes}
            for jk, it in unique.items()}
    cached = {jk: {c: cache.get(v) for c, v in ks.items()} for jk, ks in keys.items()}
    # Stored but refused (spread above SPREAD_LIMIT): measured again below, and the file heals.
    refused = sum(cached[jk][c] is None and k in cache.data["results"]
                  for jk, ks in keys.items() for c, k in ks.items())
    todo = [jk for jk in unique if not all(cached[jk].values())]
    peaks = cache.data["peaks"].get(cond["device"], {})
    if cuda and todo:  # nothing to measure (all cached): no warm-up either
        t = time.perf_counter()
        warm_up_gpu()  # initialisation, and the idle boost spent before the first cell
        timeline["warm_up"] = time.perf_counter() - t
        t = time.perf_counter()
        peaks = measure_peaks(cache.data["peaks"], cond["device"])
        timeline["peaks"] = time.perf_counter() - t
    cond["peaks_tflops"] = peaks
    errors: dict[tuple, str] = {}
    prog = _progress(progress, console)
    sampler = ClockSampler()  # no NVML (CPU): no samples, clocks_during_run None
    with prog, sampler, job_factory(use_te, modes, flush, 1 / (visits_of or visits), gemm_duty) as make_job:
        task = prog.add_task("GEMM cells", total=max(len(todo) * visits, 1))

        def measure(jks: list[tuple], errs: dict[tuple, str]) -> dict[tuple, Cells]:
            times, clocks = _measure(jks, unique, make_job, visits, errs, timeline, sampler, prog, task)
            return {jk: _cells(unique[jk], jk[1], modes, times[jk], clocks[jk], errs.get(jk), backend, cond, peaks)
                    for jk in jks}

        measured = measure(todo, errors)
        _remeasure(measured, measure, timeline, prog, task, visits)
    results: list[BenchResult] = []
    samples: dict[tuple, tuple[list[float], list[float]]] = {}
    for jk, it in unique.items():
        for s in gemm_passes(it.fprop):
            for mo in modes:
                r = cached[jk][(s.op, mo)]
                if jk in todo:
                    r, ts, ck = measured[jk][(s.op, mo)]
                    if r.ok:
                        samples[r.cell] = (ts, ck)
                    cache.put(keys[jk][(s.op, mo)], r)  # a noisy cell is not stored (ResultCache.put)
                results.append(r)
    cache.save()
    noisy = [r for r in results if r.noisy]
    if noisy:
        log.warning("te-gemm: %d cell(s) kept a spread (IQR/median) above %.0f%% after %d measurements, e.g. %s %s "
                    "%s: marked noisy, not cached", len(noisy), 100 * SPREAD_LIMIT, REMEASURES + 1, noisy[0].precision,
                    noisy[0].op, noisy[0].shape.mkn)
    timeline["jobs_total"] = sum(j["s"] for j in timeline["jobs"])  # GPU seconds, heat and holds included
    timeline["host_total"] = sum(j["host_s"] for j in timeline["jobs"])  # host seconds to build and queue them
    timeline["setup_total"] = sum(j["s"] for j in timeline.get("setup", []))
    timeline["heat"] = {k: v - heat0[k] for k, v in HEAT_LOG.items()}  # what timing at the sustained clock cost
    meta = dict(cond, wall_s=time.perf_counter() - t_start, modes=modes, precisions=wanted, visits=visits,
                clocks_during_run=sampler.summary(), timeline_s=timeline, spread_limit=SPREAD_LIMIT,
                cache_refused_noisy=refused)
    return BenchResults(results, skipped, meta, samples)


# A job's cells: (pass, mode) -> (result, its samples in ms, the SM clock of each visit).
Cells = dict[tuple[GemmOp, str], tuple[BenchResult, list[float] | None, list[float]]]

# How many times a job with a cell above cells.SPREAD_LIMIT is measured again (the quieter
# measurement of each cell kept). A host-starved CPU cell or a GPU shared with another job is
# quiet again within a second or two; one that stays noisy over three measurements is noisy for
# a reason that another try will not remove, so it is marked and the run goes on.
REMEASURES = 2


def _measure(todo: list[tuple], unique: dict, make_job: Any, visits: int, errors: dict, timeline: dict,
             sampler: ClockSampler, prog: Any, task: Any) -> tuple[dict[tuple, dict], dict[tuple, list[float]]]:
    """Build and visit the jobs ``todo``, in batches that fit in memory: each job's samples per
    (pass, mode), and the SM clock of each of its visits."""
    times: dict[tuple, dict] = {jk: {} for jk in todo}
    clocks: dict[tuple, list[float]] = {jk: [] for jk in todo}
    pending = list(todo)
    while pending:
        batch = _build(pending, unique, make_job, errors, timeline, prog, task)
        pending = pending[len(batch):]  # a job that did not fit is first in the next batch
        built = [jk for jk in batch if jk not in errors]
        # Every visit of the batch in one queue, every other visit in reverse order.
        sequence = [(v, jk) for v in range(visits) for jk in (built if v % 2 == 0 else built[::-1])]
        timeline["jobs"] += _run(sequence, {jk: batch[jk] for jk in built}, unique, times, errors,
                                 sampler, prog, task, clocks)
        prog.advance(task, (len(batch) - len(built)) * visits)
        del batch
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return times, clocks


def _remeasure(measured: dict[tuple, Cells], measure: Any, timeline: dict, prog: Any, task: Any,
               visits: int) -> None:
    """Measure again, up to REMEASURES times, every job with a noisy cell (spread above
    cells.SPREAD_LIMIT), keeping each cell's quieter measurement; a cell still above the limit
    after the last stays marked ``noisy``. A job that fails on a retry keeps what it had."""
    total = max(len(measured) * visits, 1)
    for attempt in range(2, REMEASURES + 2):
        noisy = [jk for jk, cells in measured.items() if any(r.noisy for r, _, _ in cells.values())]
        if not noisy:
            return
        total += len(noisy) * visits
        prog.update(task, total=total)
        first = len(timeline["jobs"])
        again = measure(noisy, {})  # its own errors: a failed retry must not fail the cells it had
        for entry in timeline["jobs"][first:]:
            entry["attempt"] = attempt  # the timeline says which visits were re-measurements
        for jk in noisy:
            for c, (r, ts, ck) in measured[jk].items():
                new = again[jk][c]
                r.attempts = new[0].attempts = attempt
                if new[0].ok and (not r.ok or (new[0].spread or 0.0) < (r.spread or 0.0)):
                    measured[jk][c] = new


def _cells(it: WorkItem, precision: str, modes: list[str], times: dict, clocks: list[float], error: str | None,
           backend: str, cond: dict, peaks: dict) -> Cells:
    return {(s.op, mo): (_result(s, it, precision, mo, times.get((s.op, mo)), clocks, error, backend, cond, peaks),
                         times.get((s.op, mo)), clocks) for s in gemm_passes(it.fprop) for mo in modes}


def default_visits(cuda: bool) -> int:
    """Visits per job when none are asked for: 16 on a GPU (each cell's samples then span the
    power limiter's clock swings; docs/results/h200.md), 1 on the CPU (no limiter)."""
    return 16 if cuda else 1


# How many jobs stay queued on the GPU while the host queues the next: one covers the host's
# time to queue a job (TE's Python per iteration), so the GPU never waits for the host; more would
# fill CUDA's launch queue, where a blocked launch inflates the host-time estimate that sizes a hold
# (timing.launch_timed) and the progress bar runs ahead of the GPU.
_JOBS_QUEUED = 1
# Jobs are built (and kept for all their visits) until they hold this share of the GPU's memory;
# the rest wait for the next batch.
_MEMORY_SHARE = 0.5


def _build(pending: list[tuple], unique: dict, make_job: Any, errors: dict, timeline: dict, prog: Any,
           task: Any) -> dict[tuple, Any]:
    """Build the next batch of jobs (module, operands, TE's first calls): host work, done before
    any timing so that no timed call waits behind it. A job that fails to build records why;
    running out of memory with jobs already built ends the batch instead (they hold the memory)."""
    cuda = torch.cuda.is_available()
    limit = _MEMORY_SHARE * torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory if cuda else None
    batch: dict[tuple, Any] = {}
    for jk in pending:
        it, p = unique[jk], jk[1]
        prog.update(task, description=f"setting up {p} {it.fprop.mkn}")
        try:
            job = make_job(it, p)
        except torch.cuda.OutOfMemoryError as err:
            torch.cuda.empty_cache()
            if batch:  # the built jobs hold the memory: this one goes in the next batch
                break
            errors[jk] = _reason(err)
            batch[jk] = None
            continue
        except Exception as err:  # a shape or kernel the recipe cannot run: record and go on
            errors[jk] = _reason(err)
            batch[jk] = None
            continue
        batch[jk] = job
        timeline.setdefault("setup", []).append({"item": _label(it), "precision": p, "s": job.setup_s})
        if limit is not None and torch.cuda.memory_allocated() > limit:
            break
    return batch


def _label(it: WorkItem) -> str:
    return it.fprop.mkn + (f" groups={len(it.m_splits)}" if it.m_splits else "")


def _run(sequence: list[tuple[int, tuple]], jobs: dict[tuple, Any], unique: dict, times: dict, errors: dict,
         sampler: ClockSampler, prog: Any, task: Any, clocks: dict[tuple, list[float]] | None = None) -> list[dict[str, Any]]:
    """Queue every (visit, job) of ``sequence`` back to back, the host at most ``_JOBS_QUEUED``
    jobs ahead of the GPU, then wait once and pool each job's samples into ``times``. Returns one
    timeline entry per visit of a job: its GPU span and the SM clock over it."""
    clock = StreamClock()
    if clock.cuda:  # the GPU idled while the host built the jobs: spend its boost before the first
        spend_boost()
    queued: list[tuple[tuple, dict, Any, Any, Any]] = []
    for visit, jk in sequence:
        it, p = unique[jk], jk[1]
        prog.update(task, description=f"{p} {it.fprop.mkn}")
        if jk in errors:  # failed in an earlier visit
            prog.advance(task)
            continue
        if len(queued) > _JOBS_QUEUED:  # wait for an older job; the newer ones keep the GPU busy meanwhile
            clock.wait_for(queued[-_JOBS_QUEUED - 1][4])
        job = {"item": _label(it), "precision": p, "visit": visit}
        heat0, t_job = HEAT_LOG["heat_s"], time.perf_counter()
        start = clock.mark()
        try:
            collect = jobs[jk].queue()
        except Exception as err:  # OOM, kernel or shape error: record and go on
            errors[jk] = _reason(err)
            collect = None
        job.update(host_s=time.perf_counter() - t_job, heat_s=HEAT_LOG["heat_s"] - heat0)
        queued.append((jk, job, collect, start, clock.mark()))
        prog.advance(task)
    clock.wait()  # the one synchronize, after the last timed call
    for jk, job, collect, start, end in queued:
        if collect is not None and jk not in errors:
            try:
                for cell, ts in collect().items():
                    times[jk].setdefault(cell, []).extend(ts)
            except Exception as err:  # an error the GPU reported late
                errors[jk] = _reason(err)
        t0, t1 = clock.at(start), clock.at(end)
        job["s"] = t1 - t0  # when the GPU ran this job (on CPU: the host did)
        ck = sampler.summary(since=t0, until=t1)
        if ck:  # SM clock and power while this job ran on the GPU (power-limited cells clock down)
            job.update(sm_clock_mhz=ck["sm_clock_mhz_median"], power_w=ck["power_w_median"])
            if clocks is not None:
                clocks[jk].append(ck["sm_clock_mhz_median"])
    return [job for _, job, *_ in queued]


def _reason(err: Exception) -> str:
    return f"{type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}"


def _result(s: GemmShape, it: WorkItem, precision: str, mode: str, times: list[float] | None, clocks: list[float],
            error: str | None, backend: str, cond: dict, peaks: dict) -> BenchResult:
    r = BenchResult(s.m, s.k, s.n, str(s.op), precision, mode, list(it.m_splits) if it.m_splits else None,
                    backend=backend, conditions=cond)
    padded = padded_splits(it.m_splits, precision) if it.m_splits and backend == "te" else None
    if padded is not None and padded != tuple(it.m_splits):
        r.padded_m_splits = list(padded)
    if error or not times:
        r.error = error or "no timing recorded for this pass"
        return r
    return summarise(r, s.flops, times, clocks, peaks)


def _progress(enabled: bool, console: Any) -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console, disable=not enabled, transient=True)
