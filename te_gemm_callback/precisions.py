"""The precisions we compare, named after TE's recipes, and whether this machine can run them.

Transformer Engine is optional (CUDA hosts only): every import of it goes through :func:`import_te`."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import json
import logging
import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RecipeInfo:
    """What the package knows of one precision."""

    name: str  # TE's recipe class name ("BF16": no FP8 autocast)
    family: str  # the precision label a capture gives GEMMs that ran in it
    check: str | None  # the TE function that says whether this machine runs it
    row_alignment: int  # rows per grouped-GEMM group (TE's get_align_size_for_quantization)
    low_precision_peak: bool  # its GEMMs run at the FP8 tensor-core peak rather than BF16's


# In the order tables print them.
RECIPE_TABLE: tuple[RecipeInfo, ...] = (
    RecipeInfo("BF16", "bf16", None, 1, False),
    RecipeInfo("DelayedScaling", "fp8_delayed", "is_fp8_available", 16, True),
    RecipeInfo("Float8CurrentScaling", "fp8_current", "is_fp8_available", 16, True),
    RecipeInfo("Float8BlockScaling", "fp8_block", "is_fp8_block_scaling_available", 16, True),
    RecipeInfo("MXFP8BlockScaling", "mxfp8", "is_mxfp8_available", 32, True),
    RecipeInfo("NVFP4BlockScaling", "nvfp4", "is_nvfp4_available", 128, False),
)
RECIPE_INFO = {r.name: r for r in RECIPE_TABLE}
RECIPES: tuple[str, ...] = tuple(r.name for r in RECIPE_TABLE)
FP8_RECIPES: tuple[str, ...] = tuple(r.name for r in RECIPE_TABLE if r.family.startswith(("fp8", "mxfp8")))
RECIPE_FAMILY = {r.name: r.family for r in RECIPE_TABLE}
FAMILY_RECIPE = {r.family: r.name for r in RECIPE_TABLE}
# Lower-case name or alias (each family, its scaling alone, "fp8" for Python callers) -> TE's class name.
_NAMES = {**FAMILY_RECIPE, "fp8": "DelayedScaling", "delayed": "DelayedScaling", "current": "Float8CurrentScaling",
          "block": "Float8BlockScaling", **{r.lower(): r for r in RECIPES}}

CUDNN_HINT = ("transformer_engine failed to load cuDNN ({err}). torch and the system have different cuDNN "
              "versions: put torch's cuDNN first, e.g. export LD_LIBRARY_PATH=$(python -c \"import "
              "nvidia.cudnn, os; print(os.path.join(nvidia.cudnn.__path__[0], 'lib'))\"):$LD_LIBRARY_PATH")


class TEUnavailable(RuntimeError):
    """Transformer Engine cannot be imported here; the message says why and what to do."""


@functools.lru_cache(maxsize=1)
def import_te() -> Any:
    """Import ``transformer_engine.pytorch`` lazily, with an actionable error."""
    try:
        return importlib.import_module("transformer_engine.pytorch")
    except ModuleNotFoundError as err:
        why = "transformer-engine not installed (pip install 'te-gemm-callback[te]' on a CUDA host)"
        raise TEUnavailable(why) from err
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
    except (TEUnavailable, AttributeError, ImportError):
        return None


def canonical(name: str) -> str:
    """Map a user's recipe name (any case, or an alias) to TE's class name."""
    if name.lower() in _NAMES:
        return _NAMES[name.lower()]
    raise ValueError(f"unknown precision {name!r}: choose from {', '.join(RECIPES)}")


def parse_recipes(text: str) -> list[str]:
    """A comma-separated recipe list (``--precisions``) as TE class names, in the order given, each once."""
    out = []
    for name in (part.strip() for part in text.split(",")):
        if not name:
            raise ValueError(f"empty recipe name in {text!r}: give comma-separated names, "
                             "e.g. BF16,Float8CurrentScaling")
        out.append(user_recipe(name))
    return list(dict.fromkeys(out))


def user_recipe(name: str) -> str:
    """One recipe name a user gave as TE's class name. "FP8" alone is refused: it names four recipes
    that time differently (:func:`canonical` keeps the old alias for Python callers)."""
    if name.strip().lower() == "fp8":
        raise ValueError(f"{name!r} names {len(FP8_RECIPES)} recipes ({', '.join(FP8_RECIPES)}): "
                         "choose one or more of them")
    return canonical(name)


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
    fn_name = RECIPE_INFO[recipe].check or ""  # every recipe but BF16 names its check
    fn = getattr(import_te(), fn_name, None)
    if fn is None:
        return Availability(recipe, False, f"this transformer_engine has no {fn_name}()")
    ok, reason = fn(return_reason=True)
    if not ok:
        return Availability(recipe, False, str(reason))
    refused = arch_refusal(recipe, torch.cuda.get_device_capability())
    return Availability(recipe, refused is None, refused or "")


def arch_refusal(recipe: str, capability: tuple[int, int]) -> str | None:
    """Why a recipe TE reports as available is still not run on this compute capability (None: it is
    run): TE's checks are wider than what its recipes support for training."""
    recipe = canonical(recipe)
    sm = f"SM {capability[0]}.{capability[1]}"
    # TE documents NVFP4 training on SM 10.0 and 10.3 only (nvfp4.rst); on SM 12.x its fused RHT
    # cast is off and stochastic rounding runs in software: not a training step's time.
    if recipe == "NVFP4BlockScaling" and capability not in ((10, 0), (10, 3)):
        return f"NVFP4 training is supported on SM 10.0 and 10.3 only (TE's nvfp4.rst); this GPU is {sm}"
    # From SM 10.0 TE runs FP8 block scaling as MXFP8, which it does not support on SM 12.0+.
    if recipe == "Float8BlockScaling" and capability >= (12, 0):
        return (f"Float8BlockScaling runs as MXFP8 on Blackwell, which TE does not support on SM 12.0+; "
                f"this GPU is {sm}")
    return None


