"""One measured cell (:class:`BenchResult`), its cache keys, and the bench's limits."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from te_gemm_callback.precisions import RECIPE_TABLE, recipe_fingerprint
from te_gemm_callback.shapes import GemmOp, GemmShape

MODES = ("autocast", "prequantized")

BENCH_SCHEMA = "te-gemm-bench/1"  # bench.json (microbench/results.py); here so the CLI can check it torch-free

# 1000 visits (60x the GPU default) is hours on a large model; far beyond, memory runs out.
MAX_VISITS = 1000

# The least --gemm-duty: the rest between timed calls is call * (1/duty - 1), here 19x the calls.
MIN_GEMM_DUTY = 0.05

FP8_FAMILY = {r.name for r in RECIPE_TABLE if r.low_precision_peak}  # timed against the FP8 peak

# A cell whose spread (IQR / median) is above this is measured again (engine.REMEASURES), then marked
# noisy and never cached: its median depends on which calls the host disturbed (docs/benchmark-methodology.md).
SPREAD_LIMIT = 0.5


def stats(times: list[float]) -> tuple[float, float, float]:
    """(median, first quartile, third quartile)."""
    if len(times) == 1:
        return times[0], times[0], times[0]
    q = statistics.quantiles(times, n=4, method="inclusive")
    return statistics.median(times), q[0], q[2]


@dataclass
class BenchResult:
    """One (shape, pass, precision, mode) timing, with the conditions it was measured under."""

    m: int
    k: int
    n: int
    op: str
    precision: str
    mode: str
    m_splits: list[int] | None = None
    median_ms: float | None = None
    q1_ms: float | None = None
    q3_ms: float | None = None
    iters: int = 0
    tflops: float | None = None
    peak_fraction: float | None = None
    error: str | None = None
    backend: str = ""  # "te" or "torch"
    padded_m_splits: list[int] | None = None  # rows per group as timed, where the recipe needs alignment
    sm_clock_mhz: float | None = None  # median SM clock (NVML) over the visits that timed this cell
    conditions: dict[str, Any] = field(default_factory=dict)
    attempts: int = 1  # measurements taken (a cell above SPREAD_LIMIT is measured again, the quietest kept)
    noisy: bool = False  # spread still above SPREAD_LIMIT after every attempt: never cached, marked in tables
    cached: bool = False  # reused from the cache (an earlier run's measurement), not measured by this run
    batch: int = 1  # independent products of a batched GEMM (torch.bmm); 1 for every linear layer

    @property
    def shape(self) -> GemmShape:
        return GemmShape(self.m, self.k, self.n, GemmOp(self.op), self.batch)

    @property
    def ok(self) -> bool:
        return self.error is None and self.median_ms is not None

    @property
    def spread(self) -> float | None:
        """IQR / median of the cell's samples; None when unknown."""
        med = self.median_ms
        if not self.ok or self.q1_ms is None or self.q3_ms is None or med is None or med <= 0:
            return None
        return (self.q3_ms - self.q1_ms) / med

    @property
    def above_spread_limit(self) -> bool:
        return (self.spread or 0.0) > SPREAD_LIMIT

    @property
    def cell(self) -> tuple:
        """What identifies the cell within a run: shape, pass, grouped splits, precision, mode, batch."""
        return (self.m, self.k, self.n, self.op, tuple(self.m_splits) if self.m_splits else None, self.precision,
                self.mode, self.batch)


def result_key(device: str, versions: str, shape: GemmShape, m_splits: tuple[int, ...] | None, precision: str,
               mode: str, flush_l2: bool, gemm_duty: float = 1.0) -> str:
    splits = ",".join(map(str, m_splits)) if m_splits else "-"
    return "|".join([device, versions, f"{shape.op}:{shape.mkn}", splits, precision, mode,
                     "flush" if flush_l2 else "warm-l2"] + ([f"duty {gemm_duty:g}"] if gemm_duty != 1.0 else []))


def cell_key(cond: dict[str, Any], shape: GemmShape, m_splits: Iterable[int] | None, precision: str, mode: str) -> str:
    """The cache key of a cell measured under ``cond`` (a run's device conditions).

    A CPU cell's key names the CPU model and threads (they set a CPU matmul's time); a TE recipe's
    key hashes the recipe TE built and its NVTE_* variables."""
    versions = f"torch {cond.get('torch')}, TE {cond.get('transformer_engine')}"
    if precision != "BF16" and (tag := recipe_fingerprint((cond.get("recipe_config") or {}).get(precision),
                                                          cond.get("recipe_env"))):
        versions += f", recipe {tag}"
    device = cond.get("device", "?")
    if "cpu_threads" in cond:
        device = f"{device}, {cond.get('cpu_model') or 'unknown CPU model'}, {cond['cpu_threads']} threads"
    return result_key(device, versions, shape, tuple(m_splits) if m_splits else None, precision, mode,
                      bool(cond.get("flush_l2")), cond.get("gemm_duty", 1.0))
