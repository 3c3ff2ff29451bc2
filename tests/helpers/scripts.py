"""Load a script of benchmarks/ as a module, for the tests of what it computes."""

import importlib.util
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def benchmark(name: str):
    # The scripts import their siblings by name, as they do when run (their folder is sys.path[0]).
    if str(BENCHMARKS) not in sys.path:
        sys.path.append(str(BENCHMARKS))
    path = BENCHMARKS / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
