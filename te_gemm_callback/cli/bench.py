"""``te-gemm bench``: microbenchmark shapes, a model config or a capture in every recipe."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from functools import partial
from pathlib import Path
from typing import Any

from te_gemm_callback.capture import GemmCapture
from te_gemm_callback.cli.args import (
    UsageError,
    _file_path,
    _int,
    _positive,
    add_config_args,
    config_from_args,
    float_in,
    parse_precisions,
)
from te_gemm_callback.files.jsonio import check_target, json_kind, read_json
from te_gemm_callback.files.png import PNG_KIND
from te_gemm_callback.microbench.cache import ResultCache
from te_gemm_callback.microbench.cells import BENCH_SCHEMA, MAX_VISITS, MIN_GEMM_DUTY, MODES
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
    """Without CUDA, warn before a bench that runs for minutes; return the seconds estimated (None on a GPU)."""
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
    if sum([a.shapes is not None, a.capture is not None, a.hidden_size is not None]) != 1:
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


def _device_count(a: argparse.Namespace) -> int:
    if a.devices == "all":
        return local_gpu_count()
    # One torch process per device (5000 filled the memory). run_bench_parallel still takes 2 on a
    # host without GPUs: its tests run there.
    if a.devices > local_gpu_count():
        raise UsageError(f"--devices {a.devices}, but this host has {local_gpu_count()} visible GPU(s) "
                         "(CUDA_VISIBLE_DEVICES, else nvidia-smi -L; a host without GPUs counts 1): pass at most that")
    return int(a.devices)


def check_bench_outputs(a: argparse.Namespace) -> None:
    """Refuse, before measuring, two flags naming one file and an output whose folder cannot be written."""
    if a.no_cache and a.cache:
        raise UsageError(f"--no-cache and --cache {a.cache} ask for no cache and for one: give one of them")
    outs = [(f, p) for f, p in (("--json", a.json), ("-o", a.output), ("--cache", None if a.no_cache else a.cache))
            if p]
    for i, (flag, path) in enumerate(outs):
        other = next((f for f, q in outs[:i] if os.path.abspath(os.path.expanduser(q)) ==
                      os.path.abspath(os.path.expanduser(path))), None)
        if other:
            raise UsageError(f"{flag} and {other} name the same file {path}: give two paths")
        if flag == "--cache":
            continue
        d = os.path.dirname(os.path.abspath(path))
        while not os.path.exists(d) and os.path.dirname(d) != d:  # the first of its folders that exists
            d = os.path.dirname(d)
        if not os.path.isdir(d) or not os.access(d, os.W_OK | os.X_OK):
            raise ValueError(f"{flag} {path}: cannot write in {d} (not a writable folder)")


def _print_tables(res: Any, items: list[Any], modes: list[str], out: Any) -> None:
    from te_gemm_callback.reporting.bench_tables import kept_in_bf16, pass_table, speedup_summary, totals_table
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
                kept = len(kept_in_bf16(res, items, p, mode)) if sp is not None else 0
                out.print(f"estimated GEMM speedup over BF16{label[mode]}, {p}: "
                          + ("n/a" if sp is None else f"{sp:.2f}x")
                          + (f" ({kept} GEMM(s) that failed in it counted at BF16 time)" if kept else ""))
    for line in skipped_lines(res.skipped):
        out.print(f"[yellow]{safe(line)}")


def cmd_bench(a: argparse.Namespace) -> int:
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
    a.devices = _device_count(a)
    timing = {"flush_l2": a.flush_l2, "cache": cache, "console": out, "visits": a.visits, "gemm_duty": a.gemm_duty}
    if a.devices > 1:
        res = run_bench_parallel(items, precisions, modes, a.devices, progress=True, **timing)
    from te_gemm_callback.microbench.engine import run_bench
    from te_gemm_callback.reporting.bench_tables import run_summary, swapped_items, swapped_table
    from te_gemm_callback.reporting.figures import stacked_gemm_figure
    if a.devices == 1:
        warn_long_cpu_bench(items, modes, a.visits, out)
        res = run_bench(items, precisions, modes, **timing)
    _print_tables(res, items, modes, out)
    mode = modes[0]
    if a.compare_swapped:
        out.print(swapped_table(res, run_bench(swapped_items(items), res.precisions, modes, **timing), items, mode))
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
    """The modes to measure, and whether taken from the bench file ``--json`` replaces (its report's mode stays)."""
    if a.modes:
        return a.modes, False
    if a.pre_quantize:
        return ["prequantized"], False
    old = _bench_file_modes(a.json) if a.json else None
    return (old, True) if old and old != ["autocast"] else (["autocast"], False)


def _bench_file_modes(path: str) -> list[str] | None:
    """The modes of the bench file at ``path`` (None: absent, or no modes to read). Torch-free."""
    try:
        data = read_json(path) if Path(path).is_file() else None
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


def _modes(text: str) -> list[str]:
    modes = list(MODES) if text.strip() == "both" else [m.strip() for m in text.split(",")]
    if any(m not in MODES for m in modes):
        raise argparse.ArgumentTypeError(f"expected comma-separated modes among {', '.join(MODES)}, got {text!r}")
    return [m for m in MODES if m in modes]  # the order the tables and figures use


def _devices(text: str) -> int | str:
    return "all" if text == "all" else _positive(text)


# Every visit times every cell again: far more only fills memory.
_visits = partial(_int, least=1, what="a positive integer", most=MAX_VISITS, unit="visits")
_duty = partial(float_in, lo=MIN_GEMM_DUTY, hi=1.0)


def add_bench_parser(command: Any) -> None:
    s = command("bench", cmd_bench, "microbenchmark GEMMs (from a config, --shapes or --capture) in every precision",
                "Time the Fprop, Dgrad and Wgrad GEMMs of a model config, --shapes or a capture in each TE recipe "
                "this machine runs, and print per-pass and per-step tables. Measured cells are cached (te-gemm "
                "cache). Method: docs/benchmark-methodology.md; several GPUs: docs/multi-gpu.md.")
    add_config_args(s, required=False)
    s.add_argument("--shapes", help="fprop shapes MxKxN,MxKxN (dgrad and wgrad derived)")
    s.add_argument("--capture", type=_file_path, help="a gemm_capture.json from GemmProfiler or the callback")
    s.add_argument("--precisions", help="comma-separated TE recipes, e.g. BF16,Float8CurrentScaling "
                                        "(default: all; unsupported ones skipped)")
    s.add_argument("--modes", type=_modes,
                   help="autocast (GEMM + input quantization), prequantized (kernel only), or both "
                        "(default: autocast, or those of the bench file --json replaces)")
    s.add_argument("--pre-quantize", action="store_true", help="same as --modes prequantized")
    s.add_argument("--flush-l2", action="store_true", help="flush L2 between timed calls")
    s.add_argument("--visits", type=_visits, default=None, help="times each cell is measured, spread over the run, "
                                                                "samples pooled (default: 16 on a GPU, 1 on a CPU)")
    s.add_argument("--gemm-duty", type=_duty, default=None, help="share of GPU time the timed GEMMs get (1: back to "
                                                                "back): pass your job's GEMM share (default: 0.75)")
    s.add_argument("--compare-swapped", action="store_true", help="also time dgrad/wgrad as swapped-size forward GEMMs")
    s.add_argument("-o", "--output", type=_file_path, help="write the stacked per-GEMM figure (PNG)")
    s.add_argument("--json", type=_file_path, help="write all results (with device, clocks, versions) as JSON")
    s.add_argument("--cache", type=_file_path,
                   help="result cache file (default: $TE_GEMM_CACHE, else ~/.cache/te_gemm_callback/bench.json)")
    s.add_argument("--no-cache", action="store_true", help="neither read nor write the cache: measure everything again")
    s.add_argument("--devices", type=_devices, default=1,
                   help="local GPUs to spread the visits over, one process each ('all': every visible one)")
