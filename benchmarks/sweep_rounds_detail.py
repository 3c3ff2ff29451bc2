#!/usr/bin/env python
"""Per-round detail of the in-job sweeps written by ``undisturbed.py sweep --out DIR``: for each
fit and recipe, the median step of each alternating round, the clock the kernels step ran at, and
the precisions and GEMM kernel time of its GEMMs (a recipe whose step time jumps between rounds or
fits: the clock, or the GEMMs?).

    python benchmarks/sweep_rounds_detail.py runs/undisturbed/sweep
"""

from __future__ import annotations

import statistics
import sys
from collections import Counter
from pathlib import Path

from te_gemm_callback import GemmCapture


def main() -> int:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/undisturbed/sweep")
    for path in sorted(root.glob("*/sweep/*/gemm_capture.json")):
        cap = GemmCapture.load(path)
        rounds: dict[int, list[float]] = {}
        for s in cap.steps_of("clean"):
            rounds.setdefault(-1 if s.round is None else s.round, []).append(s.ms)
        clocks = cap.meta.get("clocks_during_capture") or {}
        prec = Counter(r.precision for r in cap.records)
        kb = cap.meta.get("kernel_breakdown_ms") or {}
        print(f"{path.parts[-4]} {cap.meta.get('recipe')}: rounds " +
              ", ".join(f"{'capture' if k < 0 else k} {statistics.median(v):.1f}" for k, v in sorted(rounds.items())) +
              f" ms; kernels step clock {clocks.get('sm_clock_mhz_median')} MHz, {clocks.get('power_w_median')} W; "
              f"GEMM kernels {kb.get('gemm', float('nan')):.1f} ms of {sum(kb.values()):.1f}; precisions {dict(prec)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
