"""``te-gemm`` command line: a thin adapter over shapes, capture and rendering. What loads torch, matplotlib or
Lightning is imported inside the command that runs it (tests/test_import_graph.py checks it)."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from te_gemm_callback import __version__
from te_gemm_callback.capture import GemmCapture
from te_gemm_callback.capture.capture_file import SCHEMA as CAPTURE_SCHEMA
from te_gemm_callback.cli.args import (
    EXIT_CODES,
    HelpFormatter,
    UsageError,
    _dir_path,
    _file_path,
    _limit,
    _run_steps,
    add_config_args,
    check_run_dir,
    config_from_args,
    more_rows_hint,
    parse_precisions,
    where,
)
from te_gemm_callback.cli.bench import add_bench_parser
from te_gemm_callback.cli.cache import add_cache_parser
from te_gemm_callback.cli.nsys import add_nsys_parser
from te_gemm_callback.cli.project import _gpus, add_project_parser
from te_gemm_callback.files.jsonio import check_target, json_kind, read_json, write_json
from te_gemm_callback.microbench.cache import ResultCache
from te_gemm_callback.microbench.cells import BENCH_SCHEMA
from te_gemm_callback.precisions import RECIPES
from te_gemm_callback.printable import plain, safe
from te_gemm_callback.reporting import capture_table, shapes_table
from te_gemm_callback.reporting.console import console, tables_to_stderr
from te_gemm_callback.reporting.report_tables import plan_table
from te_gemm_callback.reporting.run import Run, bench_and_report
from te_gemm_callback.reporting.summary import summary_lines
from te_gemm_callback.shapes import config_gemms, gemm_passes

SHAPES_SCHEMA = "te-gemm-shapes/1"  # te-gemm shapes --json


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)  # every option's default in its help
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:  # one line saying what to fix, exit code 2
        self.exit(2, f"{self.prog}: error: {plain(message)}\n")  # argv echoed: no control characters


def cmd_shapes(a: argparse.Namespace) -> int:
    cfg = config_from_args(a)
    gemms = config_gemms(cfg)
    if a.json:
        rows = [{"name": g.name, "per_layer": g.per_layer, "count": g.count(cfg), "parallel": g.parallel,
                 "m_splits": list(g.m_splits) if g.m_splits else None,
                 "passes": [s.to_dict() | {"flops": s.flops} for s in gemm_passes(g.fprop)]}
                for g in gemms]
        total = sum(s.flops * g.count(cfg) for g in gemms for s in gemm_passes(g.fprop))
        write_json(a.json, {"schema": SHAPES_SCHEMA, "config": cfg.__dict__, "gemms": rows,
                            "flops_per_micro_batch": total})
    if a.json != "-":
        console().print(shapes_table(cfg, gemms))
    return 0


def cmd_show(a: argparse.Namespace) -> int:
    if a.capture is None:
        if a.json not in (None, "-") and Path(a.json).exists():  # `show --json RUN`: the optional PATH took RUN
            raise UsageError(f"--json took {a.json} as the file to write, leaving no capture to show: put the "
                             f"capture first (te-gemm show {a.json} --json)")
        raise UsageError("give a gemm_capture.json or a run folder to show")
    path = Path(a.capture)
    if path.is_dir():  # a run folder, as report, plan and project take: its job's capture
        path = path / "gemm_capture.json"
        if not path.exists():
            raise ValueError(f"{a.capture} is a folder with no gemm_capture.json: give a capture file or a run folder")
    cap = GemmCapture.load(path)
    out = console()
    if a.json:
        write_json(a.json, cap.to_dict())
    out.print(capture_table(cap, limit=a.limit))
    more_rows_hint(out, len(cap.records), a.limit)
    # Module names are the model's (or anyone's who edited the file): escaped, control characters shown.
    for key, what in (("never_ran", "that never ran"), ("not_watched", "not captured (no adapter watched them)")):
        if cap.coverage.get(key):
            out.print(f"[yellow]GEMM-bearing modules {what}: {safe(', '.join(cap.coverage[key]))}")
    return 0


def cmd_run(a: argparse.Namespace) -> int:
    """The bundled job end to end: capture, recipe sweep, microbenchmarks, report."""
    # As bench checks them, before Lightning and torch load: a bad name costs nothing.
    recipes = parse_precisions(a.precisions) or list(RECIPES)
    if "BF16" not in recipes:  # every speedup in the report is over BF16: without it there is none
        recipes.insert(0, "BF16")
    check_run_folder(Path(a.out))
    cache = ResultCache()  # checked before training: a file that is not a cache stops us here, not after
    from te_gemm_callback.recipes.demo import run_demo
    path = run_demo(a.out, steps=a.steps, recipes=recipes)
    if path is None:
        print("te-gemm run: no capture was written", file=sys.stderr)
        return 1
    out = console()
    print_summary(out, bench_and_report(a.out, path, recipes, out, cache=cache))
    return 0


def print_summary(out: Any, files: dict[str, Path]) -> None:
    """The closing lines of a run's report (the tables are already shown)."""
    for line in summary_lines(files["report"], files.get("report_md"), tables_shown=True):
        out.print(safe(line), highlight=False)


