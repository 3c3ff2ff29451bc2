"""A first estimate for a GPU from a run that measured none (a CPU run): each captured GEMM at the roofline
bound (the target's dense peak or its HBM bandwidth, whichever takes longer). A lower bound on the GEMM
time per step, without quantization, not a prediction: labelled so wherever it is shown."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from te_gemm_callback.microbench.items import items_from_capture, passes_of
from te_gemm_callback.projection.gpus import FORMAT, GpuSpec
from te_gemm_callback.projection.model import _rate

# Bytes per element of a GEMM's inputs in each tensor format; outputs are written in BF16.
IN_BYTES = {"bf16": 2.0, "fp8": 1.0, "fp4": 0.5}
OUT_BYTES = 2.0
LABEL = "shape-only estimate: public peak and bandwidth, nothing measured"


@dataclass
class ShapeOnly:
    """GEMM ms per step at the roofline bound, per recipe the target runs, and what was left out."""
    target: GpuSpec
    gemm_ms: dict[str, float] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    gemms: int = 0

    def speedup(self, recipe: str) -> float | None:
        base, t = self.gemm_ms.get("BF16"), self.gemm_ms.get(recipe)
        return base / t if base and t else None

    def to_dict(self) -> dict[str, Any]:
        return {"label": LABEL, "target": self.target.name, "gemms": self.gemms,
                "recipes": {r: {"gemm_ms_per_step": ms, "speedup_over_bf16": self.speedup(r)}
                            for r, ms in self.gemm_ms.items()},
                "skipped": self.skipped, "sources": list(self.target.sources)}


def shape_only(cap: Any, target: GpuSpec) -> ShapeOnly:
    """The roofline bound of ``cap``'s GEMMs per step on ``target`` in every recipe it runs."""
    items = items_from_capture(cap)
    out = ShapeOnly(target, gemms=sum(len(passes_of(it)) for it in items))
    for recipe, fmt in FORMAT.items():
        peak = _rate(target, fmt)  # as the measured projection takes it (FP4 capped against FP8)
        if not peak:
            out.skipped[recipe] = f"{target.name} has no {fmt.upper()} tensor-core rate"
            continue
        total = 0.0
        for it in items:
            for s in passes_of(it):
                moved = s.batch * ((s.m * s.k + s.k * s.n) * IN_BYTES[fmt] + s.m * s.n * OUT_BYTES)
                ms = max(s.flops / (peak * 1e12), moved / (target.bandwidth * 1e12)) * 1e3
                total += it.count * it.calls_of(s.op) * ms
        out.gemm_ms[recipe] = total
    return out
