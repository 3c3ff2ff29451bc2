"""Stage: project a run's measured GEMMs onto another GPU, per GEMM and recipe, and the step speedups that
follow: :func:`project_run` (docs/projection.md). Figures in :mod:`.gpus`, the per-cell model in :mod:`.model`."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from te_gemm_callback.analysis.prediction import capture_recipe
from te_gemm_callback.capture import GemmCapture
from te_gemm_callback.microbench.items import items_from_capture
from te_gemm_callback.microbench.results import BenchResults, item_ms, measured_items, step_ms
from te_gemm_callback.projection.gpus import GPUS, GpuSpec, gpu
from te_gemm_callback.projection.model import RECIPES, Projected, Projection
from te_gemm_callback.projection.steps import GemmsAlone, gemms_alone, observed_speedups, replayed, run_analysis

if TYPE_CHECKING:
    from te_gemm_callback.analysis.runs import RunReport

PROJECTION_SCHEMA = "te-gemm-projection/1"


@dataclass
class StepProjection:
    """One recipe's projected step on the target: GEMM time per step (with its band) and the step."""
    recipe: str
    gemm_ms: float
    gemm_low_ms: float
    gemm_high_ms: float
    step_ms: float | None = None
    speedup: float | None = None  # over BF16 on the target
    source_speedup: float | None = None  # the same formula on the source's bench (measured there)
    observed_speedup: float | None = None  # the run's observed speedup on the source (a sweep), if any
    step_low_ms: float | None = None  # the step's band
    step_high_ms: float | None = None
    source_step_ms: float | None = None  # the same recipe's step on the source, the same formula
    vs_source: float | None = None  # source step / target step: what moving this recipe's job gains
    bound: str | None = None  # "host" or "gpu": what bounds the replayed step on the target
    step_by: str = "gemms_alone"  # "replay": the job's step replayed on the target; else Amdahl
    gemms_alone_speedup: float | None = None  # the report's Amdahl over the GEMM share, on the target


@dataclass
class RunProjection:
    target: GpuSpec
    source: GpuSpec
    mode: str
    steps: list[StepProjection] = field(default_factory=list)
    cells: list[Projected] = field(default_factory=list)
    gemms_alone: GemmsAlone | None = None  # what the GEMMs-alone column assumes
    job_recipe: str | None = None
    notes: list[str] = field(default_factory=list)
    measured: bool = False  # the target is the GPU the run was measured on: nothing projected

    def to_dict(self) -> dict[str, Any]:
        return {"schema": PROJECTION_SCHEMA, "label": "measured" if self.measured else "projection",
                "target": self.target.name, "source": self.source.name, "mode": self.mode,
                "job_recipe": self.job_recipe, "gemms_alone": self.gemms_alone and self.gemms_alone.to_dict(),
                "notes": self.notes, "sources": list(self.target.sources),
                "steps": [vars(s) for s in self.steps],
                "cells": [{"shape": c.shape.mkn, "op": str(c.shape.op), **{k: v for k, v in vars(c).items()
                                                                             if k != "shape"}} for c in self.cells]}


def check_run_folder(run_dir: str | Path) -> Path:
    # The run analysis loads torch, which `te-gemm project --help` (the GPU list read here) must not.
    from te_gemm_callback.analysis.runs import run_folder
    return run_folder(run_dir)


