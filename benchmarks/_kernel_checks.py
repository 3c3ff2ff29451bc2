"""Per-GEMM kernel records against torch.profiler's kernel times (``undisturbed.py kernels``), and
what a profiled window leaves behind for the plain steps after it (``undisturbed.py cupti``)."""

from __future__ import annotations

import os
from typing import Any

import torch

from _lightning_jobs import HOSTBOUND, med
from _timing import event_times

from te_gemm_callback import GemmProfiler, capture_steps
from te_gemm_callback.models import codonfm


def check_kernels(model_name: str, recipe: str, steps: int, rounds: int = 4) -> dict:
    from te_gemm_callback.capture.instruments import ProfilerRanges, range_name
    from te_gemm_callback.models import stack_input, te_stack, train_step_fn

    c = {"hostbound": HOSTBOUND, "codonfm": codonfm(4)}[model_name]
    torch.manual_seed(0)
    model = te_stack(c)
    step = train_step_fn(model, stack_input(c), recipe)
    for _ in range(3):  # TE/cuBLAS initialisation and the FP8 amax history stay out
        step()
    from te_gemm_callback.clocks import ClockSampler

    caps, oracle_runs, clocks = [], [], {"ours": [], "profiler": []}
    # The oracle's own torch.profiler sessions must not leave CUPTI attached either: seen on the
    # H200, a KernelProfile session after an oracle session without the teardown got no records.
    os.environ.setdefault("TEARDOWN_CUPTI", "1")
    for _ in range(rounds):  # interleaved rounds: the GPU's clock drifts under its power limit
        with ClockSampler(period_s=0.02) as ck:
            caps.append(capture_steps(model, step, 0, kernel_steps=steps, instrumented_steps=1))
        clocks["ours"].append(ck.summary())
        # Oracle: torch.profiler with a range per GEMM on instrumented steps; a kernel belongs to the
        # range whose GPU-side span holds it (cuBLASLt launches are not tied to a CPU op by CUPTI).
        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with ClockSampler(period_s=0.02) as ck, torch.profiler.profile(activities=acts) as tp:
            p2 = GemmProfiler(model, instrumented_steps="all", timing="none", dispatch_steps=0,
                              nvtx_backend=ProfilerRanges()).start()
            for i in range(steps):
                step()
                if i < steps - 1:
                    p2.step()
            p2.stop()
            torch.cuda.synchronize()
        clocks["profiler"].append(ck.summary())
        oracle_runs.append(tp)
    cap = caps[0]
    for other in caps[1:]:
        by = {r.key(): r for r in other.records}
        for r in cap.records:
            r.times_ms += by[r.key()].times_ms if r.key() in by else []
    oracle: dict[str, list[float]] = {}
    gemm_total = 0.0
    for tp in oracle_runs:
        t, o = _attribute(tp)
        gemm_total += t
        for k, v in o.items():
            oracle.setdefault(k, []).extend(v)
    rows = []
    for r in cap.records:
        name = range_name(r.module, r.gemm, r.op, r.shape.mkn, r.precision, r.recompute)
        ours, ref = r.median_ms, med(oracle.get(name, []))
        rows.append({"gemm": name, "ours_ms": ours, "profiler_ms": ref,
                     "ratio": None if not (ours and ref) else ours / ref})
    ratios = [x["ratio"] for x in rows if x["ratio"] is not None]
    total_ref = gemm_total / len(oracle_runs) / steps
    return {"model": model_name, "recipe": recipe, "kernel_join": cap.meta.get("kernel_join"), "clocks": clocks,
            "records": len(rows), "compared": len(ratios),
            "within_3pct": sum(abs(x - 1) <= 0.03 for x in ratios),
            "max_abs_pct": 100 * max((abs(x - 1) for x in ratios), default=float("nan")),
            "median_ratio": med(ratios), "gemm_ms_per_step": cap.gemm_ms_per_step(),
            "profiler_gemm_ms_per_step": total_ref, "rows": rows}


def _attribute(tp: Any) -> tuple[float, dict[str, list[float]]]:
    """(GEMM kernel µs in the trace, {range name: [ms per range]})."""
    from te_gemm_callback.kernels import is_gemm_kernel

    events = [e for e in tp.events() if "CUDA" in str(getattr(e, "device_type", ""))]
    ranges = [e for e in events if e.name.startswith("te_gemm: ")]
    gemms = sorted((e.time_range.start, e.time_range.end) for e in events
                   if not e.name.startswith("te_gemm: ") and is_gemm_kernel(e.name))
    oracle: dict[str, list[float]] = {}
    for r in ranges:
        us = sum(e - s for s, e in gemms if s >= r.time_range.start - 1 and e <= r.time_range.end + 1)
        oracle.setdefault(r.name[len("te_gemm: "):], []).append(us / 1e3)
    return sum(e - s for s, e in gemms) / 1e3, oracle


def check_cupti(model_name: str, recipe: str, steps: int, rounds: int = 3) -> dict:
    """Does a profiled window leave the job slower afterwards? Rounds of: one window of each kind
    (nothing, kernel records alone, a GemmProfiler without and with its kernels steps), each
    followed by ``steps`` plain training steps timed by CUDA events; the kinds alternate within a
    round so the host's drift falls on all alike. The first steps after a window are reported apart
    (an effect that fades, e.g. an asynchronous CUPTI teardown, shows there)."""
    from te_gemm_callback.capture.kernel_records import KernelProfile
    from te_gemm_callback.models import stack_input, te_stack, train_step_fn

    c = {"hostbound": HOSTBOUND, "codonfm": codonfm(4)}[model_name]
    torch.manual_seed(0)
    model = te_stack(c)
    step = train_step_fn(model, stack_input(c), recipe)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)

    def train() -> None:
        step()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def records() -> None:
        kp = KernelProfile()
        kp.start()
        train()
        kp.stop()

    def profiler(kernel_steps: int) -> Any:
        return lambda: capture_steps(model, train, 0, kernel_steps=kernel_steps)

    windows = {"nothing": train, "kernel records": records, "profiler, no kernels steps": profiler(0),
               "profiler with kernels steps": profiler(1)}
    for _ in range(5):
        train()
    series: dict[str, list[list[float]]] = {k: [] for k in windows}
    for _ in range(rounds):
        for k, run in windows.items():
            run()
            torch.cuda.synchronize()  # the window's end, outside the timed block
            series[k].append(event_times(train, steps))
    head = 3
    return {"model": model_name, "recipe": recipe, "steps": steps, "rounds": rounds,
            "median_ms": {k: med([t for b in v for t in b]) for k, v in series.items()},
            "first_steps_median_ms": {k: med([t for b in v for t in b[:head]]) for k, v in series.items()},
            "later_median_ms": {k: med([t for b in v for t in b[head:]]) for k, v in series.items()},
            "series": series}
