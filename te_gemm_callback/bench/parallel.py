"""Spread microbenchmark cells over several local GPUs: one process per GPU.

The unit of work is a job: one work item in one recipe (its three passes in every mode). A
recipe's first job on a device also pays that recipe's first-call setup there, so whole recipes
are dealt first and single jobs then even out the loads (:func:`partition`). Device 0's share runs in this process while
the others run in fresh processes pinned to their GPU (a crash or OOM there cannot take the caller
down), started before this process touches CUDA or TE so that their start-up overlaps ours.
Results come back as plain dicts and are merged in the order a one-GPU run would list them.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import time
from dataclasses import asdict
from typing import Any

from ..precisions import canonical
from .cells import BenchResult, ResultCache, WorkItem, cell_key
from .engine import FP8_FAMILY, BenchResults, run_bench

# Cost model of a job, in seconds (H200, TE 2.20, docs/results/h200.md "where the time goes").
_JOB_SETUP_S = 0.25  # module build and the first forward/backward of a job
_RECIPE_FIRST_USE_S = 0.5  # a recipe's first job in a process (its kernels' first calls)
_TIMED_CALLS = 40  # forward+backward calls a job runs, all modes together (order of magnitude)
_BF16_FLOPS = 6.5e14  # sustained dense BF16 FLOP/s; FP8 recipes about 1.7x that


def job_cost(item: WorkItem, precision: str) -> float:
    rate = _BF16_FLOPS * (1.7 if precision in FP8_FAMILY else 1.0)
    return _JOB_SETUP_S + _TIMED_CALLS * 3 * item.fprop.flops / rate


def _load(group: list[tuple[WorkItem, str]]) -> float:
    return sum(job_cost(*j) for j in group) + _RECIPE_FIRST_USE_S * len({p for _, p in group})


def _even_out(groups: list[list[tuple[WorkItem, str]]]) -> list[list[tuple[WorkItem, str]]]:
    """Move single jobs from the most to the least loaded group while that lowers the larger load."""
    while len(groups) > 1:
        hi, lo = max(groups, key=_load), min(groups, key=_load)
        best, worst_now = None, _load(hi)
        for j in hi:
            after = max(_load([x for x in hi if x is not j]), _load(lo + [j]))
            if after < worst_now - 1e-9:
                best, worst_now = j, after
        if best is None:
            return groups
        hi.remove(best)
        lo.append(best)
    return groups


def partition(jobs: list[tuple[WorkItem, str]], n: int) -> list[list[tuple[WorkItem, str]]]:
    """Split (item, precision) jobs into n groups of about equal estimated time.

    Two candidates, the better kept: whole recipes dealt longest-first (each recipe's first-call
    setup is paid once per device that runs it), and single jobs dealt longest-first (better
    balance when a few recipes carry most of the FLOPs); each then evened out job by job.
    """
    blocks: dict[str, list[tuple[WorkItem, str]]] = {}
    for j in jobs:
        blocks.setdefault(j[1], []).append(j)
    by_recipe: list[list[tuple[WorkItem, str]]] = [[] for _ in range(n)]
    for block in sorted(blocks.values(), key=lambda b: -_load(b)):
        min(by_recipe, key=_load).extend(block)
    by_job: list[list[tuple[WorkItem, str]]] = [[] for _ in range(n)]
    for j in sorted(jobs, key=lambda j: -job_cost(*j)):
        min(by_job, key=lambda g: _load(g + [j])).append(j)
    return min((_even_out(by_recipe), _even_out(by_job)), key=lambda gs: max(map(_load, gs)))


def _worker(device: int, items: list[WorkItem], precisions: list[str], modes: list[str], flush_l2: bool,
            only: set[tuple], visits: int | None) -> dict:
    import torch

    if torch.cuda.is_available():
        torch.cuda.set_device(device)
    res = run_bench(items, precisions, modes, flush_l2=flush_l2, cache=ResultCache(enabled=False), progress=False,
                    only=only, visits=visits)
    return {"results": [asdict(r) for r in res.results], "skipped": res.skipped, "meta": res.meta}


def run_bench_parallel(items: list[WorkItem], precisions: list[str], modes: list[str], devices: int, *,
                       flush_l2: bool = False, cache: ResultCache | None = None,
                       visits: int | None = None) -> BenchResults:
    """``run_bench`` over ``devices`` local GPUs; every measured cell goes into ``cache``. Device 0's
    share looks its cells up there first; the workers measure theirs (they start before this
    process knows the device and versions a cache key needs)."""
    if devices < 1:
        raise ValueError("--devices must be >= 1")
    t0 = time.perf_counter()
    precisions = list(dict.fromkeys(canonical(p) for p in precisions))
    unique = list(dict.fromkeys(items))
    jobs = [(it, p) for it in unique for p in precisions]
    groups = [g for g in partition(jobs, devices) if g]
    ctx = mp.get_context("spawn")  # CUDA cannot be forked
    parts: list[dict] = []
    with cf.ProcessPoolExecutor(max_workers=max(len(groups) - 1, 1), mp_context=ctx) as pool:
        futs = [pool.submit(_worker, d, unique, precisions, list(modes), flush_l2, {(it.key, p) for it, p in g}, visits)
                for d, g in enumerate(groups) if d > 0]
        own = run_bench(unique, precisions, modes, flush_l2=flush_l2, cache=cache, progress=False, visits=visits,
                        only={(it.key, p) for it, p in groups[0]}) if groups else None
        parts = ([{"results": own.results, "skipped": own.skipped, "meta": own.meta}] if own else []) + \
            [{**f.result(), "results": [BenchResult(**r) for r in f.result()["results"]]} for f in futs]
    order = {(it.key, p): i for i, (it, p) in enumerate(jobs)}
    results = sorted((r for part in parts for r in part["results"]),
                     key=lambda r: order.get(_job_of(r, unique), len(order)))
    if cache is not None:
        for part in parts[1:]:  # device 0's share went through the cache already
            for r in part["results"]:
                cache.put(cell_key(r.conditions, r.shape, r.m_splits, r.precision, r.mode), r)
        cache.save()
    meta: dict[str, Any] = dict(parts[0]["meta"]) if parts else {}
    meta.update(devices=[p["meta"].get("device") for p in parts], wall_s=time.perf_counter() - t0,
                worker_wall_s=[p["meta"].get("wall_s") for p in parts],
                worker_timeline_s=[p["meta"].get("timeline_s") for p in parts])
    skipped = dict(parts[0]["skipped"]) if parts else {}
    return BenchResults(results, skipped, meta)


def _job_of(r: BenchResult, items: list[WorkItem]) -> tuple:
    """The (item key, precision) a result belongs to: the item whose passes include its shape."""
    from ..shapes import gemm_passes

    splits = tuple(r.m_splits) if r.m_splits else None
    for it in items:
        if it.m_splits == splits and any((s.m, s.k, s.n, str(s.op)) == (r.m, r.k, r.n, r.op)
                                         for s in gemm_passes(it.fprop)):
            return (it.key, r.precision)
    return ()
