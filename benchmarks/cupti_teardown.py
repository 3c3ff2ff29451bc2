#!/usr/bin/env python
"""Does a kernels step leave the job's kernel launches slower? Host µs per launch of a tiny kernel
before and after one torch.profiler session (CUDA kernels only), in a fresh process.

    python benchmarks/cupti_teardown.py plain   # torch.profiler as is
    python benchmarks/cupti_teardown.py ours    # KernelProfile (sets TEARDOWN_CUPTI=1 for its session)
"""

from __future__ import annotations

import os
import sys
import time

import torch

from instrument_cost import launch_cost_us as launch_us  # this script's folder
from te_gemm_callback.capture.kernel_records import KernelProfile


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
