"""Stage: project a run's measured GEMMs onto another GPU, per GEMM and recipe, and the step speedups that
follow: :func:`project_run` (docs/projection.md). Figures in :mod:`.gpus`, the per-cell model in :mod:`.model`."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from te_gemm_callback.analysis.prediction import capture_recipe
from te_gemm_callback.analysis.whatif import job_trace, replay_recipes
from te_gemm_callback.capture import GemmCapture
from te_gemm_callback.microbench.items import items_from_capture
from te_gemm_callback.microbench.results import BenchResults, item_ms, measured_items, step_ms
from te_gemm_callback.projection.gpus import GPUS, GpuSpec, gpu
from te_gemm_callback.projection.model import RECIPES, Projected, Projection

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
    step_low_ms: float | None = None  # the step with the GEMM band's edges
    step_high_ms: float | None = None
    source_step_ms: float | None = None  # the same recipe's step on the source, the same formula
    vs_source: float | None = None  # source step / target step: what moving this recipe's job gains
    bound: str | None = None  # "host" or "gpu": what bounds the replayed step on the target
    step_by: str = "gemms_alone"  # "replay": the job's step replayed on the target; else Amdahl
    gemms_alone_step_ms: float | None = None  # Amdahl over the GEMM share, kept beside the replay
    gemms_alone_speedup: float | None = None


@dataclass
class RunProjection:
    target: GpuSpec
    source: GpuSpec
    mode: str
    steps: list[StepProjection] = field(default_factory=list)
    cells: list[Projected] = field(default_factory=list)
    non_gemm_ms: float | None = None  # the job's non-GEMM step time on the target (bandwidth-scaled)
    job_recipe: str | None = None
    notes: list[str] = field(default_factory=list)
    measured: bool = False  # the target is the GPU the run was measured on: nothing projected

    def to_dict(self) -> dict[str, Any]:
        return {"schema": PROJECTION_SCHEMA, "label": "measured" if self.measured else "projection",
                "target": self.target.name, "source": self.source.name, "mode": self.mode,
                "job_recipe": self.job_recipe, "non_gemm_ms": self.non_gemm_ms, "notes": self.notes,
                "sources": list(self.target.sources),
                "steps": [vars(s) for s in self.steps],
                "cells": [{"shape": c.shape.mkn, "op": str(c.shape.op), **{k: v for k, v in vars(c).items()
                                                                             if k != "shape"}} for c in self.cells]}


def check_run_folder(run_dir: str | Path) -> Path:
    # The run analysis loads torch, which `te-gemm project --help` (the GPU list read here) must not.
    from te_gemm_callback.analysis.runs import run_folder
    return run_folder(run_dir)


def project_run(run_dir: str | Path, target: str | GpuSpec, source: str | GpuSpec | None = None,
                mode: str = "autocast", host_speed: float = 1.0) -> RunProjection:
    """Project a run folder onto ``target``: every bench cell, the job's GEMM time per step, and the step,
    replayed on the target where the capture holds its host calls (the host ``host_speed`` times faster) so
    that a host-bound job stays bound; always also "GEMMs alone" (Amdahl)."""
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
    job_step, job_gemm = cap.step_ms(), cap.gemm_ms_per_step()
    if cap.step_kind() not in (None, "clean"):
        out.notes.append(f"the job's step time is of its {cap.step_kind()} steps (no clean step in the capture): "
                         "instruments included")
    if not proj.clock_known:
        out.notes.append("the bench recorded no SM clocks: the band's clock term is taken as 20%")
    if job_step is not None and job_gemm is not None and job_step > job_gemm:
        out.non_gemm_ms = (job_step - job_gemm) * proj.bw
    else:
        out.notes.append("no step projection: the capture has no clean step time or no in-job GEMM time")

    def step_of(res: BenchResults, recipe: str) -> float | None:
        """Amdahl: the job's non-GEMM time, less its own recipe's quantization, plus ``recipe``'s GEMMs."""
        job = out.job_recipe or "BF16"
        own, own_pre = step_ms(res, items, job, mode), step_ms(res, items, job, "prequantized")
        new = step_ms(res, items, recipe, mode, "BF16")
        if out.non_gemm_ms is None or own is None or own_pre is None or new is None:
            return None
        return new + out.non_gemm_ms / (1 if res is projected else proj.bw) - (own - own_pre)

    observed = _observed(root)
    # The band's edges as benches of their own, totalled as the central value is.
    low, high = (BenchResults([replace(c, median_ms=getattr(c, edge)) for c in projected.results])
                 for edge in ("q1_ms", "q3_ms"))
    base_t, base_s = step_of(projected, "BF16"), step_of(bench, "BF16")
    for r in RECIPES:
        g = step_ms(projected, items, r, mode, "BF16")
        if g is None or not any(c.recipe == r for c in cells):
            continue
        lo, hi = (step_ms(edge, items, r, mode, "BF16") or g for edge in (low, high))
        st, ss = step_of(projected, r), step_of(bench, r)
        measured_here = step_ms(bench, items, r, mode) is not None
        out.steps.append(StepProjection(
            r, g, lo, hi, st, base_t / st if st and base_t else None,
            base_s / ss if ss and base_s and measured_here else None, observed.get(r),
            st - (g - lo) if st else None, st + (hi - g) if st else None,
            ss if measured_here else None, ss / st if ss and st and measured_here else None))
    if not out.steps:  # else an empty table, exit 0: a bench of another capture's shapes (or of none of its GEMMs)
        missing = [it for it in items if item_ms(projected, it, "BF16", mode) is None]
        which = f" ({len(missing)} of {len(items)} not measured, e.g. {missing[0].name} {missing[0].fprop.mkn})" \
            if missing else ""
        raise ValueError(f"no recipe's GEMM time can be projected: {root}/bench.json has no {mode} cells for the "
                         f"capture's GEMMs{which}; bench this capture: {bench_cmd}")
    if out.non_gemm_ms is not None:
        out.notes.append(f"non-GEMM step time scaled by HBM bandwidth {proj.source.bandwidth:g} -> "
                         f"{tgt.bandwidth:g} TB/s: {out.non_gemm_ms:.2f} ms on the target")
    _replayed(out, cap, bench, projected, proj.bw, host_speed, observed)
    return out