def check_run_folder(out: Path) -> None:
    """Refuse, before training, a run folder that cannot be written and any user file the run would replace."""
    from te_gemm_callback.reporting.speedups import report_targets
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file: give a folder for the run")
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as err:
        raise ValueError(f"--out {out}: cannot write the run folder there ({err.strerror or err})") from None
    check_target(out / "gemm_capture.json", json_kind(CAPTURE_SCHEMA))
    check_target(out / "bench.json", json_kind(BENCH_SCHEMA))
    report_targets(out, ("autocast", "prequantized"))


def cmd_compare(a: argparse.Namespace) -> int:
    from te_gemm_callback.analysis.runs import weight_gemms
    from te_gemm_callback.analysis.verdicts import analyze
    from te_gemm_callback.reporting.speedups import report_table, verdict_panel, write_report_json
    from te_gemm_callback.sweep.observed import capture_recipe
    if len(a.captures) < 2:
        raise UsageError("compare needs two captures or more, one per recipe (a BF16 one among them): a lone "
                         "capture has nothing to compare with (te-gemm show prints one)")
    seen: dict[str, str] = {}
    for path in a.captures:
        if (same := seen.get(os.path.realpath(path))) is not None:
            raise UsageError(f"{path} is given twice (as {same}): give each run's capture once")
        seen[os.path.realpath(path)] = path
    caps = [GemmCapture.load(p) for p in a.captures]
    base = weight_gemms(caps[0])
    for path, cap in zip(a.captures, caps):  # named here: the analysis below cannot say which file
        if cap.step_ms() is None:
            raise ValueError(f"{path} has no step times: give captures of training steps (GemmProfiler, the callback)")
    for path, cap in zip(a.captures[1:], caps[1:]):
        if weight_gemms(cap) != base:
            raise ValueError(f"{path} is a capture of another model than {a.captures[0]} (its GEMM shapes differ): "
                             "compare runs of the same model in different recipes")
    by_recipe: dict[str, str] = {}
    for path, cap in zip(a.captures, caps):
        if cap.records and (other := by_recipe.setdefault(capture_recipe(cap), path)) != path:
            raise ValueError(f"{other} and {path} are both {capture_recipe(cap)} runs: give one capture per recipe "
                             "(a run folder with a sweep: te-gemm report RUN_DIR)")
    rep = analyze(caps[0], None, caps[1:],
                  no_bench="no replay in te-gemm compare: separate captures and no microbenchmark, which the "
                           "replay runs on (te-gemm report on a run folder with bench.json replays the job's step)")
    console().print(report_table(rep))
    console().print(verdict_panel(rep))
    if a.json:
        write_report_json(rep, a.json)
    return 0


def cmd_report(a: argparse.Namespace) -> int:
    check_run_dir(a.run_dir)  # before the report searches every folder below it (and before its imports)
    from te_gemm_callback.analysis.runs import keep_report
    from te_gemm_callback.reporting.speedups import REPORT_SCHEMA
    if a.json and a.json != "-":  # refused before the run folder's files are written, not after
        check_target(a.json, json_kind(REPORT_SCHEMA))
    out = console()
    run = Path(a.run_dir)
    lost = _observed_without_sweep(run)
    kept = keep_report(run)
    if lost:  # measured once, on a GPU: the new report.json must not be their only end
        _keep(run, kept)
    files = Run(a.run_dir).report(out, a.project or ()).files
    print_summary(out, files)
    if lost:
        print(f"te-gemm report: warning: {a.run_dir} has no sweep/ captures, so the observed speedups its earlier "
              f"report.json held ({', '.join(lost)}) could not be made again and are not in the new one; "
              f"that report.json is kept as {kept}", file=sys.stderr)
    if a.json:
        write_json(a.json, read_json(files["report"], "report.json"))
    return 0


