"""One job of the microbenchmark: a work item's GEMM passes in one recipe, in each mode.

A TE job runs a real ``te.Linear`` / ``te.GroupedLinear`` forward and backward under the recipe.
``autocast`` (quantization included) times each iteration: fprop = the forward, wgrad = its GEMM,
dgrad = backward minus it; ``prequantized`` (kernels only) repeats each GEMM call with TE's operands.
Without TE or CUDA, and for a GEMM no recipe runs, torch BF16 matmuls time the same passes.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from te_gemm_callback.capture.te_adapter import LAYOUT_OP, arg_reader, patch_te_gemms, unpatch
from te_gemm_callback.microbench.items import WorkItem, passes_of
from te_gemm_callback.microbench.rates import gemm_seconds
from te_gemm_callback.microbench.timing import (
    GEMM_DUTY,
    L2Flush,
    Pairs,
    adaptive_iters,
    between_calls,
    elapsed,
    hold_gpu,
    launch_timed,
    stats,
    time_cpu,
)
from te_gemm_callback.precisions import autocast, import_te, padded_splits, shape_problem
from te_gemm_callback.shapes import GemmOp

Times = dict[tuple[GemmOp, str], list[float]]  # (pass, mode) -> per-call milliseconds
Collect = Callable[[], Times]  # reads a job's times once the GPU has run it (after a synchronize)


class _GemmTap:
    """Sits on TE's GEMM entry points during a job: records event pairs, or repeats each call."""

    def __init__(self) -> None:
        self.mode = "off"  # "events": time each call; "repeat": call it n more times, timed
        self.n = 10
        self.burst_s: float | None = None
        self.flush: Callable[[], None] | None = None
        self.events: list[tuple[str, Any, Any]] = []
        self.repeats: list[tuple[str, Pairs]] = []
        self._patched: list = []
        self._depth = 0  # TE GEMM calls in progress: a TE GEMM can call another

    def __enter__(self) -> _GemmTap:
        self._patched = patch_te_gemms(self._wrap)
        return self

    def __exit__(self, *exc: Any) -> None:
        unpatch(self._patched)

    def _wrap(self, orig: Callable, grouped: bool) -> Callable:
        arg = arg_reader(orig)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            # general_grouped_gemm may call general_gemm, also tapped (TE cpp_extensions/gemm.py):
            # the inner call is part of the outer one's time.
            if self._depth:
                return orig(*args, **kwargs)
            self._depth += 1
            try:
                return self._call(orig, arg(args, kwargs, "layout", "TN"), args, kwargs)
            finally:
                self._depth -= 1

        return wrapper

    def _call(self, orig: Callable, layout: str, args: tuple, kwargs: dict) -> Any:
        if self.mode == "repeat":  # operands are valid now
            # A named range, so a profiler trace shows each burst's pass (`bench_vs_job.py kernels`).
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


