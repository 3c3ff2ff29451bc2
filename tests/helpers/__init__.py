"""Stand-ins shared by the tests, for what cannot run on a CPU-only machine."""

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def import_example(name: str) -> ModuleType:
    """A training example from examples/ as a module (its ``main(argv)`` runs it), without putting
    examples/ on sys.path: the examples import their shared ``_common`` by name, so it is loaded first."""
    for mod in ("_common", name):
        if mod not in sys.modules:
            spec = importlib.util.spec_from_file_location(mod, EXAMPLES / f"{mod}.py")
            module = importlib.util.module_from_spec(spec)
            sys.modules[mod] = module
            spec.loader.exec_module(module)
    return sys.modules[name]
