"""Spread microbenchmark cells over several local GPUs: one process per GPU.

The unit of work is a job: one work item in one recipe (its three passes in every mode). A
recipe's first job on a device also pays that recipe's first-call setup there, so whole recipes
are dealt first and single jobs then even out the loads (:func:`partition`).

Device 0's share runs in this process; every other device gets a fresh interpreter
(``python -m te_gemm_callback.bench.parallel SPEC OUT``) pinned to its GPU, so a crash or OOM there
cannot take the caller down. Each worker pays about 11 s before its first cell on the H200 host
(Python and torch 4 s, TE's import 6 s, a 0.3-0.5 s warm-up), so the workers are started before this
module imports torch or TE (nothing above the launch needs them): their start-up overlaps this
process's own. Results come back as JSON files and are merged in the order one GPU would list them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..shapes import GemmOp, GemmShape, gemm_passes
from .cells import MODES, BenchResult, ResultCache, WorkItem, cell_key, gemm_seconds

# Cost model of a job, in seconds (H200, TE 2.20, docs/results/h200.md "where the time goes").
_JOB_SETUP_S = 0.25  # module build and the first forward/backward of a job
_RECIPE_FIRST_USE_S = 0.5  # a recipe's first job in a process (its kernels' first calls)
_TIMED_CALLS = 40  # forward+backward calls a job runs, all modes together (order of magnitude)

if TYPE_CHECKING:
    from .engine import BenchResults

Job = tuple[WorkItem, str]


def job_cost(item: WorkItem, precision: str) -> float:
    return _JOB_SETUP_S + _TIMED_CALLS * 3 * gemm_seconds(item.fprop.flops, precision)


def _load(group: list[Job]) -> float:
    return sum(job_cost(*j) for j in group) + _RECIPE_FIRST_USE_S * len({p for _, p in group})


def _even_out(groups: list[list[Job]]) -> list[list[Job]]:
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


def partition(jobs: list[Job], n: int) -> list[list[Job]]:
    """Split (item, precision) jobs into n groups of about equal estimated time.

    Two candidates, the better kept: whole recipes dealt longest-first (each recipe's first-call
    setup is paid once per device that runs it), and single jobs dealt longest-first (better
    balance when a few recipes carry most of the FLOPs); each then evened out job by job.
    """
    blocks: dict[str, list[Job]] = {}
    for j in jobs:
        blocks.setdefault(j[1], []).append(j)
    by_recipe: list[list[Job]] = [[] for _ in range(n)]
    for block in sorted(blocks.values(), key=lambda b: -_load(b)):
        min(by_recipe, key=_load).extend(block)
    by_job: list[list[Job]] = [[] for _ in range(n)]
    for j in sorted(jobs, key=lambda j: -job_cost(*j)):
        min(by_job, key=lambda g: _load(g + [j])).append(j)
    return min((_even_out(by_recipe), _even_out(by_job)), key=lambda gs: max(map(_load, gs)))


def _item_to_json(it: WorkItem) -> list:
    s = it.fprop
    return [it.name, s.m, s.k, s.n, str(s.op), s.batch, it.count, list(it.m_splits) if it.m_splits else None]


def _item_from_json(row: list) -> WorkItem:
    name, m, k, n, op, batch, count, splits = row
    return WorkItem(name, GemmShape(m, k, n, GemmOp(op), batch), count, tuple(splits) if splits else None)


def _launch(device: int, items: list[WorkItem], group: list[Job], precisions: list[str], modes: list[str],
            flush_l2: bool, visits: int | None, gemm_duty: float, tmp: Path) -> tuple[subprocess.Popen, Path, Path]:
    index = {it.key: i for i, it in enumerate(items)}
    spec = {"device": device, "items": [_item_to_json(it) for it in items], "precisions": precisions,
            "modes": modes, "flush_l2": flush_l2, "visits": visits, "gemm_duty": gemm_duty,
            "only": [[index[it.key], p] for it, p in group]}
    spec_path, out_path, log_path = tmp / f"spec{device}.json", tmp / f"out{device}.json", tmp / f"log{device}.txt"
    spec_path.write_text(json.dumps(spec))
    log = open(log_path, "w")
    # The worker imports this package from where this process found it (a checkout on sys.path
    # need not be installed or be the working directory).
    root = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    proc = subprocess.Popen([sys.executable, "-m", "te_gemm_callback.bench.parallel", str(spec_path), str(out_path)],
                            stdout=log, stderr=subprocess.STDOUT,
                            env=dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=path))
    log.close()  # the child holds its own handle
    return proc, out_path, log_path


def _failed_part(group: list[Job], modes: list[str], reason: str) -> dict:
    """A worker that died: its cells carry the reason, the run goes on."""
    res = [BenchResult(s.m, s.k, s.n, str(s.op), p, mo, list(it.m_splits) if it.m_splits else None, error=reason)
           for it, p in group for s in gemm_passes(it.fprop) for mo in modes]
    return {"results": res, "skipped": {}, "meta": {}}


def run_bench_parallel(items: list[WorkItem], precisions: list[str], modes: list[str], devices: int, *,
                       flush_l2: bool = False, cache: ResultCache | None = None,
                       visits: int | None = None, gemm_duty: float | None = None) -> "BenchResults":
    """``run_bench`` over ``devices`` local GPUs (returns its BenchResults); every measured cell
    goes into ``cache``. Device 0's share looks its cells up there first; the workers measure
    theirs (they start before this process knows the device and versions a cache key needs)."""
    if devices < 1:
        raise ValueError("--devices must be >= 1")
    from ..precisions import canonical  # torch-free

    t0 = time.perf_counter()
    precisions = list(dict.fromkeys(canonical(p) for p in precisions))
    modes = [m for m in MODES if m in set(modes)]
    unique = list(dict.fromkeys(items))
    jobs = [(it, p) for it in unique for p in precisions]
    groups = [g for g in partition(jobs, devices) if g]
    with tempfile.TemporaryDirectory(prefix="te_gemm_bench_") as tmp:
        workers = [(_launch(d, unique, g, precisions, modes, flush_l2, visits, gemm_duty, Path(tmp)), g)
                   for d, g in enumerate(groups) if d > 0]
        from .engine import BenchResults, run_bench  # torch and TE: after the workers have started

        own = run_bench(unique, precisions, modes, flush_l2=flush_l2, cache=cache, progress=False, visits=visits,
                        gemm_duty=gemm_duty, only={(it.key, p) for it, p in groups[0]}) if groups else None
        parts = [{"results": own.results, "skipped": own.skipped, "meta": own.meta}] if own else []
        for (proc, out_path, log_path), g in workers:
            rc = proc.wait()
            if rc == 0 and out_path.exists():
                part = json.loads(out_path.read_text())
                part["results"] = [BenchResult(**r) for r in part["results"]]
            else:
                tail = [ln for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()][-1:]
                part = _failed_part(g, modes, f"worker process failed (exit {rc}): {tail[0][:200] if tail else ''}")
            parts.append(part)
    # In the order one process lists them: job by job, pass by pass, mode by mode.
    by_cell = {_cell(r.m, r.k, r.n, r.op, r.m_splits, r.precision, r.mode): r
               for part in parts for r in part["results"]}
    results = [by_cell[c] for it, p in jobs for s in gemm_passes(it.fprop) for mo in modes
               if (c := _cell(s.m, s.k, s.n, str(s.op), it.m_splits, p, mo)) in by_cell]
    if cache is not None:
        for part in parts[1:]:  # device 0's share went through the cache already
            for r in part["results"]:
                if r.conditions:
                    cache.put(cell_key(r.conditions, r.shape, r.m_splits, r.precision, r.mode), r)
        cache.save()
    meta: dict[str, Any] = dict(parts[0]["meta"]) if parts else {}
    meta.update(devices=[p["meta"].get("device") for p in parts], wall_s=time.perf_counter() - t0,
                worker_wall_s=[p["meta"].get("wall_s") for p in parts],
                worker_timeline_s=[p["meta"].get("timeline_s") for p in parts])
    skipped = dict(parts[0]["skipped"]) if parts else {}
    return BenchResults(results, skipped, meta)


def _cell(m: int, k: int, n: int, op: str, splits: Any, precision: str, mode: str) -> tuple:
    return (m, k, n, op, tuple(splits) if splits else None, precision, mode)


def _worker_main(spec_path: str, out_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    import torch

    from .engine import run_bench

    if torch.cuda.is_available():
        torch.cuda.set_device(spec["device"])
    items = [_item_from_json(row) for row in spec["items"]]
    only = {(items[i].key, p) for i, p in spec["only"]}
    res = run_bench(items, spec["precisions"], spec["modes"], flush_l2=spec["flush_l2"],
                    cache=ResultCache(enabled=False), progress=False, only=only, visits=spec["visits"],
                    gemm_duty=spec.get("gemm_duty"))
    Path(out_path).write_text(json.dumps({"results": [asdict(r) for r in res.results], "skipped": res.skipped,
                                          "meta": res.meta}))
    return 0


if __name__ == "__main__":
    sys.exit(_worker_main(*sys.argv[1:3]))
