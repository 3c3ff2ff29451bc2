"""A run folder and everything analysed from it, with no drawing: the report, the precision plan, the
per-rank summary and kernel split (:func:`te_gemm_callback.reporting.run.report` draws them)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from te_gemm_callback.analysis.notes import (
    clock_note,
    duty_note,
    framework_note,
    host_bound,
    instrument_note,
    instrument_problem,
)
from te_gemm_callback.analysis.plan import run_plan
from te_gemm_callback.analysis.prediction import capture_recipe, precision_ran
from te_gemm_callback.analysis.verdicts import Report, analyze
from te_gemm_callback.capture import GemmCapture
from te_gemm_callback.capture.distributed import rank_summary
from te_gemm_callback.microbench.items import WorkItem, items_from_capture
from te_gemm_callback.microbench.results import BenchResults, measured_items
from te_gemm_callback.sweep.plan import PrecisionPlan

log = logging.getLogger("te_gemm_callback")


@dataclass
class RunReport:
    """The report of a run folder and what it was made from."""
    report: Report
    job: GemmCapture
    captures: list[GemmCapture]  # the observed runs: the sweep's, else one per recipe
    bench: BenchResults | None
    items: list[WorkItem]  # the job's GEMMs, as measured by the bench where it holds them
    ranks: list[dict[str, Any]] | None = None
    kernels: dict[str, dict[str, float]] = field(default_factory=dict)  # recipe -> kernel ms by category
    plan: PrecisionPlan | None = None  # where the bench allows one (analysis.plan.run_plan)
    host_bound_notes: list[str] = field(default_factory=list)  # report.meta keys of host-bound notes
    files: dict[str, Path] = field(default_factory=dict)  # what reporting.run.report wrote, once it has
    projections: list[Any] = field(default_factory=list)  # projection.RunProjection, where asked for
    replay_from: GemmCapture | None = None  # the capture the report's replay replays (the job's, in its recipe)


def observed_in(report_json: Any) -> dict[str, float]:
    """The observed step speedups a report.json's rows hold (BF16, the baseline over itself, among them)."""
    rows = report_json.get("recipes") if isinstance(report_json, dict) else None
    return {str(a["recipe"]): float(a["observed_step_speedup"]) for a in rows or []
            if isinstance(a, dict) and isinstance(a.get("observed_step_speedup"), (int, float))}


def kept_reports(root: Path) -> list[Path]:
    """The earlier report.json files ``te-gemm report`` kept in ``root`` (:func:`keep_report`), first kept first."""
    return sorted(root.glob("report-before*.json"), key=lambda p: (len(p.name), p.name))


def keep_report(root: Path) -> Path:
    """A name no earlier kept report has: report-before.json, then report-before-2.json, ..."""
    n = len(kept_reports(root)) + 1
    while (path := root / ("report-before.json" if n == 1 else f"report-before-{n}.json")).exists():
        n += 1
    return path


def run_folder(run_dir: str | Path) -> Path:
    """``run_dir`` as a path; every command that reads a run folder refuses one that is not a folder in these words."""
    root = Path(run_dir)
    if not root.is_dir():
        raise ValueError(f"{run_dir} is not a folder: point at the callback's output folder")
    return root


