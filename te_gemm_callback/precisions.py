"""The precisions we compare, named after TE's recipes, and whether this machine can run them.

Transformer Engine is optional: it only installs on CUDA hosts. Every import of it goes through
:func:`import_te`, which turns the two common failures (not installed; cuDNN loaded from the
wrong library) into a message that says what to do.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from typing import Any, Iterable

# TE recipe class names, in the order tables print them. "BF16" means no FP8 autocast.
RECIPES: tuple[str, ...] = (
    "BF16",
    "DelayedScaling",
    "Float8CurrentScaling",
    "Float8BlockScaling",
    "MXFP8BlockScaling",
    "NVFP4BlockScaling",
)
ALIASES = {
    "bf16": "BF16", "fp8": "DelayedScaling", "fp8_delayed": "DelayedScaling", "delayed": "DelayedScaling",
    "fp8_current": "Float8CurrentScaling", "current": "Float8CurrentScaling",
    "fp8_block": "Float8BlockScaling", "block": "Float8BlockScaling",
    "mxfp8": "MXFP8BlockScaling", "nvfp4": "NVFP4BlockScaling",
}
# The TE availability function that decides each recipe, and the minimum compute capability
# TE documents for it (used only to word the reason when TE is absent).
_CHECKS = {
    "DelayedScaling": ("is_fp8_available", (8, 9)),
    "Float8CurrentScaling": ("is_fp8_available", (8, 9)),
    "Float8BlockScaling": ("is_fp8_block_scaling_available", (9, 0)),
    "MXFP8BlockScaling": ("is_mxfp8_available", (10, 0)),
    "NVFP4BlockScaling": ("is_nvfp4_available", (10, 0)),
}

CUDNN_HINT = (
    "transformer_engine failed to load cuDNN ({err}). torch and the system have different cuDNN "
    "versions: put torch's cuDNN first, e.g. export LD_LIBRARY_PATH=$(python -c \"import "
    "nvidia.cudnn, os; print(os.path.join(nvidia.cudnn.__path__[0], 'lib'))\"):$LD_LIBRARY_PATH"
)


class TEUnavailable(RuntimeError):
    """Transformer Engine cannot be imported here; the message says why and what to do."""


@functools.lru_cache(maxsize=1)
def import_te() -> Any:
    """Import ``transformer_engine.pytorch`` lazily, with an actionable error."""
    try:
        return importlib.import_module("transformer_engine.pytorch")
    except ModuleNotFoundError as err:
        raise TEUnavailable(
            "transformer-engine not installed (pip install 'te-gemm-callback[te]' on a CUDA host)"
        ) from err
    except (ImportError, OSError) as err:
        if "cudnn" in str(err).lower():
            raise TEUnavailable(CUDNN_HINT.format(err=err)) from err
        raise TEUnavailable(f"transformer_engine failed to import: {err}") from err


def te_available() -> tuple[bool, str]:
    try:
        import_te()
        return True, ""
    except TEUnavailable as err:
        return False, str(err)


def te_version() -> str | None:
    try:
        import_te()
        return importlib.import_module("transformer_engine").__version__
    except (TEUnavailable, AttributeError):
        return None


def canonical(name: str) -> str:
    """Map a user's recipe name (any case, or an alias) to TE's class name."""
    for r in RECIPES:
        if r.lower() == name.lower():
            return r
    if name.lower() in ALIASES:
        return ALIASES[name.lower()]
    raise ValueError(f"unknown precision {name!r}: choose from {', '.join(RECIPES)}")


@dataclass(frozen=True)
class Availability:
    recipe: str
    ok: bool
    reason: str = ""


def availability(recipe: str) -> Availability:
    """Can this machine run ``recipe``? The reason comes from TE's own check where TE exists."""
    import torch  # here, not at import: `te-gemm bench --devices N` names recipes before torch loads

    recipe = canonical(recipe)
    if recipe == "BF16":
        return Availability(recipe, True, "" if torch.cuda.is_available() else "CPU (torch only)")
    ok_te, why = te_available()
    if not torch.cuda.is_available():
        return Availability(recipe, False, "no CUDA device" + ("" if ok_te else f"; {why}"))
    if not ok_te:
        return Availability(recipe, False, why)
    te = import_te()
    fn_name, _ = _CHECKS[recipe]
    fn = getattr(te, fn_name, None)
    if fn is None:
        return Availability(recipe, False, f"this transformer_engine has no {fn_name}()")
    ok, reason = fn(return_reason=True)
    return Availability(recipe, bool(ok), "" if ok else str(reason))


def make_recipe(recipe: str) -> Any:
    """The TE recipe object for ``recipe`` (None for BF16). Raises if TE is unavailable."""
    recipe = canonical(recipe)
    if recipe == "BF16":
        return None
    import_te()
    mod = importlib.import_module("transformer_engine.common.recipe")
    return getattr(mod, recipe)()


def row_alignment(recipe: str) -> int:
    """Rows per grouped-GEMM group must be a multiple of this under the recipe: 1 for BF16, else
    TE's get_align_size_for_quantization (MXFP8 32, NVFP4 128, other FP8 16)."""
    return {"BF16": 1, "MXFP8BlockScaling": 32, "NVFP4BlockScaling": 128}.get(canonical(recipe), 16)


def padded_splits(splits: Iterable[int], recipe: str) -> tuple[int, ...]:
    """Each group's rows rounded up to the recipe's alignment, as MoE code pads them (TE's Fp8Padding)."""
    a = row_alignment(recipe)
    return tuple(-(-n // a) * a for n in splits)


def autocast(recipe: str):
    """``te.autocast`` for a recipe, or a no-op context for BF16 (TE's current API; fp8_autocast
    is deprecated)."""
    import contextlib

    import sys

    recipe = canonical(recipe)
    if recipe == "BF16":
        if "transformer_engine.pytorch" in sys.modules and hasattr(sys.modules["transformer_engine.pytorch"], "autocast"):
            # Explicitly off: an outer FP8 autocast (a precision plugin's) must not leak into BF16.
            return sys.modules["transformer_engine.pytorch"].autocast(enabled=False)
        return contextlib.nullcontext()
    te = import_te()
    if hasattr(te, "autocast"):
        return te.autocast(enabled=True, recipe=make_recipe(recipe))
    return te.fp8_autocast(enabled=True, fp8_recipe=make_recipe(recipe))  # TE < 2.8
