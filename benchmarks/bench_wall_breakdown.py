#!/usr/bin/env python
"""Where a cold `te-gemm bench` / scripts/benchmark.py process spends its wall time before and
around the measurement.

Each phase runs in a fresh interpreter, as a user's command would: Python with torch, + CUDA
context, + `import transformer_engine.pytorch` (twice: the first may read the files from disk), and
the 15 slowest modules of TE's import (`python -X importtime`, cumulative microseconds).

    python benchmarks/bench_wall_breakdown.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

PHASES = {
    "python + import torch": "import torch",
    "+ CUDA context": "import torch; torch.zeros(1, device='cuda'); torch.cuda.synchronize()",
    "+ import transformer_engine.pytorch (1st)": "import torch; import transformer_engine.pytorch",
    "+ import transformer_engine.pytorch (2nd)": "import torch; import transformer_engine.pytorch",
    "+ both": "import torch; torch.zeros(1, device='cuda'); import transformer_engine.pytorch",
    "+ matplotlib and rich": "import torch, matplotlib.pyplot, rich.progress",
}


def wall(code: str) -> float | None:
    """Seconds for a fresh interpreter to run ``code``; None where it fails (no CUDA, no TE)."""
    t = time.perf_counter()
    if subprocess.run([sys.executable, "-c", code], capture_output=True).returncode != 0:
        return None
    return time.perf_counter() - t


def slowest_imports(code: str, n: int = 15) -> list[tuple[int, str]]:
    err = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True).stderr
    rows = []
    for line in err.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            rows.append((int(parts[1]), parts[2].rstrip()))
    return sorted(rows, reverse=True)[:n]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json")
    a = p.parse_args()
    res = {name: wall(code) for name, code in PHASES.items()}
    for name, s in res.items():
        print(f"{name:45s} " + ("failed (no CUDA or no TE here)" if s is None else f"{s:6.2f} s"))
    top = slowest_imports("import torch; import transformer_engine.pytorch")
    print("slowest imports under `import transformer_engine.pytorch` (cumulative ms):")
    for us, mod in top:
        print(f"  {us / 1e3:9.1f}  {mod}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"wall_s": res, "slowest_imports_us": top}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
