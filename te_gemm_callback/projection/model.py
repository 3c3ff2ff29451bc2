"""Project a run's microbenchmark onto another GPU, cell by cell (docs/projection.md, "The model"): the
GEMM kernel by the ratio of dense peaks, the quantization by the bandwidth ratio, and a band."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import Any

from te_gemm_callback.microbench.results import BenchResults
from te_gemm_callback.projection.gpus import FORMAT, FP4_OVER_FP8_MAX, GPUS, GpuSpec, gpu_of_device
from te_gemm_callback.projection.traffic import gemm_io_bytes, output_bytes, quant_bytes
from te_gemm_callback.shapes import GemmShape

RECIPES = ("BF16", "DelayedScaling", "Float8CurrentScaling", "Float8BlockScaling", "MXFP8BlockScaling",
           "NVFP4BlockScaling")
# The source recipe whose GEMM kernel a recipe is projected from, where the source did not run it.
KERNEL_BASE = {"MXFP8BlockScaling": "Float8CurrentScaling", "NVFP4BlockScaling": "Float8CurrentScaling"}
CAST_BASE = "Float8BlockScaling"  # whose cast bandwidth a recipe without a measured cast takes
MXFP8_TERM = 0.05  # the block-scale loads Hopper's per-tensor kernel does not have
NVFP4_TERM = 0.10  # an NVFP4 kernel has no Hopper counterpart at all: on top of the FP4 cap's term
# Recipes whose GEMMs need Blackwell's block-scaled tensor cores (TE: compute capability 10.0).
BLACKWELL_ONLY = ("MXFP8BlockScaling", "NVFP4BlockScaling")


@dataclass(frozen=True)
class Projected:
    shape: GemmShape
    recipe: str
    mode: str
    ms: float
    low_ms: float
    high_ms: float
    gemm_ms: float
    quant_ms: float
    basis: str  # "measured" (the target is the source), or what the projection took


def _rate(g: GpuSpec, fmt: str) -> float | None:
    """The rate a format is projected at: its peak, FP4 at most FP4_OVER_FP8_MAX times FP8's."""
    p, fp8 = g.peak(fmt), g.peak("fp8")
    if fmt == "fp4" and p and fp8:
        return min(p, FP4_OVER_FP8_MAX * fp8)
    return p


def _ms(bench: BenchResults, shape: GemmShape, recipe: str, mode: str) -> float | None:
    r = bench.get(shape, recipe, mode)
    return r.median_ms if r is not None and r.ok else None


def _spread(bench: BenchResults, shape: GemmShape, recipe: str, mode: str) -> float:
    r = bench.get(shape, recipe, mode)
    if r is None or not r.ok or r.q1_ms is None or r.q3_ms is None or not r.median_ms:
        return 0.0
    return (r.q3_ms - r.q1_ms) / 2 / r.median_ms


def source_gpu(bench: BenchResults, given: GpuSpec | None = None) -> GpuSpec:
    """The GPU the bench ran on, from its device name; ``given`` (``--source-gpu``) only where it is not ours."""
    device = str(bench.meta.get("device") or "")
    g = gpu_of_device(device)
    if g is None:
        if given is None:
            known = ", ".join(s.name for s in GPUS.values())
            raise ValueError(f"no public figures for {device or 'an unnamed device'} here (known: {known}): a "
                             "projection from it is not supported; --source-gpu only names one of these whose device "
                             "name was not recognised")
        return given
    if given is not None and given.key != g.key:
        raise ValueError(f"bench.json was measured on {device} ({g.name}), not on {given.name}: leave out --source-gpu")
    return g


# A bench without NVML clocks: about the term a measured bench had (docs/results/h200.md: clock term).
CLOCK_TERM_UNKNOWN = 0.2


def clock_term(bench: BenchResults) -> float | None:
    """1 - median SM clock during the bench / the GPU's maximum (NVML); None when not recorded."""
    try:
        med = float(bench.meta["clocks_during_run"]["sm_clock_mhz_median"])
        top = float(bench.meta["sm_clock_max_mhz"])
        return max(0.0, 1.0 - med / top)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None


