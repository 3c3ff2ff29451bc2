"""A projection's step columns beside the cells (docs/projection.md): the job's step replayed on the target,
"GEMMs alone" as the report computes it, and the observed speedups on the source as the report makes them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from te_gemm_callback.analysis.whatif import job_trace, own_miss, replay_recipes
from te_gemm_callback.files.jsonio import read_json
from te_gemm_callback.microbench.items import WorkItem
from te_gemm_callback.microbench.results import BenchResults, step_ms
from te_gemm_callback.sweep.observed import observe

if TYPE_CHECKING:  # the run analysis loads torch, which `te-gemm project --help` must not
    from te_gemm_callback.analysis.runs import RunReport


def run_analysis(root: Path, given: RunReport | None) -> tuple[RunReport | None, str | None]:
    """The run's report analysis (``given`` where the caller has it), else None and why it cannot be made."""
    if given is not None:
        return given, None
    from te_gemm_callback.analysis.runs import analyze_run
    try:
        return analyze_run(root), None
    except ValueError as err:
        return None, str(err)


@dataclass
class GemmsAlone:
    """The report's "GEMMs alone" on either GPU: Amdahl over the GEMM share of the report's base run (its step
    ``step_ms``, of it ``gemm_ms`` GEMM kernels, in ``recipe``), each recipe's GEMMs at their ``mode`` time on
    that GPU over the base recipe's on the source, the rest of the step times the bandwidth ratio ``bw`` on the
    target. No host in it: a host-bound step is the replay's to give."""
    recipe: str
    step_ms: float
    gemm_ms: float
    mode: str
    of: str  # whose step: "the job's" or "the sweep's <recipe> run's"
    source: BenchResults
    items: list[WorkItem]
    bw: float

    def step(self, bench: BenchResults, recipe: str, on_target: bool) -> float | None:
        # The report's fallback: a GEMM a recipe cannot run stays in BF16 in the job.
        b0 = step_ms(self.source, self.items, self.recipe, self.mode, "BF16")
        b = step_ms(bench, self.items, recipe, self.mode, "BF16")
        if not b0 or b is None:
            return None
        return (self.step_ms - self.gemm_ms) * (self.bw if on_target else 1.0) + self.gemm_ms * b / b0

    def to_dict(self) -> dict[str, Any]:
        return {"of": self.of, "recipe": self.recipe, "mode": self.mode, "step_ms": self.step_ms,
                "gemm_ms": self.gemm_ms, "non_gemm_ms_on_target": (self.step_ms - self.gemm_ms) * self.bw}

    def note(self, source_bw: float, target_bw: float, replayed: bool) -> str:
        rest = self.step_ms - self.gemm_ms
        moved = (f"scaled by HBM bandwidth {source_bw:g} -> {target_bw:g} TB/s to {rest * self.bw:.2f} ms"
                 if self.bw != 1.0 else "as measured")
        return (f"GEMMs alone: Amdahl over the GEMM share of {self.of} step on the source ({self.step_ms:.2f} ms, "
                f"{self.gemm_ms:.2f} of GEMMs) with {self.mode} GEMM speedups, as the report; the other "
                f"{rest:.2f} ms {moved}, the host not in it" + ("; not the replayed step" if replayed else ""))


def gemms_alone(rr: RunReport | None, cap: Any, bench: BenchResults, items: list[WorkItem],
                bw: float) -> tuple[GemmsAlone | None, str | None]:
    """The report's Amdahl base (the job's capture where the report cannot be made), or None and why."""
    if rr is not None:
        rep = rr.report
        t, g, recipe = rep.step_ms, rep.gemm_ms, rep.current_recipe
        mode = str(rep.meta.get("mode") or "autocast")
        of = f"the sweep's {recipe} run's" if rep.meta.get("base_run") == "sweep" else "the job's"
    else:
        base = observe(cap)
        t, g, recipe = base.step_ms, base.gemm_ms, base.recipe
        mode = "prequantized" if "prequantized" in (bench.meta.get("modes") or []) else "autocast"
        of = "the job's"
    if g is None or not t or not 0 <= g <= t:
        return None, f"GEMMs alone: none: {of} step has no in-job GEMM time within it to scale"
    alone = GemmsAlone(recipe, t, g, mode, of, bench, items, bw)
    if step_ms(bench, items, recipe, mode, "BF16") is None:
        return None, f"GEMMs alone: none: bench.json has no {mode} time of {recipe}'s GEMMs, the job's recipe"
    return alone, None


