#!/usr/bin/env python
"""Two `te-gemm bench` processes on one cache file, N rounds: is any cell lost, is the file ever torn?

Each round both processes measure shapes of their own (CPU is enough: the cache is the point) and
save into the same cache at about the same time; afterwards the cache must hold every cell of
every round and parse.

    python benchmarks/cache_race.py --rounds 20
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=20)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache.json"
        expected, torn = 0, 0
        for i in range(a.rounds):
            procs = []
            for side in (0, 1):
                s = 16 + 8 * (2 * i + side)  # a shape no other process measures: 3 cells (fprop, dgrad, wgrad)
                procs.append(subprocess.Popen([sys.executable, "-m", "te_gemm_callback.cli", "bench", "--shapes",
                                               f"{s}x{s}x{s}", "--precisions", "BF16", "--cache", str(cache),
                                               "--visits", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
            for proc in procs:
                _, err = proc.communicate()
                if proc.returncode:
                    print(err.decode()[-500:], file=sys.stderr)
                    return 1
            expected += 6
            try:
                have = len(json.loads(cache.read_text())["results"])
            except ValueError:
                torn += 1
                have = -1
            print(f"round {i + 1}: {have} cells in the cache, {expected} expected", flush=True)
        ok = have == expected and torn == 0
        print(f"{a.rounds} rounds: {have} of {expected} cells kept, {torn} torn reads -> {'OK' if ok else 'LOST DATA'}")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
