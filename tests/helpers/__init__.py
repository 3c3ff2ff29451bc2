"""What tests of several folders share: stand-ins for what cannot run on a CPU-only machine, small
models and jobs, hand-made captures and benches."""

import importlib
from types import ModuleType


def import_example(name: str) -> ModuleType:
    """A training recipe from recipes/ as a module (its ``main(argv)`` runs it)."""
    return importlib.import_module(f"te_gemm_callback.recipes.{name}")
