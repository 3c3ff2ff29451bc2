"""Torch adapter: a TorchDispatchMode that sees every aten GEMM, whoever calls it.

nn.Linear, F.linear, HF's Conv1D (addmm with a (in, out) weight), einsum layers (bmm), Mixtral's
3-D expert weights (mm on a slice, or ``torch._grouped_mm``) and ``F.multi_head_attention_forward``
all end in the ops below. The mode costs Python dispatch on every aten op of the step, so the
profiler runs it only on the steps chosen for shape discovery (what it costs: docs/step-plan.md).

Pass of a backward GEMM: autograd's mm backward computes ``grad @ W^T`` (dgrad, one operand is the
weight) and ``X^T @ grad`` (wgrad, no weight operand). A weight is recognised by its storage: a
parameter, a view of one, or a cast of one (torch.autocast copies the weight once per forward).
GEMMs with no weight at all (attention's QK^T in eager code) are told apart by shape against the
module's forward GEMMs (dgrad = M x N x K, wgrad = K x M x N).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from te_gemm_callback.capture.recorder import Recorder, splits_from_offs
from te_gemm_callback.shapes import GemmOp, GemmShape, backward_shapes

aten = torch.ops.aten
_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32",
           torch.float8_e4m3fn: "fp8_e4m3", torch.float8_e5m2: "fp8_e5m2"}


def _op(name: str) -> Any:
    packet = getattr(aten, name, None)
    return getattr(packet, "default", None) if packet is not None else None


GEMM_OPS = {op: name for name in ("mm", "addmm", "bmm", "baddbmm", "_scaled_mm", "_grouped_mm",
                                  "_scaled_grouped_mm") if (op := _op(name)) is not None}
_CASTS = {op for op in (_op("_to_copy"), _op("clone"), _op("contiguous")) if op is not None}
# Under torch.inference_mode() autograd's keys are skipped, so these composites reach the mode whole,
# never as the mm/addmm/bmm above: seen here, they say why the capture holds no torch GEMMs.
_INFERENCE_COMPOSITES = {op for op in (_op("linear"), _op("matmul"), _op("einsum")) if op is not None}
_WATCHED = _CASTS | _INFERENCE_COMPOSITES


def _storage_key(t: Any) -> int | None:
    if not isinstance(t, torch.Tensor) or t.device.type == "meta":
        return None
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None


def dispatch_mkn(name: str, args: tuple, kwargs: dict) -> tuple[int, int, int, int, Any]:
    """(m, k, n, batch, offs) of an aten GEMM call. ``offs`` marks a grouped GEMM's splits."""
    if name in ("addmm", "baddbmm"):
        a, b = args[1], args[2]
    else:
        a, b = args[0], args[1]
    offs = kwargs.get("offs", args[2] if name == "_grouped_mm" and len(args) > 2 else None)
    if name == "_scaled_grouped_mm":
        offs = kwargs.get("offs", args[4] if len(args) > 4 else None)
    if a.dim() == 2 and b.dim() == 2:
        if offs is not None:  # wgrad of a grouped GEMM: (K, total) @ (total, N), split along total
            return a.shape[0], a.shape[1], b.shape[1], 1, offs
        return a.shape[0], a.shape[1], b.shape[1], 1, None
    if a.dim() == 2 and b.dim() == 3:  # grouped: tokens (total, K) x experts (G, K, N)
        return a.shape[0], a.shape[1], b.shape[2], 1, offs
    if a.dim() == 3 and b.dim() == 2:
        return a.shape[1], a.shape[2], b.shape[1], a.shape[0], offs
    return a.shape[-2], a.shape[-1], b.shape[-1], a.shape[0], offs  # bmm / 3-D x 3-D