def _replayed(out: RunProjection, cap: Any, bench: Any, projected: Any, bw: float, host_speed: float,
              observed: dict[str, float]) -> None:
    """Each step the replay gives in place of the GEMMs-alone one (kept beside it); the notes say how."""
    job = out.job_recipe or "BF16"
    costs = bench.meta.get("module_costs")
    clean = cap.step_ms()
    recipes = [s.recipe for s in out.steps]
    traced = job_trace(cap, costs)  # one trace for both GPUs' replays
    on_target = replay_recipes(cap, projected, recipes, job, clean, costs, source=bench, other=bw,
                               host_speed=host_speed, traced=traced)
    if not on_target or "BF16" not in on_target:
        out.notes.append("step: GEMMs alone (the capture holds no host calls of its kernels step to replay)")
        return
    on_source = replay_recipes(cap, bench, recipes, job, clean, costs, traced=traced)
    host_bound = []
    for s in out.steps:
        r = on_target.get(s.recipe)
        if r is None:
            continue
        s.gemms_alone_step_ms, s.gemms_alone_speedup = s.step_ms, s.speedup
        s.step_ms, s.step_low_ms, s.step_high_ms = r.step_ms, r.low_ms, r.high_ms
        s.speedup, s.bound, s.step_by = on_target["BF16"].step_ms / r.step_ms, r.bound, "replay"
        src = on_source.get(s.recipe)
        if src is not None and "BF16" in on_source:
            s.source_step_ms, s.source_speedup = src.step_ms, on_source["BF16"].step_ms / src.step_ms
            s.vs_source = src.step_ms / r.step_ms
        if r.bound == "host":
            host_bound.append(s.recipe)
        out.notes += [f"{s.recipe}: {n}" for n in r.notes]
    speed = f" {host_speed:g}x faster" if host_speed != 1.0 else " as measured"
    out.notes.append(f"step: the job's kernels step replayed on the target (GEMMs projected, other kernels and "
                     f"quantization x{bw:.2f} by bandwidth, the host{speed}); GEMMs alone: Amdahl over the "
                     "job's GEMM share with the projected GEMM speedups")
    if host_bound:
        out.notes.append(f"host-bound on the target in {', '.join(host_bound)}: the host issues the step more slowly "
                         "than the GPU runs it, so faster kernels gain nothing there")


def _observed(root: Path) -> dict[str, float]:
    """The run's observed step speedups (a sweep on the source GPU), from its report.json."""
    try:
        rep = json.loads((root / "report.json").read_text())
        return {a["recipe"]: a["observed_step_speedup"] for a in rep.get("recipes", [])
                if a.get("observed_step_speedup")}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


__all__ = ["GPUS", "GpuSpec", "Projection", "Projected", "RunProjection", "StepProjection", "check_run_folder",
           "project_run", "gpu"]
