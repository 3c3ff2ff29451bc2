"""A precision plan as TE's own per-module recipe (sweep/native_plan.py). TE cannot run here:
which role names the plan keeps, and what is said where TE has no such recipe. On the GPU:
tests/test_gpu.py::test_a_plan_runs_as_tes_own_per_module_recipe_in_the_sweep."""

import sys

import pytest
from torch import nn

from te_gemm_callback.sweep.native_plan import kept, native_support


def test_roles_are_kept_by_module_and_layernorm_mlps_by_their_fc_gemms():
    keep = {"layers.0.mlp", "lm_head"}
    assert kept("lm_head", keep) and kept("layers.0.mlp.fc1", keep) and kept("layers.0.mlp.fc2", keep)
    assert not kept("layers.0.mlp.fc3", keep) and not kept("layers.1.mlp.fc1", keep)
    assert not kept("", keep) and not kept("lm_head2", keep) and not kept("layers.0", keep)


def test_without_te_the_reason_is_one_line(monkeypatch):
    for mod in [m for m in sys.modules if m.startswith("transformer_engine")]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setitem(sys.modules, "transformer_engine", None)  # an import of it or below raises
    why = native_support("DelayedScaling")
    assert why.startswith("TE's per-module recipe is not importable here (ModuleNotFoundError") and "\n" not in why
    assert native_support("BF16") == "BF16 has no per-module quantizer factory in TE"


def test_a_model_without_te_cannot_take_a_native_plan(monkeypatch):
    from te_gemm_callback.analysis.plan import PrecisionPlan
    from te_gemm_callback.sweep.native_plan import native_plan

    monkeypatch.setattr("te_gemm_callback.sweep.native_plan.native_support", lambda r: "no TE here")
    with pytest.raises(RuntimeError, match="no TE here"):
        native_plan(nn.Linear(2, 2), PrecisionPlan("DelayedScaling", []))