def analyze_run(run_dir: str | Path) -> RunReport:
    """Analyse a run folder: no GPU, no drawing; with the precision plan where the bench allows one.

    Example:
        >>> rr = analyze_run("runs/demo")          # doctest: +SKIP
        >>> [a.verdict for a in rr.report.recipes]  # doctest: +SKIP
    """
    root = run_folder(run_dir)
    paths = sorted(root.rglob("gemm_capture.json"))
    if not paths:
        raise ValueError(f"{run_dir} holds no gemm_capture.json: point at the callback's output folder")
    sweep = [p for p in paths if "sweep" in p.relative_to(root).parts]
    main = [p for p in paths if p not in sweep]
    if sweep:
        # A sweep compares recipes within one run: a parent folder of several runs is refused.
        runs = sorted({p.parent for p in main} | {_run_of(p, root) for p in sweep})
        if len(runs) > 1:
            raise ValueError(f"{run_dir} holds {len(runs)} run folders ({', '.join(map(str, runs[:4]))}"
                             f"{', ...' if len(runs) > 4 else ''}): give one of them")
    job_path = _job_capture(root, main, sweep)
    job = GemmCapture.load(job_path)
    main = [job_path] if main else main
    # Observed runs: the callback's sweep when present, else one capture per recipe (separate runs).
    sweep_caps, stale = _same_run(job, [(p, GemmCapture.load(p)) for p in sweep]) if main else \
        ([GemmCapture.load(p) for p in sweep], [])
    sweep = sweep if sweep_caps else []
    caps = sweep_caps or [GemmCapture.load(p) for p in paths if p not in stale]
    if not sweep_caps and len(caps) > 1:
        _one_model_one_run_per_recipe(run_dir, [p for p in paths if p not in stale], caps)
    own = capture_recipe(job)
    # The baseline is the job's recipe; an FP32 (FP16) job's is the sweep's FP8-off entry, keyed "BF16".
    base = next((c for c in caps if capture_recipe(c) == own), None) or \
        next((c for c in caps if capture_recipe(c) == "BF16" and precision_ran(c) == own), caps[0])
    bench = BenchResults.load(root / "bench.json") if (root / "bench.json").exists() else None
    # The prediction replays the job's own capture, never a sweep's run: the same with or without one.
    replay_from = job if capture_recipe(job) == capture_recipe(base) else base
    rep = analyze(base, bench, [c for c in caps if c is not base], items=items_from_capture(job),
                  replay_from=replay_from,
                  no_bench=f"no bench.json: te-gemm bench --capture {job_path} --json {root / 'bench.json'} "
                           "measures the GEMM times and module costs the replay runs on, then te-gemm report")
    # The step note speaks of the run whose step time the table shows; the job's own is beside it.
    with_job = bool(sweep and main)
    job_note = instrument_note(job) if with_job else None
    observed = {a.recipe: a.observed_step_speedup for a in rep.recipes if a.observed_step_speedup}
    job_name = rep.meta.get("job_precision") or rep.current_recipe  # as the table names it (FP32 keyed BF16)
    sweep_run = f"the job's {job_name} run in the sweep" if with_job else None
    notes = {"step_note": instrument_note(base), "job_step_note": job_note and f"training job: {job_note}",
             "framework_note": framework_note(job, base, observed) if with_job else None,
             "clock_note": clock_note(job, bench),
             # The table's share, that of the job's run in the sweep where there is one: said so.
             "duty_note": duty_note(rep.gemm_share, bench, sweep_run)}
    rep.meta.update({key: note for key, note in notes.items() if note})
    if with_job:  # the table's step is the sweep's run of the job's recipe, not the job's own steps
        rep.meta["base_run"] = "sweep"
    alerts = [key for key, cap in (("step_note", base), ("job_step_note", job if job_note else None))
              if cap is not None and key in rep.meta and host_bound(cap)]
    warnings = rep.meta.setdefault("warnings", [])
    if stale:  # said where the report's readers look first, with the files to remove
        warnings.append(f"sweep captures of another run ignored ({', '.join(str(p.relative_to(root)) for p in stale)}"
                        "): their run id is not the job capture's; remove them or run the sweep again")
    # A cost the notes refuse to state is a finding of the checks too: report.json carries it.
    for who, cap in ((f"{capture_recipe(base)} run", base), ("training job", job if with_job else None)):
        if cap is not None and (problem := instrument_problem(cap)):
            warnings.append(f"{who}: {problem}")
    items = measured_items(bench, items_from_capture(job)) if bench is not None else items_from_capture(job)
    rank_files = sorted((root / "ranks").glob("rank*.json"),
                        key=lambda p: int(p.stem[4:]) if p.stem[4:].isdigit() else 0)
    ranks = rank_summary([GemmCapture.load(p) for p in rank_files]) if rank_files else None
    kernels = {capture_recipe(c): c.meta.get("kernel_breakdown_ms") or {} for c in caps}
    rr = RunReport(rep, job, caps, bench, items, ranks, kernels, host_bound_notes=alerts, replay_from=replay_from)
    rr.plan = run_plan(rr)
    return rr


def weight_gemms(cap: GemmCapture) -> set[tuple]:
    """What runs of one model in different recipes share: who runs which GEMM shape (grouped GEMMs, padded
    per expert under FP8, left out)."""
    return {(r.module, r.gemm, r.op, r.m, r.k, r.n, r.batch) for r in cap.records if not r.m_splits}


def _one_model_one_run_per_recipe(run_dir: str | Path, paths: list[Path], caps: list[GemmCapture]) -> None:
    """Separate runs are compared only if they ran one model and no recipe twice."""
    first = weight_gemms(caps[0])
    for p, cap in zip(paths[1:], caps[1:]):
        if weight_gemms(cap) != first:
            raise ValueError(f"{run_dir} holds runs of different models ({paths[0].parent} and {p.parent}: "
                             "their GEMMs are not the same modules' in the same shapes): give one run folder, "
                             "or a folder of one model's runs in different recipes")
    seen: dict[str, Path] = {}
    for p, cap in zip(paths, caps):
        recipe = capture_recipe(cap)
        if recipe in seen:
            raise ValueError(f"{run_dir} holds two runs in {recipe} ({seen[recipe].parent} and {p.parent}): "
                             "give one folder per recipe")
        seen[recipe] = p


def _run_of(sweep_capture: Path, root: Path) -> Path:
    """The run folder a sweep capture belongs to: the folder holding its ``sweep/``."""
    parts = sweep_capture.relative_to(root).parts
    return root.joinpath(*parts[:parts.index("sweep")])


def _job_capture(root: Path, main: list[Path], sweep: list[Path]) -> Path:
    """The job's capture: ``gemm_capture.json``, or among a resumed job's ``gemm_capture.step<N>.json`` the
    one of the sweep's run id, else the newest."""
    resumed = sorted(root.glob("gemm_capture.step*.json"))
    if not main:
        log.warning("te-gemm: %s holds no capture of the job itself: the sweep's %s stands in for it (the job's "
                    "step, GEMMs and share are that run's)", root, sweep[0].relative_to(root))
        return sweep[0]
    if not resumed:
        return main[0]
    mine = [p for p in main if p.parent == root] + resumed
    caps = {p: GemmCapture.load(p) for p in mine}
    ids = {GemmCapture.load(p).meta.get("run_id") for p in sweep}
    swept = [p for p, c in caps.items() if c.meta.get("run_id") in ids and c.meta.get("run_id")]
    pick = swept or mine
    return max(pick, key=lambda p: (str(caps[p].meta.get("created") or ""), p.stat().st_mtime))


def _same_run(job: GemmCapture, sweep: list[tuple[Path, GemmCapture]]) -> tuple[list[GemmCapture], list[Path]]:
    """The sweep captures of the job's run (same ``meta["run_id"]``), and the paths of the others."""
    jid = job.meta.get("run_id")
    return [c for _, c in sweep if c.meta.get("run_id") == jid], [p for p, c in sweep if c.meta.get("run_id") != jid]
