"""Torch adapter: a TorchDispatchMode that sees every aten GEMM (nn.Linear, F.linear, einsum's bmm,
``torch._grouped_mm``...), whoever calls it. It costs Python dispatch on every aten op, so it runs only on the
shape-discovery steps (docs/step-plan.md). A backward GEMM runs inside the autograd node its forward GEMM made: that
gives owner and pass, and the operand it reuses says which gradient it computes (``dC B^T`` reads B, computes A's).
Where the node is unknown, sizes decide. A weight is recognised by its storage: a parameter, or a view or cast
(autocast) of one."""

from __future__ import annotations

import sys
import weakref
from typing import Any, NamedTuple

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
# The GEMMs autograd makes a node for (a derivative formula of their own); _scaled_mm has none.
_DIFFERENTIABLE = {"mm", "addmm", "bmm", "baddbmm", "_grouped_mm"}
# nn.MultiheadAttention's input-projection weights (packed, or separate) -> the sub-GEMM they name.
_MHA_PROJ = {"in_proj_weight": "in_proj", "q_proj_weight": "q_proj", "k_proj_weight": "k_proj",
             "v_proj_weight": "v_proj"}


class ForwardGemm(NamedTuple):
    """A forward GEMM as its backward GEMMs need it: who owns it, its shape, and its operands."""

    module: str | None  # the owner it was recorded under
    gemm: str  # its sub-GEMM label
    shape: GemmShape  # fprop, as recorded (m x k x n, batch)
    a: int | None  # storage of its left operand
    b: int | None  # storage of its right operand
    weighted: bool  # an operand was a weight: a linear layer's (dgrad, wgrad), else (dgrad_a, dgrad_b)


def _storage_key(t: Any) -> int | None:
    if not isinstance(t, torch.Tensor) or t.device.type == "meta":
        return None
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None


def _operands(name: str, args: tuple) -> tuple[Any, Any]:
    return (args[1], args[2]) if name in ("addmm", "baddbmm") else (args[0], args[1])


def dispatch_mkn(name: str, args: tuple, kwargs: dict) -> tuple[int, int, int, int, Any]:
    """(m, k, n, batch, offs) of an aten GEMM call. ``offs`` marks a grouped GEMM's splits."""
    a, b = _operands(name, args)
    offs = kwargs.get("offs", args[2] if name == "_grouped_mm" and len(args) > 2 else None)
    if name == "_scaled_grouped_mm":
        offs = kwargs.get("offs", args[4] if len(args) > 4 else None)
    if a.dim() == 2 and b.dim() == 2:  # with offs: a grouped GEMM's wgrad, (K, total) @ (total, N)
        return a.shape[0], a.shape[1], b.shape[1], 1, offs
    if a.dim() == 2 and b.dim() == 3:  # grouped: tokens (total, K) x experts (G, K, N)
        return a.shape[0], a.shape[1], b.shape[2], 1, offs
    if a.dim() == 3 and b.dim() == 2:
        return a.shape[1], a.shape[2], b.shape[1], a.shape[0], offs
    return a.shape[-2], a.shape[-1], b.shape[-1], a.shape[0], offs  # bmm / 3-D x 3-D


