#!/usr/bin/env python
"""Microbenchmark cells against the same GEMMs inside training steps, and why they can differ.

``times`` (default): capture steps of the CodonFM-layer te.TransformerLayer stack (per-GEMM kernel
    time from its kernels step), then microbenchmark the same shapes in pre-quantized mode; the
    per-GEMM ratio bench / in-job, and the SM clock and power on both sides. Layers without biases
    by default (as Llama-style models and the dense recipe): the microbenchmark times bias-free
    GEMMs; ``--bias`` shows what a bias epilogue in the job's fprop adds.
``kernels``: the kernel each side launches per (recipe, pass, shape), with CUPTI durations from
    torch.profiler: a different kernel name means the microbenchmark does not reproduce the job's
    call; the same name with a different duration points at the conditions (clock, memory,
    concurrent kernels). Also how much of the job's GEMM kernel time another kernel overlapped, and
    the bench's time after a filler (nothing, its L2 flush, a 1 GB copy, an idle spin).
``burst``: one GEMM's time along a long back-to-back burst after the GPU sat idle, per window of
    calls, with NVML's SM clock (the boost an idle GPU regains). ``--recovery REPS``: how much boost
    an idle gap gives back, how much load spends it, and the shipped timing after the same gaps.

    python benchmarks/bench_vs_job.py times --layers 4 --steps 6 --json out.json
    python benchmarks/bench_vs_job.py kernels --layers 4 --steps 3
    python benchmarks/bench_vs_job.py burst --calls 400
    python benchmarks/bench_vs_job.py burst --recovery 2
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from _timing import profiled_steps

from te_gemm_callback import GemmProfiler
from te_gemm_callback.capture.clocks import ClockSampler
from te_gemm_callback.capture.kernels import is_gemm_kernel
from te_gemm_callback.microbench import jobs
from te_gemm_callback.microbench.cache import ResultCache
from te_gemm_callback.microbench.engine import run_bench
from te_gemm_callback.microbench.items import WorkItem, items_from_capture
from te_gemm_callback.microbench.jobs import te_job
from te_gemm_callback.microbench.timing import GEMM_DUTY, L2Flush, warm_up_gpu
from te_gemm_callback.precisions import availability
from te_gemm_callback.recipes.models import DemoConfig, codonfm, stack_input, te_stack, train_step_fn
from te_gemm_callback.shapes import GemmShape, gemm_passes


# --- times --------------------------------------------------------------------------------------
def in_job(recipe: str, c: DemoConfig, steps: int, bias: bool):
    torch.manual_seed(0)
    model = te_stack(c, bias=bias)
    step = train_step_fn(model, stack_input(c), recipe)
    for _ in range(3):
        step()
    prof = GemmProfiler(model, dispatch_steps=0, nvtx=False).start()
    # Its own sampler, not the profiler's clocks_during_capture: a few steps of a small stack last
    # 0.2-0.5 s, which the profiler's 20 reads a second cover coarsely; this one reads 50 a second
    # (2 x H200, --layers 2 --steps 4, Float8CurrentScaling in-job median: 1860 MHz from the
    # profiler's reads, 1620 MHz from this one's in the next run; the BF16 job 1575 and 1590).
    with ClockSampler() as clocks:  # SM clock and power during the training steps
        for _ in range(steps):
            step()
            prof.step()
        torch.cuda.synchronize()
    cap = prof.stop()
    cap.meta["clocks_during_steps"] = clocks.summary()
    times = collections.defaultdict(list)
    for r in cap.records:
        times[(r.op, r.m, r.k, r.n)] += r.times_ms
    del model
    torch.cuda.empty_cache()
    return cap, {k: statistics.median(v) for k, v in times.items()}


def check_times(a: argparse.Namespace) -> dict[str, Any]:
    c = codonfm(a.layers)
    rows, clocks = [], []
    for recipe in a.recipes.split(","):
        cap, job = in_job(recipe, c, a.steps, a.bias)
        items = items_from_capture(cap)
        share = (cap.gemm_ms_per_step() or 0) / (cap.step_ms() or float("inf"))
        duty = min(max(share, 0.05), 1.0) if a.duty_from_job else (a.gemm_duty or GEMM_DUTY)
        print(f"{recipe:22s} GEMM share of the job's step {share:.3f}; microbenchmark GEMM duty {duty:.3f}")
        res = run_bench(items, [recipe], ["prequantized"], flush_l2=a.flush_l2, cache=ResultCache(enabled=False),
                        visits=a.visits, progress=False, gemm_duty=duty)
        ck_job, ck_bench = cap.meta.get("clocks_during_steps"), res.meta.get("clocks_during_run")
        clocks.append({"recipe": recipe, "in_job": ck_job, "bench": ck_bench, "gemm_share": share, "gemm_duty": duty})
        if ck_job and ck_bench:
            print(f"{recipe:22s} SM clock median (min) in-job {ck_job['sm_clock_mhz_median']:.0f} "
                  f"({ck_job['sm_clock_mhz_min']:.0f}) MHz at {ck_job['power_w_median']:.0f} W; bench "
                  f"{ck_bench['sm_clock_mhz_median']:.0f} ({ck_bench['sm_clock_mhz_min']:.0f}) MHz at "
                  f"{ck_bench['power_w_median']:.0f} W")
        for (op, m, k, n), job_ms in sorted(job.items()):
            r = res.get(GemmShape(m, k, n, op), recipe, "prequantized")
            if r is None or not r.ok:
                continue
            rows.append({"recipe": recipe, "op": op, "shape": f"{m}x{k}x{n}", "in_job_ms": job_ms,
                         "bench_ms": r.median_ms, "bench_over_job": r.median_ms / job_ms})
            print(f"{recipe:22s} {op:5s} {m}x{k}x{n:<8d} in-job {job_ms:8.3f} ms  bench {r.median_ms:8.3f} ms  "
                  f"ratio {r.median_ms / job_ms:.3f}")
    worst = {rc: max(abs(x["bench_over_job"] - 1) for x in rows if x["recipe"] == rc)
             for rc in {x["recipe"] for x in rows}}
    print("worst |ratio - 1| per recipe:", {k: f"{100 * v:.1f}%" for k, v in worst.items()})
    summary = []
    for rc in dict.fromkeys(x["recipe"] for x in rows):
        ratios = [x["bench_over_job"] for x in rows if x["recipe"] == rc]
        tol = 0.05 if rc == "BF16" else 0.08  # the bar: 5% BF16, 8% FP8 recipes
        summary.append(f"{rc} median {statistics.median(ratios):.3f}, within {100 * tol:.0f}%: "
                       f"{sum(abs(r - 1) <= tol for r in ratios)}/{len(ratios)}")
    print("bench / in-job:", "; ".join(summary))
    return {"config": c.__dict__, "bias": a.bias, "rows": rows, "worst": worst, "clocks": clocks}


# --- kernels ------------------------------------------------------------------------------------
ACTS = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]


def kernels_under(prof, prefix: str) -> dict[str, list[tuple[str, float]]]:
    """{range name: [(GEMM kernel name, µs), ...]} for every range whose name starts with ``prefix``.

    CUPTI does not tie the kernels cuBLASLt launches (cuLaunchKernelEx) to their CPU op, so the
    match is on the GPU timeline: a range's GPU-side annotation spans its kernels."""
    events = [e for e in prof.events() if "CUDA" in str(getattr(e, "device_type", ""))]
    ranges = [e for e in events if e.name.startswith(prefix)]
    kernels = sorted((e.time_range.start, e.time_range.end, e.name) for e in events
                     if not e.name.startswith(prefix) and is_gemm_kernel(e.name))
    out: dict[str, list[tuple[str, float]]] = collections.defaultdict(list)
    for r in ranges:
        rs, re_ = r.time_range.start, r.time_range.end
        out[r.name] += [(n, e - s) for s, e, n in kernels if s >= rs - 1 and e <= re_ + 1]
    return out


