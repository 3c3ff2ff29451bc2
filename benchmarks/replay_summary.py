"""A run folder's replay against its sweep, and what the module benchmark cost it: per recipe the
predicted step speedup with its band, the GEMMs-alone figure and the observed median with its 95%
interval (the miss, whether the interval holds the prediction and the band the median); the GEMM
bench's and the module benchmark's wall times (share of the bench, phases). Offline, from the
files a `te-gemm run` or a recipe with a sweep wrote.

    python benchmarks/replay_summary.py runs/demo runs/dense_host [--json OUT]
"""
import argparse
import json
import sys
from pathlib import Path


def summary(run: Path) -> dict:
    rep = json.loads((run / "report.json").read_text())
    meta = json.loads((run / "bench.json").read_text())["meta"]
    mc = meta.get("module_costs") or {}
    out = {"run": str(run), "step_ms": round(rep["step_ms"], 2), "bench_s": round(meta["wall_s"], 2),
           "module_s": mc.get("wall_s"), "module_share": round(mc.get("wall_s", 0) / meta["wall_s"], 3),
           "phases_s": mc.get("phases_s"), "cached": mc.get("cached"), "recipes": {}}
    for x in rep["recipes"]:
        if x.get("observed_ci") is None or x.get("predicted_step_speedup") is None or x["recipe"] == rep.get(
                "current_recipe"):
            continue
        p, o, ci, band = (x["predicted_step_speedup"], x["observed_step_speedup"], x["observed_ci"],
                          x["predicted_band"])
        out["recipes"][x["recipe"]] = {
            "predicted": round(p, 3), "band": [round(v, 3) for v in band],
            "gemms_alone": round(x["predicted_gemms_alone"], 3),
            "observed": round(o, 3), "ci": [round(v, 3) for v in ci], "miss_pct": round(100 * (p / o - 1), 1),
            "in_ci": ci[0] <= p <= ci[1], "band_covers": band[0] <= o <= band[1], "bound": x.get("predicted_bound")}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--json")
    a = ap.parse_args()
    got = [summary(r) for r in a.runs]
    for s in got:
        print(f"{s['run']}: step {s['step_ms']} ms; GEMM bench {s['bench_s']} s, module benchmark {s['module_s']} s "
              f"({100 * s['module_share']:.1f}%), phases {s['phases_s']}, cached rows {s['cached']}")
        for r, v in s["recipes"].items():
            lo, hi = v["band"]
            print(f"  {r:22s} predicted {v['predicted']:.3f} (band {lo:.3f}-{hi:.3f}, GEMMs alone "
                  f"{v['gemms_alone']:.3f}) observed {v['observed']:.3f} ({v['ci'][0]:.3f}-{v['ci'][1]:.3f}) "
                  f"miss {v['miss_pct']:+.1f}%, in interval {v['in_ci']}, band covers {v['band_covers']}, "
                  f"{v['bound']}-bound")
    if a.json:
        Path(a.json).write_text(json.dumps(got, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
