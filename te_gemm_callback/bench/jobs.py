"""One job of the microbenchmark: a work item's three GEMM passes in one recipe, in each mode.

Each work item (a linear layer's fprop shape, or a grouped MoE GEMM with its m_splits) is run as
a real ``te.Linear`` / ``te.GroupedLinear`` forward and backward under the recipe, so dgrad and
wgrad are the GEMMs TE's backward really calls: same layouts ("NN", "NT"), operand formats and
scaling (FP8 block scaling with the 1D x 2D scaling training uses), not a forward with swapped
sizes. Two modes:

- ``autocast`` (what training pays, quantization included), per-iteration CUDA events:
  fprop = the module's forward (input and weight quantization + GEMM);
  wgrad = the wgrad GEMM (its operands were quantized by fprop and dgrad);
  dgrad = backward minus the wgrad GEMM (grad-output quantization + dgrad GEMM).
- ``prequantized`` (kernel time only): inside that same forward/backward, each GEMM call is
  re-issued back-to-back with the operands TE built for it, so the quantization happened once,
  outside the timed region, in exactly TE's formats.

Without TE (or without CUDA) the torch backend times BF16 matmuls with the same three passes.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch

from ..capture.te_adapter import LAYOUT_OP
from ..precisions import autocast, import_te, padded_splits
from ..shapes import GemmOp
from .cells import WorkItem, gemm_seconds
from .timing import L2Flush, Pairs, adaptive_iters, elapsed, hold_gpu, launch_timed, stats, time_cpu

Times = dict[tuple[GemmOp, str], list[float]]  # (pass, mode) -> per-call milliseconds
Collect = Callable[[], Times]  # reads a job's times once the GPU has run it (after a synchronize)


class _GemmTap:
    """Sits on TE's GEMM entry points during a job: records event pairs, or re-issues each call."""

    def __init__(self) -> None:
        self.mode = "off"
        self.n = 10
        self.burst_s: float | None = None
        self.flush: Callable[[], None] | None = None
        self.events: list[tuple[str, Any, Any]] = []
        self.repeats: list[tuple[str, Pairs]] = []
        self._patched: list = []

    def __enter__(self) -> "_GemmTap":
        from ..capture.te_adapter import patch_te_gemms

        self._patched = patch_te_gemms(self._wrap)
        return self

    def __exit__(self, *exc: Any) -> None:
        from ..capture.te_adapter import unpatch

        unpatch(self._patched)

    def _wrap(self, orig: Callable, grouped: bool) -> Callable:
        from ..capture.te_adapter import arg_reader

        arg = arg_reader(orig)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            layout = arg(args, kwargs, "layout", "TN")
            if self.mode == "repeat":  # operands are valid now: re-issue the call back-to-back
                # A named range, so a profiler trace of the bench shows which pass each burst is
                # (scripts/kernel_match.py reads the kernels under it); outside the timed events.
                with torch.profiler.record_function(f"te_gemm_bench: {LAYOUT_OP[layout]}"):
                    self.repeats.append((layout, launch_timed(lambda: orig(*args, **kwargs), self.n, self.flush,
                                                              self.burst_s)))
            if self.mode == "events":
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                out = orig(*args, **kwargs)
                e.record()
                self.events.append((layout, s, e))
                return out
            return orig(*args, **kwargs)

        return wrapper


def te_job(item: WorkItem, precision: str, modes: Iterable[str], flush: L2Flush | None,
           clock: dict[str, float] | None = None, share: float = 1.0) -> Collect:
    """Queue one work item's timed calls under one recipe; returns what reads the times of each
    (pass, mode) after the caller's synchronize. The job never waits for the GPU itself, so jobs
    queue back to back and the GPU stays at the sustained clock from one to the next (an idle gap
    between jobs would give it its boost back). ``clock`` receives the host seconds spent before
    the first measurement (module build, TE/cuBLAS first calls); ``share``: this call's part of the
    cell's samples (run_bench measures each job in several visits)."""
    t_job = time.perf_counter()
    te = import_te()
    plan = plan_job(item, precision, modes, share)
    # If the GPU is idle (the run's first job, or the host fell behind), it has its boost back:
    # heat it before the module is built, so the load overlaps this job's host-side setup.
    hold_gpu(0.0, plan.timed_s)
    m, k, n = item.fprop.m, item.fprop.k, item.fprop.n
    bf16 = torch.bfloat16
    if item.m_splits:
        mod = te.GroupedLinear(len(item.m_splits), k, n, bias=False, params_dtype=bf16, device="cuda")
        # Quantized grouped GEMMs need each expert's rows aligned; the job pads them, so do we
        # (the padding rows are part of what the recipe costs).
        splits = list(padded_splits(item.m_splits, precision))
        m = sum(splits)
        fwd = lambda x: mod(x, splits)  # noqa: E731
    else:
        mod = te.Linear(k, n, bias=False, params_dtype=bf16, device="cuda")
        fwd = mod
    x = torch.randn(m, k, dtype=bf16, device="cuda", requires_grad=True)
    dy = torch.randn(m, n, dtype=bf16, device="cuda")
    params = list(mod.parameters())

    def forward() -> torch.Tensor:
        with autocast(precision):
            return fwd(x)

    def clear_grads() -> None:
        for p in params:  # no gradient accumulation kernel between iterations
            p.grad = None
        x.grad = None

    def iteration() -> None:
        clear_grads()
        forward().backward(dy)

    with _GemmTap() as tap:
        iteration()  # TE/cuBLAS initialisation; delayed scaling starts its amax history
        t = time.perf_counter()
        iteration()
        host_s = time.perf_counter() - t
        if clock is not None:
            clock["setup_s"] = time.perf_counter() - t_job  # host seconds before the first timed call
        marks: list[list[Any]] = []
        if "autocast" in modes:
            tap.mode = "events"
            marks = [[torch.cuda.Event(enable_timing=True) for _ in range(3)] for _ in range(plan.iters)]
            # Hold the GPU while the host queues every iteration: TE's Python per iteration can
            # exceed a small layer's GPU time, and a drained queue would put idle gaps in the pairs.
            hold_gpu(min(1.5 * plan.iters * host_s + 1e-3, 0.5), burst_s=plan.autocast_s)
            for e0, e1, e2 in marks:
                clear_grads()
                if flush is not None:
                    flush()
                e0.record()
                y = forward()
                e1.record()
                y.backward(dy)
                e2.record()
        if "prequantized" in modes:
            tap.mode, tap.flush, tap.n, tap.burst_s = "repeat", flush, plan.repeats, plan.repeat_burst_s
            iteration()
        tap.mode = "off"
    events, repeats = tap.events, tap.repeats

    def collect() -> Times:
        out: Times = {}
        if marks:
            wgrad = [s.elapsed_time(e) for lay, s, e in events if lay == "NT"]
            fwd_ms = [a.elapsed_time(b) for a, b, _ in marks]
            bwd_ms = [b.elapsed_time(c) for _, b, c in marks]
            out[(GemmOp.FPROP, "autocast")] = fwd_ms
            out[(GemmOp.WGRAD, "autocast")] = wgrad
            out[(GemmOp.DGRAD, "autocast")] = [b - w for b, w in zip(bwd_ms, wgrad)]
        for layout, pairs in repeats:
            out[(LAYOUT_OP[layout], "prequantized")] = elapsed(pairs)
        return out

    # Only the events are kept: the module and tensors are freed now; the caching allocator
    # reuses their memory in stream order, after the queued calls that read them.
    return collect


