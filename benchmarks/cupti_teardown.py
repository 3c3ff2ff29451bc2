#!/usr/bin/env python
"""Does a kernels step leave the job's kernel launches slower? Host µs per launch of a tiny kernel
before and after one torch.profiler session (CUDA kernels only), in a fresh process.

    python benchmarks/cupti_teardown.py plain     # torch.profiler as is
    python benchmarks/cupti_teardown.py ours      # KernelProfile (TEARDOWN_CUPTI=1, kept set after it)
    python benchmarks/cupti_teardown.py restored  # TEARDOWN_CUPTI=1 for the session only, unset at its end
    python benchmarks/cupti_teardown.py none      # no session: the host's own drift while it idles
    python benchmarks/cupti_teardown.py ours --until 60   # probes up to 60 s after the session
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

from instrument_cost import launch_cost_us as launch_us  # this script's folder
from te_gemm_callback.capture.kernel_records import KernelProfile


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("which", nargs="?", default="ours", choices=("ours", "plain", "restored", "none"))
    p.add_argument("--until", type=float, default=8.0, help="last probe, seconds after the session")
    a = p.parse_args()
    which = a.which
    before = launch_us()
    n = 0
    if which == "none":  # the same probes with no session: what idling between probes does alone
        launch_us(200, 1)
    elif which == "ours":
        kp = KernelProfile()
        kp.start()
        launch_us(200, 1)
        n = sum(len(st.kernels) for st in kp.stop() or [])
    elif which == "restored":
        os.environ["TEARDOWN_CUPTI"] = "1"
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            launch_us(200, 1)
        del os.environ["TEARDOWN_CUPTI"]
        n = sum("CUDA" in str(getattr(e, "device_type", "")) for e in prof.events())
    elif which == "plain":
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            launch_us(200, 1)
        n = sum("CUDA" in str(getattr(e, "device_type", "")) for e in prof.events())
    # Short probes right after the session, then later: an asynchronous teardown shows as a launch
    # cost that falls back over time.
    t0 = time.perf_counter()
    timeline = []
    for wait in [w for w in (0.0, 0.2, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0, 120.0) if w <= a.until]:
        time.sleep(max(0.0, t0 + wait - time.perf_counter()))
        timeline.append((time.perf_counter() - t0, launch_us(1000, 5)))
    after = ", ".join(f"{us:.2f} at {t:.2f} s" for t, us in timeline)
    print(f"{which}: host µs per launch {before:.2f} before; after the session: {after} "
          f"({n} kernels recorded; TEARDOWN_CUPTI now {os.environ.get('TEARDOWN_CUPTI')!r})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
