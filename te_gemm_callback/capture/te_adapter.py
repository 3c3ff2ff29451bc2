"""TE adapter: intercept ``general_gemm`` / ``general_grouped_gemm`` in every loaded TE module that
imported them by name. The operands' types tell the precision. Operand conventions (TE 2.x;
docs/design.md, docs/results/h200.md: operands):
    fprop  "TN": general_gemm(weight (N, K), input (..., K))        -> M x K x N
    dgrad  "NN": general_gemm(weight (N, K), grad_out (..., N))     -> M x N x K
    wgrad  "NT": general_gemm(input (..., K), grad_out (..., N))    -> K x M x N
Grouped GEMMs take lists of the same operands, one per expert, and ``m_splits``.
"""

from __future__ import annotations

import inspect
import math
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import torch

from te_gemm_callback.capture.launch_order import LaunchOwners
from te_gemm_callback.capture.scope import TAG
from te_gemm_callback.shapes import GemmOp

if TYPE_CHECKING:
    from te_gemm_callback.capture.recorder import Recorder

GEMM_FUNCS = ("general_gemm", "general_grouped_gemm")
LAYOUT_OP = {"TN": GemmOp.FPROP, "NN": GemmOp.DGRAD, "NT": GemmOp.WGRAD}  # TE layout -> pass
_WRAPPED = "__te_gemm_wrapped__"

# TE storage class -> precision family. Per-tensor FP8 is refined by its quantizer below.
_FAMILIES = {"NVFP4TensorStorage": "nvfp4", "MXFP8TensorStorage": "mxfp8",
             "Float8BlockwiseQTensorStorage": "fp8_block", "Float8TensorStorage": "fp8"}
_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def operand_format(x: Any) -> tuple[str, str]:
    """(family, detail) of one GEMM operand: ("fp8_delayed", "Float8Tensor[E4M3]") or ("bf16", ...)."""
    if isinstance(x, torch.Tensor) and type(x) is torch.Tensor:
        return _DTYPES.get(x.dtype, str(x.dtype).replace("torch.", "")), f"Tensor[{x.dtype}]"
    mro = [c.__name__ for c in type(x).__mro__]
    if "IdentityTensorStorage" in mro:  # TE's high-precision slot of a CustomRecipe: its data as given
        data = getattr(x, "_hp_data", None)
        dtype: Any = data.dtype if isinstance(data, torch.Tensor) else getattr(x, "_dtype", None)
        return _DTYPES.get(dtype, str(dtype).replace("torch.", "")), f"{type(x).__name__}[{dtype}]"
    for cls_name, family in _FAMILIES.items():
        if cls_name in mro:
            detail = type(x).__name__
            fp8_dtype = getattr(x, "_fp8_dtype", None)
            if fp8_dtype is not None:
                detail += f"[{str(fp8_dtype).split('.')[-1].replace('kFloat8', '')}]"
            if family == "fp8":
                quantizer = type(getattr(x, "_quantizer", None)).__name__
                family = "fp8_current" if "CurrentScaling" in quantizer else "fp8_delayed"
            return family, detail
    if isinstance(x, torch.Tensor):  # another tensor subclass: report its dtype
        return _DTYPES.get(x.dtype, str(x.dtype)), type(x).__name__
    return "unknown", type(x).__name__


def precision_of(*operands: Any) -> tuple[str, tuple[str, ...]]:
    fams, details = zip(*(operand_format(x) for x in operands))
    return "+".join(dict.fromkeys(fams)), tuple(details)


def _size(x: Any) -> tuple[int, ...]:
    if isinstance(x, torch.Tensor):
        return x.shape
    cw = getattr(x, "_columnwise_data", None)
    if hasattr(x, "_fp4_dtype") and cw is not None and getattr(x, "_rowwise_data", None) is None:
        # NVFP4 holding only its columnwise copy (te.Linear's input for wgrad): TE's size() warns on
        # every call there. The copy is stored transposed, two values a byte; this is what size() reads.
        s = cw.shape
        return (*s[1:-1], s[-1] * 2, s[0])
    return tuple(x.size()) if hasattr(x, "size") else tuple(x.shape)