class GemmDispatchMode(TorchDispatchMode):
    """Records aten GEMMs into a recorder; TE-owned calls are left to the TE adapter."""

    def __init__(self, recorder: Recorder) -> None:
        super().__init__()
        self.recorder = recorder
        self.param_storages: dict[int, str] = {}
        self.casts: dict[int, tuple[weakref.ref, str]] = {}
        self.refresh_params()
        # Forward shapes of each module this step, to tell dgrad from wgrad without a weight.
        self.forward_shapes: dict[str | None, set[GemmShape]] = {}
        self.te_forward: set[tuple[int, int, int, int]] = set()  # aten GEMMs inside TE modules

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # Compiled modules inside the model run eagerly on the instrumented steps (steady.py), but
        # a compiled frame outside it (a compiled loss or step function) may still be entered under
        # this mode. Without this, dynamo skips such a frame and, on torch 2.13, marks its code
        # skipped for good: the job would run eagerly from then on. With it (torch >= 2.9; older
        # versions never ask), dynamo compiles with the mode off and runs the compiled code under it.
        return True

    def refresh_params(self) -> None:
        self.param_storages = {k: n for n, p in self.recorder.scope.model.named_parameters()
                               if (k := _storage_key(p)) is not None}

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        rec = self.recorder
        name = GEMM_OPS.get(func)
        if name is None or not rec.active:
            out = func(*args, **kwargs)
            if func in _WATCHED and rec.active:
                if func in _CASTS:
                    self._track_cast(args, out)
                elif torch.is_inference_mode_enabled():
                    rec.note_inference()
            return out
        token = None
        try:
            token = self._before(name, args, kwargs)
        except Exception as err:  # never break the job
            rec.fail(err)
        out = func(*args, **kwargs)
        if token is not None:
            rec.end(token)
        return out

    def _track_cast(self, args: tuple, out: Any) -> None:
        # A cast of a weight (autocast's bf16 copy) is still that weight for dgrad detection. The
        # copy is freed after backward and its memory reused, so it is held by a weak reference
        # and only counts while alive (a reused address must not make an activation a "weight").
        src = _storage_key(args[0]) if args else None
        if not isinstance(out, torch.Tensor) or src is None:
            return
        name = self.param_storages.get(src) or (self.casts[src][1] if self._live_cast(src) else None)
        if name is None and isinstance(args[0], nn.Parameter):
            # A parameter the model did not hold at start: FSDP2's all-gathered weight, whose
            # bf16 autocast copy dgrad uses. Only parameters pay this lookup, never activations.
            name = self._param_name(args[0])
        if name is not None:
            self.casts[_storage_key(out)] = (weakref.ref(out), name)

    def _param_name(self, p: torch.Tensor) -> str | None:
        module_name, _ = self.recorder.scope.current()
        module = self.recorder.scope.module(module_name)
        for n, q in (module.named_parameters() if module is not None else ()):
            if q is p:
                return f"{module_name}.{n}" if module_name else n
        return None

    def _current_params(self, module_name: str | None) -> set[int]:
        """Storages of the parameters the module holds right now. FSDP2 swaps each sharded
        parameter for a freshly all-gathered one around the module's forward and backward, so
        the storages recorded at start do not match the weights its GEMMs use."""
        module = self.recorder.scope.module(module_name)
        if module is None:
            return set()
        # A leaf module's own parameter dict is all of module.parameters(), without the generator
        # machinery of named_members (most of this lookup's cost, once per activation operand).
        params = module._parameters.values() if not module._modules else module.parameters()
        return {k for p in params if p is not None and (k := _storage_key(p)) is not None}

    def _live_cast(self, key: int | None) -> bool:
        entry = self.casts.get(key)
        if entry is None:
            return False
        t = entry[0]()
        if t is None or _storage_key(t) != key:
            del self.casts[key]
            return False
        return True

    def is_weight(self, t: Any, module_name: str | None = None) -> bool:
        key = _storage_key(t)
        if key is None:
            return False
        name = self.param_storages.get(key) or (self.casts[key][1] if self._live_cast(key) else None)
        if name is not None:
            self.recorder.scope.weights_used.add(name.rpartition(".")[0])
            return True
        return key in self._current_params(module_name)

    def _before(self, name: str, args: tuple, kwargs: dict) -> Any:
        rec = self.recorder
        module_name, in_fwd = rec.scope.current()
        m, k, n, batch, offs = dispatch_mkn(name, args, kwargs)
        if module_name in rec.scope.te_scoped or (
                in_fwd and rec.scope.te_scoped and any(x in rec.scope.te_scoped for x in rec.scope.stack)):
            if in_fwd:
                self.te_forward.add((m, k, n, batch))
            rec.skip()  # inside a TE module: the TE adapter counts it (or nobody: unfused attention)
            return None
        if module_name is None and not in_fwd and self._from_te(m, k, n, batch):
            # An untagged backward node (seen for TE's unfused attention bmm on the H200) whose
            # GEMM is the backward of one that ran inside a TE module: it belongs to TE too.
            rec.skip()
            return None
        m_splits = None
        if offs is not None:
            if offs.device.type == "cpu":
                m_splits = splits_from_offs(offs)
            else:  # reading device memory now would sync inside the step: resolve later
                m_splits = rec.defer_copy(offs)
        operands = [x for x in args if isinstance(x, torch.Tensor) and x.dim() >= 2][:2]
        has_weight = any(self.is_weight(x, module_name) for x in operands)
        backward = not in_fwd and rec.in_backward()
        op = GemmOp.FPROP
        if backward:
            op, m, k, n = self._backward_op(module_name, GemmShape(m, k, n, GemmOp.DGRAD, batch), has_weight)
        else:
            self.forward_shapes.setdefault(module_name, set()).add(GemmShape(m, k, n, batch=batch))
        if isinstance(m_splits, tuple):
            m = sum(m_splits) if op is not GemmOp.WGRAD else m
            k = sum(m_splits) if op is GemmOp.WGRAD else k
        dtypes = "+".join(dict.fromkeys(_DTYPES.get(x.dtype, str(x.dtype)) for x in operands))
        module = rec.scope.module(module_name)
        site = rec.site(
            module=module_name or "", gemm="", op=op, m=m, k=k, n=n, batch=batch, precision=dtypes,
            operands=tuple(f"Tensor[{x.dtype}]" for x in operands), source="torch",
            kernel=f"aten.{name}", module_type=type(module).__name__ if module is not None else "")
        return rec.begin(site, in_fwd and rec.in_backward(), m_splits)

    def _from_te(self, m: int, k: int, n: int, batch: int) -> bool:
        for fm, fk, fn, fb in self.te_forward:
            if fb == batch and (m, k, n) in ((fm, fn, fk), (fk, fn, fm), (fk, fm, fn), (fn, fm, fk)):
                return True
        return False

    def _backward_op(self, module_name: str | None, shape: GemmShape,
                     has_weight: bool) -> tuple[GemmOp, int, int, int]:
        """Pass of a backward GEMM and its shape in the package convention.

        Autograd may compute a gradient transposed (dW^T = X^T dY for ``mm(X, W.t())``, dW for
        addmm): FLOPs are the same, so the shape is written the canonical way (shapes.py).
        """
        raw = (shape.m, shape.k, shape.n)
        for f in self.forward_shapes.get(module_name, ()):
            if f.batch != shape.batch:
                continue
            dgrad, wgrad = backward_shapes(f)
            d, w = (dgrad.m, dgrad.k, dgrad.n), (wgrad.m, wgrad.k, wgrad.n)
            if not has_weight and raw in (w, w[::-1]):
                return (GemmOp.WGRAD, *w)
            if raw in (d, d[::-1]):
                return (GemmOp.DGRAD, *d)
        return (GemmOp.DGRAD if has_weight else GemmOp.WGRAD, *raw)
