"""What the schedule does once its window is over: gather the capture from every rank, write it into
the run folder, print and log it, run the sweep, then benchmark, report and hand the report to the
job's logger; and what an adapter shows of all that (:class:`ScheduleResults`)."""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from te_gemm_callback.analysis.verdicts import analyze, capture_recipe
from te_gemm_callback.capture.capture_file import SCHEMA
from te_gemm_callback.capture.distributed import RANKS_SCHEMA, gather_captures, rank_summary, world
from te_gemm_callback.files.jsonio import read_json, write_json
from te_gemm_callback.microbench.cache import ResultCache
from te_gemm_callback.precisions import RECIPES, skipped_lines, warn_once
from te_gemm_callback.printable import error_text
from te_gemm_callback.reporting import capture_table, print_table, summary_metrics
from te_gemm_callback.reporting.capture_tables import ranks_table
from te_gemm_callback.reporting.console import console
from te_gemm_callback.reporting.loggers import report_metrics
from te_gemm_callback.reporting.summary import summary_lines

if TYPE_CHECKING:
    from te_gemm_callback.capture import GemmCapture
    from te_gemm_callback.capture.config import CaptureConfig
    from te_gemm_callback.reporting.config import ReportConfig
    from te_gemm_callback.schedule import GemmSchedule, JobStep
    from te_gemm_callback.sweep.config import SweepConfig

log = logging.getLogger("te_gemm_callback")


def guard(fn: Callable[[], Any], what: str) -> Any:
    """Run one piece of our own work; a failure is logged and never reaches the job (returns False)."""
    try:
        return fn()
    except Exception as err:
        log.warning("te-gemm: %s: %s (training goes on)", what, error_text(err))
        return False


