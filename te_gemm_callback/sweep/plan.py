"""A precision plan: which modules stay in BF16 under an FP8 recipe, its files (JSON, and TE's debug-API
YAML), and :func:`apply_precision_plan`. The analysis makes plans (:mod:`te_gemm_callback.analysis.plan`)."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from te_gemm_callback.capture.guards import StandIn
from te_gemm_callback.files import jsonio

SCHEMA = "te-gemm-plan/1"
MODE = "autocast"
# The YAML's first line marks a file as ours to replace; files written before the marker start with the key.
YAML_MARKER = "# te-gemm precision plan: TE debug-API config written by te-gemm (safe to regenerate)"
YAML_KIND = jsonio.text_kind("te-gemm plan YAML", YAML_MARKER.encode(), b"te_gemm_plan_keep_bf16:")


@dataclass
class ModuleChoice:
    module: str
    bf16_ms: float | None  # GEMM (+ quantization) time per step in BF16
    fp8_ms: float | None  # ... in the plan's recipe (None: TE cannot run it)
    keep_bf16: bool

    @property
    def fp8_loss_ms(self) -> float | None:
        """How much slower the recipe is than BF16 on this module, per step (> 0: FP8 loses)."""
        return None if self.fp8_ms is None or self.bf16_ms is None else self.fp8_ms - self.bf16_ms


@dataclass
class PrecisionPlan:
    """One FP8 recipe, and the modules kept in BF16 under it.

    Example:
        >>> plan = PrecisionPlan("Float8CurrentScaling", ["lm_head"])
        >>> plan.keep_bf16
        ['lm_head']
    """

    recipe: str
    keep_bf16: list[str]
    modules: list[ModuleChoice] = field(default_factory=list)
    predicted_step_ms: dict[str, float] = field(default_factory=dict)  # "BF16", each recipe, "plan"
    predicted_speedup: dict[str, float] = field(default_factory=dict)  # over BF16
    gemm_ms: dict[str, float] = field(default_factory=dict)  # bench GEMM time per step, same keys
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def same_as(self) -> str | None:
        """The single recipe this plan amounts to, or None for a mixed plan: "BF16" when every module
        stays BF16, the recipe when only modules TE cannot run in it stay BF16."""
        if not self.modules:
            return None if self.keep_bf16 else self.recipe
        kept = set(self.keep_bf16)
        if kept >= {m.module for m in self.modules}:
            return "BF16"
        if kept <= {m.module for m in self.modules if m.fp8_ms is None}:
            return self.recipe
        return None

    @property
    def best_single(self) -> str | None:
        singles = {k: v for k, v in self.predicted_step_ms.items() if k != "plan"}
        return min(singles, key=lambda k: singles[k]) if singles else None

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, **asdict(self)}

    def save(self, path: str | Path) -> Path:
        return jsonio.write_json(path, self.to_dict(), schema=SCHEMA)

    @classmethod
    def load(cls, path: str | Path) -> PrecisionPlan:
        d = jsonio.read_schema(path, SCHEMA, "te-gemm precision plan")  # field types checked (PLAN_FILE)
        return jsonio.from_fields(cls, {**d, "modules": [jsonio.from_fields(ModuleChoice, m)
                                                         for m in d.get("modules", [])]})

    def nvdlfw_yaml(self) -> str:
        """A config for TE's debug API (nvdlfw_inspect) that keeps the same modules out of FP8 without this
        package: ``debug_api.initialize(config_file=...)``. Layer names are this capture's module paths."""
        bad = [m for m in self.keep_bf16 if not m.isprintable()]
        if bad:  # a YAML scalar cannot hold them literally, and no module path of TE's has them
            raise ValueError(f"module name {bad[0]!r} holds control characters: it cannot go in the YAML config")
        # A single-quoted YAML scalar: its only escape is a doubled quote (a module named a'b broke the file).
        pattern = ("^(" + "|".join(re.escape(m) for m in self.keep_bf16) + ")$").replace("'", "''")
        return (YAML_MARKER + "\n"
                "te_gemm_plan_keep_bf16:\n"
                f"  enabled: {bool(self.keep_bf16)}\n"
                "  layers:\n"
                f"    layer_name_regex_pattern: '{pattern}'\n"
                "  transformer_engine:\n"
                "    DisableFP8Layer:\n"
                "      enabled: True\n")


def write_plan(plan: PrecisionPlan, json_path: str | Path, yaml_path: str | Path) -> tuple[Path, Path]:
    """The plan as JSON (for :func:`apply_precision_plan` and ``sweep_plan=``) and as TE's debug-API config.
    Both targets are checked before either is written: a refused YAML path leaves no new JSON behind."""
    jsonio.check_target(json_path, jsonio.json_kind(SCHEMA))
    jsonio.check_target(yaml_path, YAML_KIND)
    try:  # never write a plan that PrecisionPlan.load would refuse
        jsonio.check(plan.to_dict(), jsonio.SPECS[SCHEMA])
    except ValueError as err:
        raise ValueError(f"precision plan not written, its values are invalid: {err}") from None
    text = plan.nvdlfw_yaml()  # refuses a module name it cannot hold before either file is written
    return plan.save(json_path), jsonio.write_text(yaml_path, text, YAML_KIND)


class PlanHandle:
    """What :func:`apply_precision_plan` changed; ``remove()`` puts it back."""

    def __init__(self) -> None:
        self._undo: list[tuple[nn.Module, Any]] = []

    def remove(self) -> None:
        for module, had in reversed(self._undo):
            if had is None:
                module.__dict__.pop("forward", None)
            else:
                module.forward = had
        self._undo.clear()


def apply_precision_plan(model: nn.Module, plan: PrecisionPlan | str | Path) -> PlanHandle:
    """Keep the plan's modules out of FP8 inside the job's ``te.autocast``: each one's forward runs under
    ``te.autocast(enabled=False)`` (its backward follows). No hook, no weight touched; ``.remove()`` undoes it.

    Example:
        >>> import torch
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
        >>> h = apply_precision_plan(model, PrecisionPlan("Float8CurrentScaling", ["1"]))
        >>> model(torch.randn(3, 4)).shape
        torch.Size([3, 2])
        >>> h.remove()
    """
    if not isinstance(plan, PrecisionPlan):
        plan = PrecisionPlan.load(plan)
    found = {name: _get(model, name) for name in plan.keep_bf16}
    missing = [name for name, module in found.items() if module is None]
    if missing:
        raise ValueError(f"the plan names modules this model does not have: {', '.join(missing[:5])} "
                         "(was it made for another model, or another root module?)")
    handle = PlanHandle()
    for module in found.values():
        assert module is not None
        handle._undo.append((module, module.__dict__.get("forward")))
        module.forward = _BF16Forward(module.forward)
    return handle


class _BF16Forward(StandIn):
    """A listed module's forward under ``autocast("BF16")``. A StandIn, not a closure: a closure cannot be
    pickled, and a ``deepcopy`` shared it (the copy ran the original's weights)."""

    __slots__ = ()

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from te_gemm_callback.precisions import autocast  # looked up per call: a test's stand-in runs
        with autocast("BF16"):  # explicitly off inside the job's FP8 autocast
            return self.fn(*args, **kwargs)


def _get(model: nn.Module, name: str) -> nn.Module | None:
    try:
        return model.get_submodule(name) if name else model
    except AttributeError:
        return None