def _keep(run: Path, kept: Path) -> None:
    """report.json copied to ``kept``, marked with the run it is of (the folder's capture) where it is not: a later
    run written to the same folder must not take its observed speedups for its own."""
    report = read_json(run / "report.json", "report.json")
    meta = report.setdefault("meta", {})
    if not meta.get("run_id") and (run / "gemm_capture.json").is_file():
        try:
            meta["run_id"] = (read_json(run / "gemm_capture.json", "gemm_capture.json").get("meta") or {}).get("run_id")
        except ValueError:
            pass  # no capture to name: kept as it was
    write_json(kept, report)


def _observed_without_sweep(run: Path) -> list[str]:
    """The recipes with an observed speedup in ``run``'s report.json but no sweep captures to remake it from."""
    if any((run / "sweep").glob("*/gemm_capture.json")) or not (run / "report.json").is_file():
        return []
    from te_gemm_callback.analysis.runs import observed_in
    try:
        return [r for r in observed_in(read_json(run / "report.json", "report.json")) if r != "BF16"]
    except Exception:  # a report.json that cannot be read is the report's to say
        return []


def cmd_plan(a: argparse.Namespace) -> int:
    json_path = a.json or f"{a.run_dir}/precision_plan.json"
    yaml_path = a.yaml or f"{a.run_dir}/precision_plan_nvdlfw.yaml"
    if json_path == yaml_path == "-" or (json_path != "-" and Path(json_path).resolve() == Path(yaml_path).resolve()):
        # The plan was written, then the YAML refused over it with a cause that was not the cause.
        raise UsageError(f"--json and --yaml name the same {'output' if json_path == '-' else 'file'} "
                         f"({json_path}): give each its own")
    check_run_dir(a.run_dir)
    from te_gemm_callback.sweep.plan import write_plan
    plan = Run(a.run_dir).plan()
    out = console()
    out.print(plan_table(plan, limit=a.limit))
    more_rows_hint(out, len(plan.modules), a.limit)
    js, yaml = write_plan(plan, json_path, yaml_path)
    out.print(f"plan: {where(js)} (apply_precision_plan(model, path)); TE debug config: {where(yaml)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="te-gemm", epilog=EXIT_CODES,
                description="The GEMMs your training job runs and what each TE recipe does to them: shapes, captures, "
                            "microbenchmarks, reports and plans. te-gemm COMMAND --help says more; details: README.md.")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser, metavar="COMMAND")

    def command(name: str, fn: Callable, summary: str, description: str) -> argparse.ArgumentParser:
        s = sub.add_parser(name, help=summary, description=description, epilog=EXIT_CODES)
        s.set_defaults(fn=fn)
        return s

    s = command("shapes", cmd_shapes, "GEMM shapes derived from a model config",
                "List the Fprop, Dgrad and Wgrad GEMMs of a transformer config, per layer and for the whole model, "
                "with their FLOPs. Nothing is measured; no GPU needed.")
    add_config_args(s)
    s.add_argument("--json", type=_file_path, nargs="?", const="-", default=None, metavar="PATH",
                   help="also write the shapes as JSON to PATH ('-' or no PATH: stdout instead of the table)")

    add_bench_parser(command)

    s = command("compare", cmd_compare, "compare captures of separate runs (one per recipe): GEMM vs step speedup",
                "Set captures of separate runs of one model (one per recipe) side by side: each recipe's GEMM "
                "speedup against its step speedup over the BF16 run, with a verdict.")
    s.add_argument("captures", nargs="+", type=_file_path,
                   help="gemm_capture.json files, the job's first; speedups are over the BF16 one")
    s.add_argument("--json", type=_file_path, help="write the report as JSON")

    s = command("report", cmd_report, "re-render tables, figures and report.json from a run folder (no GPU needed)",
                "Write a run folder's tables, verdicts, report.json and figures again from its captures and "
                "bench.json. Nothing is measured; no GPU needed. Observed speedups come from sweep/: a folder "
                "without it whose report.json held some keeps that file as report-before.json (-2, -3, ... "
                "where one is there).")
    s.add_argument("run_dir", type=_dir_path, help="the run folder (the callback's output_dir, te-gemm run --out)")
    s.add_argument("--project", type=_gpus, default=None, metavar="GPU[,GPU]",
                   help="also project onto these GPUs, e.g. B300,GB200 (docs/projection.md)")
    s.add_argument("--json", type=_file_path, default=None, metavar="PATH",
                   help="also write a copy of report.json to PATH ('-': stdout, tables to stderr) "
                        "(default: only RUN_DIR/report.json)")

    add_project_parser(command)
    add_nsys_parser(command)

    s = command("plan", cmd_plan,
                "which modules to keep in BF16 under an FP8 recipe, from a run folder with bench.json",
                "Pick BF16 or the best FP8 recipe per module from the run folder's microbenchmarks, print the "
                "plan, and write it (for apply_precision_plan) with TE's debug-API config. "
                "Method: docs/benchmark-methodology.md.")
    s.add_argument("run_dir", type=_dir_path, help="a run folder with gemm_capture.json and bench.json")
    s.add_argument("--json", type=_file_path, help="where to write the plan (default: RUN_DIR/precision_plan.json)")
    s.add_argument("--yaml", type=_file_path,
                   help="where to write TE's debug-API config (default: RUN_DIR/precision_plan_nvdlfw.yaml)")
    s.add_argument("--limit", type=_limit, default=40, help="modules to print, 0 for all")

    s = command("show", cmd_show, "print a capture file as a table",
                "Print a capture's GEMMs (module, pass, shape, precision, calls, time per step) and the "
                "GEMM-bearing modules that never ran or were not watched.")
    s.add_argument("capture", type=_file_path, nargs="?",
                   help="a gemm_capture.json, or a run folder (its gemm_capture.json)")
    s.add_argument("--limit", type=_limit, default=None, help="rows to print, 0 for all (default: 0, every row)")
    s.add_argument("--json", type=_file_path, nargs="?", const="-", default=None, metavar="PATH",
                   help="also write the capture as JSON to PATH ('-' or no PATH: stdout, table to stderr)")

    s = command("run", cmd_run, "profile the bundled demo model (BF16 on CPU; every supported recipe on GPU)",
                "Train the bundled model a few steps with the callback (a tiny BF16 config on CPU; a 4-layer stack "
                "on a GPU with TE), sweep the recipes, benchmark the captured shapes and write the report to --out.")
    s.add_argument("--out", type=_dir_path, default="runs/demo", help="the run folder to write")
    s.add_argument("--steps", type=_run_steps, default=8, help="training steps (at least 3)")
    s.add_argument("--precisions",
                   help="comma-separated TE recipes; BF16 always added (default: all; unsupported ones skipped)")
    add_cache_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0].startswith("-") and args[0] not in ("-h", "--help", "--version"):
        # argparse answered "the following arguments are required: COMMAND", naming no flag.
        parser.error(f"unrecognized argument {args[0]}: the command comes first (te-gemm COMMAND --help)")
    a = parser.parse_args(args)
    cmd = " ".join(x for x in (a.cmd, getattr(a, "cache_cmd", None)) if x)
    tables_to_stderr("-" in (getattr(a, "json", None), getattr(a, "yaml", None)))  # stdout: the JSON alone
    try:
        return a.fn(a)
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM during a multi-GPU bench: workers already stopped
        print(f"te-gemm {cmd}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader left (te-gemm ... | head): nothing to say, as other tools
        # Output still buffered would fail again at exit: it goes nowhere instead.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a tool the pipe ended
    except (ValueError, OSError) as err:  # one line that says what to fix
        what = f"{err.strerror}: {err.filename}" if isinstance(err, OSError) and err.filename else err
        # plain(): a path or name holding ESC sequences must not drive the user's terminal
        print(f"te-gemm {cmd}: error: {plain(what)}", file=sys.stderr)
        # 2: the command line itself, as argparse's refusals; 1: the run or its inputs (files, folders)
        return 2 if isinstance(err, UsageError) else 1
    finally:  # a process that goes on (a fit after `main([...])`) prints its tables on stdout again
        tables_to_stderr(False)


if __name__ == "__main__":
    sys.exit(main())