class GemmDispatchMode(TorchDispatchMode):
    """Records aten GEMMs into a recorder; TE-owned calls are left to the TE adapter."""

    def __init__(self, recorder: Recorder) -> None:
        super().__init__()
        self._raw: Any = None
        self.recorder = recorder
        scope = recorder.scope
        self.param_storages = {k: scope.param_name(n) for n, p in scope.model.named_parameters()
                               if (k := _storage_key(p)) is not None}
        self.casts: dict[int | None, tuple[weakref.ref, str]] = {}
        # This step's forward GEMMs by module (fprop shape -> ForwardGemm), for backward GEMMs of unknown node.
        self.forward_shapes: dict[str | None, dict[GemmShape, ForwardGemm]] = {}
        # This step's forward GEMMs by the sequence number of the autograd node each made.
        self.nodes: dict[int, ForwardGemm] = {}
        self._nodes_step = -1
        # Without the sequence-number getter (older torch) nodes are not known: sizes decide.
        self._next_seq = getattr(getattr(torch._C, "_autograd", None), "_get_sequence_nr", None)
        self.te_forward: set[tuple[int, int, int, int]] = set()  # aten GEMMs inside TE modules

    def __enter__(self) -> GemmDispatchMode:
        # torch wraps __torch_dispatch__ so that its first call imports torch._dynamo (torch/_compile.py,
        # _disable_dynamo): a second inside the job's first captured GEMM, a cache folder under /tmp, and
        # the job's environment and torch.manual_seed changed. A job that has not loaded dynamo cannot be
        # tracing: while the mode is on, the wrapper's cache holds our function itself.
        raw = getattr(type(self).__dict__.get("__torch_dispatch__"), "__wrapped__", None)
        self._raw = None
        if "torch._dynamo" not in sys.modules and raw is not None and not hasattr(raw, "__dynamo_disable"):
            setattr(raw, "__dynamo_disable", raw)
            self._raw = raw
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            raw, self._raw = self._raw, None
            if raw is not None and vars(raw).get("__dynamo_disable") is raw:
                delattr(raw, "__dynamo_disable")

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # A compiled frame outside the model (a compiled loss) may run under this mode: without this dynamo
        # skips it, maybe for good (steady.py); with it, dynamo compiles with the mode off.
        return True

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        rec = self.recorder
        name = GEMM_OPS.get(func)
        if name is None or not rec.active:
            out = func(*args, **kwargs)
            if func in _WATCHED and rec.active:
                try:
                    if func in _CASTS:
                        self._track_cast(args, out)
                    elif torch.is_inference_mode_enabled():
                        rec.note_inference()
                except Exception as err:  # never break the job
                    rec.fail(err)
            return out
        token = None
        try:
            token = self._before(name, args, kwargs)
        except Exception as err:  # never break the job
            rec.fail(err)
        out = func(*args, **kwargs)  # the job's own op: its exception is the job's
        if token is not None:
            try:
                rec.end(token)
            except Exception as err:
                rec.fail(err)
        return out

    def _track_cast(self, args: tuple, out: Any) -> None:
        # A cast of a weight (autocast's copy) is still that weight. The copy is freed after backward
        # and its memory reused: held by a weak reference, it counts only while alive.
        src = _storage_key(args[0]) if args else None
        if not isinstance(out, torch.Tensor) or src is None:
            return
        name = self._known(src)
        if name is None and isinstance(args[0], nn.Parameter):
            # A parameter the model did not hold at start (FSDP2's all-gathered weight).
            name = self._param_name(args[0])
        if name is not None:
            self.casts[_storage_key(out)] = (weakref.ref(out), name)

    def _known(self, key: int | None) -> str | None:
        """The name of the parameter with storage ``key``, or of the live cast of one there."""
        name = self.param_storages.get(key)  # type: ignore[arg-type]
        if name:
            return name
        entry = self.casts.get(key)
        t = entry[0]() if entry is not None else None
        if entry is not None and t is not None and _storage_key(t) == key:
            return entry[1]
        self.casts.pop(key, None)  # dead, or its memory reused
        return None

    def _param_name(self, p: torch.Tensor) -> str | None:
        module_name, _ = self.recorder.scope.current()
        module = self.recorder.scope.module(module_name)
        for n, q in (module.named_parameters() if module is not None else ()):
            if q is p:
                return self.recorder.scope.param_name_in(module_name or "", n)
        return None

    def _current_params(self, module_name: str | None) -> set[int]:
        """Storages of the module's parameters now: FSDP2 swaps in freshly all-gathered ones."""
        module = self.recorder.scope.module(module_name)
        if module is None:
            return set()
        # A leaf's own parameter dict spares named_members' generators (once per activation operand).
        params = module._parameters.values() if not module._modules else module.parameters()
        return {k for p in params if p is not None and (k := _storage_key(p)) is not None}

    def weight_name(self, t: Any, module_name: str | None = None) -> str | None:
        """The shown name of the parameter ``t`` is, a view of, or a cast of; "" for one the module
        holds now under no name we know (FSDP2's all-gathered weight); None for an activation."""
        key = _storage_key(t)
        if key is None:
            return None
        name = self._known(key)
        if name is not None:
            self.recorder.scope.weights_used.add(name.rpartition(".")[0])
            return name
        return "" if key in self._current_params(module_name) else None

    def _owner(self, module_name: str | None, weight: str | None) -> tuple[str | None, str]:
        """(owner, sub-GEMM) of a forward GEMM in ``module_name``'s forward with weight ``weight``."""
        if not weight or module_name is None:
            return module_name, ""
        holder, _, attr = weight.rpartition(".")
        # A submodule's weight handed to a functional call: the submodule's GEMM.
        if holder != module_name and (not module_name or holder.startswith(module_name + ".")):
            return holder, ""
        if holder == module_name and attr in _MHA_PROJ and \
                isinstance(self.recorder.scope.module(module_name), nn.MultiheadAttention):
            return module_name, _MHA_PROJ[attr]
        return module_name, ""

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
            # An untagged backward node (TE's unfused attention bmm: docs/results/h200.md, node
            # metadata) running the backward of a GEMM inside a TE module: TE's too.
            rec.skip()
            return None
        m_splits: tuple[int, ...] | torch.Tensor | None = None
        if offs is not None:  # on the GPU, reading it now would sync inside the step: resolved later
            m_splits = splits_from_offs(offs) if offs.device.type == "cpu" else rec.defer_copy(offs)
        a, b = _operands(name, args)
        operands = [x for x in (a, b) if isinstance(x, torch.Tensor)]
        weights = [self.weight_name(x, module_name) for x in operands]
        has_weight = any(w is not None for w in weights)
        shape = GemmShape(m, k, n, batch=batch)
        if not in_fwd and rec.in_backward():
            owner, gemm, op, (m, k, n) = self._backward(module_name, shape, operands, has_weight)
        else:
            owner, gemm = self._owner(module_name, next((w for w in weights if w), None))
            fwd = ForwardGemm(owner, gemm, shape, _storage_key(a), _storage_key(b), has_weight)
            self.forward_shapes.setdefault(module_name, {}).setdefault(shape, fwd)
            if self._next_seq is not None and name in _DIFFERENTIABLE and torch.is_grad_enabled() and \
                    any(x.requires_grad for x in operands):
                if rec.step != self._nodes_step:  # the nodes of earlier steps have run their backward
                    self.nodes.clear()
                    self._nodes_step = rec.step
                # Autograd made this GEMM's node just before dispatching it here: the latest number.
                self.nodes[self._next_seq() - 1] = fwd
            op = GemmOp.FPROP
        if isinstance(m_splits, tuple):
            m = sum(m_splits) if op is not GemmOp.WGRAD else m
            k = sum(m_splits) if op is GemmOp.WGRAD else k
        dtypes = "+".join(dict.fromkeys(_DTYPES.get(x.dtype, str(x.dtype)) for x in operands))
        module = rec.scope.module(owner)
        site = rec.site(module=owner or "", gemm=gemm, op=op, m=m, k=k, n=n, batch=batch, precision=dtypes,
                        operands=tuple(f"Tensor[{x.dtype}]" for x in operands), source="torch", kernel=f"aten.{name}",
                        module_type=type(module).__name__ if module is not None else "")
        return rec.begin(site, in_fwd and rec.in_backward(), m_splits)

    def _from_te(self, m: int, k: int, n: int, batch: int) -> bool:
        return any(fb == batch and (m, k, n) in ((fm, fn, fk), (fk, fn, fm), (fk, fm, fn), (fn, fm, fk))
                   for fm, fk, fn, fb in self.te_forward)

    def _backward(self, module_name: str | None, raw: GemmShape, operands: list[torch.Tensor],
                  has_weight: bool) -> tuple[str | None, str, GemmOp, tuple[int, int, int]]:
        """(owner, sub-GEMM, pass, shape in the package convention) of a backward GEMM: from the
        forward GEMM whose node runs it, else by sizes against the module's forward GEMMs. A 2-D
        gradient computed transposed is written the canonical way (shapes.py)."""
        node = torch._C._current_autograd_node() if self.nodes else None
        fwd = self.nodes.get(node._sequence_nr()) if node is not None else None
        if fwd is not None and fwd.shape.batch == raw.batch:
            keys = {_storage_key(x) for x in operands}
            reads_a, reads_b = fwd.a in keys, fwd.b in keys
            # The operand it reads is not the one whose gradient it computes (dA = dC B^T reads B).
            grad_of = ("b" if reads_a else "a") if reads_a != reads_b else None
            found = _pass(raw, fwd, has_weight, grad_of)
            if found is not None:
                return (fwd.module, fwd.gemm, *found)
        for fwd in self.forward_shapes.get(module_name, {}).values():
            if fwd.shape.batch == raw.batch and (found := _pass(raw, fwd, has_weight, None)) is not None:
                return (fwd.module, fwd.gemm, *found)
        # Nothing matches: with a weight, an input's gradient; without, most likely a weight gradient.
        return module_name, "", GemmOp.DGRAD if has_weight else GemmOp.WGRAD, (raw.m, raw.k, raw.n)


def _pass(raw: GemmShape, fwd: ForwardGemm, has_weight: bool,
          grad_of: str | None) -> tuple[GemmOp, tuple[int, int, int]] | None:
    """Pass and canonical shape of backward GEMM ``raw`` if its sizes fit forward GEMM ``fwd``, else
    None. ``grad_of``: the input whose gradient it computes, where its operands told ("a", "b")."""
    da, db = backward_shapes(fwd.shape, weight=fwd.weighted)
    d, w = (da.m, da.k, da.n), (db.m, db.k, db.n)
    got = (raw.m, raw.k, raw.n)
    flip = raw.batch == 1  # mm's backward may run transposed; bmm's never does
    is_d = got == d or (flip and got == d[::-1])
    is_w = got == w or (flip and got == w[::-1])
    if is_d and is_w:  # sizes alone cannot tell (square products)
        if grad_of is not None:
            return (da.op, d) if grad_of == "a" else (db.op, w)
        # A linear layer's GEMM that reads the weight computes the input's gradient.
        return (da.op, d) if has_weight or not fwd.weighted else (db.op, w)
    if is_w and not (fwd.weighted and has_weight):  # a weight gradient never reads the weight
        return db.op, w
    if is_d:
        return da.op, d
    return None
