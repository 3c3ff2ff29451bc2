"""What the host-cost microbenchmark (te_gemm_callback.microbench.module_cost) needs to rebuild each
captured TE module: its class, the features that change what it launches, its forward GEMM shapes."""

from __future__ import annotations

from typing import Any

TE_CLASSES = ("Linear", "LayerNormLinear", "LayerNormMLP")
FEATURES = ("normalization", "activation", "use_bias", "zero_centered_gamma")


def module_specs(model: Any, records: list[Any]) -> dict[str, dict[str, Any]]:
    """{module name: {"class", features..., "dtype", "gemms": {gemm: [m, k, n]}}} for every TE module
    of ``model`` whose forward GEMMs the capture holds (records of source "te", op "fprop")."""
    fprops: dict[str, dict[str, list[int]]] = {}
    for r in records:
        if r.source == "te" and r.op == "fprop":
            fprops.setdefault(r.module, {})[r.gemm or ""] = [r.m, r.k, r.n]
    out: dict[str, dict[str, Any]] = {}
    for name, mod in model.named_modules():
        cls = type(mod).__name__
        if name not in fprops or cls not in TE_CLASSES:
            continue
        spec: dict[str, Any] = {"class": cls, "gemms": fprops[name]}
        for f in FEATURES:
            v = getattr(mod, f, None)
            if isinstance(v, (bool, int, str)):
                spec[f] = v
        w = next((p for p in mod.parameters(recurse=False)), None)
        spec["dtype"] = str(w.dtype).replace("torch.", "") if w is not None else "bfloat16"
        out[name] = spec
    return out


def spec_key(spec: dict[str, Any]) -> str:
    """Modules that launch the same work share a key: one measurement serves them all."""
    feats = ",".join(f"{f}={spec[f]}" for f in FEATURES if f in spec)
    gemms = ";".join(f"{g}:{'x'.join(map(str, s))}" for g, s in sorted(spec["gemms"].items()))
    return f"{spec['class']}({feats}) {spec.get('dtype', 'bfloat16')} [{gemms}]"
