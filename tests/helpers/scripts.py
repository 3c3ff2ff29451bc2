"""Load a script of benchmarks/ as a module, for the tests of what it computes."""

import importlib.util
from pathlib import Path


def benchmark(name: str):
    path = Path(__file__).resolve().parents[2] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