def shape_problem(recipe: str, m: int | None, k: int, n: int, grouped: bool = False) -> str | None:
    """Why TE cannot run a te.Linear / te.GroupedLinear of fprop M x K x N under ``recipe`` (None: it
    can), said by the cell rather than TE's C++ assertion. ``m`` None: not checked (padded per group)."""
    recipe = canonical(recipe)
    if recipe not in ("MXFP8BlockScaling", "NVFP4BlockScaling"):
        return None
    # Input (M, K), weight (N, K) and output gradient (M, N) are quantized in both directions, in
    # 32-element blocks (MXFP8) or with rows and columns divisible by 32 (NVFP4's TMA alignment).
    bad = [f"{d}={v}" for d, v in (("M", m), ("K", k), ("N", n)) if v is not None and v % 32]
    if bad:
        return f"{recipe} needs M, K and N divisible by 32 (TE's quantization blocks): {', '.join(bad)}"
    # NVFP4 grouped split-quantize needs the inner dimension divisible by 128.
    if grouped and recipe == "NVFP4BlockScaling" and (k % 128 or n % 128):
        return f"NVFP4 grouped GEMMs need K and N divisible by 128 (TE's split quantize): K={k}, N={n}"
    return None


def skipped_lines(skipped: Mapping[str, str]) -> list[str]:
    """One line per cause (without CUDA or TE, every TE recipe's): ``"A, B not run: <why>"``."""
    by_reason: dict[str, list[str]] = {}
    for recipe, why in skipped.items():
        by_reason.setdefault(str(why).rstrip(". "), []).append(str(recipe))  # TE's own reasons end in "."
    return [f"{', '.join(recipes)} not run: {why}" for why, recipes in by_reason.items()]


_WARNED: set[str] = set()


def warn_once(message: str, logger: logging.Logger | None = None) -> bool:
    """Log ``message`` as a warning the first time this process asks; True if it was logged."""
    if message in _WARNED:
        return False
    _WARNED.add(message)
    (logger or logging.getLogger("te_gemm_callback")).warning("%s", message)
    return True


def make_recipe(recipe: str) -> Any:
    """The TE recipe object for ``recipe`` (None for BF16). Raises if TE is unavailable."""
    recipe = canonical(recipe)
    if recipe == "BF16":
        return None
    import_te()
    return getattr(importlib.import_module("transformer_engine.common.recipe"), recipe)()


# Environment variables TE reads when it defines the recipe classes or runs the NVFP4 quantizer,
# changing what a recipe runs (NVTE_BACKWARD_OVERRIDE runs a recipe's backward in BF16).
RECIPE_ENV_VARS = ("NVTE_BACKWARD_OVERRIDE", "NVTE_FP8_BLOCK_SCALING_FP32_SCALES",
                   "NVTE_FP8_CURRENT_SCALING_POWER_2_SCALES", "NVTE_USE_FAST_MATH")
RECIPE_ENV_PREFIX = "NVTE_NVFP4_"


def recipe_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The NVTE_* variables set here that change a TE recipe, sorted by name."""
    env = os.environ if environ is None else environ
    return {k: env[k] for k in sorted(env) if k in RECIPE_ENV_VARS or k.startswith(RECIPE_ENV_PREFIX)}


def recipe_config(recipe: str) -> str | None:
    """The repr of the recipe TE builds here; None for BF16 or where TE cannot be imported."""
    if canonical(recipe) == "BF16" or not te_available()[0]:
        return None
    try:
        return repr(make_recipe(recipe))
    except Exception as err:  # e.g. an NVTE_* value TE's recipe refuses: its cells fail and say so
        return f"not built: {type(err).__name__}: {err}"


def recipe_fingerprint(config: str | None, env: Mapping[str, str] | None) -> str | None:
    """A short hash of a recipe's configuration and environment, for cache keys (None: neither known)."""
    if not config and not env:
        return None
    text = json.dumps([config, dict(env or {})], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def row_alignment(recipe: str) -> int:
    """Rows per grouped-GEMM group must be a multiple of this under the recipe (1 for BF16)."""
    return RECIPE_INFO[canonical(recipe)].row_alignment


def padded_splits(splits: Iterable[int], recipe: str) -> tuple[int, ...]:
    """Each group's rows rounded up to the recipe's alignment, as MoE code pads them (TE's Fp8Padding)."""
    a = row_alignment(recipe)
    return tuple(-(-n // a) * a for n in splits)


def autocast(recipe: Any):
    """``te.autocast`` for a recipe (its name, or a TE recipe object such as a per-module
    ``CustomRecipe``), or a no-op context for BF16."""
    if isinstance(recipe, str):
        if canonical(recipe) == "BF16":
            te = sys.modules.get("transformer_engine.pytorch")
            # Explicitly off: an outer FP8 autocast (a precision plugin's) must not leak into BF16.
            return te.autocast(enabled=False) if te and hasattr(te, "autocast") else contextlib.nullcontext()
        recipe = make_recipe(recipe)
    te = import_te()
    if hasattr(te, "autocast"):
        return te.autocast(enabled=True, recipe=recipe)
    return te.fp8_autocast(enabled=True, fp8_recipe=recipe)  # TE < 2.8 (fp8_autocast is deprecated)
