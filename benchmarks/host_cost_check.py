"""The module benchmark's host cost per recipe against the job's own, from one run folder with a
sweep: per FP8 recipe, the module benchmark's host difference to BF16 summed over the job's TE
modules (bench.json ``meta.module_costs``), beside the difference of the sweep's clean steps and
of the kernels steps' host time (less the recording taxes). No GPU needed.

    python benchmarks/host_cost_check.py runs/gpt_neox_host
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", help="a run folder with bench.json and sweep/<recipe>/gemm_capture.json")
    a = p.parse_args()
    from te_gemm_callback.analysis.whatif import step_trace
    from te_gemm_callback.capture.capture_file import GemmCapture

    run = Path(a.run)
    costs = json.loads((run / "bench.json").read_text())["meta"].get("module_costs")
    sweep = {d.name: GemmCapture.load(d / "gemm_capture.json") for d in sorted((run / "sweep").glob("*"))
             if (d / "gemm_capture.json").exists()}
    if not costs or "BF16" not in sweep:
        raise SystemExit(f"{run}: needs bench.json with module_costs and a sweep with BF16")
    tax = (costs.get("cupti_call_tax_us") or 0.0, costs.get("profiler_op_tax_us") or 0.0)

    def host_ms(cap: GemmCapture) -> float | None:
        t = step_trace(cap, *tax)
        return sum(c.gap + c.cost for c in t.calls) / 1e3 if t else None

    def bench_ms(recipe: str) -> float:
        total = 0.0
        for key in costs["modules"].values():
            r, b = costs["kinds"][key].get(recipe, {}), costs["kinds"][key].get("BF16", {})
            total += r["host_fwd_us"] + r["host_bwd_us"] - b["host_fwd_us"] - b["host_bwd_us"]
        return total / 1e3

    base = sweep["BF16"]
    print(f"{run}: {len(costs['modules'])} TE modules; recipe less BF16, ms per step")
    print(f"{'recipe':22s} {'module bench':>12s} {'clean steps':>12s} {'ratio':>6s} {'kernels step host':>18s}")
    for recipe, cap in sweep.items():
        if recipe == "BF16" or not all(recipe in row for row in costs["kinds"].values()):
            continue
        b, c = bench_ms(recipe), cap.step_ms() - base.step_ms()
        h = (host_ms(cap) or 0.0) - (host_ms(base) or 0.0)
        print(f"{recipe:22s} {b:12.2f} {c:12.2f} {b / c if c else float('nan'):6.2f} {h:18.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