@dataclass(frozen=True)
class JobPlan:
    """How many timed calls a job makes, planned from a FLOP model rather than a timed trial: a
    trial needs a synchronize, which idles the GPU, and an idle GPU gives its boost back
    (timing.hold_gpu). ``share``: this visit's part of the cell's samples."""

    gemm_ms: float  # model estimate of one pass's GEMM
    iters: int  # autocast: forward+backward iterations, one sample of each pass per iteration
    repeats: int  # pre-quantized: back-to-back re-issues of each pass's GEMM
    modes: frozenset[str]

    @property
    def autocast_s(self) -> float:
        """Expected GPU time of the autocast iterations (three GEMMs each)."""
        return 3e-3 * self.gemm_ms * self.iters

    @property
    def repeat_burst_s(self) -> float:
        """Expected GPU time of one pass's pre-quantized burst."""
        return 1e-3 * self.gemm_ms * self.repeats

    @property
    def timed_s(self) -> float:
        """Expected GPU time of the job's timed calls, all modes."""
        return self.autocast_s * ("autocast" in self.modes) + 3 * self.repeat_burst_s * ("prequantized" in self.modes)


def plan_job(item: WorkItem, precision: str, modes: Iterable[str], share: float = 1.0) -> JobPlan:
    gemm_ms = 1e3 * gemm_seconds(item.fprop.flops, precision)
    return JobPlan(gemm_ms, iters=_share_iters(3 * gemm_ms, share, target_ms=60.0, lo=10, hi=30),
                   repeats=_share_iters(gemm_ms, share, target_ms=30.0, lo=10, hi=50), modes=frozenset(modes))


def _share_iters(estimate_ms: float, share: float, *, target_ms: float, lo: int, hi: int) -> int:
    return adaptive_iters(estimate_ms, target_ms * share, math.ceil(lo * share), math.ceil(hi * share))


def torch_job(item: WorkItem, modes: Iterable[str], share: float = 1.0) -> Collect:
    """BF16 matmuls with torch alone (CPU, or a GPU without TE): no quantization, so both modes
    time the same three products. Queued like :func:`te_job` on a GPU."""
    m, k, n = item.fprop.m, item.fprop.k, item.fprop.n
    cuda = torch.cuda.is_available()
    dev, dt = ("cuda" if cuda else "cpu"), torch.bfloat16
    splits = list(item.m_splits) if item.m_splits else [m]
    w = torch.randn(n, k, device=dev, dtype=dt)
    xs = [torch.randn(s, k, device=dev, dtype=dt) for s in splits]
    dys = [torch.randn(s, n, device=dev, dtype=dt) for s in splits]
    fns = {GemmOp.FPROP: lambda: [x @ w.t() for x in xs],
           GemmOp.DGRAD: lambda: [d @ w for d in dys],
           GemmOp.WGRAD: lambda: [d.t() @ x for d, x in zip(dys, xs)]}
    gemm_s = gemm_seconds(item.fprop.flops, "BF16")
    timed: dict[GemmOp, Callable[[], list[float]]] = {}
    for op, fn in fns.items():
        fn()
        if cuda:
            calls = _share_iters(1e3 * gemm_s, share, target_ms=30.0, lo=10, hi=50)
            pairs = launch_timed(fn, calls, burst_s=calls * gemm_s)
            timed[op] = lambda pairs=pairs: elapsed(pairs)
        else:  # the model rate is a GPU's: size CPU runs from a timed trial
            calls = _share_iters(stats(time_cpu(fn, 2))[0], share, target_ms=20.0, lo=5, hi=50)
            times = time_cpu(fn, calls)
            timed[op] = lambda times=times: times
    return lambda: {(op, mode): read() for op, read in timed.items() for mode in modes}
