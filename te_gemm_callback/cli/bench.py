"""``te-gemm bench``: microbenchmark shapes, a model config or a capture in every recipe."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

from te_gemm_callback.capture import GemmCapture
from te_gemm_callback.cli.args import UsageError, check_bench_outputs, config_from_args, parse_precisions
from te_gemm_callback.files.jsonio import check_target, json_kind, read_json
from te_gemm_callback.files.png import PNG_KIND
from te_gemm_callback.microbench.cache import ResultCache
from te_gemm_callback.microbench.cells import BENCH_SCHEMA, MODES
from te_gemm_callback.microbench.items import items_from_capture, items_from_config, items_from_shapes, passes_of
from te_gemm_callback.microbench.parallel import local_gpu_count, run_bench_parallel
from te_gemm_callback.precisions import RECIPES, skipped_lines
from te_gemm_callback.printable import safe
from te_gemm_callback.reporting.console import console
from te_gemm_callback.shapes import GemmOp, parse_shapes

# The engine, its tables and the figure load torch (and matplotlib): imported inside the functions,
# after run_bench_parallel has started its GPU workers, and never by `import te_gemm_callback.cli`.

# A rough BF16 GEMM rate for a CPU: it only sizes the warning below, never a reported figure.
CPU_GFLOPS = 50.0
LONG_CPU_S = 60.0


def warn_long_cpu_bench(items: list[Any], modes: list[str], visits: int | None, out: Any) -> float | None:
    """Without CUDA, one line before a bench that runs for minutes: about how long, and how to make
    it shorter. The seconds estimated, or None on a GPU."""
    import torch

    if torch.cuda.is_available():
        return None
    flops = sum(s.flops for it in items for s in passes_of(it)) * len(modes) * (visits or 1)
    seconds = 10 * flops / (CPU_GFLOPS * 1e9)  # warm-up, then the timed calls: about 10 calls per visit
    if seconds > LONG_CPU_S:
        out.print(f"te-gemm bench: on this CPU (no CUDA) these shapes take about {seconds / 60:.0f} minutes "
                  f"({flops / 1e12:.1f} TFLOP a visit of every cell, at about {CPU_GFLOPS:g} GFLOP/s); CPU timings "
                  "say nothing of a GPU: smaller --shapes, or Ctrl-C to stop")
    return seconds


def _bench_items(a: argparse.Namespace) -> list[Any]:
    """The work items of exactly one source: --shapes, --capture or the model-config flags."""
    sources = [a.shapes is not None, a.capture is not None, a.hidden_size is not None]
    if sum(sources) != 1:
        raise UsageError("give exactly one of: the model-config flags, --shapes MxKxN,..., or --capture FILE")
    if a.modes and a.pre_quantize:
        raise UsageError("give --modes or --pre-quantize (= --modes prequantized), not both")
    if a.capture:
        items = items_from_capture(GemmCapture.load(a.capture))
        if not items:
            raise ValueError(f"{a.capture} holds no GEMMs to benchmark")
        return items
    if a.shapes is not None:  # an empty --shapes "" is a bad --shapes, not a missing model config
        try:
            return items_from_shapes(parse_shapes(a.shapes))
        except ValueError as err:
            raise UsageError(f"--shapes: {err}") from None
    missing = [f for f in ("intermediate_size", "num_attention_heads", "num_hidden_layers",
                           "micro_batch_size", "sequence_length") if getattr(a, f) is None]
    if missing:
        raise UsageError("missing config flags: " + ", ".join("--" + m.replace("_", "-") for m in missing))
    return items_from_config(config_from_args(a))


def _devices(a: argparse.Namespace) -> int:
    if a.devices == "all":
        return local_gpu_count()
    # One torch process per device (5000 filled the memory). run_bench_parallel still takes 2 on a
    # host without GPUs: its tests run there.
    if a.devices > local_gpu_count():
        raise UsageError(f"--devices {a.devices}, but this host has {local_gpu_count()} visible GPU(s) "
                         "(CUDA_VISIBLE_DEVICES, else nvidia-smi -L; a host without GPUs counts 1): pass at most that")
    return int(a.devices)


def _print_tables(res: Any, items: list[Any], modes: list[str], out: Any) -> None:
    from te_gemm_callback.reporting.bench_tables import pass_table, speedup_summary, totals_table
    # The recipes that did not run are said once below, one line per cause, not in every caption.
    quiet = dataclasses.replace(res, skipped={})
    ops = [op for op in GemmOp if any(s.op is op for it in items for s in passes_of(it))]  # the passes the job ran
    label = {m: f" ({m})" if len(modes) > 1 else "" for m in modes}
    for mode in modes:
        for op in ops:
            out.print(pass_table(res, items, op, mode))
        out.print(totals_table(quiet, items, mode))
        for p, sp in speedup_summary(res, items, mode).items():
            if p != "BF16":
                out.print(f"estimated GEMM speedup over BF16{label[mode]}, {p}: "
                          + ("n/a" if sp is None else f"{sp:.2f}x"))
    for line in skipped_lines(res.skipped):
        out.print(f"[yellow]{safe(line)}")


def cmd_bench(a: argparse.Namespace) -> int:
    # Nothing here imports torch or TE before run_bench_parallel has started its workers.
    precisions = parse_precisions(a.precisions) or list(RECIPES)
    items = _bench_items(a)
    if a.json:  # outputs that would be refused are refused now, not after minutes of measuring
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
    a.devices = _devices(a)
    if a.devices > 1:
        res = run_bench_parallel(items, precisions, modes, a.devices, flush_l2=a.flush_l2, cache=cache,
                                 visits=a.visits, gemm_duty=a.gemm_duty, progress=True, console=out)
    from te_gemm_callback.microbench.engine import run_bench
    from te_gemm_callback.reporting.bench_tables import run_summary, swapped_items, swapped_table
    from te_gemm_callback.reporting.figures import stacked_gemm_figure
    if a.devices == 1:
        warn_long_cpu_bench(items, modes, a.visits, out)
        res = run_bench(items, precisions, modes, flush_l2=a.flush_l2, cache=cache, console=out, visits=a.visits,
                        gemm_duty=a.gemm_duty)
    _print_tables(res, items, modes, out)
    mode = modes[0]
    if a.compare_swapped:
        sw_items = swapped_items(items)
        sw = run_bench(sw_items, res.precisions, modes, flush_l2=a.flush_l2, cache=cache, console=out,
                       visits=a.visits, gemm_duty=a.gemm_duty)
        out.print(swapped_table(res, sw, items, mode))
    if cache.save_error:  # after the results: a cache that could not be written loses nothing shown
        out.print(f"[yellow]warning: {safe(cache.save_error)}")
    if not any(r.ok for r in res.results):
        # Nothing measured (every recipe skipped, or every cell failed): an earlier run's files stay.
        failed = [r for r in res.results if not r.ok]
        reasons = sorted({(r.error or "no time")[:160] for r in failed}) or skipped_lines(res.skipped)
        outputs = [f for f in (a.json, a.output) if f]
        print(f"te-gemm bench: error: nothing was measured ({len(failed)} cell(s) failed): " + "; ".join(reasons[:3])
              + (f"; {', '.join(outputs)} not written" if outputs else ""), file=sys.stderr)
        return 1
    if a.json:
        res.save(a.json)
    if a.output:
        stacked_gemm_figure(res, items, mode, a.output)
    out.print(run_summary(res))
    return 0


def bench_modes(a: argparse.Namespace) -> tuple[list[str], bool]:
    """The modes to measure, and whether they are those of the bench file ``--json`` replaces: so
    re-benchmarking a run never drops the mode its report and figures were drawn from."""
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
    if not Path(path).is_file():
        return None
    try:
        data = read_json(path)
    except ValueError:  # check_target took it for a bench file; one that cannot be read keeps nothing
        return None
    if not isinstance(data, dict):
        return None
    meta = got if isinstance(got := data.get("meta"), dict) else {}
    named = meta.get("modes")
    if not isinstance(named, list):  # an older file: the modes its cells were measured in
        results = rows if isinstance(rows := data.get("results"), list) else []
        named = [r.get("mode") for r in results if isinstance(r, dict)]
    return [m for m in MODES if m in named] or None
