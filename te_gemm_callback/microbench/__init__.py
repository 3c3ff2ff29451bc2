"""Offline microbenchmarks of the captured shapes in every recipe, in autocast mode (GEMM plus the
quantization of its inputs) and pre-quantized mode (GEMM kernels only).

Nothing here imports torch at import time: ``te-gemm bench --devices N`` starts its GPU workers first.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from te_gemm_callback.capture import GemmCapture
from te_gemm_callback.microbench.cache import ResultCache
from te_gemm_callback.microbench.cells import MODES
from te_gemm_callback.microbench.items import WorkItem, items_from_capture, items_from_config, items_from_shapes
from te_gemm_callback.precisions import RECIPES, parse_recipes, user_recipe
from te_gemm_callback.shapes import GemmShape, ModelConfig, parse_shapes

# bench() imports parallel and the engine itself: the engine loads torch, and parallel runs as
# `python -m te_gemm_callback.microbench.parallel`, which must not find it imported by this package.

if TYPE_CHECKING:
    from te_gemm_callback.microbench.results import BenchResults


def bench(source: Any, recipes: str | Sequence[str] | None = None,
          modes: str | Sequence[str] = ("autocast", "prequantized"), *,
          devices: int = 1, cache: str | Path | bool = True, visits: int | None = None,
          gemm_duty: float | None = None, flush_l2: bool = False, progress: bool = False,
          console: Any = None) -> BenchResults:
    """Microbenchmark GEMMs in each recipe this machine runs (the others are skipped, with TE's reason).

    Args:
        source: a ``GemmCapture`` or its ``gemm_capture.json`` path, a ``ModelConfig``, fprop shapes
            as ``"MxKxN,MxKxN"`` or a list of ``GemmShape`` (dgrad and wgrad derived), or ``WorkItem``\\ s.
        recipes: TE recipe names, a list or "A,B" as ``--precisions`` takes them (default: all of them).
        modes: a list, or "autocast", "prequantized" or "both".
        devices: local GPUs to spread the visits over (one process each).
        cache: True (the default cache), False, or a cache file path.
        visits, gemm_duty, flush_l2: see ``te-gemm bench --help``.

    Raises:
        engine.BenchStopped: a CUDA error left the GPU context unusable; ``results`` holds the cells before it.

    Example:
        >>> from te_gemm_callback import bench
        >>> res = bench("64x32x16", ["BF16"], ["autocast"], cache=False)
        >>> sorted({r.op for r in res.results})
        ['dgrad', 'fprop', 'wgrad']
    """
    if isinstance(source, (str, Path)) and Path(source).suffix == ".json":
        source = GemmCapture.load(source)
    seq = isinstance(source, Sequence) and bool(source)
    if isinstance(source, GemmCapture):
        items = items_from_capture(source)
    elif isinstance(source, ModelConfig):
        items = items_from_config(source)
    elif isinstance(source, str):
        items = items_from_shapes(parse_shapes(source))
    elif seq and all(isinstance(s, GemmShape) for s in source):
        items = items_from_shapes(list(source))
    elif seq and all(isinstance(s, WorkItem) for s in source):
        items = list(source)
    else:
        raise ValueError("bench() takes a GemmCapture or its path, a ModelConfig, 'MxKxN,...' shapes, or GemmShapes")
    if not items:
        raise ValueError("nothing to benchmark: the source holds no GEMMs")
    rc = ResultCache(enabled=False) if cache is False else ResultCache(None if cache is True else cache)
    # As the command line takes them: "FP8" alone is refused (it names four recipes), a string is a list.
    recipes = (parse_recipes(recipes) if isinstance(recipes, str) else
               list(dict.fromkeys(user_recipe(r) for r in recipes)) if recipes else list(RECIPES))
    if isinstance(modes, str):
        modes = list(MODES) if modes.strip() == "both" else [m.strip() for m in modes.split(",")]
    if devices > 1:
        from te_gemm_callback.microbench.parallel import run_bench_parallel
        return run_bench_parallel(items, recipes, list(modes), devices, flush_l2=flush_l2, cache=rc, visits=visits,
                                  gemm_duty=gemm_duty, progress=progress, console=console)
    from te_gemm_callback.microbench.engine import run_bench
    return run_bench(items, recipes, list(modes), flush_l2=flush_l2, cache=rc, visits=visits, gemm_duty=gemm_duty,
                     progress=progress, console=console)


__all__ = ["bench"]
