"""Where the replay's predicted step differs from the sweep's measured one, per recipe, from a run
folder's files alone (no GPU): the replayed step's GEMM kernel time, other kernel time and host
time against the same recipe's kernels step in the sweep (sweep/<recipe>/gemm_capture.json), and
the SM clock each capture sampled. Ratios to BF16 on both sides, so a clock or host offset common
to every recipe cancels and what is left is the recipe's own difference. The replay's other kernel
time holds the GPU's gap between queued kernels for each kernel a recipe adds (the sweep's sum is
kernel durations alone), so its "other - BF16" runs a little high by construction.

Then, per pass (fprop, dgrad, wgrad) of the TE GEMMs, the bench's pre-quantized recipe / BF16 time
ratio over the same ratio of the sweep's in-job GEMM records: above 1, the bench makes the recipe's
GEMMs gain less than they did in the job.

    python benchmarks/replay_parts.py docs/results/h200/replay/main    # JSON to --json PATH
"""
import argparse
import json
import statistics
import sys
from pathlib import Path

from te_gemm_callback.analysis import whatif
from te_gemm_callback.analysis.replay import replay
from te_gemm_callback.capture import GemmCapture
from te_gemm_callback.capture.kernels import is_gemm_kernel
from te_gemm_callback.microbench.results import BenchResults

RECIPES = ("BF16", "DelayedScaling", "Float8CurrentScaling", "Float8BlockScaling")


def replayed(cap, bench, recipe, base):
    """(GEMM ms, other kernel ms, host ms, step ms) of ``cap``'s kernels step replayed in ``recipe``; None
    without host calls."""
    costs = bench.meta.get("module_costs")
    got = whatif.job_trace(cap, costs)
    if got is None:  # a capture of a version that kept no host calls: no replay
        return None
    trace, _ = got
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


def by_pass(bench, swept, bf16, recipe):
    """{pass: bench ratio / in-job ratio} of the TE GEMMs, recipe over BF16, weighted by calls per step."""
    sums = {}
    for a, b in zip(swept.records, bf16.records):
        if a.source != "te" or not a.times_ms or not b.times_ms:
            continue
        ca, cb = (bench.get(a.shape, r, "prequantized", None) for r in (recipe, "BF16"))
        if ca is None or cb is None or not (ca.ok and cb.ok):
            continue
        t = sums.setdefault(a.op, [0.0, 0.0, 0.0, 0.0])
        for i, v in enumerate((statistics.median(a.times_ms), statistics.median(b.times_ms),
                               ca.median_ms, cb.median_ms)):
            t[i] += v * a.calls_per_step
    return {op: (t[2] / t[3]) / (t[0] / t[1]) for op, t in sorted(sums.items())}


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
        mg, mo, ms, clock = measured(GemmCapture.load(path))
        rows[r] = {"sweep": {"gemm_ms": mg, "other_ms": mo, "step_ms": ms, "sm_clock_mhz": clock}}
        if (got := replayed(job, bench, r, base)) is not None:
            rows[r]["replay"] = dict(zip(("gemm_ms", "other_ms", "host_ms", "step_ms"), got))
    if "BF16" not in rows:
        print("no BF16 sweep capture to set the recipes against", file=sys.stderr)
        return 1
    b = rows["BF16"]
    if "replay" not in b:
        print("the job's capture holds no host calls (an older version's): no replay, the per-pass ratios only")
    print(f"{'recipe':22s} {'GEMM vs BF16: replay / sweep':>30s} {'other - BF16 ms: replay / sweep':>32s} "
          f"{'step vs BF16: replay / sweep':>30s} {'SM clock MHz':>13s}")
    for r, x in rows.items() if "replay" in b else ():
        p, m = x["replay"], x["sweep"]
        x["gemm_ratio"] = [p["gemm_ms"] / b["replay"]["gemm_ms"], m["gemm_ms"] / b["sweep"]["gemm_ms"]]
        x["other_extra_ms"] = [p["other_ms"] - b["replay"]["other_ms"], m["other_ms"] - b["sweep"]["other_ms"]]
        x["step_ratio"] = [p["step_ms"] / b["replay"]["step_ms"], m["step_ms"] / b["sweep"]["step_ms"]]
        print(f"{r:22s} {x['gemm_ratio'][0]:14.3f} / {x['gemm_ratio'][1]:.3f}      "
              f"{x['other_extra_ms'][0]:14.2f} / {x['other_extra_ms'][1]:.2f}      "
              f"{x['step_ratio'][0]:14.3f} / {x['step_ratio'][1]:.3f}   {m['sm_clock_mhz'] or '-':>10}")
    bf16 = GemmCapture.load(a.run / "sweep" / "BF16" / "gemm_capture.json")
    print("\nbench / in-job GEMM ratio to BF16, pre-quantized cells, per pass (1.000: the bench gains as the job)")
    for r in rows:
        if r != "BF16":
            x = rows[r]["bench_over_job"] = by_pass(bench, GemmCapture.load(a.run / "sweep" / r / "gemm_capture.json"),
                                                    bf16, r)
            print(f"{r:22s} " + "  ".join(f"{op} {v:.3f}" for op, v in x.items()))
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
