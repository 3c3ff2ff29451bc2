"""Multi-process jobs: every rank captures its own GEMMs (tensor and expert parallelism show in
their shapes); rank 0 gathers them, over any torch.distributed process group."""

from __future__ import annotations

import statistics
from typing import Any

import torch.distributed as dist

from te_gemm_callback.capture.capture_file import GemmCapture

RANKS_SCHEMA = "te-gemm-ranks/1"  # ranks/summary.json: {"schema": ..., "ranks": [rank_summary rows]}


def world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def gather_captures(cap: GemmCapture) -> list[GemmCapture] | None:
    """Collective: every rank calls it, also one whose capture failed (it sends its error). Rank 0
    gets all captures in rank order, the others None; a single process gets ``[cap]``."""
    rank, size = world()
    cap.meta.update(rank=rank, world_size=size)
    if size == 1:
        return [cap]
    objs: list[Any] | None = [None] * size if rank == 0 else None
    dist.gather_object(cap.to_dict(), objs, dst=0)
    return [GemmCapture.from_dict(o) for o in objs] if objs is not None else None


def rank_summary(caps: list[GemmCapture]) -> list[dict[str, Any]]:
    """Per-rank step time, GEMM time and FLOPs, communication time (total and exposed), grouped-GEMM
    rows (MoE load), and each rank's step time against the median (stragglers)."""
    rows = []
    for i, c in enumerate(caps):
        grouped = [r for r in c.records if r.m_splits and r.op == "fprop"]
        tokens = sum(sum(s) for r in grouped for s in r.m_splits) / max(len(c.steps), 1) if grouped else None
        rows.append({"rank": c.meta.get("rank", i), "step_ms": c.step_ms(), "gemm_ms": c.gemm_ms_per_step(),
                     "gemm_tflop_per_step": c.flops_per_step / 1e12, "grouped_rows_per_step": tokens,
                     "comm_ms": c.meta.get("comm_ms"), "comm_exposed_ms": c.meta.get("comm_exposed_ms"),
                     # Captures written before the window was recorded profiled the warm-up step.
                     "comm_window": c.meta.get("kernel_breakdown_window",
                                               "the warm-up step" if c.meta.get("comm_ms") is not None else None),
                     "records": len(c.records), "error": c.coverage.get("error")})
    steps = [r["step_ms"] for r in rows if r["step_ms"]]
    med = statistics.median(steps) if steps else None
    for r in rows:
        r["step_vs_median"] = r["step_ms"] / med if med and r["step_ms"] else None
    return rows