class TeJob:
    """A work item's ``te.Linear`` / ``te.GroupedLinear`` in one recipe, built once, visited often."""

    def __init__(self, item: WorkItem, precision: str, modes: Iterable[str], flush: L2Flush | None,
                 tap: _GemmTap, share: float = 1.0, gemm_duty: float = GEMM_DUTY) -> None:
        t0 = time.perf_counter()
        grouped = bool(item.m_splits)
        why = shape_problem(precision, None if grouped else item.fprop.m, item.fprop.k, item.fprop.n, grouped)
        if why:  # before anything is built: the cell says why, not TE's C++ assertion
            raise ValueError(why)
        te = import_te()
        self.precision, self.modes, self.tap = precision, set(modes), tap
        self.plan = plan_job(item, precision, modes, share)
        self.ops = set(item.ops)
        # Between two timed calls: a forward+backward (its GEMMs) in autocast, one GEMM pre-quantized.
        self.between_iters = between_calls(flush, gemm_duty, 1e-3 * self.plan.passes * self.plan.gemm_ms)
        self.between_repeats = between_calls(flush, gemm_duty, 1e-3 * self.plan.gemm_ms)
        m, k, n = item.fprop.m, item.fprop.k, item.fprop.n
        bf16 = torch.bfloat16
        if item.m_splits:
            mod = te.GroupedLinear(len(item.m_splits), k, n, bias=False, params_dtype=bf16, device="cuda",
                                   **grouped_linear_options(te.GroupedLinear))
            # Quantized grouped GEMMs need each expert's rows aligned: the padding is part of the cost.
            splits = list(padded_splits(item.m_splits, precision))
            m = sum(splits)
            self.fwd: Callable[[torch.Tensor], torch.Tensor] = lambda x: mod(x, splits)
        else:
            mod = te.Linear(k, n, bias=False, params_dtype=bf16, device="cuda")
            self.fwd = mod
        # Only the passes the job ran: no dgrad or wgrad TE's backward would then skip.
        self.x = torch.randn(m, k, dtype=bf16, device="cuda", requires_grad=GemmOp.DGRAD in self.ops)
        self.dy = torch.randn(m, n, dtype=bf16, device="cuda")
        self.params = list(mod.parameters())
        for prm in self.params:
            prm.requires_grad_(GemmOp.WGRAD in self.ops)
        self.backward = bool(self.ops & {GemmOp.DGRAD, GemmOp.WGRAD})
        self.iteration()  # TE/cuBLAS initialisation; delayed scaling starts its amax history
        t = time.perf_counter()
        self.iteration()
        self.host_s = time.perf_counter() - t  # sizes the holds
        self.setup_s = time.perf_counter() - t0

    def forward(self) -> torch.Tensor:
        with autocast(self.precision):
            return self.fwd(self.x)

    def clear_grads(self) -> None:
        for p in self.params:  # no gradient accumulation kernel between iterations
            p.grad = None
        self.x.grad = None

    def iteration(self) -> None:
        self.clear_grads()
        y = self.forward()
        if self.backward:
            y.backward(self.dy)

    def queue(self) -> Collect:
        """Queue one visit's timed calls without waiting; returns what reads them after a synchronize."""
        plan, tap, between = self.plan, self.tap, self.between_iters
        # An idle GPU (first visit, or the host fell behind) has its boost back: spend it first.
        hold_gpu(0.0, plan.timed_s)
        tap.events, tap.repeats = [], []
        marks: list[list[Any]] = []
        try:
            if "autocast" in self.modes:
                tap.mode = "events"
                marks = [[torch.cuda.Event(enable_timing=True) for _ in range(3)] for _ in range(plan.iters)]
                # Hold the GPU while the host queues every iteration (TE's Python can outlast a small
                # layer's GPU time: a drained queue would put idle gaps in the pairs).
                hold_gpu(min(1.5 * plan.iters * self.host_s + 1e-3, 0.5), burst_s=plan.autocast_s)
                for e0, e1, e2 in marks:
                    self.clear_grads()
                    if between is not None:
                        between()
                    e0.record()
                    y = self.forward()
                    e1.record()
                    if self.backward:
                        y.backward(self.dy)
                    e2.record()
            if "prequantized" in self.modes:
                tap.mode, tap.flush = "repeat", self.between_repeats
                tap.n, tap.burst_s = plan.repeats, plan.repeat_burst_s
                self.iteration()
        finally:  # the next job's setup calls are neither timed nor repeated
            tap.mode = "off"
        events, repeats = tap.events, tap.repeats

        def collect() -> Times:
            out: Times = {}
            if marks:
                wgrad = [s.elapsed_time(e) for lay, s, e in events if lay == "NT"]
                bwd_ms = [b.elapsed_time(c) for _, b, c in marks]
                out[(GemmOp.FPROP, "autocast")] = [a.elapsed_time(b) for a, b, _ in marks]
                if GemmOp.WGRAD in self.ops:
                    out[(GemmOp.WGRAD, "autocast")] = wgrad
                if GemmOp.DGRAD in self.ops:  # backward minus its wgrad GEMM, where it ran one
                    out[(GemmOp.DGRAD, "autocast")] = [b - w for b, w in zip(bwd_ms, wgrad or [0.0] * len(bwd_ms))]
            for layout, pairs in repeats:
                if LAYOUT_OP[layout] in self.ops:
                    out[(LAYOUT_OP[layout], "prequantized")] = elapsed(pairs)
            return out

        return collect


class TorchJob:
    """BF16 torch matmuls (no TE, or a GEMM no recipe runs): both modes time the same products."""

    def __init__(self, item: WorkItem, modes: Iterable[str], share: float = 1.0, gemm_duty: float = GEMM_DUTY) -> None:
        t0 = time.perf_counter()
        m, k, n = item.fprop.m, item.fprop.k, item.fprop.n
        self.cuda = torch.cuda.is_available()
        self.modes = list(modes)
        dev, dt = ("cuda" if self.cuda else "cpu"), torch.bfloat16
        fns: dict[GemmOp, Callable[[], Any]]
        if item.runs_recipe:  # a linear layer: Y = X W^T, one product per group of a grouped GEMM
            splits = list(item.m_splits) if item.m_splits else [m]
            w = torch.randn(n, k, device=dev, dtype=dt)
            xs = [torch.randn(s, k, device=dev, dtype=dt) for s in splits]
            dys = [torch.randn(s, n, device=dev, dtype=dt) for s in splits]
            fns = {GemmOp.FPROP: lambda: [x @ w.t() for x in xs],
                   GemmOp.DGRAD: lambda: [d @ w for d in dys],
                   GemmOp.WGRAD: lambda: [d.t() @ x for d, x in zip(dys, xs)]}
        else:  # C = A @ B, batched or not, as the job ran it: its input gradients dC B^T and A^T dC
            lead = (item.fprop.batch,) if item.fprop.batch > 1 else ()
            a, b = torch.randn(*lead, m, k, device=dev, dtype=dt), torch.randn(*lead, k, n, device=dev, dtype=dt)
            dc = torch.randn(*lead, m, n, device=dev, dtype=dt)
            grad_a, grad_b = (lambda: dc @ b.transpose(-2, -1)), (lambda: a.transpose(-2, -1) @ dc)
            # A batched GEMM with a weight (a 3-D parameter) has dgrad and wgrad of the same sizes.
            fns = {GemmOp.FPROP: lambda: a @ b, GemmOp.DGRAD_A: grad_a, GemmOp.DGRAD_B: grad_b,
                   GemmOp.DGRAD: grad_a, GemmOp.WGRAD: grad_b}
        self.fns = {s.op: fns[s.op] for s in passes_of(item)}
        self.gemm_s = gemm_seconds(item.fprop.flops, "BF16")
        self.between = between_calls(None, gemm_duty, self.gemm_s) if self.cuda else None
        self.calls = {}
        for op, fn in self.fns.items():
            fn()
            # On CPU the model rate (a GPU's) does not apply: size from a timed trial.
            est_ms = 1e3 * self.gemm_s if self.cuda else stats(time_cpu(fn, 2))[0]
            target_ms, lo = (30.0, 10) if self.cuda else (20.0, 5)
            self.calls[op] = _share_iters(est_ms, share, target_ms=target_ms, lo=lo, hi=50)
        self.setup_s = time.perf_counter() - t0

    def queue(self) -> Collect:
        timed: dict[GemmOp, Callable[[], list[float]]] = {}
        for op, fn in self.fns.items():
            n = self.calls[op]
            if self.cuda:
                timed[op] = functools.partial(elapsed, launch_timed(fn, n, self.between, burst_s=n * self.gemm_s))
            else:
                timed[op] = functools.partial(list, time_cpu(fn, n))
        return lambda: {(op, mode): read() for op, read in timed.items() for mode in self.modes}


