"""The module benchmark's non-GEMM kernels against the job's, per kernel (offline, from a run folder).

For the job's capture and each sweep capture (sweep/<recipe>/gemm_capture.json): each non-GEMM kernel's
time in the kernels step beside what the module benchmark's rows (bench.json ``meta.module_costs``) give
for the same kernel summed over the job's TE modules in that recipe. A ratio below 1: the job ran the
kernel faster than the bench did. Only kernel names the bench launched are listed; a generic one (an
elementwise kernel) also counts the job's launches outside TE modules. The summary ratio takes only kernels
launched as often on both sides (a kernel launched more often in the bench is once-per-step work the bench's
modules each paid; more often in the job, launches from elsewhere).

    python benchmarks/module_kernels.py RUN_DIR [--json PATH]
"""
import argparse
import collections
import json
import sys
from pathlib import Path

from te_gemm_callback.capture import GemmCapture
from te_gemm_callback.capture.kernels import is_gemm_kernel, kernel_key


def job_side(cap):
    """{kernel key: [launches, µs]} of the non-GEMM kernels in ``cap``'s kernels step, and its SM clock."""
    tl = cap.kernel_timeline
    out = collections.defaultdict(lambda: [0, 0.0])
    for k in tl.kernels:
        name = tl.names[k[0]]
        if not is_gemm_kernel(name):
            out[kernel_key(name)][0] += 1
            out[kernel_key(name)][1] += k[2]
    return out, (cap.meta.get("clocks_during_capture") or {}).get("sm_clock_mhz_median")


def bench_side(costs, recipe):
    """{kernel key: [launches, µs]} the module benchmark gives per step for the job's TE modules in ``recipe``."""
    out = collections.defaultdict(lambda: [0.0, 0.0])
    for key in costs.get("modules", {}).values():
        row = costs.get("kinds", {}).get(key, {}).get(recipe) or {}
        for k, (n, us) in (row.get("other_by_kernel") or {}).items():
            out[k][0] += n
            out[k][1] += us
    return out


def compare(job, bench):
    """Per kernel both ran: (job launches, job µs, bench launches, bench µs); and job over bench µs over the
    kernels launched as often on both sides (the same launches)."""
    rows = {k: (*job[k], *bench[k]) for k in bench if k in job}
    same = [r for r in rows.values() if abs(r[0] - r[2]) < 0.5]
    tb = sum(r[3] for r in same)
    return rows, (sum(r[1] for r in same) / tb if tb else None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--json")
    a = ap.parse_args()
    costs = json.loads((a.run / "bench.json").read_text())["meta"].get("module_costs") or {}
    if not any("other_by_kernel" in row for kind in costs.get("kinds", {}).values() for row in kind.values()):
        print(f"{a.run}/bench.json: the module benchmark kept no per-kernel times (an older version's)")
        return 1
    sides = {"job": GemmCapture.load(a.run / "gemm_capture.json")}
    for p in sorted((a.run / "sweep").glob("*/gemm_capture.json")):
        sides[p.parent.name] = GemmCapture.load(p)
    out = {}
    for label, cap in sides.items():
        recipe = cap.meta.get("recipe") or "BF16"
        job, clock = job_side(cap)
        rows, ratio = compare(job, bench_side(costs, recipe))
        out[label] = {"recipe": recipe, "sm_clock_mhz": clock, "job_over_bench": ratio,
                      "kernels": {k: {"job_launches": jn, "job_us": round(j, 1), "bench_launches": round(bn, 2),
                                      "bench_us": round(b, 1)} for k, (jn, j, bn, b) in rows.items()}}
        print(f"\n{label} ({recipe}, SM clock {clock or '-'} MHz): job / bench over the kernels launched as "
              f"often on both sides {ratio:.3f}" if ratio else f"\n{label} ({recipe}): no kernel launched as often")
        for k, (jn, j, bn, b) in sorted(rows.items(), key=lambda x: -x[1][3]):
            print(f"  {j / 1e3:8.3f} / {b / 1e3:8.3f} ms  {j / b if b else float('nan'):6.3f}  "
                  f"launches {jn:5d} / {bn:7.1f}  {k[:80]}")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
