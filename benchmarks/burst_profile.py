#!/usr/bin/env python
"""How one GEMM's time moves along a long back-to-back burst, after the GPU sat idle.

benchmarks/kernel_match.py showed the microbenchmark and the training job launch the same kernel for
every GEMM, with no other kernel beside it, yet the bench's cells run 3-15% faster, most for the
short cells. Hypothesis: a cell's burst (tens of ms) starts after idle time (module build, host
work), while the board's averaged power is low, so it runs above the clock a sustained training
job settles at. This times N consecutive calls of each pass (te_job's own pre-quantized re-issue)
and prints the median per window of calls, with NVML's SM clock over each window.

    python benchmarks/burst_profile.py --calls 400 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from te_gemm_callback.bench import jobs  # noqa: E402
from te_gemm_callback.bench.cells import WorkItem  # noqa: E402
from te_gemm_callback.clocks import ClockSampler  # noqa: E402
from te_gemm_callback.bench.timing import warm_up_gpu  # noqa: E402
from te_gemm_callback.shapes import GemmShape  # noqa: E402

WINDOWS = ((0, 10), (10, 30), (30, 100), (100, 200), (200, 400), (400, 10**9))


def _burst(fn, n: int) -> list[float]:
    """Per-call times of n back-to-back calls, no hold (torch.mm launches far faster than it runs)."""
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for s, e in ev:
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in ev]


def _boost(times: list[float]) -> dict:
    """The burst's boost window: up to its last call faster than 0.95x the settled time (median of
    the last 50 calls). The very first calls after an idle can be slow (clocks ramping up from
    idle), so the window is not required to start fast."""
    steady = statistics.median(times[-50:])
    head = times[:-50]
    fast = [i for i, t in enumerate(head) if t < 0.95 * steady]
    end = fast[-1] + 1 if fast else 0
    return {"steady_ms": steady, "boost_calls": end, "boost_ms": sum(times[:end]),
            "first10_over_steady": statistics.median(times[:10]) / steady}


def recovery(reps: int) -> dict:
    """How much boost an idle gap gives back, and how much load before a burst spends it; then the
    shipped time_cuda (heated hold) after the same gaps."""
    from te_gemm_callback.bench import timing

    x = torch.randn(15872, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    fn = lambda: torch.mm(x, w)  # noqa: E731
    heater = timing._heater()
    out: dict = {"idle": [], "heat": [], "time_cuda": []}
    for _ in range(reps):
        for idle in (0.005, 0.02, 0.05, 0.1, 0.3, 1.0):
            heater.load(0.3)  # settled first
            torch.cuda.synchronize()
            time.sleep(idle)
            out["idle"].append({"idle_s": idle, **_boost(_burst(fn, 200))})
            print(f"after {1e3 * idle:6.0f} ms idle: {out['idle'][-1]}")
        for heat in (0.0, 0.01, 0.03, 0.1, 0.2):
            torch.cuda.synchronize()
            time.sleep(1.0)
            if heat:
                n = max(1, round(heat / heater.call_s))
                for _ in range(n):
                    heater.mm()
            out["heat"].append({"idle_s": 1.0, "heat_s": heat, **_boost(_burst(fn, 200))})
            print(f"1 s idle, then {1e3 * heat:4.0f} ms load: {out['heat'][-1]}")
        # What a job start meets (a few ms of host bookkeeping after a synchronize): how much load
        # spends the boost a short idle gives back (sizes timing.HEAT_MAX_S).
        for idle in (0.005, 0.02):
            for heat in (0.025, 0.05, 0.1):
                heater.load(0.3)
                torch.cuda.synchronize()
                time.sleep(idle)
                heater.load(heat)
                out["heat"].append({"idle_s": idle, "heat_s": heat, **_boost(_burst(fn, 200))})
                print(f"{1e3 * idle:.0f} ms idle, then {1e3 * heat:4.0f} ms load: {out['heat'][-1]}")
        for idle in (0.02, 0.1, 1.0):
            heater.load(0.3)
            torch.cuda.synchronize()
            steady = statistics.median(_burst(fn, 100)[-50:])
            time.sleep(idle)
            med = statistics.median(timing.time_cuda(fn, 30))
            out["time_cuda"].append({"idle_s": idle, "median_over_steady": med / steady})
            print(f"time_cuda after {1e3 * idle:5.0f} ms idle: median / settled {med / steady:.3f}")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=400)
    p.add_argument("--shapes", default="15872x4096x4096,15872x4096x16384")
    p.add_argument("--recipes", default="BF16,Float8CurrentScaling")
    p.add_argument("--idle-s", type=float, default=1.0, help="idle time before each burst")
    p.add_argument("--recovery", type=int, default=0, metavar="REPS",
                   help="instead: how much boost an idle gap gives back, how much load spends it (REPS repeats)")
    p.add_argument("--json")
    a = p.parse_args()
    if a.recovery:
        warm_up_gpu(1.0)
        res = recovery(a.recovery)
        if a.json:
            Path(a.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), **res}, indent=1))
        return 0
    # Every pass re-issued `calls` times back-to-back (the bench's own code path, longer).
    jobs._share_iters = lambda *args, **kw: a.calls
    warm_up_gpu(1.0)
    rows = []
    for recipe in a.recipes.split(","):
        for mkn in a.shapes.split(","):
            m, k, n = map(int, mkn.split("x"))
            item = WorkItem("probe", GemmShape(m, k, n), 1.0)
            torch.cuda.synchronize()
            time.sleep(a.idle_s)
            with ClockSampler(period_s=0.005) as clk:
                t0 = time.perf_counter()
                out = jobs.te_job(item, recipe, ["prequantized"], None)
            for (op, _mode), times in out.items():
                # The passes ran one after another; place each window on the host clock to read NVML.
                wins = []
                for lo, hi in WINDOWS:
                    part = times[lo:hi]
                    if part:
                        wins.append({"calls": f"{lo}-{lo + len(part)}", "median_ms": statistics.median(part)})
                rows.append({"recipe": recipe, "shape": mkn, "op": str(op), "windows": wins,
                             "steady_over_first": wins[-1]["median_ms"] / wins[0]["median_ms"]})
                print(f"{recipe:22s} {str(op):5s} {mkn:18s} " + "  ".join(
                    f"[{w['calls']}] {w['median_ms']:.3f}" for w in wins)
                    + f"   last/first {rows[-1]['steady_over_first']:.3f}")
            s = clk.summary(since=t0)
            if s:
                print(f"    SM clock over the job: median {s['sm_clock_mhz_median']:.0f} MHz, min "
                      f"{s['sm_clock_mhz_min']:.0f}, power median {s['power_w_median']:.0f} W")
                rows[-1]["clock"] = s
                series = [(round(t - t0, 4), c, pw) for (c, pw), t in zip(clk.samples, clk.times) if t >= t0]
                rows[-1]["clock_series"] = series
                print("    clock (s: MHz/W): " + " ".join(f"{t:.2f}:{c:.0f}/{pw:.0f}" for t, c, pw in series[::8]))
    if a.json:
        Path(a.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "calls": a.calls, "rows": rows},
                                           indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