class Publishing:
    """The publishing half of :class:`~te_gemm_callback.schedule.GemmSchedule` (which sets the rest)."""

    capture_config: CaptureConfig
    sweep_config: SweepConfig
    report_config: ReportConfig
    metrics: dict[str, float]
    report_files: dict[str, Path]
    _logged_metrics: dict[str, float]
    capture: GemmCapture | None = None
    path: Path | None = None
    run_id: str | None = None  # meta["run_id"] of the capture and of its sweep's
    rank_summary: list[dict[str, Any]] | None = None
    sweep_result: Any = None
    resumed = False
    _swept = False
    _reported = False
    _owed = False  # the gather this rank still owes the others (GemmSchedule)

    def _publish(self, job: JobStep, cap: GemmCapture, prof: Any = None) -> None:
        """Gather (collective), save, print, sweep and log the capture; then end ``prof``'s nsys range."""
        cap.meta["accumulate_grad_batches"] = int(job.accumulate)
        cap.meta["global_step_end"] = int(job.global_step)
        cap.meta["run_id"] = self.run_id = uuid.uuid4().hex  # shared by the capture and its sweep's
        self._owed = False
        # Collective, on every rank whatever its capture holds: a rank that skipped it would hang.
        gathered = guard(lambda: gather_captures(cap), "captures of the other ranks not gathered")
        if not cap.steps:
            if job.writes and gathered and len(gathered) > 1:  # this rank's failed: the others' still count
                guard(lambda: write_ranks(gathered, self.report_config.output_dir), "ranks not written")
            return
        self.capture = cap
        if job.writes:
            guard(lambda: self._save(cap, gathered or None), f"capture not written to {self.report_config.output_dir}")
        if prof is not None:
            # With the capture on disk: under nsys's default --capture-range-end=stop-shutdown nsys
            # ends the job here (docs/nsight-systems.md).
            guard(prof.end_nsys_range, "nsys capture range not ended")
        self.metrics.update(guard(lambda: summary_metrics(cap), "no summary metrics") or {})
        self._sweep_and_log(job, fresh=True)
        self._report(job, at_end=False)

    def _save(self, cap: GemmCapture, gathered: list[GemmCapture] | None) -> None:
        # Written before anything is printed: a table that cannot be printed never costs the capture.
        out = self.report_config.output_dir
        self.path = save_capture(cap, out, self.report_config.filename, keep_existing=self.resumed)
        if gathered is not None and len(gathered) > 1:
            self.rank_summary = write_ranks(gathered, out)
        log.info("te-gemm: capture written to %s", self.path)
        if not self.report_config.report and (out / "report.json").is_file():
            log.warning("te-gemm: %s holds an earlier run's report (report.json, report.md, figures), not this "
                        "capture's: te-gemm bench and te-gemm report remake it", out)
        if not self.resumed:  # a resumed job's folder keeps the first process's run beside this one
            guard(lambda: clear_stale_sweep(out, self.run_id or ""), "stale sweep captures not removed")
        if self.report_config.verbose:
            def show() -> None:
                print_table(capture_table(cap, limit=40))
                if len(cap.records) > 40:
                    log.info("te-gemm: %d more GEMM row(s) in the capture: te-gemm show %s --limit 0",
                             len(cap.records) - 40, self.path)
                if self.rank_summary is not None:
                    print_table(ranks_table(self.rank_summary))

            guard(show, "capture table not printed")

    def _sweep_and_log(self, job: JobStep, fresh: bool = False) -> None:
        """Run the sweep once, when the job can give what it needs; then log the new metrics."""
        swept = False
        if self.sweep_config.recipes and not self._swept and job.sweep is not None:
            self._swept = swept = True
            self.metrics.update(guard(lambda: self._run_sweep(job), "recipe sweep failed and was skipped") or {})
        new = {k: v for k, v in self.metrics.items() if self._logged_metrics.get(k, object()) != v}  # each once
        log_metrics = job.log_metrics
        if log_metrics is not None and (fresh or swept) and new:
            self._logged_metrics.update(new)
            guard(lambda: log_metrics(new), "metrics not logged")

    def _report(self, job: JobStep, at_end: bool) -> None:
        """Benchmark the captured shapes and write the report into the run folder (rank zero), once."""
        cfg = self.report_config
        if not cfg.report or self._reported or self.path is None or not job.writes:
            return
        if (cfg.report == "end" or (self.sweep_config.recipes and not self._swept)) and not at_end:
            return  # asked for at the end, or the sweep it sets beside the prediction has not run yet
        if not at_end and world()[1] > 1:
            # Mid-training the other ranks would wait for rank zero at their next collective, and a
            # bench longer than the process group's timeout kills the job.
            log.info("te-gemm: a multi-process job: the benchmarks and report run on rank 0 when training ends, "
                     "so that no rank waits for them mid-training")
            return
        self._reported = True
        t0 = time.perf_counter()
        files = guard(self._bench_and_report, "benchmarks and report not written")
        if not files:
            return
        self.report_files = files
        moves = "" if cfg.report == "end" else "report='end' moves this to the end of training, "
        log.info("te-gemm: benchmarked the captured shapes and wrote the report to %s in %.1f s (%sreport=False "
                 "leaves it to te-gemm bench/report)", cfg.output_dir, time.perf_counter() - t0, moves)
        if not cfg.verbose:  # verbose printed the full tables
            for line in guard(lambda: summary_lines(files["report"], files.get("report_md")),
                              "report summary not logged") or []:
                log.info("%s", line)
        metrics = guard(lambda: report_metrics(files), "no report metrics") or {}
        self.metrics.update(metrics)
        log_metrics, log_artifacts = job.log_metrics, job.log_artifacts
        if log_metrics is not None and metrics:
            guard(lambda: log_metrics(metrics), "report metrics not logged")
        if log_artifacts is not None:
            guard(lambda: log_artifacts(files), "report not handed to the logger")

    def _bench_and_report(self) -> dict[str, Path]:
        import torch

        from te_gemm_callback.reporting.run import bench_and_report  # looked up per call: a test's stand-in runs
        from te_gemm_callback.sweep.te_global import te_global_kept
        # The microbenchmarks draw from the global RNGs, the job's inside a fit: put back after. Their
        # DelayedScaling modules join TE's global buffers, which every later FP8 step would update: put back.
        cpu = torch.get_rng_state()
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        try:
            assert self.path is not None  # _report returns first without a written capture
            with te_global_kept():
                # Inside fit(): a cache another process holds locked is not waited for (lock_timeout_s=0).
                return bench_and_report(self.report_config.output_dir, self.path, RECIPES,
                                        console=console() if self.report_config.verbose else None,
                                        project=self.report_config.project, cache=ResultCache(lock_timeout_s=0))
        finally:
            torch.set_rng_state(cpu)
            if cuda is not None:
                torch.cuda.set_rng_state_all(cuda)

    def _run_sweep(self, job: JobStep) -> dict[str, float]:
        from te_gemm_callback.sweep.engine import run_sweep  # looked up per call: a test's stand-in runs
        from te_gemm_callback.sweep.state import RestoreError
        assert job.sweep is not None  # _sweep_and_log runs the sweep only for a job that gives one
        sj = job.sweep()
        out_dir = self.report_config.output_dir / "sweep" if job.writes else None
        if out_dir is not None and out_dir.is_symlink():  # run_sweep checks only the folders below it
            raise ValueError(f"{out_dir} is a symbolic link: the sweep writes only into real folders")
        opt_step = sj.optimizer_step if sj.optimizer_step is not None or not sj.optimizers else None
        config = self.sweep_config
        if sj.set_recipe is not None:  # the job's own (Lightning's module.recipe) over the default
            config = dataclasses.replace(config, set_recipe=sj.set_recipe)
        try:
            res = self.sweep_result = run_sweep(
                sj.module, sj.step, config=config, profile_kernels=self.capture_config.kernel_breakdown,
                context=sj.context, out_dir=out_dir,
                job_recipe=capture_recipe(self.capture) if self.capture is not None else None,
                nvtx=self.capture_config.nvtx, optimizers=list(sj.optimizers), optimizer_step=opt_step,
                run_id=self.run_id, rng_objects=list(sj.rng_objects))
        except RestoreError as err:  # not "skipped": the job changed, said as an error
            log.error("te-gemm: %s", err)
            return {}
        return sweep_metrics(res)


