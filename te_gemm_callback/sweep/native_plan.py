"""A precision plan as TE's own per-module recipe (TE >= 2.19): a ``CustomRecipe`` whose quantizer factory
gives each TE module the plan's recipe or, kept BF16, identity quantizers. The factory tells modules apart by
``QuantizerRole.name``, so each TE module is named after its path in the model until ``remove()``."""

from __future__ import annotations

import importlib
from typing import Any

from torch import nn

from te_gemm_callback.capture.scope import is_te_module

# The plan's recipe -> TE's factory that mirrors it (custom_recipes/quantizer_factories.py).
FACTORIES = {"DelayedScaling": "delayed_scaling_factory", "Float8CurrentScaling": "current_scaling_factory",
             "Float8BlockScaling": "float8_block_scaling_factory", "MXFP8BlockScaling": "mxfp8_factory",
             "NVFP4BlockScaling": "nvfp4_factory"}
KEEP = "high_precision_factory"
HOW = "TE's CustomRecipe: a quantizer factory per module, identity quantizers for the modules kept BF16"


def _factories() -> Any:
    return importlib.import_module("transformer_engine.pytorch.custom_recipes.quantizer_factories")


def native_support(recipe: str) -> str | None:
    """None where the installed TE can run a plan in ``recipe`` as its own per-module recipe; else why not."""
    if recipe not in FACTORIES:
        return f"{recipe} has no per-module quantizer factory in TE"
    try:
        rec = importlib.import_module("transformer_engine.common.recipe")
        qf = _factories()
    except Exception as err:  # TE absent, or a build whose import fails: both mean "not here"
        return f"TE's per-module recipe is not importable here ({type(err).__name__}: {str(err)[:120]})"
    if not hasattr(rec, "CustomRecipe"):
        return "the installed TE has no CustomRecipe (TE >= 2.19 has)"
    missing = [f for f in (FACTORIES[recipe], KEEP) if not hasattr(qf, f)]
    if missing:
        return f"the installed TE's quantizer_factories lacks {', '.join(missing)}"
    return None


def kept(role_name: str, keep: set[str]) -> bool:
    """Whether a quantizer role's module is kept BF16 (LayerNormMLP's GEMMs: ``<module>.fc1``/``.fc2``)."""
    if role_name in keep:
        return True
    head, _, tail = role_name.rpartition(".")
    return tail in ("fc1", "fc2") and head in keep


class NativePlan:
    """The plan's ``CustomRecipe`` (``recipe``); ``remove()`` gives the TE modules their own names back."""

    def __init__(self, recipe: Any, names: list[tuple[nn.Module, Any]]) -> None:
        self.recipe, self._names = recipe, names

    def remove(self) -> None:
        for module, name in reversed(self._names):
            module.name = name
        self._names.clear()


def native_plan(model: nn.Module, plan: Any) -> NativePlan:
    """``plan`` (a :class:`~te_gemm_callback.sweep.plan.PrecisionPlan`) as TE's own per-module recipe for
    ``model``; RuntimeError, one line, where TE has none.

    Example:
        >>> handle = native_plan(model, PrecisionPlan("DelayedScaling", ["lm_head"]))  # doctest: +SKIP
        >>> with te.autocast(recipe=handle.recipe):  # doctest: +SKIP
        ...     loss = model(batch).loss
        >>> handle.remove()  # doctest: +SKIP
    """
    why = native_support(plan.recipe)
    if why is not None:
        raise RuntimeError(why)
    qf = _factories()
    base, high = getattr(qf, FACTORIES[plan.recipe]), getattr(qf, KEEP)
    keep = set(plan.keep_bf16)

    def qfactory(role: Any) -> Any:
        return high(role) if kept(getattr(role, "name", "") or "", keep) else base(role)

    recipe = importlib.import_module("transformer_engine.common.recipe").CustomRecipe(qfactory=qfactory)
    names = []
    for path, module in model.named_modules():
        if is_te_module(module) and hasattr(module, "name"):
            names.append((module, module.name))
            module.name = path
    return NativePlan(recipe, names)