class Projection:
    """One bench run projected onto ``target``; ``schedule``: which operands a pass quantizes (:mod:`.traffic`)."""

    def __init__(self, bench: BenchResults, target: GpuSpec, source: GpuSpec | None = None,
                 schedule: str = "training") -> None:
        self.bench, self.target = bench, target
        self.source = source_gpu(bench, source)
        self.schedule = schedule
        self.same = self.source.key == self.target.key
        clock = clock_term(bench)
        self.clock_known = clock is not None
        self.clock = clock if clock is not None else CLOCK_TERM_UNKNOWN
        self.bw = self.source.bandwidth / self.target.bandwidth
        self.cast_bw = self._cast_bandwidth()

    def _gap(self, shape: GemmShape, recipe: str) -> float | None:
        a, p = _ms(self.bench, shape, recipe, "autocast"), _ms(self.bench, shape, recipe, "prequantized")
        return None if a is None or p is None else a - p

    def _excess(self, shape: GemmShape, recipe: str) -> float | None:
        """Autocast minus pre-quantized, less BF16's own difference: the recipe's quantization."""
        gap = self._gap(shape, recipe)
        return None if gap is None else max(gap - (self._gap(shape, "BF16") or 0.0), 0.0)

    def _cast_bandwidth(self) -> dict[str, float]:
        """GB/s of each recipe's quantization on the source (training schedule: the autocast mode's)."""
        out = {}
        shapes = {r.shape for r in self.bench.results if r.ok}
        for recipe in RECIPES[1:]:
            moved = took = 0.0
            for s in shapes:
                ex = self._excess(s, recipe)
                if ex is not None:
                    moved += quant_bytes(recipe, s, "training")
                    took += ex
            if took > 0 and moved > 0:
                out[recipe] = moved / took / 1e6  # bytes per ms -> GB/s
        return out

    def cast_gbps(self, recipe: str) -> float | None:
        """The source's cast bandwidth for ``recipe``, or the block-scaled one, or the FP8 mean."""
        if recipe in self.cast_bw:
            return self.cast_bw[recipe]
        if CAST_BASE in self.cast_bw:
            return self.cast_bw[CAST_BASE]
        return statistics.mean(self.cast_bw.values()) if self.cast_bw else None

    def _kernel(self, shape: GemmShape, recipe: str) -> tuple[float, str, float, str] | None:
        """(GEMM ms on the target, basis, extra band term, the source recipe it came from)."""
        base = recipe if _ms(self.bench, shape, recipe, "prequantized") is not None else KERNEL_BASE.get(recipe)
        src_ms = _ms(self.bench, shape, base, "prequantized") if base else None
        if src_ms is None or base is None:
            return None
        f_src, f_tgt = FORMAT[base], FORMAT[recipe]
        p_src, p_tgt = _rate(self.source, f_src), _rate(self.target, f_tgt)
        if not p_src or not p_tgt:
            return None
        extra, note = 0.0, ""
        if f_tgt == "fp4":
            # p_tgt is the target's FP4 rate: its FP4 and FP8 peaks are known there.
            fp4, fp8 = self.target.peak("fp4") or p_tgt, self.target.peak("fp8") or p_tgt
            if p_tgt < fp4:
                note = f", FP4 at {p_tgt / fp8:.1f}x the FP8 rate"
            if f_src != "fp4":  # a kernel with no counterpart on the source: 4-bit data, two-level scales
                extra = max(fp4 / p_tgt - 1.0, 0.0) / 2 + NVFP4_TERM
        elif base != recipe:
            extra = MXFP8_TERM
        # The output's write is serial with the main loop: the loop shrinks by the peak ratio, the write only
        # by the bandwidth ratio, so a write a Hopper kernel hid may no longer hide (docs/projection.md).
        w_src, w_tgt = (output_bytes(shape) / (g.bandwidth * 1e9) for g in (self.source, self.target))
        ms = max(src_ms - w_src, 0.0) * p_src / p_tgt + w_tgt
        floor = gemm_io_bytes(f_tgt, shape) / (self.target.bandwidth * 1e9)  # TB/s -> bytes per ms
        basis = f"{base} pre-quantized on {self.source.key} x peak {f_src}->{f_tgt}{note}"
        return max(ms, floor), basis, extra, base

    def cell(self, shape: GemmShape, recipe: str, mode: str) -> Projected | None:
        """One cell's projection; None with nothing to project from, or a recipe the target cannot run."""
        if recipe in BLACKWELL_ONLY and self.target.arch != "blackwell":
            return None
        if self.same:
            ms = _ms(self.bench, shape, recipe, mode)
            if ms is None:
                return None
            s = _spread(self.bench, shape, recipe, mode)
            return Projected(shape, recipe, mode, ms, ms * (1 - s), ms * (1 + s), ms, 0.0, "measured")
        k = self._kernel(shape, recipe)
        if k is None:
            return None
        gemm, basis, extra, base = k
        quant = 0.0
        if mode == "autocast":
            quant = max(self._gap(shape, "BF16") or 0.0, 0.0) * self.bw  # BF16's own work around the GEMM
            if recipe != "BF16":
                ex = self._excess(shape, recipe)
                if ex is not None and self.schedule == "training":  # this cell's own measured cast
                    quant += ex * self.bw
                else:  # the traffic model's bytes at the source's cast bandwidth, scaled to the target
                    gbps = self.cast_gbps(recipe)
                    if gbps is None:
                        return None
                    quant += quant_bytes(recipe, shape, self.schedule) / (gbps * 1e6 / self.bw)
        s = _spread(self.bench, shape, base, "prequantized")
        if mode == "autocast" and recipe != "BF16" and _ms(self.bench, shape, recipe, "autocast") is not None:
            s = max(s, _spread(self.bench, shape, recipe, "autocast"))
        ms = gemm + quant
        band = s + self.clock + extra
        return Projected(shape, recipe, mode, ms, ms * (1 - band), ms * (1 + band), gemm, quant, basis)

    def cells(self, recipes: tuple[str, ...] = RECIPES, modes: tuple[str, ...] = ("autocast", "prequantized")
              ) -> list[Projected]:
        shapes = list(dict.fromkeys(r.shape for r in self.bench.results if r.ok))
        return [p for s in shapes for r in recipes for m in modes if (p := self.cell(s, r, m)) is not None]

    def as_bench(self, cells: list[Projected]) -> BenchResults:
        """The projection as a bench result for the target (band edges as quartiles) for every table to read."""
        out = []
        for p in cells:
            like = self.bench.get(p.shape, "BF16", "prequantized") or next(iter(self.bench.results))
            out.append(replace(like, m=p.shape.m, k=p.shape.k, n=p.shape.n, op=str(p.shape.op), precision=p.recipe,
                               mode=p.mode, median_ms=p.ms, q1_ms=p.low_ms, q3_ms=p.high_ms, tflops=None,
                               peak_fraction=None, error=None, sm_clock_mhz=None, noisy=False, cached=False,
                               attempts=1, iters=0, conditions={}))
        meta: dict[str, Any] = {
            "device": self.target.name, "projection": {
                "source": self.source.name, "target": self.target.name, "schedule": self.schedule,
                "clock_term": round(self.clock, 4), "bandwidth_ratio": round(self.bw, 4),
                "cast_gbps_on_source": {k: round(v, 1) for k, v in self.cast_bw.items()},
                "sources": list(self.target.sources) + list(self.source.sources),
                "measured": self.same},
            "modes": sorted({p.mode for p in cells}), "precisions": list(dict.fromkeys(p.recipe for p in cells))}
        return BenchResults(out, {}, meta)