class ScheduleResults:
    """What a framework adapter shows of its :class:`GemmSchedule` (``self.schedule``)."""

    schedule: GemmSchedule
    capture = property(lambda self: self.schedule.capture, doc="The published capture (None before the window ends).")
    path = property(lambda self: self.schedule.path, doc="Where the capture was written.")
    sweep_result = property(lambda self: self.schedule.sweep_result, doc="The recipe sweep's result (None without).")
    metrics = property(lambda self: self.schedule.metrics, doc="Summary and sweep metrics, as logged.")
    run_id = property(lambda self: self.schedule.run_id, doc="meta['run_id'] of the capture and its sweep's.")
    rank_summary = property(lambda self: self.schedule.rank_summary, doc="Per-rank summary of a multi-process job.")
    done = property(lambda self: self.schedule.done, doc="The window is over (captured, or given up).")
    steps_seen = property(lambda self: self.schedule.steps_seen, doc="Optimizer steps completed while watched.")
    output_dir = property(lambda self: self.schedule.report_config.output_dir, doc="The run folder.")
    sweep = property(lambda self: self.schedule.sweep_config.recipes, doc="The recipes to sweep, in TE's names.")
    sweep_plan = property(lambda self: self.schedule.sweep_config.plan, doc="The precision plan to sweep, loaded.")


def sweep_metrics(res: Any) -> dict[str, float]:
    """Logger scalars from a sweep's result: observed step time and speedup per recipe."""
    for line in skipped_lines(res.skipped):  # one line per cause, once per process
        warn_once(f"te-gemm: sweep: {line}")
    caps = list(res.captures.values())
    if not caps:
        return {}
    try:
        rep = analyze(caps[0], None, caps[1:])
    except ValueError:
        return {}
    return {f"te_gemm/{name}/{a.recipe}": v for a in rep.recipes
            for name, v in (("observed_step_speedup", a.observed_step_speedup), ("sweep_step_ms", a.observed_step_ms))
            if v is not None}


def clear_stale_sweep(output_dir: Path, run_id: str) -> list[Path]:
    """Remove our captures in ``output_dir/sweep/`` of another run id (this run's report would take them
    for its own), then the folders that leaves empty; other files and links are left alone."""
    sweep, gone = output_dir / "sweep", list[Path]()
    if not sweep.is_dir() or sweep.is_symlink():
        return gone
    root = output_dir.resolve()
    for p in sorted(sweep.glob("*/gemm_capture.json")):
        # glob follows a linked subfolder: never delete through a link, nor outside output_dir.
        if p.parent.is_symlink() or p.is_symlink() or not p.is_file() or not p.resolve().is_relative_to(root):
            continue
        try:
            data = read_json(p)
        except ValueError:
            continue
        if isinstance(data, dict) and data.get("schema") == SCHEMA and (data.get("meta") or {}).get("run_id") != run_id:
            p.unlink()
            gone.append(p)
    for d in [*{p.parent for p in gone}, sweep]:
        try:
            d.rmdir()  # only when empty: anything else of the user's stays
        except OSError:
            pass
    if gone:
        log.warning("te-gemm: removed %d sweep capture(s) of an earlier run from %s: this run's report must not "
                    "take them for its own", len(gone), sweep)
    return gone


def save_capture(cap: GemmCapture, output_dir: Path, filename: str, *, keep_existing: bool = False) -> Path:
    """Write the capture; with ``keep_existing`` (a resumed job), one already at the path stays and
    this one goes beside it, named after its last step."""
    path = output_dir / filename
    if keep_existing and path.exists():
        path = path.with_name(f"{path.stem}.step{cap.meta.get('global_step_end', 'resumed')}{path.suffix}")
        log.warning("te-gemm: %s exists from before the resume: this capture goes to %s", output_dir / filename, path)
    return cap.save(path)


def write_ranks(caps: list[GemmCapture], output_dir: Path) -> list[dict[str, Any]]:
    """Every rank's capture and the per-rank summary under ``output_dir/ranks/``."""
    for c in caps:
        c.save(output_dir / "ranks" / f"rank{c.meta.get('rank')}.json", root=output_dir)  # ranks/ a link: refused
    summary = rank_summary(caps)
    write_json(output_dir / "ranks" / "summary.json", {"schema": RANKS_SCHEMA, "ranks": summary},
               schema=RANKS_SCHEMA, root=output_dir)
    return summary
