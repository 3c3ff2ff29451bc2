"""Torch adapter: a TorchDispatchMode that sees every aten GEMM, whoever calls it.

nn.Linear, F.linear, HF's Conv1D (addmm with a (in, out) weight), einsum layers (bmm), Mixtral's
3-D expert weights (mm on a slice, or ``torch._grouped_mm``) and ``F.multi_head_attention_forward``
all end in the ops below. The mode costs Python dispatch on every aten op of the step, so the
profiler runs it only on the steps chosen for shape discovery (what it costs: docs/step-plan.md).

Pass and owner of a backward GEMM: each forward GEMM made an autograd node (its sequence number is
the one autograd handed out just before the GEMM reached this mode), and the backward GEMMs run
inside that node, so the forward GEMM they belong to is known exactly: its owner, its shape, and
its operands. The operand a backward GEMM reuses says which gradient it computes: ``dC B^T`` reads
B and computes A's gradient, ``A^T dC`` reads A and computes B's. For a linear layer (B is the
weight) these are dgrad and wgrad; for a GEMM with no weight (attention's ``Q K^T`` and ``P V``,
an einsum of two activations) dgrad_a and dgrad_b (shapes.py): no weight, no "wgrad". Where the
node is unknown (a custom Function's backward) or reused storages cannot tell, sizes decide
against the forward GEMMs the module ran (gradient of A = M x N x K, of B = K x M x N).

A weight is recognised by its storage: a parameter, a view of one, or a cast of one
(torch.autocast copies the weight once per forward). Whose GEMM it is: the module running, except
where a module hands a submodule's weight to a functional call (``nn.MultiheadAttention`` gives
``out_proj.weight`` to ``F.multi_head_attention_forward``): that submodule owns it. Inside
MultiheadAttention the input projection is named by its weight (``attn.in_proj``, or
``q_proj``/``k_proj``/``v_proj`` with separate weights).
"""

from __future__ import annotations

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
# nn.MultiheadAttention's input-projection weights (packed, or separate when kdim/vdim differ) ->
# the sub-GEMM they name.
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


def _under(name: str, parent: str) -> bool:
    """Whether module ``name`` is strictly inside module ``parent``."""
    return name != parent and (not parent or name.startswith(parent + "."))


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
        self.casts: dict[int | None, tuple[weakref.ref, str]] = {}
        self.refresh_params()
        # Forward GEMMs of each module this step (by the module running), for backward GEMMs whose
        # node is unknown: fprop shape -> its ForwardGemm.
        self.forward_shapes: dict[str | None, dict[GemmShape, ForwardGemm]] = {}
        # Forward GEMMs of this step by the sequence number of the autograd node each made.
        self.nodes: dict[int, ForwardGemm] = {}
        self._nodes_step = -1
        # Without the sequence-number getter (older torch) nodes are not known: sizes decide.
        self._next_seq = getattr(getattr(torch._C, "_autograd", None), "_get_sequence_nr", None)
        self.te_forward: set[tuple[int, int, int, int]] = set()  # aten GEMMs inside TE modules

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # Compiled modules inside the model run eagerly on the instrumented steps (steady.py), but
        # a compiled frame outside it (a compiled loss or step function) may still be entered under
        # this mode. Without this, dynamo skips such a frame and can mark its code skipped for good
        # (steady.py): the job would run eagerly from then on. With it (torch >= 2.9; older
        # versions never ask), dynamo compiles with the mode off and runs the compiled code under it.
        return True

    def refresh_params(self) -> None:
        scope = self.recorder.scope
        self.param_storages = {k: scope.param_name(n) for n, p in scope.model.named_parameters()
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
                return self.recorder.scope.param_name_in(module_name or "", n)
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
        return self.weight_name(t, module_name) is not None

    def weight_name(self, t: Any, module_name: str | None = None) -> str | None:
        """The (shown) name of the parameter ``t`` is, a view of, or a cast of; "" for a parameter
        the module holds now under no name we know (FSDP2's all-gathered weight); None for an
        activation."""
        key = _storage_key(t)
        if key is None:
            return None
        name = self.param_storages.get(key) or (self.casts[key][1] if self._live_cast(key) else None)
        if name is not None:
            self.recorder.scope.weights_used.add(name.rpartition(".")[0])
            return name
        return "" if key in self._current_params(module_name) else None

    def _owner(self, module_name: str | None, weight: str | None) -> tuple[str | None, str]:
        """(owner, sub-GEMM) of a forward GEMM run while ``module_name``'s forward runs with weight
        ``weight``: a submodule whose weight its parent hands to a functional call owns the GEMM
        (MultiheadAttention's out_proj); MultiheadAttention's input projection is its ``in_proj``."""
        if not weight or module_name is None:
            return module_name, ""
        holder, _, attr = weight.rpartition(".")
        if _under(holder, module_name):
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
            # An untagged backward node (TE's unfused attention bmm: docs/results/h200.md, facts the
            # code relies on: node metadata) whose GEMM is the backward of one that ran inside a TE
            # module: it belongs to TE too.
            rec.skip()
            return None
        m_splits: tuple[int, ...] | torch.Tensor | None = None
        if offs is not None:
            if offs.device.type == "cpu":
                m_splits = splits_from_offs(offs)
            else:  # reading device memory now would sync inside the step: resolve later
                m_splits = rec.defer_copy(offs)
        a, b = (args[1], args[2]) if name in ("addmm", "baddbmm") else (args[0], args[1])
        operands = [x for x in (a, b) if isinstance(x, torch.Tensor)]
        weights = [self.weight_name(x, module_name) for x in operands]
        has_weight = any(w is not None for w in weights)
        backward = not in_fwd and rec.in_backward()
        shape = GemmShape(m, k, n, batch=batch)
        if backward:
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
        site = rec.site(
            module=owner or "", gemm=gemm, op=op, m=m, k=k, n=n, batch=batch, precision=dtypes,
            operands=tuple(f"Tensor[{x.dtype}]" for x in operands), source="torch",
            kernel=f"aten.{name}", module_type=type(module).__name__ if module is not None else "")
        return rec.begin(site, in_fwd and rec.in_backward(), m_splits)

    def _from_te(self, m: int, k: int, n: int, batch: int) -> bool:
        for fm, fk, fn, fb in self.te_forward:
            if fb == batch and (m, k, n) in ((fm, fn, fk), (fk, fn, fm), (fk, fm, fn), (fn, fm, fk)):
                return True
        return False

    def _backward(self, module_name: str | None, raw: GemmShape, operands: list[torch.Tensor],
                  has_weight: bool) -> tuple[str | None, str, GemmOp, tuple[int, int, int]]:
        """(owner, sub-GEMM, pass, shape in the package convention) of a backward GEMM.

        The forward GEMM whose node runs it gives owner and pass; failing that (no node known), the
        forward GEMMs the owning module ran, by sizes. Autograd may compute a 2-D gradient
        transposed (dW^T = X^T dY for ``mm(X, W.t())``, dW for addmm): FLOPs are the same, so the
        shape is written the canonical way (shapes.py)."""
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
        # Nothing to match: a GEMM with a weight computes an input's gradient, one without most
        # likely a linear layer's weight gradient (a custom Function's backward).
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
