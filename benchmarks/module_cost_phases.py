"""Where the module benchmark's cold time goes (microbench/module_cost.py), in a fresh process after
the GEMM bench of the same capture as `te-gemm run` runs them: each recipe's first passes, the host
rounds, the GPU rows, the recording taxes; with `--host-tokens N` the host rounds run on N tokens
instead of the captured input (each new shape paying its own first calls), and the rows are printed
to set beside the default's. Needs a GPU and TE. In a fresh process the first calls include what
the job itself would have paid before (TE's torch.compile'd fusions): the job's figure is the
bench.json of a `te-gemm run`.

    python benchmarks/module_cost_phases.py docs/results/h200/replay/main [--host-tokens 256] [--json OUT]
"""
import argparse
import json
import sys
import time
from pathlib import Path

from te_gemm_callback.capture import GemmCapture
from te_gemm_callback.microbench import module_cost as mc
from te_gemm_callback.microbench.cache import ResultCache
from te_gemm_callback.microbench.engine import run_bench
from te_gemm_callback.microbench.items import items_from_capture

RECIPES = ["BF16", "DelayedScaling", "Float8CurrentScaling", "Float8BlockScaling"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--host-tokens", type=int, help="host rounds on this many tokens (default: the captured input)")
    ap.add_argument("--no-bench", action="store_true", help="skip the GEMM bench before (its first calls too)")
    ap.add_argument("--json")
    a = ap.parse_args()
    cap = GemmCapture.load(a.run / "gemm_capture.json")
    t0 = time.perf_counter()
    if not a.no_bench:  # as te-gemm run: the GEMM cells first, in this process, no cache
        run_bench(items_from_capture(cap), RECIPES, ("autocast", "prequantized"), cache=ResultCache(enabled=False),
                  progress=False)
    bench_s = time.perf_counter() - t0
    if a.host_tokens:
        mc.HOST_TOKENS = a.host_tokens
    first: list[tuple[str, int, str, float]] = []
    passes = mc._Run.passes

    def timed(self, n, which="host"):
        # No sync here: a host round's calls must stay behind its busy kernel, as in production.
        t = time.perf_counter()
        out = passes(self, n, which)
        first.append((self.recipe, n, which, round((time.perf_counter() - t) * 1e3, 2)))
        return out

    mc._Run.passes = timed
    t0 = time.perf_counter()
    costs = mc.measure_module_costs(cap.meta["te_modules"], RECIPES)
    out = {"bench_s": round(bench_s, 2), "module_s": round(time.perf_counter() - t0, 2),
           "host_tokens": mc.HOST_TOKENS or "captured", "phases_s": costs["phases_s"],
           "calls_ms": first, "rows": costs["kinds"]}
    print(json.dumps({k: v for k, v in out.items() if k not in ("rows", "calls_ms")}))
    for key, row in costs["kinds"].items():
        print(key[:70])
        for r, v in row.items():
            print(f"  {r:22s} host fwd {v.get('host_fwd_us', 0):8.1f} bwd {v.get('host_bwd_us', 0):8.1f} us, "
                  f"non-GEMM GPU {v.get('gpu_other_us', 0):8.1f} us")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
