#!/usr/bin/env python
"""Does a kernels step leave the job's kernel launches slower? Host µs per launch of a tiny kernel
before and after one torch.profiler session (CUDA kernels only), in a fresh process.

    python benchmarks/cupti_teardown.py plain   # torch.profiler as is
    python benchmarks/cupti_teardown.py ours    # KernelProfile (sets TEARDOWN_CUPTI=1 for its session)
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import torch

from te_gemm_callback.capture.kernel_records import KernelProfile


def launch_us(n: int = 2000, reps: int = 15) -> float:
    x = torch.zeros(16, device="cuda")
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()  # outside the timed launches
        t0 = time.perf_counter()
        for _ in range(n):
            x.add_(1.0)
        out.append((time.perf_counter() - t0) / n * 1e6)
    torch.cuda.synchronize()
    return statistics.median(out)


def main() -> int:
    which = sys.argv[1] if len(sys.argv) > 1 else "ours"
    before = launch_us()
    if which == "ours":
        kp = KernelProfile()
        kp.start()
        launch_us(200, 1)
        n = len(kp.stop().kernels)
    else:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            launch_us(200, 1)
        n = sum("CUDA" in str(getattr(e, "device_type", "")) for e in prof.events())
    after = launch_us()
    time.sleep(0.5)
    later = launch_us()
    print(f"{which}: host µs per launch {before:.2f} before, {after:.2f} after, {later:.2f} 0.5 s later "
          f"({n} kernels recorded; TEARDOWN_CUPTI now {os.environ.get('TEARDOWN_CUPTI')!r})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