def observed_speedups(root: Path, rr: RunReport | None, why: str | None) -> tuple[dict[str, float], str | None]:
    """The observed step speedups on the source as the run's report makes them (from sweep/), else those its
    report.json kept; with one line where they come from report.json or the column is empty, and why."""
    if rr is not None:
        got = {a.recipe: a.observed_step_speedup for a in rr.report.recipes
               if a.observed_step_speedup and a.recipe != "plan"}
        if set(got) - {"BF16"}:  # BF16 alone is the baseline over itself: nothing observed
            return got, None
        swept = any((root / "sweep").glob("*/gemm_capture.json"))
        why = "the report made from its sweep/ captures has none" if swept else "no sweep/ captures"
    else:
        why = f"its report cannot be made ({why})"
    from te_gemm_callback.analysis.runs import kept_reports, observed_in  # loads torch: not at --help
    # report.json, then the earlier ones te-gemm report kept where it could not make them again.
    paths = [p for p in (root / "report.json", *reversed(kept_reports(root))) if p.is_file()]
    if not paths:
        return {}, f"source: observed: empty: {why}, and no report.json"
    errors = []
    run_id = rr.job.meta.get("run_id") if rr is not None else None
    for path in paths:
        try:
            report = read_json(path, path.name)
            got = observed_in(report)
        except ValueError as err:
            errors.append(f"{path.name} unreadable ({err})")
            continue
        theirs = (report.get("meta") or {}).get("run_id") if isinstance(report, dict) else None
        if run_id and theirs and theirs != run_id:  # an earlier run's, written to the same folder
            errors.append(f"{path.name} is of another run ({theirs})")
            continue
        if set(got) - {"BF16"}:
            return got, f"source: observed: from {path.name} ({why} to make them again)"
    held = "; ".join(errors) or f"{' and '.join(p.name for p in paths)} hold none"
    return {}, f"source: observed: empty: {why}, and {held}"


def replayed(out: Any, cap: Any, bench: Any, projected: Any, bw: float, host_speed: float) -> bool:
    """Each step the replay gives in place of the GEMMs-alone one; the notes say how. False without a trace."""
    job = out.job_recipe or "BF16"
    costs = bench.meta.get("module_costs")
    clean = cap.step_ms()
    recipes = [s.recipe for s in out.steps]
    traced = job_trace(cap, costs)  # one trace for both GPUs' replays
    # On another GPU the host is the job's as calibrated to its clean step: the miss before that calibration
    # is how far the replay's host can be off, and every band carries it.
    miss = own_miss(traced[1]) if traced is not None else None
    on_target = replay_recipes(cap, projected, recipes, job, clean, costs, source=bench, other=bw,
                               host_speed=host_speed, traced=traced, miss=miss)
    if not on_target or "BF16" not in on_target or traced is None:
        out.notes.append("step: GEMMs alone (the capture holds no host calls of its kernels step to replay)")
        return False
    on_source = replay_recipes(cap, bench, recipes, job, clean, costs, traced=traced)
    host_bound = []
    for s in out.steps:
        r = on_target.get(s.recipe)
        if r is None:
            continue
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
                     f"quantization x{bw:.2f} by bandwidth, the host{speed})")
    own = traced[1]
    if own.get("host_scale", 1.0) != 1.0 and own.get("clean_ms"):
        out.notes.append(f"band: the replay of the job's own {job} step missed it by "
                         f"{own['replay_ms'] / own['clean_ms'] - 1:+.1%} before its host was scaled "
                         f"x{own['host_scale']:.2f} to it; every recipe's band carries that miss")
    if host_bound:
        out.notes.append(f"host-bound on the target in {', '.join(host_bound)}: the host issues the step more slowly "
                         "than the GPU runs it, so faster kernels gain nothing there")
    return True