def _summary(pairs: list[tuple[str, float]]) -> dict:
    by_name: dict[str, list[float]] = collections.defaultdict(list)
    if not pairs:
        return {"kernel": "(none attributed)", "median_us": float("nan"), "calls": 0, "others": []}
    for name, us in pairs:
        by_name[name].append(us)
    main = max(by_name, key=lambda n: sum(by_name[n]))  # the kernel that does the work
    return {"kernel": main, "median_us": statistics.median(by_name[main]), "calls": len(by_name[main]),
            "others": sorted(set(by_name) - {main})}


def overlap_report(prof) -> dict:
    """GEMM kernel time, and how much of it other kernels overlapped, by their name and stream
    (from the Chrome trace, which carries each kernel's stream). A kernel running beside a GEMM
    takes SMs and memory bandwidth from it; the microbenchmark's GEMMs run alone."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
    ks = [(e["ts"], e["ts"] + e["dur"], e["name"], e.get("args", {}).get("stream"))
          for e in trace.get("traceEvents", []) if e.get("cat") == "kernel"]
    gemms = [k for k in ks if is_gemm_kernel(k[2])]
    others = sorted(k for k in ks if not is_gemm_kernel(k[2]))
    by: dict[str, float] = collections.defaultdict(float)
    for s, e, _, _ in gemms:
        for os_, oe, name, stream in others:
            if os_ >= e:
                break
            if oe > s:
                by[f"stream {stream}: {name[:90]}"] += min(e, oe) - max(s, os_)
    return {"gemm_us": sum(e - s for s, e, _, _ in gemms), "overlapped_us": sum(by.values()),
            "gemm_streams": sorted({str(k[3]) for k in gemms}),
            "top_overlapping": sorted(by.items(), key=lambda kv: -kv[1])[:8]}


def job_side(recipe: str, layers: int, steps: int):
    cap, tp = profiled_steps(recipe, codonfm(layers), steps, bias=False)
    per: dict[tuple[str, str], list[tuple[str, float]]] = collections.defaultdict(list)
    for name, ks in kernels_under(tp, "te_gemm: ").items():
        parts = name[len("te_gemm: "):].split()
        per[(parts[1], parts[2])] += ks  # (pass, MxKxN)
    ov = overlap_report(tp)
    return cap, {k: _summary(v) for k, v in per.items()}, ov


def bench_side(cap, recipe: str) -> dict[tuple[str, str], dict]:
    out = {}
    seen = set()
    for item in items_from_capture(cap):
        if item.fprop.mkn in seen:
            continue
        seen.add(item.fprop.mkn)
        with torch.profiler.profile(activities=ACTS) as tp:
            te_job(item, recipe, ["prequantized"], None)
            torch.cuda.synchronize()
        for name, ks in kernels_under(tp, "te_gemm_bench: ").items():
            op = name.split(": ")[1]
            shape = {str(g.op): g for g in gemm_passes(item.fprop)}[op]
            out[(op, shape.mkn)] = _summary(ks)
    return out


def fillers() -> dict:
    """What runs between two timed GEMM calls (outside their events): nothing (the microbenchmark's
    default), its L2 flush, a memory-bound copy like the casts and norms around a job's GEMMs, or an
    idle spin. If a GEMM's time moves with what ran before it, the job's context is the difference."""
    a = torch.empty(2**29, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    return {"none": None, "l2_flush": L2Flush(), "copy_1GB": lambda: b.copy_(a),
            "idle_0.3ms": lambda: torch.cuda._sleep(600_000)}


def bench_with_fillers(cap, recipe: str, fills: dict) -> dict[tuple[str, str], dict[str, float]]:
    out: dict[tuple[str, str], dict[str, float]] = collections.defaultdict(dict)
    items = {i.fprop.mkn: i for i in items_from_capture(cap)}.values()
    for fname, fn in fills.items():
        for item in items:
            times = te_job(item, recipe, ["prequantized"], fn)
            for (op, _mode), ts in times.items():
                shape = {g.op: g for g in gemm_passes(item.fprop)}[op]
                out[(str(op), shape.mkn)][fname] = statistics.median(ts)
    return out


def check_kernels(a: argparse.Namespace) -> dict[str, Any]:
    warm_up_gpu(1.0)
    fills = fillers()
    rows, overlaps = [], {}
    for recipe in a.recipes.split(","):
        av = availability(recipe)
        if not av.ok:
            print(f"{recipe}: skipped: {av.reason}")
            continue
        cap, job, ov = job_side(recipe, a.layers, a.steps)
        overlaps[recipe] = ov
        bench = bench_side(cap, recipe)
        filled = bench_with_fillers(cap, recipe, fills)
        print(f"{recipe}: job GEMM kernels {ov['gemm_us'] / 1e3:.1f} ms, overlapped by other kernels "
              f"{ov['overlapped_us'] / 1e3:.3f} ms (GEMM streams {ov['gemm_streams']})")
        for name, us in ov["top_overlapping"]:
            print(f"    overlapping {us / 1e3:8.3f} ms  {name}")
        for key in sorted(job):
            j, b = job[key], bench.get(key)
            row = {"recipe": recipe, "op": key[0], "shape": key[1], "job": j, "bench": b,
                   "same_kernel": b is not None and b["kernel"] == j["kernel"],
                   "bench_over_job": b["median_us"] / j["median_us"] if b else None,
                   "bench_ms_after": filled.get(key, {})}
            rows.append(row)
            bk = b["kernel"][:60] if b else "-"
            print(f"  {key[0]:5s} {key[1]:18s} job {j['median_us']:8.1f} us {j['kernel'][:60]:60s} | bench "
                  f"{(b or {}).get('median_us', float('nan')):8.1f} us "
                  f"{'same kernel' if row['same_kernel'] else bk} | ratio {row['bench_over_job'] or float('nan'):.3f}")
            after = row["bench_ms_after"]
            print("        bench/job after a filler: " + ", ".join(
                f"{f} {1e3 * ms / j['median_us']:.3f}" for f, ms in after.items()))
    same = sum(r["same_kernel"] for r in rows)
    print(f"same kernel in job and bench: {same}/{len(rows)}")
    return {"rows": rows, "overlap": overlaps}


# --- burst --------------------------------------------------------------------------------------
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
    from te_gemm_callback.microbench import timing

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


def check_burst(a: argparse.Namespace) -> dict[str, Any]:
    if a.recovery:
        warm_up_gpu(1.0)
        return recovery(a.recovery)
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
    return {"calls": a.calls, "rows": rows}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("check", nargs="?", default="times", choices=("times", "kernels", "burst"))
    p.add_argument("--layers", type=int, default=4, help="times, kernels: layers of the CodonFM-layer stack")
    p.add_argument("--steps", type=int, help="times, kernels: profiled training steps (6; kernels 3)")
    p.add_argument("--recipes", help="recipes (times, kernels: the four Hopper ones; burst: BF16,Float8CurrentScaling)")
    p.add_argument("--flush-l2", action="store_true", help="times: flush L2 between timed calls in the microbenchmark")
    p.add_argument("--visits", type=int, help="times: microbenchmark visits per job (default 16 on a GPU)")
    p.add_argument("--gemm-duty", type=float, default=None,
                   help="times: microbenchmark GEMM duty (default 0.75; te-gemm bench --gemm-duty)")
    p.add_argument("--duty-from-job", action="store_true",
                   help="times: microbenchmark each recipe at its job's measured GEMM share of the step")
    p.add_argument("--bias", action="store_true",
                   help="times: layers with biases (TE's default): the job's fprop GEMMs then carry a bias epilogue "
                        "that the microbenchmark's bias-free te.Linear does not")
    p.add_argument("--calls", type=int, default=400, help="burst: back-to-back calls per pass")
    p.add_argument("--shapes", default="15872x4096x4096,15872x4096x16384", help="burst: MxKxN shapes")
    p.add_argument("--idle-s", type=float, default=1.0, help="burst: idle time before each burst")
    p.add_argument("--recovery", type=int, default=0, metavar="REPS",
                   help="burst: instead, how much boost an idle gap gives back, how much load spends it (REPS repeats)")
    p.add_argument("--json")
    a = p.parse_args()
    if not torch.cuda.is_available():
        p.exit(2, "bench_vs_job.py: error: needs a CUDA GPU with transformer-engine\n")
    a.steps = a.steps or (3 if a.check == "kernels" else 6)
    hopper = "BF16,DelayedScaling,Float8CurrentScaling,Float8BlockScaling"
    a.recipes = a.recipes or ("BF16,Float8CurrentScaling" if a.check == "burst" else hopper)
    res = {"times": check_times, "kernels": check_kernels, "burst": check_burst}[a.check](a)
    if a.json:
        Path(a.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                            "check": a.check, "layers": a.layers, **res}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
