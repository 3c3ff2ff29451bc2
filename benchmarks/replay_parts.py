"""Where the replay's predicted step differs from the sweep's measured one, per recipe, from a run
folder's files alone (no GPU): the replayed step's GEMM kernel time, other kernel time and host
time against the same recipe's kernels step in the sweep (sweep/<recipe>/gemm_capture.json), and
the SM clock each capture sampled. Ratios to BF16 on both sides, so a clock or host offset common
to every recipe cancels and what is left is the recipe's own difference. The replay's other kernel
time holds the GPU's gap between queued kernels for each kernel a recipe adds (the sweep's sum is
kernel durations alone), so its "other - BF16" runs a little high by construction.

    python benchmarks/replay_parts.py docs/results/h200/replay/main    # JSON to --json PATH
"""
import argparse
import json
import sys
from pathlib import Path

from te_gemm_callback.analysis import whatif
from te_gemm_callback.analysis.replay import replay
from te_gemm_callback.capture import GemmCapture
from te_gemm_callback.capture.kernels import is_gemm_kernel
from te_gemm_callback.microbench.results import BenchResults

RECIPES = ("BF16", "DelayedScaling", "Float8CurrentScaling", "Float8BlockScaling")


def replayed(cap, bench, recipe, base):
    """(GEMM ms, other kernel ms, host ms, step ms) of ``cap``'s kernels step replayed in ``recipe``."""
    costs = bench.meta.get("module_costs")
    trace, _ = whatif.job_trace(cap, costs)
    tr = whatif.transform(trace, cap, whatif._gemm_ratio(cap, bench, recipe, base),
                          whatif._module_deltas(cap, costs, recipe, base))
    gemm = sum(op.dur for c in tr.calls for op in c.ops if op.gemm is not None or op.category == "gemm")
    other = sum(op.dur for c in tr.calls for op in c.ops if not (op.gemm is not None or op.category == "gemm"))
    r = replay(tr)
    return gemm / 1e3, other / 1e3, r.host_us / 1e3, r.step_ms


def measured(cap):
    """(GEMM ms, other kernel ms, clean step ms, SM clock MHz) of a sweep capture's kernels step."""
    tl = cap.kernel_timeline
    gemm = sum(k[2] for k in tl.kernels if is_gemm_kernel(tl.names[k[0]])) / 1e3
    other = sum(k[2] for k in tl.kernels if not is_gemm_kernel(tl.names[k[0]])) / 1e3
    clock = (cap.meta.get("clocks_during_capture") or {}).get("sm_clock_mhz_median")
    return gemm, other, cap.step_ms(), clock


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--json")
    a = ap.parse_args()
    job = GemmCapture.load(a.run / "gemm_capture.json")
    bench = BenchResults.load(a.run / "bench.json")
    base = job.meta.get("recipe") or "BF16"
    rows = {}
    for r in RECIPES:
        path = a.run / "sweep" / r / "gemm_capture.json"
        if not path.is_file() or r not in bench.precisions:
            continue
        g, o, h, s = replayed(job, bench, r, base)
        mg, mo, ms, clock = measured(GemmCapture.load(path))
        rows[r] = {"replay": {"gemm_ms": g, "other_ms": o, "host_ms": h, "step_ms": s},
                   "sweep": {"gemm_ms": mg, "other_ms": mo, "step_ms": ms, "sm_clock_mhz": clock}}
    if "BF16" not in rows:
        print("no BF16 sweep capture to set the recipes against", file=sys.stderr)
        return 1
    b = rows["BF16"]
    print(f"{'recipe':22s} {'GEMM vs BF16: replay / sweep':>30s} {'other - BF16 ms: replay / sweep':>32s} "
          f"{'step vs BF16: replay / sweep':>30s} {'SM clock MHz':>13s}")
    for r, x in rows.items():
        p, m = x["replay"], x["sweep"]
        x["gemm_ratio"] = [p["gemm_ms"] / b["replay"]["gemm_ms"], m["gemm_ms"] / b["sweep"]["gemm_ms"]]
        x["other_extra_ms"] = [p["other_ms"] - b["replay"]["other_ms"], m["other_ms"] - b["sweep"]["other_ms"]]
        x["step_ratio"] = [p["step_ms"] / b["replay"]["step_ms"], m["step_ms"] / b["sweep"]["step_ms"]]
        print(f"{r:22s} {x['gemm_ratio'][0]:14.3f} / {x['gemm_ratio'][1]:.3f}      "
              f"{x['other_extra_ms'][0]:14.2f} / {x['other_extra_ms'][1]:.2f}      "
              f"{x['step_ratio'][0]:14.3f} / {x['step_ratio'][1]:.3f}   {m['sm_clock_mhz'] or '-':>10}")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
