#!/usr/bin/env python
"""Which kernel the training job and the microbenchmark launch for the same GEMM, and how long each runs.

The bench-vs-job gap this was written for (docs/results/h200.md): pre-quantized microbenchmark cells time 3-15%
below the same GEMM inside training steps of the CodonFM-layer te.TransformerLayer stack. This names the
kernels both sides launched per (recipe, pass, shape), with CUPTI durations from torch.profiler:
a different kernel name means the microbenchmark does not reproduce the job's call; the same name
with a different duration points at the conditions (clock, memory, concurrent kernels). It also
reports how much of the job's GEMM kernel time another kernel overlapped (a second stream taking SMs).

    python benchmarks/kernel_match.py --layers 4 --steps 3 --json out.json
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from te_gemm_callback.bench.cells import items_from_capture  # noqa: E402
from te_gemm_callback.bench.jobs import te_job  # noqa: E402
from te_gemm_callback.bench.timing import L2Flush, warm_up_gpu  # noqa: E402
from te_gemm_callback.kernels import is_gemm_kernel  # noqa: E402
from te_gemm_callback.models import codonfm  # noqa: E402
from te_gemm_callback.precisions import availability  # noqa: E402
from te_gemm_callback.shapes import gemm_passes  # noqa: E402
from validate_capture import profiled_steps  # noqa: E402  (this script's folder)

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
    for s, e, _, gstream in gemms:
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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--recipes", default="BF16,DelayedScaling,Float8CurrentScaling,Float8BlockScaling")
    p.add_argument("--json")
    a = p.parse_args()
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
    if a.json:
        Path(a.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                            "rows": rows, "overlap": overlaps}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
