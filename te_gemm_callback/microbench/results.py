"""A microbenchmark run's results (:class:`BenchResults`), a multi-GPU run's pooling, and the GEMM
time per layer call and per step that the report takes from them."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from te_gemm_callback.files.jsonio import from_fields, read_schema, write_json
from te_gemm_callback.microbench.cells import BENCH_SCHEMA, FP8_FAMILY, BenchResult, stats
from te_gemm_callback.microbench.items import WorkItem, passes_of
from te_gemm_callback.shapes import GemmOp, GemmShape


@dataclass
class BenchResults:
    """Every cell of a run (cached, measured or failed), the recipes skipped and why, and ``meta``."""

    results: list[BenchResult]
    skipped: dict[str, str] = field(default_factory=dict)  # precision -> reason it did not run
    meta: dict[str, Any] = field(default_factory=dict)
    # Cells this run measured: BenchResult.cell -> (samples in ms, SM clock per visit); not saved.
    samples: dict[tuple, tuple[list[float], list[float]]] = field(default_factory=dict, repr=False)

    def get(self, shape: GemmShape, precision: str, mode: str,
            m_splits: tuple[int, ...] | None = None) -> BenchResult | None:
        cell = (shape.m, shape.k, shape.n, str(shape.op), m_splits, precision, mode, shape.batch)
        return next((r for r in self.results if r.cell == cell), None)

    @property
    def precisions(self) -> list[str]:
        return list(dict.fromkeys(r.precision for r in self.results))

    def to_dict(self) -> dict[str, Any]:
        return {"schema": BENCH_SCHEMA, "meta": self.meta, "skipped": self.skipped,
                "results": [asdict(r) for r in self.results]}

    def save(self, path: str | Path) -> Path:
        return write_json(path, self.to_dict(), schema=BENCH_SCHEMA)

    @classmethod
    def load(cls, path: str | Path) -> BenchResults:
        d = read_schema(path, BENCH_SCHEMA, "te-gemm bench result")  # field types and ranges: jsonio.BENCH_FILE
        try:
            return cls([from_fields(BenchResult, r) for r in d["results"]], d.get("skipped") or {}, d.get("meta") or {})
        except (KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"{path}: malformed te-gemm bench result: {type(err).__name__}: {err}") from None


def summarise(r: BenchResult, flops: float, times: list[float], clocks: list[float], peaks: dict) -> BenchResult:
    r.median_ms, r.q1_ms, r.q3_ms = stats(times)
    r.iters = len(times)
    r.tflops = flops / (r.median_ms * 1e-3) / 1e12
    # No FP4 peak is measured (measure_peaks times BF16 and FP8): an NVFP4 cell has no fraction.
    peak = None if r.precision == "NVFP4BlockScaling" else peaks.get("fp8" if r.precision in FP8_FAMILY else "bf16")
    r.peak_fraction = r.tflops / peak if peak else None
    r.sm_clock_mhz = statistics.median(clocks) if clocks else None
    r.noisy = r.above_spread_limit  # cleared if a later attempt is quieter (engine.BenchRun._remeasure)
    return r


def pool_parts(parts: list[BenchResults]) -> list[BenchResult]:
    """One run's results from a multi-GPU run's parts, in the first part's order: each measured cell
    summarised over the samples of every part; cached and failed-everywhere cells stay as they are."""
    peaks = parts[0].meta.get("peaks_tflops") or {}
    out = []
    for r in parts[0].results:
        measured = [p.samples[r.cell] for p in parts if r.cell in p.samples]
        if measured:
            ok = r if r.ok else next(x for p in parts for x in p.results if x.cell == r.cell and x.ok)
            flops = (ok.tflops or 0.0) * 1e12 * (ok.median_ms or 0.0) * 1e-3  # both set on an ok cell
            attempts = max(x.attempts for p in parts for x in p.results if x.cell == r.cell)
            r = summarise(BenchResult(**{**asdict(ok), "error": None, "attempts": attempts}), flops,
                          [t for ts, _ in measured for t in ts], [c for _, cs in measured for c in cs], peaks)
        out.append(r)
    return out


def item_ms(res: BenchResults, item: WorkItem, precision: str, mode: str,
            ops: tuple[GemmOp, ...] | None = None) -> float | None:
    """GEMM time of one call of a work item, each pass at its calls per call; None if any failed.

    ``ops``: only those passes (dgrad_a and dgrad_b count as the passes they are sized as)."""
    total = 0.0
    for s in passes_of(item):
        if ops is not None and s.op not in ops and s.op.sized_as not in ops:
            continue
        r = res.get(s, precision, mode, item.m_splits)
        if r is None or not r.ok:
            return None
        total += (r.median_ms or 0.0) * item.calls_of(s.op)  # set on an ok cell
    return total


def measured_items(res: BenchResults, items: list[WorkItem]) -> list[WorkItem]:
    """Items as this run measured them: m_splits it timed carry the calls of those it did not."""
    timed = {(r.m, r.k, r.n, r.batch, tuple(r.m_splits) if r.m_splits else None) for r in res.results}
    groups: dict[tuple, list[WorkItem]] = {}
    for it in items:
        groups.setdefault((it.name, it.key[:4]), []).append(it)
    out = []
    for group in groups.values():
        total = sum(it.count for it in group)
        first = group[0]
        f = first.fprop
        kept = [it for it in group if (it.fprop.m, it.fprop.k, it.fprop.n, it.fprop.batch, it.m_splits) in timed]
        if not kept and first.m_splits:  # none of ours timed: the splits this run did time
            other = [t[4] for t in timed if t[:4] == (f.m, f.k, f.n, f.batch) and t[4]]
            kept = [replace(first, count=1.0, m_splits=sp) for sp in other]
        if not kept:
            out += group  # not measured at all: the totals say so
            continue
        kept_calls = sum(it.count for it in kept)
        scale = total / kept_calls if kept_calls else 1.0  # a hand-made capture may give 0 calls per step
        out += [replace(it, count=it.count * scale) for it in kept]
    return out


def step_ms(res: BenchResults, items: list[WorkItem], precision: str, mode: str,
            fallback: str | None = None) -> float | None:
    """Σ count x time over all work items: GEMM time per step (or per micro-batch of a config).

    An item that failed in ``precision`` counts at its ``fallback`` time where given (the job would
    keep it there), else the total is None."""
    total = 0.0
    for it in items:
        t = item_ms(res, it, precision, mode)
        if t is None and fallback is not None and fallback != precision:
            t = item_ms(res, it, fallback, mode)
        if t is None:
            return None
        total += it.count * t
    return total


def fallback_items(res: BenchResults, items: list[WorkItem], precision: str, mode: str,
                   fallback: str = "BF16") -> list[tuple[WorkItem, str]]:
    """Items that failed in ``precision`` but ran in ``fallback``, with the failure reason."""
    out = []
    for it in items:
        if item_ms(res, it, precision, mode) is None and item_ms(res, it, fallback, mode) is not None:
            errs = [r.error for s in passes_of(it)
                    if (r := res.get(s, precision, mode, it.m_splits)) is not None and r.error]
            out.append((it, errs[0] if errs else "not measured"))
    return out