def project_run(run_dir: str | Path, target: str | GpuSpec, source: str | GpuSpec | None = None,
                mode: str = "autocast", host_speed: float = 1.0, analysis: RunReport | None = None) -> RunProjection:
    """Project a run folder onto ``target``: every bench cell, the job's GEMM time per step, and the step,
    replayed on the target where the capture holds its host calls (the host ``host_speed`` times faster) so
    that a host-bound job stays bound; always also "GEMMs alone" as the report computes it. ``analysis``: the
    run's :func:`~te_gemm_callback.analysis.runs.analyze_run`, made here when not given."""
    if not host_speed > 0:
        raise ValueError(f"host_speed must be a positive factor, got {host_speed}")
    root = check_run_folder(run_dir)
    bench_cmd = (f"te-gemm bench --capture {root}/gemm_capture.json --modes autocast,prequantized "
                 f"--json {root}/bench.json")
    if not (root / "gemm_capture.json").is_file():
        raise ValueError(f"{root} has no gemm_capture.json: a run folder is where the callback or te-gemm run wrote "
                         "its capture")
    if not (root / "bench.json").is_file():
        raise ValueError(f"{root} has no bench.json: {bench_cmd} on the source GPU first")
    bench = BenchResults.load(root / "bench.json")
    cap = GemmCapture.load(root / "gemm_capture.json")
    tgt = target if isinstance(target, GpuSpec) else gpu(target)
    src = source if isinstance(source, GpuSpec) or source is None else gpu(source)
    proj = Projection(bench, tgt, src)
    if "prequantized" not in (bench.meta.get("modes") or []):
        raise ValueError(f"{root}/bench.json has no pre-quantized cells, which the projection scales: {bench_cmd}")
    cells = proj.cells()
    if not cells:
        raise ValueError(f"no cell of {root}/bench.json can be projected: every cell failed, or none was measured "
                         "pre-quantized; bench the capture again")
    projected = proj.as_bench(cells)
    items = measured_items(bench, items_from_capture(cap))
    out = RunProjection(tgt, proj.source, mode, cells=cells, job_recipe=capture_recipe(cap), measured=proj.same)
    if cap.step_kind() not in (None, "clean"):
        out.notes.append(f"the job's step time is of its {cap.step_kind()} steps (no clean step in the capture): "
                         "instruments included")
    if not proj.clock_known:
        out.notes.append("the bench recorded no SM clocks: the band's clock term is taken as 20%")
    rr, why = run_analysis(root, analysis)
    observed, observed_note = observed_speedups(root, rr, why)
    alone, alone_note = gemms_alone(rr, cap, bench, items, proj.bw)
    out.gemms_alone = alone
    # The band's edges as benches of their own, totalled as the central value is.
    low, high = (BenchResults([replace(c, median_ms=getattr(c, edge)) for c in projected.results])
                 for edge in ("q1_ms", "q3_ms"))
    for r in RECIPES:
        g = step_ms(projected, items, r, mode, "BF16")
        if g is None or not any(c.recipe == r for c in cells):
            continue
        lo, hi = (step_ms(edge, items, r, mode, "BF16") or g for edge in (low, high))
        out.steps.append(StepProjection(r, g, lo, hi, observed_speedup=observed.get(r)))
    if not out.steps:  # else an empty table, exit 0: a bench of another capture's shapes (or of none of its GEMMs)
        missing = [it for it in items if item_ms(projected, it, "BF16", mode) is None]
        which = f" ({len(missing)} of {len(items)} not measured, e.g. {missing[0].name} {missing[0].fprop.mkn})" \
            if missing else ""
        raise ValueError(f"no recipe's GEMM time can be projected: {root}/bench.json has no {mode} cells for the "
                         f"capture's GEMMs{which}; bench this capture: {bench_cmd}")
    if alone is not None:
        _gemms_alone_steps(out, alone, bench, projected, low, high)
    if not replayed(out, cap, bench, projected, proj.bw, host_speed) and alone is None:
        out.notes.append("no step projection: the capture has no host calls to replay nor an in-job GEMM time")
    out.notes += [n for n in (alone and alone.note(proj.source.bandwidth, tgt.bandwidth,
                                                   any(s.step_by == "replay" for s in out.steps)),
                              alone_note, observed_note) if n]
    return out


def _gemms_alone_steps(out: RunProjection, alone: GemmsAlone, bench: BenchResults, projected: BenchResults,
                       low: BenchResults, high: BenchResults) -> None:
    """Every step's GEMMs-alone speedup, and the step itself where the replay will not give one."""
    base_t, base_s = alone.step(projected, "BF16", True), alone.step(bench, "BF16", False)
    for s in out.steps:
        st, ss = alone.step(projected, s.recipe, True), alone.step(bench, s.recipe, False)
        s.gemms_alone_speedup = base_t / st if st and base_t else None
        s.step_ms, s.speedup = st, s.gemms_alone_speedup
        s.step_low_ms, s.step_high_ms = alone.step(low, s.recipe, True), alone.step(high, s.recipe, True)
        if ss and step_ms(bench, alone.items, s.recipe, alone.mode) is not None:  # measured on the source
            s.source_step_ms, s.source_speedup = ss, base_s / ss if base_s else None
            s.vs_source = ss / st if st else None


__all__ = ["GPUS", "GpuSpec", "Projection", "Projected", "RunProjection", "StepProjection", "check_run_folder",
           "project_run", "gpu"]
