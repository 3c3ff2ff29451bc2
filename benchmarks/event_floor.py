#!/usr/bin/env python
"""Event pairs against kernel records: what the capture's CUDA-event pairs read for a GEMM, with the
GPU gate ahead of the start event, with the 50 us spin that stands in without Triton, and bare.

Per shape (the dense example's lm_head GEMMs as autograd runs them, a 4096-wide projection, square
GEMMs from ~4 us to ~180 us, a one-element fill): the kernel time from CUPTI kernel records
(torch.profiler: the sum of the call's kernels), and each timer's raw pairs (``EventTimer``, no
floor taken off) with the host working 0 or 100 us between the start event and the launch (a slow
host: the dispatch mode, a profiler's API trace), and on an idle GPU. The "fill (one element)" row
is the floor the capture takes off each pair; the "empty pair" row, the events' own time.

    python benchmarks/event_floor.py --json OUT.json
    nsys profile -t cuda -s none --cpuctxsw=none python benchmarks/event_floor.py --events-only --json OUT.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from te_gemm_callback.capture.instruments import LEAD_CYCLES, EventTimer

# (name, m, k, n): Y = X W^T with X (m, k), W (n, k); the lm_head of recipes/dense.py is 15872 x 4096 x 128.
LINEARS = [("lm_head", 15872, 4096, 128), ("proj", 15872, 4096, 4096)]
SQUARES = [512, 1024, 2048, 4096]


def calls() -> list[tuple[str, object]]:
    """(label, zero-argument call) for each GEMM, operands made once."""
    out = []
    dev, dt = "cuda", torch.bfloat16
    for name, m, k, n in LINEARS:
        x, w, dy = (torch.randn(*s, device=dev, dtype=dt) for s in ((m, k), (n, k), (m, n)))
        # As autograd runs a linear layer: fprop mm(X, W^T); dgrad mm(dY, W); wgrad mm(dY^T, X).
        out += [(f"{name} fprop {m}x{k}x{n}", lambda x=x, w=w: torch.mm(x, w.t())),
                (f"{name} dgrad {m}x{n}x{k}", lambda dy=dy, w=w: torch.mm(dy, w)),
                (f"{name} wgrad {k}x{m}x{n}", lambda dy=dy, x=x: torch.mm(dy.t(), x))]
    for s in SQUARES:
        a, b = torch.randn(s, s, device=dev, dtype=dt), torch.randn(s, s, device=dev, dtype=dt)
        out.append((f"square {s}^3", lambda a=a, b=b: torch.mm(a, b)))
    z = torch.zeros(1, device=dev)
    out.append(("fill (one element)", z.zero_))
    return out


def kernel_records(fn, reps: int) -> dict:
    """Per call: sum of its kernels' durations, their span, their count (CUPTI through torch.profiler).
    Each call sits behind a spin kernel, which separates the calls in the record."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):  # cuBLAS picks and loads its kernel outside the records
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            torch.cuda._sleep(LEAD_CYCLES)
            fn()
        torch.cuda.synchronize()
    kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                     key=lambda e: e.time_range.start)
    groups, cur = [], None
    for e in kernels:
        if "spin_kernel" in e.name:  # torch.cuda._sleep's kernel
            if cur is not None:
                groups.append(cur)
            cur = []
        elif cur is not None:
            cur.append(e)
    if cur is not None:
        groups.append(cur)
    groups = [g for g in groups if g]
    if not groups:
        return {"error": "no kernel records"}
    sums = [sum(e.time_range.elapsed_us() for e in g) for g in groups]
    spans = [g[-1].time_range.end - g[0].time_range.start for g in groups]
    return {"kernel_us": statistics.median(sums), "span_us": statistics.median(spans),
            "kernels_per_call": statistics.median(len(g) for g in groups),
            "names": sorted({e.name[:80] for g in groups for e in g})}


def pairs(fn, timer: EventTimer, reps: int, delay_us: float, idle: bool) -> float:
    """Median us of ``timer``'s pairs around ``fn`` (as the timer reads them), the host working
    ``delay_us`` between the start event and the launch; on an idle GPU (a sync before each) or
    behind the previous call (the GPU kept busy)."""
    got = []
    for _ in range(reps):
        if idle:
            torch.cuda.synchronize()
        start = timer.start()
        until = time.perf_counter() + delay_us * 1e-6
        while time.perf_counter() < until:
            pass
        fn()
        got.append(timer.stop(start))
    torch.cuda.synchronize()
    ms = [m for p in got if (m := timer.elapsed_ms(p)) is not None]
    return statistics.median(ms) * 1e3 if ms else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--delays", default="0,100", help="host us between the start event and the launch")
    p.add_argument("--events-only", action="store_true", help="no kernel records (under nsys, which holds CUPTI)")
    a = p.parse_args()
    timers = {"gate": EventTimer(True), "spin": EventTimer(True), "bare": EventTimer(True, lead=False)}
    timers["gate"].prepare()
    if timers["gate"].gates.get(torch.cuda.current_device()) is None:
        del timers["gate"]
    dev = torch.cuda.current_device()
    floors = {}
    for name, t in timers.items():
        t.devices.add(dev)
        t.calibrate()  # the floor the capture takes off: a pair around a one-element fill
        floors[name] = t.floors.pop(dev) * 1e3  # the rows are raw pairs: none taken off here
    print("fill-pair floors (us):", json.dumps(floors), flush=True)
    rows = []
    for label, fn in [*calls(), ("empty pair", lambda: None)]:
        row = {"gemm": label}
        if not a.events_only and label != "empty pair":
            row.update(kernel_records(fn, a.reps))
        for name, t in timers.items():
            for d in (float(x) for x in a.delays.split(",")):
                row[f"{name} delay {d:g} us"] = pairs(fn, t, a.reps, d, idle=False)
            row[f"{name} idle"] = pairs(fn, t, a.reps, 0, idle=True)
        rows.append(row)
        print(json.dumps(row), flush=True)
    a.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                  "raw_pairs": True, "fill_floor_us": floors, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
