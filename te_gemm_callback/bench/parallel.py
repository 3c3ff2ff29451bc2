"""Spread microbenchmark cells over several local GPUs: one process per GPU.

Work items are dealt to devices by descending FLOPs (greedy: each goes to the least-loaded device),
so the slowest shapes do not pile up on one GPU. Each worker is a fresh process pinned to its GPU
(a crash or OOM there cannot take the caller down); results come back as plain dicts and are merged
in the original order.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import time
from dataclasses import asdict
from typing import Any

from .cells import BenchResult, ResultCache, WorkItem
from .engine import BenchResults, run_bench


def partition(items: list[WorkItem], n: int) -> list[list[WorkItem]]:
    """Greedy longest-processing-time split of items into n groups by FLOPs per item."""
    groups: list[list[WorkItem]] = [[] for _ in range(n)]
    load = [0.0] * n
    for it in sorted(items, key=lambda i: -3 * i.fprop.flops):
        j = load.index(min(load))
        groups[j].append(it)
        load[j] += 3 * it.fprop.flops
    return groups


def _worker(device: int, items: list[WorkItem], precisions: list[str], modes: list[str], flush_l2: bool) -> dict:
    import torch

    if torch.cuda.is_available():
        torch.cuda.set_device(device)
    res = run_bench(items, precisions, modes, flush_l2=flush_l2, cache=ResultCache(enabled=False), progress=False)
    return {"results": [asdict(r) for r in res.results], "skipped": res.skipped, "meta": res.meta}


def run_bench_parallel(items: list[WorkItem], precisions: list[str], modes: list[str], devices: int, *,
                       flush_l2: bool = False, cache: ResultCache | None = None) -> BenchResults:
    if devices < 1:
        raise ValueError("--devices must be >= 1")
    t0 = time.perf_counter()
    groups = [g for g in partition(list(dict.fromkeys(items)), devices) if g]
    ctx = mp.get_context("spawn")  # CUDA cannot be forked
    with cf.ProcessPoolExecutor(max_workers=len(groups), mp_context=ctx) as pool:
        futs = [pool.submit(_worker, d, g, list(precisions), list(modes), flush_l2) for d, g in enumerate(groups)]
        parts = [f.result() for f in futs]
    results = [BenchResult(**r) for p in parts for r in p["results"]]
    meta: dict[str, Any] = dict(parts[0]["meta"])
    meta.update(devices=[p["meta"].get("device") for p in parts], wall_s=time.perf_counter() - t0,
                worker_wall_s=[p["meta"].get("wall_s") for p in parts])
    return BenchResults(results, parts[0]["skipped"], meta)
