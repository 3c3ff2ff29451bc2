"""``te-gemm`` command line: a thin adapter over shapes, capture and rendering."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from te_gemm_callback.cli.args import (
    EXIT_CODES,
    HelpFormatter,
    UsageError,
    _devices,
    _dir_path,
    _duty,
    _file_path,
    _limit,
    _modes,
    _non_negative,
    _positive,
    _run_steps,
    _visits,
    check_bench_outputs,
    parse_precisions,
)
from te_gemm_callback.printable import plain, safe
from te_gemm_callback.reporting.tables import console
from te_gemm_callback.shapes import ModelConfig, config_gemms, gemm_passes


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)  # every option's default in its help
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # one line saying what to fix, exit code 2
        self.exit(2, f"{self.prog}: error: {plain(message)}\n")  # argv echoed: no control characters


def add_config_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    g = p.add_argument_group("model config" if required else
                             "model config (one source of shapes: these flags, or --shapes, or --capture)")
    # Without a config (bench from --shapes or --capture) these stay unset: "(default: none)".
    g.add_argument("--hidden-size", type=_positive, required=required, help="H, the model width")
    g.add_argument("--intermediate-size", type=_positive, required=required, help="I, the MLP width")
    g.add_argument("--num-attention-heads", type=_positive, required=required, help="attention heads")
    g.add_argument("--num-key-value-heads", type=_positive, help="GQA/MQA key/value heads (default: = heads)")
    g.add_argument("--head-dim", type=_positive, help="per-head width (default: hidden / heads)")
    g.add_argument("--gated-mlp", action=argparse.BooleanOptionalAction, default=False,
                   help="SwiGLU/GeGLU: gate and up projections")
    g.add_argument("--fused-gate-up", action=argparse.BooleanOptionalAction, default=True,
                   help="gate+up as one 2I GEMM (TE LayerNormMLP) or two I GEMMs")
    g.add_argument("--fused-qkv", action=argparse.BooleanOptionalAction, default=True,
                   help="q, k and v as one GEMM or three")
    g.add_argument("--num-experts", type=_non_negative, default=0, help="MoE experts per layer (0: a dense MLP)")
    g.add_argument("--top-k", type=_positive, default=1, help="experts each token is routed to")
    g.add_argument("--tensor-parallel", type=_positive, default=1, help="tensor-parallel ranks the GEMMs split over")
    g.add_argument("--vocab-size", type=_positive, help="adds the lm_head GEMM (default: none, no lm_head)")
    g.add_argument("--num-hidden-layers", type=_positive, required=required, help="transformer layers")
    g.add_argument("--micro-batch-size", type=_positive, required=required, help="sequences per micro-batch")
    g.add_argument("--sequence-length", type=_positive, required=required, help="tokens per sequence")


def config_from_args(a: argparse.Namespace) -> ModelConfig:
    """The model config the flags give; flags that contradict each other are a usage error."""
    try:
        return _config(a)
    except ValueError as err:
        raise UsageError(str(err)) from None


def _config(a: argparse.Namespace) -> ModelConfig:
    return ModelConfig(
        hidden_size=a.hidden_size, intermediate_size=a.intermediate_size,
        num_attention_heads=a.num_attention_heads, num_key_value_heads=a.num_key_value_heads,
        head_dim=a.head_dim, gated_mlp=a.gated_mlp, fused_gate_up=a.fused_gate_up,
        fused_qkv=a.fused_qkv, num_experts=a.num_experts, top_k=a.top_k,
        tensor_parallel=a.tensor_parallel, vocab_size=a.vocab_size,
        num_hidden_layers=a.num_hidden_layers, micro_batch_size=a.micro_batch_size,
        sequence_length=a.sequence_length)


def cmd_shapes(a: argparse.Namespace) -> int:
    from te_gemm_callback.reporting import shapes_table

    cfg = config_from_args(a)
    gemms = config_gemms(cfg)
    if a.json:
        rows = [{"name": g.name, "per_layer": g.per_layer, "count": g.count(cfg), "parallel": g.parallel,
                 "m_splits": list(g.m_splits) if g.m_splits else None,
                 "passes": [s.to_dict() | {"flops": s.flops} for s in gemm_passes(g.fprop)]}
                for g in gemms]
        total = sum(s.flops * g.count(cfg) for g in gemms for s in gemm_passes(g.fprop))
        print(json.dumps({"config": cfg.__dict__, "gemms": rows, "flops_per_micro_batch": total}, indent=1))
    else:
        console().print(shapes_table(cfg, gemms))
    return 0


def cmd_show(a: argparse.Namespace) -> int:
    from te_gemm_callback.capture import GemmCapture
    from te_gemm_callback.reporting import capture_table

    cap = GemmCapture.load(a.capture)
    out = console()
    out.print(capture_table(cap, limit=a.limit))
    more_rows_hint(out, len(cap.records), a.limit)
    # Module names are the model's (or anyone's who edited the file): escaped, control characters shown.
    if cap.coverage.get("never_ran"):
        out.print(f"[yellow]GEMM-bearing modules that never ran: {safe(', '.join(cap.coverage['never_ran']))}")
    if cap.coverage.get("not_watched"):
        out.print(f"[yellow]GEMM-bearing modules not captured (no adapter watched them): "
                  f"{safe(', '.join(cap.coverage['not_watched']))}")
    return 0


def more_rows_hint(out, total: int, limit: int | None) -> None:
    """Under a table cut at ``limit`` rows: how many were left out and the flag that shows them."""
    if limit is not None and total > limit:
        out.print(f"[dim]{total - limit} more row(s) not shown: --limit 0 shows every row[/dim]")


def cmd_run(a: argparse.Namespace) -> int:
    """The bundled job end to end: capture, recipe sweep, microbenchmarks, report."""
    from te_gemm_callback.precisions import RECIPES

    # As bench checks them, before Lightning and torch load: a bad name costs nothing.
    recipes = parse_precisions(a.precisions) or list(RECIPES)
    if "BF16" not in recipes:  # every speedup in the report is over BF16: without it there is none
        recipes.insert(0, "BF16")
    from te_gemm_callback.demo.job import run_demo
    from te_gemm_callback.microbench.cells import ResultCache
    from te_gemm_callback.reporting.pipeline import bench_and_report

    cache = ResultCache()  # checked before training: a file that is not a cache stops us here, not after
    check_run_folder(Path(a.out))
    path = run_demo(a.out, steps=a.steps, recipes=recipes)
    if path is None:
        print("te-gemm run: no capture was written", file=sys.stderr)
        return 1
    bench_and_report(a.out, path, recipes, console(), cache=cache)
    return 0


def check_run_folder(out: Path) -> None:
    """Refuse, before training, every file of the user's that the run would replace in ``out`` (their
    own speedups.png, a link, a JSON of another kind): one line, nothing trained or written."""
    from te_gemm_callback.capture.capture_file import SCHEMA as CAPTURE_SCHEMA
    from te_gemm_callback.files.jsonio import check_target, json_kind
    from te_gemm_callback.microbench.cells import BENCH_SCHEMA
    from te_gemm_callback.reporting.speedups import report_targets

    check_target(out / "gemm_capture.json", json_kind(CAPTURE_SCHEMA))
    check_target(out / "bench.json", json_kind(BENCH_SCHEMA))
    report_targets(out, ("autocast", "prequantized"))


def cmd_bench(a: argparse.Namespace) -> int:
    # Nothing here imports torch or TE before run_bench_parallel has started its workers.
    from te_gemm_callback.capture import GemmCapture
    from te_gemm_callback.microbench.cells import ResultCache, items_from_capture, items_from_config, items_from_shapes
    from te_gemm_callback.precisions import RECIPES, skipped_lines
    from te_gemm_callback.shapes import parse_shapes

    precisions = parse_precisions(a.precisions) or list(RECIPES)
    sources = [a.shapes is not None, a.capture is not None, a.hidden_size is not None]
    if sum(sources) != 1:
        raise UsageError("give exactly one of: the model-config flags, --shapes MxKxN,..., or --capture FILE")
    if a.modes and a.pre_quantize:
        raise UsageError("give --modes or --pre-quantize (= --modes prequantized), not both")
    if a.capture:
        items = items_from_capture(GemmCapture.load(a.capture))
        if not items:
            raise ValueError(f"{a.capture} holds no GEMMs to benchmark")
    elif a.shapes:
        try:
            shapes = parse_shapes(a.shapes)
        except ValueError as err:
            raise UsageError(f"--shapes: {err}") from None
        items = items_from_shapes(shapes)
    else:
        missing = [f for f in ("intermediate_size", "num_attention_heads", "num_hidden_layers",
                               "micro_batch_size", "sequence_length") if getattr(a, f) is None]
        if missing:
            raise UsageError("missing config flags: " + ", ".join("--" + m.replace("_", "-") for m in missing))
        items = items_from_config(config_from_args(a))
    # Outputs that would be refused are refused now, not after minutes of measuring.
    from te_gemm_callback.files.jsonio import check_target, json_kind
    from te_gemm_callback.files.png import PNG_KIND
    from te_gemm_callback.microbench.cells import BENCH_SCHEMA

    if a.json:
        check_target(a.json, json_kind(BENCH_SCHEMA))
    if a.output:
        check_target(a.output, PNG_KIND)
    check_bench_outputs(a)
    modes, kept = bench_modes(a)
    cache = ResultCache(a.cache, enabled=not a.no_cache)
    out = console()
    if kept:
        out.print(f"modes {', '.join(modes)}: those of the existing {safe(a.json)}, which this run replaces "
                  "(--modes to choose others)")
    from te_gemm_callback.microbench.parallel import local_gpu_count  # torch-free

    if a.devices == "all":
        a.devices = local_gpu_count()
    # Before launch: one torch process per device (5000 filled the memory). Two stay allowed on a
    # host without GPUs: the workers' split, pooling and signals are tested there.
    elif a.devices > max(2, local_gpu_count()):
        raise UsageError(f"--devices {a.devices}, but this host has {local_gpu_count()} visible GPU(s) "
                         "(CUDA_VISIBLE_DEVICES, else nvidia-smi -L; a host without GPUs counts 1): pass at most that")
    if a.devices > 1:
        from te_gemm_callback.microbench.parallel import run_bench_parallel

        res = run_bench_parallel(items, precisions, modes, a.devices, flush_l2=a.flush_l2, cache=cache,
                                 visits=a.visits, gemm_duty=a.gemm_duty, progress=True, console=out)
    from te_gemm_callback.microbench.engine import run_bench
    from te_gemm_callback.reporting.bench_tables import (
        pass_table,
        run_summary,
        speedup_summary,
        swapped_items,
        swapped_table,
        totals_table,
    )
    from te_gemm_callback.reporting.figures import stacked_gemm_figure

    if a.devices == 1:
        res = run_bench(items, precisions, modes, flush_l2=a.flush_l2, cache=cache, console=out, visits=a.visits,
                        gemm_duty=a.gemm_duty)
    from te_gemm_callback.microbench.cells import passes_of
    from te_gemm_callback.shapes import GemmOp

    # The recipes that did not run are said once below, one line per cause: not in every table's caption,
    # where a host without CUDA repeated "no CUDA device; transformer-engine not installed" per recipe.
    quiet = dataclasses.replace(res, skipped={})
    for mode in modes:
        for op in GemmOp:  # a table per pass the job ran (dgrad_a/dgrad_b: GEMMs with no weight)
            if any(s.op is op for it in items for s in passes_of(it)):
                out.print(pass_table(res, items, op, mode))
        out.print(totals_table(quiet, items, mode))
        for p, sp in speedup_summary(res, items, mode).items():
            if p == "BF16":
                continue
            label = f" ({mode})" if len(modes) > 1 else ""
            out.print(f"estimated GEMM speedup over BF16{label}, {p}: " + ("n/a" if sp is None else f"{sp:.2f}x"))
    for line in skipped_lines(res.skipped):
        out.print(f"[yellow]{safe(line)}")
    mode = modes[0]
    if a.compare_swapped:
        sw_items = swapped_items(items)
        sw = run_bench(sw_items, res.precisions, modes, flush_l2=a.flush_l2, cache=cache, console=out,
                       visits=a.visits, gemm_duty=a.gemm_duty)
        out.print(swapped_table(res, sw, items, mode))
    if a.json:
        res.save(a.json)
    if a.output:
        stacked_gemm_figure(res, items, mode, a.output)
    out.print(run_summary(res))
    if cache.save_error:  # after the results: a cache that could not be written loses nothing shown
        out.print(f"[yellow]warning: {safe(cache.save_error)}")
    failed = [r for r in res.results if not r.ok]
    if res.results and len(failed) == len(res.results):
        reasons = sorted({(r.error or "no time")[:160] for r in failed})
        print(f"te-gemm bench: error: every cell failed ({len(failed)}): " + "; ".join(reasons[:3]), file=sys.stderr)
        return 1
    return 0


def bench_modes(a: argparse.Namespace) -> tuple[list[str], bool]:
    """The modes to measure, and whether they are those of the bench file ``--json`` replaces.

    ``--modes``, or ``--pre-quantize``, say; else a bench file already at ``--json`` (a run folder's
    bench.json holds both modes) keeps its modes, so re-benchmarking a run never drops the mode its
    report and figures were drawn from; else autocast."""
    if a.modes:
        return a.modes, False
    if a.pre_quantize:
        return ["prequantized"], False
    old = _bench_file_modes(a.json) if a.json else None
    if old and old != ["autocast"]:
        return old, True
    return ["autocast"], False


def _bench_file_modes(path: str) -> list[str] | None:
    """The modes of the bench file at ``path`` (None: absent, or no modes to read). Torch-free."""
    from te_gemm_callback.files.jsonio import read_json
    from te_gemm_callback.microbench.cells import MODES

    if not Path(path).is_file():
        return None
    try:
        data = read_json(path)
    except ValueError:  # check_target took it for a bench file; one that cannot be read keeps nothing
        return None
    if not isinstance(data, dict):
        return None
    meta = data.get("meta") if isinstance(data.get("meta"), dict) else {}
    named = meta.get("modes")
    if not isinstance(named, list):  # an older file: the modes its cells were measured in
        results = data.get("results") if isinstance(data.get("results"), list) else []
        named = [r.get("mode") for r in results if isinstance(r, dict)]
    modes = [m for m in MODES if m in {x for x in named if isinstance(x, str)}]
    return modes or None


def _print_report(rep, out) -> None:
    from te_gemm_callback.reporting.speedups import report_table, verdict_panel

    out.print(report_table(rep))
    out.print(verdict_panel(rep))


def cmd_compare(a: argparse.Namespace) -> int:
    from te_gemm_callback.analysis.verdicts import analyze
    from te_gemm_callback.capture import GemmCapture

    caps = [GemmCapture.load(p) for p in a.captures]
    base = _weight_gemms(caps[0])
    for path, cap in zip(a.captures[1:], caps[1:]):
        if _weight_gemms(cap) != base:
            raise ValueError(f"{path} is a capture of another model than {a.captures[0]} (its GEMM shapes differ): "
                             "compare runs of the same model in different recipes")
    rep = analyze(caps[0], None, caps[1:])
    _print_report(rep, console())
    if a.json:
        from te_gemm_callback.reporting.speedups import write_report_json

        write_report_json(rep, a.json)
    return 0


def _weight_gemms(cap) -> set[tuple]:
    # What must match between runs of one model in different recipes: who runs which GEMM shape.
    return {(r.module, r.gemm, r.op, r.m, r.k, r.n, r.batch) for r in cap.records if not r.m_splits}


def cmd_report(a: argparse.Namespace) -> int:
    from te_gemm_callback.reporting.speedups import render_run

    render_run(a.run_dir, console())
    return 0


def cmd_plan(a: argparse.Namespace) -> int:
    from te_gemm_callback.analysis.plan import plan_for_run, write_plan
    from te_gemm_callback.analysis.runs import analyze_run
    from te_gemm_callback.reporting.tables import plan_table

    rr = analyze_run(a.run_dir)
    if rr.bench is None:
        raise ValueError(f"{a.run_dir} has no bench.json: te-gemm bench --capture {a.run_dir}/gemm_capture.json "
                         f"--json {a.run_dir}/bench.json first")
    plan = plan_for_run(rr)
    out = console()
    out.print(plan_table(plan, limit=a.limit))
    more_rows_hint(out, len(plan.modules), a.limit)
    js, yaml = write_plan(plan, a.json or f"{a.run_dir}/precision_plan.json",
                          a.yaml or f"{a.run_dir}/precision_plan_nvdlfw.yaml")
    out.print(f"plan: {safe(js)} (apply_precision_plan(model, path)); TE debug config: {safe(yaml)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from te_gemm_callback import __version__
    from te_gemm_callback.cli.cache import add_cache_parser

    p = _Parser(prog="te-gemm", epilog=EXIT_CODES,
                description="The GEMMs your training job really runs, and what each TE recipe does to them: "
                            "shapes from a config, captures from a job, microbenchmarks, reports and plans. "
                            "te-gemm COMMAND --help says what each command does and takes.")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser, metavar="COMMAND")

    def command(name: str, summary: str, description: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=summary, description=description, epilog=EXIT_CODES)

    s = command("shapes", "GEMM shapes derived from a model config",
                "The Fprop, Dgrad and Wgrad GEMMs a transformer of this configuration runs, per layer and for the "
                "whole model, with their FLOPs. Nothing is measured; no GPU needed.")
    add_config_args(s)
    s.add_argument("--json", action="store_true", help="print JSON instead of a table")
    s.set_defaults(fn=cmd_shapes)

    s = command("bench", "microbenchmark GEMMs (from a config, --shapes or --capture) in every precision",
                "Time the Fprop, Dgrad and Wgrad GEMMs of a model config, of --shapes, or of a job's capture "
                "(--capture) in each TE recipe this machine runs (the others are skipped with TE's reason), and "
                "print per-pass and per-step tables. Measured cells are cached (te-gemm cache list). Outputs "
                "(--json, -o) are checked before anything is measured. On a run folder, "
                "--capture RUN/gemm_capture.json --json RUN/bench.json keeps the modes of the bench.json it replaces.")
    add_config_args(s, required=False)
    s.add_argument("--shapes", help="fprop shapes MxKxN,MxKxN (dgrad and wgrad derived)")
    s.add_argument("--capture", type=_file_path, help="a gemm_capture.json from GemmProfiler or the callback")
    s.add_argument("--precisions",
                   help="comma-separated TE recipe names, e.g. BF16,Float8CurrentScaling (default: all; unsupported "
                        "ones are skipped with TE's reason)")
    s.add_argument("--modes", type=_modes,
                   help="comma-separated: autocast (GEMM plus the quantization of its inputs), prequantized "
                        "(kernels only) (default: the modes of the bench file --json replaces, else autocast)")
    s.add_argument("--pre-quantize", action="store_true",
                   help="kernel time only: operands quantized outside the timed region (= --modes prequantized)")
    s.add_argument("--flush-l2", action="store_true", help="flush L2 between timed calls")
    s.add_argument("--visits", type=_visits, default=None,
                   help="times each job is measured, spread over the run, samples pooled: more visits average the "
                        "GPU's clock swings at the power limit (a job is built once; a visit costs host time only) "
                        "(default: 16 on a GPU, 1 on a CPU)")
    s.add_argument("--gemm-duty", type=_duty, default=None,
                   help="share of GPU time the timed GEMMs get, a low-power rest between calls the rest "
                        "(1: back to back). Under a power limit it sets the clock the GEMMs run at: pass your job's "
                        "GEMM share of the step (the capture report shows it) (default: 0.75, a transformer step's)")
    s.add_argument("--compare-swapped", action="store_true",
                   help="also time dgrad/wgrad as swapped-size forward GEMMs")
    s.add_argument("-o", "--output", type=_file_path, help="write the stacked per-GEMM figure (PNG) (default: none)")
    s.add_argument("--json", type=_file_path,
                   help="write all results (with device, clocks, versions) as JSON (default: none)")
    s.add_argument("--cache", type=_file_path,
                   help="result cache file (default: $TE_GEMM_CACHE if set, else ~/.cache/te_gemm_callback/bench.json)")
    s.add_argument("--no-cache", action="store_true", help="measure everything again")
    s.add_argument("--devices", type=_devices, default=1,
                   help="spread the visits over N local GPUs ('all': every visible one), one process each: every "
                        "GPU runs every job (the same power mix, so the same clocks), each cell's samples pooled")
    s.set_defaults(fn=cmd_bench)

    s = command("compare", "compare captures of separate runs (one per recipe): GEMM vs step speedup",
                "Set the captures of separate runs of one model (one per recipe, the baseline first) side by side: "
                "each recipe's GEMM speedup against its step speedup, with a verdict.")
    s.add_argument("captures", nargs="+", type=_file_path,
                   help="gemm_capture.json files; the first is the baseline job")
    s.add_argument("--json", type=_file_path, help="write the report as JSON (default: none)")
    s.set_defaults(fn=cmd_compare)

    s = command("report", "re-render tables, figures and report.json from a run folder (no GPU needed)",
                "Read a run folder (gemm_capture.json, bench.json, the sweep's captures) and write its tables, "
                "verdicts, report.json and figures again. Nothing is measured; no GPU needed.")
    s.add_argument("run_dir", type=_dir_path, help="the run folder (the callback's output_dir, te-gemm run --out)")
    s.set_defaults(fn=cmd_report)

    s = command("plan", "which modules to keep in BF16 under an FP8 recipe, from a run folder with bench.json",
                "Pick, per module, BF16 or the best FP8 recipe from the run folder's microbenchmarks, write the plan "
                "(for apply_precision_plan) and TE's debug-API config, and print it.")
    s.add_argument("run_dir", type=_dir_path, help="a run folder with gemm_capture.json and bench.json")
    s.add_argument("--json", type=_file_path, help="where to write the plan (default: RUN_DIR/precision_plan.json)")
    s.add_argument("--yaml", type=_file_path,
                   help="where to write TE's debug-API config (default: RUN_DIR/precision_plan_nvdlfw.yaml)")
    s.add_argument("--limit", type=_limit, default=40, help="modules to print, 0 for all")
    s.set_defaults(fn=cmd_plan)

    s = command("show", "print a capture file as a table",
                "Print the GEMMs of a capture file (gemm_capture.json): module, pass, shape, precision, calls and "
                "time per step, and the GEMM-bearing modules that never ran or were not watched.")
    s.add_argument("capture", type=_file_path, help="a gemm_capture.json")
    s.add_argument("--limit", type=_limit, default=None, help="rows to print, 0 for all (default: 0, every row)")
    s.set_defaults(fn=cmd_show)

    s = command("run", "profile the bundled demo model (BF16 on CPU; every supported recipe on GPU)",
                "Train the bundled model for a few steps with the callback (its tiny configuration in BF16 on a CPU; "
                "on a GPU with TE, a 4-layer stack), sweep the recipes, benchmark the captured shapes and write the "
                "report into --out.")
    s.add_argument("--out", type=_dir_path, default="runs/demo", help="the run folder to write")
    s.add_argument("--steps", type=_run_steps, default=8, help="training steps (at least 3)")
    s.add_argument("--precisions",
                   help="comma-separated TE recipe names, checked as bench checks them; BF16, the base of every "
                        "speedup, is always added (default: all; those this machine cannot run are skipped with "
                        "the reason)")
    s.set_defaults(fn=cmd_run)

    add_cache_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    a = parser.parse_args(argv)
    cmd = " ".join(x for x in (a.cmd, getattr(a, "cache_cmd", None)) if x)
    try:
        return a.fn(a)
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM during a multi-GPU bench: workers already stopped
        print(f"te-gemm {cmd}: interrupted", file=sys.stderr)
        return 130
    except (ValueError, OSError) as err:  # one line that says what to fix
        what = f"{err.strerror}: {err.filename}" if isinstance(err, OSError) and err.filename else err
        # plain(): a path or name holding ESC sequences must not drive the user's terminal
        print(f"te-gemm {cmd}: error: {plain(what)}", file=sys.stderr)
        # 2: the command line itself, as argparse's refusals; 1: the run or its inputs (files, folders)
        return 2 if isinstance(err, UsageError) else 1


if __name__ == "__main__":
    sys.exit(main())