def grouped_linear_options(cls: Callable) -> dict[str, Any]:
    """Keyword arguments for ``te.GroupedLinear``: the per-expert GEMMs where TE takes ``use_grouped_tensor``.

    Its grouped-tensor path calls a GEMM entry point the tap does not hold (module/grouped_linear.py)."""
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return {}
    return {"use_grouped_tensor": False} if "use_grouped_tensor" in params else {}


@contextlib.contextmanager
def job_factory(use_te: bool, modes: Iterable[str], flush: L2Flush | None, share: float,
                gemm_duty: float = GEMM_DUTY) -> Iterator[Callable[[WorkItem, str], TeJob | TorchJob]]:
    """``with job_factory(...) as make: job = make(item, precision)``; with TE, its GEMMs tapped."""
    modes = list(modes)
    if not use_te:
        yield lambda item, precision: TorchJob(item, modes, share, gemm_duty)
        return
    with _GemmTap() as tap:
        # A GEMM no recipe runs (batched, weightless) is the same torch matmul under every recipe.
        yield lambda item, precision: (TeJob(item, precision, modes, flush, tap, share, gemm_duty) if item.runs_recipe
                                       else TorchJob(item, modes, share, gemm_duty))


def te_job(item: WorkItem, precision: str, modes: Iterable[str], flush: L2Flush | None,
           share: float = 1.0, gemm_duty: float = 1.0) -> Times:
    """One job built, measured once and read back (benchmarks/bench_vs_job.py), calls back to back."""
    with job_factory(True, modes, flush, share, gemm_duty) as make:
        collect = make(item, precision).queue()
    torch.cuda.synchronize()
    return collect()


@dataclass(frozen=True)
class JobPlan:
    """A job's timed calls, from a FLOP model: a timed trial's synchronize would give the boost back."""

    gemm_ms: float  # model estimate of one pass's GEMM
    iters: int  # autocast: forward+backward iterations, one sample of each pass per iteration
    repeats: int  # pre-quantized: back-to-back repeats of each pass's GEMM
    modes: frozenset[str]
    passes: int = 3  # the GEMMs of one iteration: the passes the item runs

    @property
    def autocast_s(self) -> float:  # expected GPU seconds, as the two below
        return 1e-3 * self.passes * self.gemm_ms * self.iters

    @property
    def repeat_burst_s(self) -> float:  # one pass's pre-quantized burst
        return 1e-3 * self.gemm_ms * self.repeats

    @property
    def timed_s(self) -> float:  # every timed call, all modes
        return (self.autocast_s * ("autocast" in self.modes)
                + self.passes * self.repeat_burst_s * ("prequantized" in self.modes))


def plan_job(item: WorkItem, precision: str, modes: Iterable[str], share: float = 1.0) -> JobPlan:
    gemm_ms = 1e3 * gemm_seconds(item.fprop.flops, precision)
    passes = len(passes_of(item))
    return JobPlan(gemm_ms, iters=_share_iters(passes * gemm_ms, share, target_ms=60.0, lo=10, hi=30),
                   repeats=_share_iters(gemm_ms, share, target_ms=30.0, lo=10, hi=50), modes=frozenset(modes),
                   passes=passes)


def _share_iters(estimate_ms: float, share: float, *, target_ms: float, lo: int, hi: int) -> int:
    return adaptive_iters(estimate_ms, target_ms * share, math.ceil(lo * share), math.ceil(hi * share))
