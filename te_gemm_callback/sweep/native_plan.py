"""A precision plan as Transformer Engine's own per-module recipe: a ``CustomRecipe`` whose
quantizer factory gives each TE module's tensors the plan's recipe, or none (high precision) for
the modules the plan keeps in BF16.

TE 2.19 added ``transformer_engine.common.recipe.CustomRecipe``: under it each TE module asks a
factory for its quantizers, one call per tensor slot, with a ``QuantizerRole`` naming the module
(``module.name``; LayerNormMLP's GEMMs as ``<name>.fc1`` and ``<name>.fc2``). TE ships factories
that mirror its built-in recipes (``custom_recipes.quantizer_factories``) and an identity
quantizer for a slot left in high precision. :func:`native_plan` builds that recipe and names each
TE module after its path in the model so the factory can tell them apart; ``remove()`` gives the
modules their names back. Where the installed TE has no such recipe, :func:`native_support` says
why, and :func:`~te_gemm_callback.sweep.plan.apply_precision_plan` (a module's forward under
``te.autocast(enabled=False)``) is the way to apply the plan.
"""

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
    """None where the installed TE can run a plan in ``recipe`` as its own per-module recipe; else
    why not, in one line."""
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
    """Whether a quantizer role's module name is one the plan keeps in BF16 (LayerNormMLP names
    its two GEMMs' roles ``<module>.fc1`` and ``<module>.fc2``)."""
    if role_name in keep:
        return True
    head, _, tail = role_name.rpartition(".")
    return tail in ("fc1", "fc2") and head in keep


class NativePlan:
    """The plan's ``CustomRecipe`` (``recipe``), and the TE modules named for it; ``remove()`` puts
    their own names back."""

    def __init__(self, model: nn.Module, recipe_name: str, keep_bf16: list[str]) -> None:
        why = native_support(recipe_name)
        if why is not None:
            raise RuntimeError(why)
        rec = importlib.import_module("transformer_engine.common.recipe")
        qf = _factories()
        base, high = getattr(qf, FACTORIES[recipe_name]), getattr(qf, KEEP)
        keep = set(keep_bf16)

        def qfactory(role: Any) -> Any:
            name = getattr(role, "name", "") or ""
            return high(role) if kept(name, keep) else base(role)

        self.recipe = rec.CustomRecipe(qfactory=qfactory)
        self.recipe_name, self.keep_bf16 = recipe_name, sorted(keep)
        self._names: list[tuple[nn.Module, Any]] = []
        for path, module in model.named_modules():
            if is_te_module(module) and hasattr(module, "name"):
                self._names.append((module, module.name))
                module.name = path

    def remove(self) -> None:
        for module, name in reversed(self._names):
            module.name = name
        self._names.clear()


def native_plan(model: nn.Module, plan: Any) -> NativePlan:
    """``plan`` (a :class:`~te_gemm_callback.sweep.plan.PrecisionPlan`) as TE's own per-module
    recipe for ``model``: run the step under ``te.autocast(recipe=handle.recipe)`` in place of the
    plan's recipe, then ``handle.remove()``. RuntimeError, one line, where TE has none.

    Example:
        >>> handle = native_plan(model, PrecisionPlan("DelayedScaling", ["lm_head"]))  # doctest: +SKIP
        >>> with te.autocast(recipe=handle.recipe):  # doctest: +SKIP
        ...     loss = model(batch).loss
        >>> handle.remove()  # doctest: +SKIP
    """
    return NativePlan(model, plan.recipe, list(plan.keep_bf16))