def _rows(shape: tuple[int, ...]) -> int:
    return math.prod(shape[:-1])


def gemm_mkn(layout: str, a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> tuple[int, int, int]:
    """(m, k, n) in the package convention from TE's layout and operand shapes."""
    if layout == "TN":  # A = weight (N, K), B = input (..., K)
        return _rows(b_shape), b_shape[-1], a_shape[0]
    if layout == "NN":  # A = weight (N, K), B = grad_output (..., N)
        return _rows(b_shape), b_shape[-1], a_shape[-1]
    if layout == "NT":  # A = input (..., K), B = grad_output (..., N)
        return a_shape[-1], _rows(a_shape), b_shape[-1]
    raise ValueError(f"unknown GEMM layout {layout!r}")


def grouped_mkn(layout: str, a0: tuple[int, ...], b0: tuple[int, ...], total: int) -> tuple[int, int, int]:
    """Grouped GEMM: the weight dims come from one expert, the token count is the sum of splits."""
    if layout == "TN":
        return total, a0[-1], a0[0]
    if layout == "NN":
        return total, a0[0], a0[-1]
    return a0[-1], total, b0[-1]  # "NT": inputs (m_i, K), grads (m_i, N)


def weight_label(module: torch.nn.Module | None, n: int, k: int) -> str:
    """Name the sub-GEMM by the module's own weight of shape (N, K): LayerNormMLP's fc1/fc2."""
    if module is None:
        return ""
    names = [name for name, p in module.named_parameters(recurse=False)
             if "weight" in name and tuple(p.shape) == (n, k)]
    return "" if len(names) != 1 or names[0] == "weight" else names[0].removesuffix("_weight").removesuffix("weight")


def patch_te_gemms(make_wrapper: Callable[[Callable, bool], Callable]) -> list[tuple[Any, str, Callable]]:
    """Replace TE's GEMM functions, built by ``make_wrapper(orig, grouped)``, wherever a loaded TE
    module holds them; returns what :func:`unpatch` restores (nothing where TE was never imported)."""
    gemm_mod = sys.modules.get("transformer_engine.pytorch.cpp_extensions.gemm")
    if "transformer_engine.pytorch" not in sys.modules or gemm_mod is None:
        return []
    patched: list[tuple[Any, str, Callable]] = []
    for fname in GEMM_FUNCS:
        orig = getattr(gemm_mod, fname, None)
        if orig is None:
            continue
        if getattr(orig, _WRAPPED, False):
            unpatch(patched)
            raise RuntimeError("another GemmProfiler is already capturing TE GEMMs: stop it first")
        wrapper: Any = make_wrapper(orig, fname == "general_grouped_gemm")  # a function: takes attributes
        setattr(wrapper, _WRAPPED, True)
        wrapper.__wrapped__ = orig
        for name, mod in list(sys.modules.items()):
            if name.startswith("transformer_engine.pytorch") and getattr(mod, fname, None) is orig:
                setattr(mod, fname, wrapper)
                patched.append((mod, fname, cast(Callable, orig)))
    return patched


def arg_reader(fn: Callable) -> Callable[[tuple, dict, str, Any], Any]:
    """``arg(args, kwargs, name, default)``: one argument of a call to ``fn``, positional or not."""
    pos = {p: i for i, p in enumerate(inspect.signature(fn).parameters)}

    def arg(args: tuple, kwargs: dict, name: str, default: Any) -> Any:
        if name in kwargs:
            return kwargs[name]
        i = pos[name]
        return args[i] if i < len(args) else default

    return arg


def unpatch(patched: list[tuple[Any, str, Callable]]) -> None:
    for mod, fname, orig in reversed(patched):
        setattr(mod, fname, orig)


class TEInterceptor:
    """Installs wrappers around TE's GEMM entry points that report to a recorder."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self._patched: list[tuple[Any, str, Callable]] = []
        self._precisions: dict[tuple, tuple[str, tuple[str, ...]]] = {}
        self._sites: dict[tuple, Any] = {}
        # (owner, layout, operand keys) -> (site, is fprop): shape and precision are read once per site.
        self._calls: dict[tuple, tuple[Any, bool]] = {}
        self.owners = LaunchOwners()

    @property
    def installed(self) -> bool:
        return bool(self._patched)

    @staticmethod
    def te_loaded() -> bool:
        return "transformer_engine.pytorch" in sys.modules

    def install(self) -> int:
        """Wrap every reference to TE's GEMM functions; returns how many names were wrapped."""
        self._patched = patch_te_gemms(self._wrap)
        return len(self._patched)

    def uninstall(self) -> None:
        unpatch(self._patched)
        self._patched = []

    def _wrap(self, orig: Callable, grouped: bool) -> Callable:
        arg = arg_reader(orig)
        if not grouped and not self.recorder.scope.ops_owners:
            return self._wrap_plain(orig, arg)
        rec = self.recorder

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not rec.active:
                return orig(*args, **kwargs)
            token = None
            try:
                token = self._before(args, kwargs, arg, grouped)
            except Exception as err:  # never break the job: report once, stop capturing
                rec.fail(err)
            out = orig(*args, **kwargs)
            if token is not None:
                rec.end(token)
            return out

        return wrapper

    def _wrap_plain(self, orig: Callable, arg: Callable) -> Callable:
        """The hot path, a plain GEMM of a model without te.ops: ``_before``, ``Recorder.begin`` and ``Recorder.end``
        inlined, as in a host-bound job every statement is step time (benchmarks/instrument_cost.py)."""
        rec, calls, local, owners = self.recorder, self._calls, self.recorder.scope._local, self.owners
        timer, nvtx, raw = rec.timer, rec.nvtx, rec.raw
        current_node, task_id = torch._C._current_autograd_node, torch._C._current_graph_task_id
        params = list(inspect.signature(orig).parameters)
        i_layout = params.index("layout") if "layout" in params else 1 << 30  # past any call's arguments

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not rec.active:
                return orig(*args, **kwargs)
            token = None
            try:
                a, b = args[:2] if len(args) > 1 else (arg(args, kwargs, "A", None), arg(args, kwargs, "B", None))
                layout = kwargs.get("layout") or (args[i_layout] if len(args) > i_layout else "TN")
                ka = (a.shape, a.dtype) if type(a) is torch.Tensor else _call_key(a)
                kb = (b.shape, b.dtype) if type(b) is torch.Tensor else _call_key(b)
                ckey = (layout, ka, kb)
                # No hooks this step: the hooked step's site at this launch position, once its key matches.
                entry = owners.next_entry(ckey) if owners.by_order else None
                if entry is not None and entry[2] is not None:
                    site, recompute = entry[2]
                else:
                    backward = task_id() != -1
                    if owners.by_order:  # None: another call than the reference's (the step is dropped)
                        owner = entry[1] if entry is not None else None
                    else:
                        st = getattr(local, "stack", None)
                        if st:
                            owner = st[-1]
                        else:
                            node = current_node() if backward else None
                            owner = node.metadata.get(TAG) if node is not None else None  # type: ignore[attr-defined]
                    key = (owner, layout, ka, kb)
                    found = calls.get(key)
                    if found is None:
                        found = calls[key] = self._site(owner, layout, a, b, False)
                    site, fprop = found
                    recompute = fprop and backward
                    if not owners.by_order:
                        owners.trace.append((ckey, owner, (site, recompute)))
                start = timer.start() if timer.enabled else None  # before the range: Recorder.begin says why
                try:
                    handle = nvtx.start(site.range_recompute if recompute else site.range) if nvtx.enabled else None
                except Exception:
                    timer.stop(start)  # opens the gate: a failed range must not hold the stream
                    raise
                token = (site, recompute, start, handle)
            except Exception as err:  # never break the job: report once, stop capturing
                rec.fail(err)
            out = orig(*args, **kwargs)
            if token is not None:
                site, recompute, start, handle = token
                try:
                    pair = timer.stop(start) if start is not None else None
                    if handle is not None:
                        nvtx.end(handle)
                    raw.append((rec.step, site, recompute, None, pair))
                except Exception as err:
                    rec.fail(err)
            return out

        return wrapper

    def _before(self, args: tuple, kwargs: dict, arg: Callable, grouped: bool) -> Any:
        """A grouped GEMM, or a plain one whose owner needs more than the scope (te.ops)."""
        rec = self.recorder
        a, b = arg(args, kwargs, "A", None), arg(args, kwargs, "B", None)
        layout = arg(args, kwargs, "layout", "TN")
        if not grouped:
            ckey = (layout, _call_key(a), _call_key(b))
            owner = self._owner(ckey)
            key = (owner, *ckey)
            hit = self._calls.get(key)
            if hit is None:
                hit = self._calls[key] = self._site(owner, layout, a, b, False)
            return rec.begin(hit[0], hit[1] and rec.in_backward(), None)
        m_splits = arg(args, kwargs, "m_splits", None)
        if m_splits is None:  # derive from the token-major operand of each expert
            m_splits = [_rows(_size(t)) for t in (a if layout == "NT" else b)]
        m_splits = tuple(int(x) for x in m_splits)
        # Token counts change from step to step: the launch position checks layout and expert count.
        mkn = grouped_mkn(layout, _size(a[0]), _size(b[0]), sum(m_splits))
        site, fprop = self._site(self._owner((layout, "grouped", len(m_splits))), layout, a[0], b[0], True, mkn)
        return rec.begin(site, fprop and rec.in_backward(), m_splits)

    def _owner(self, ckey: tuple) -> str | None:
        if self.owners.by_order:
            return self.owners.at(ckey)
        scope = self.recorder.scope
        module_name, _ = scope.current()
        if scope.ops_owners and module_name not in scope.te_gemm_set:
            module_name = scope.ops_owner() or module_name
        self.owners.trace.append((ckey, module_name, None))
        return module_name

    def _site(self, module_name: str | None, layout: str, a: Any, b: Any, grouped: bool,
              mkn: tuple[int, int, int] | None = None) -> tuple[Any, bool]:
        """The site of a GEMM call (built once per distinct site) and whether it is an fprop."""
        m, k, n = mkn or gemm_mkn(layout, _size(a), _size(b))
        pkey = (_operand_key(a), _operand_key(b))
        prec = self._precisions.get(pkey)
        if prec is None:
            prec = self._precisions[pkey] = precision_of(a, b)
        op = LAYOUT_OP[layout]
        skey = (module_name, op, m, k, n, prec, grouped)
        site = self._sites.get(skey)
        if site is None:
            module = self.recorder.scope.module(module_name)
            # The weight is (N, K) of the forward GEMM: read it back from each pass's written shape.
            wn, wk = {GemmOp.FPROP: (n, k), GemmOp.DGRAD: (k, n), GemmOp.WGRAD: (n, m)}[op]
            site = self._sites[skey] = self.recorder.site(
                module=module_name or "", gemm=weight_label(module, wn, wk), op=op, m=m, k=k, n=n,
                precision=prec[0], operands=prec[1], source="te",
                kernel="general_grouped_gemm" if grouped else "general_gemm",
                module_type=type(module).__name__ if module is not None else "")
        return site, op is GemmOp.FPROP


def _call_key(x: Any) -> tuple:
    if type(x) is torch.Tensor:  # a plain tensor: shape and dtype say all
        return x.shape, x.dtype
    return _size(x), _operand_key(x)


def _operand_key(x: Any) -> tuple:
    """What decides the precision label: the storage type, dtype, quantizer type and FP8 format."""
    return (type(x), getattr(x, "dtype", None), type(getattr(x, "_quantizer", None)), getattr(x, "_fp8_dtype", None))
