"""Which module owns the GEMM running right now. Forward: a per-thread stack kept by forward pre/post hooks.
Backward: hooks cannot tell sibling branches apart, so when a module's forward returns we tag the autograd nodes it
created (``node.metadata``); in backward ``torch._C._current_autograd_node()`` names the node running. Names are as
the user wrote the model, without torch's wrapper attributes (compile, DDP, FSDP, checkpointing)."""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any, cast

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from te_gemm_callback.capture.guards import POST, PRE, HookFn, StandIn, register

log = logging.getLogger("te_gemm_callback")

TAG = "te_gemm_module"


def is_te_module(module: nn.Module) -> bool:
    return type(module).__module__.startswith("transformer_engine")


def bears_gemm(m: nn.Module) -> bool:
    """Whether a module holds a weight that its own forward runs a GEMM with."""
    if isinstance(m, nn.Linear) or type(m).__name__ == "Conv1D":
        return True
    return any(p.dim() >= (2 if is_te_module(m) else 3) for _, p in m.named_parameters(recurse=False))


# torch's wrapper class (or a subclass) -> the attribute holding the wrapped module.
# ActivationWrapper is the base of CheckpointWrapper and OffloadWrapper.
_WRAPPERS = {"OptimizedModule": "_orig_mod", "DistributedDataParallel": "module", "DataParallel": "module",
             "FullyShardedDataParallel": "_fsdp_wrapped_module", "ActivationWrapper": "_checkpoint_wrapped_module"}


def wrapper_attr(module: nn.Module) -> str | None:
    """The attribute under which ``module`` wraps another, if it is one of torch's wrappers."""
    for cls in type(module).__mro__:
        attr = _WRAPPERS.get(cls.__name__)
        if attr is not None and cls.__module__.startswith("torch.") and attr in module._modules:
            return attr
    return None


def compiled_wrapper(model: nn.Module, known: nn.Module | None = None) -> nn.Module | None:
    """The live ``torch.compile`` wrapper around ``model`` (``known`` while it still wraps it), or None. A framework
    that compiles the model it was given (HF Trainer's ``torch_compile``) hands its callbacks the uncompiled one:
    the wrapper is found on the heap (a full scan: callers search once)."""
    import gc

    def wraps(outer: nn.Module | None) -> bool:
        while outer is not None and outer is not model:
            attr = wrapper_attr(outer)
            outer = outer._modules.get(attr) if attr is not None else None
        return outer is model

    if known is not None and wraps(known):
        return known
    found = [o for o in gc.get_objects() if type(o).__name__ == "OptimizedModule" and wraps(o)]
    return found[-1] if found else None


def display_names(model: nn.Module) -> dict[str, str]:
    """Qualified name -> the name shown, wrapper attributes dropped (``"_orig_mod.fc1"`` -> ``"fc1"``)."""
    modules: dict[str, nn.Module] = {}
    shown: dict[str, str] = {}
    for raw, m in model.named_modules():  # pre-order: a parent comes before its children
        modules[raw] = m
        parent, _, attr = raw.rpartition(".")
        if not raw:
            shown[raw] = ""
        elif wrapper_attr(modules[parent]) == attr:
            shown[raw] = shown[parent]
        else:
            shown[raw] = f"{shown[parent]}.{attr}" if shown[parent] else attr
    return shown


def te_ops_owners(modules: dict[str, nn.Module]) -> dict[int, tuple[str, str]]:
    """id of each GEMM-bearing te.ops op -> (owner shown, its own name); a ``te.ops.Linear``'s op is shown as it."""
    out: dict[int, tuple[str, str]] = {}
    for name, m in modules.items():
        if not type(m).__module__.startswith("transformer_engine.pytorch.ops") or not bears_gemm(m):
            continue
        parent, sep, _ = ("." + name).rpartition(".basic_ops.")  # "1.basic_ops.0" -> "1"
        shown = parent[1:] if sep and type(modules.get(parent[1:])).__name__ == "Linear" else name
        out[id(m)] = (shown, name)
    return out


def in_backward() -> bool:
    """True while the autograd engine runs a backward graph task on this thread."""
    return torch._C._current_graph_task_id() != -1


def _grad_nodes(output: Any) -> list[Any]:
    if isinstance(output, torch.Tensor):  # most modules: no pytree walk (µs per hooked call)
        return [output.grad_fn] if output.grad_fn is not None else []
    return [leaf.grad_fn for leaf in tree_leaves(output)
            if isinstance(leaf, torch.Tensor) and leaf.grad_fn is not None]


def _probe_next_seq(probe: torch.Tensor) -> int:
    # A view of a leaf that requires grad creates one node and takes the number; the next gets the one after.
    with torch.enable_grad():
        node = cast("torch.autograd.graph.Node", probe.view(()).grad_fn)
        return node._sequence_nr() + 1


def next_seq_reader() -> Callable[[], int]:
    """The autograd sequence number the next node made on this thread will get: torch's getter, else a probe
    node (docs/results/h200.md, facts the code relies on: sequence number)."""
    peek = getattr(getattr(torch._C, "_autograd", None), "_get_sequence_nr", None)
    if peek is not None:
        try:
            peek()
            return peek
        except Exception:
            pass
    probe = torch.zeros((), requires_grad=True)
    return lambda: _probe_next_seq(probe)


class _DeleteAttr:
    """A handle whose ``remove()`` takes an instance attribute off again (the class's shows)."""

    def __init__(self, obj: Any, name: str) -> None:
        self.obj, self.name = obj, name

    def remove(self) -> None:
        self.obj.__dict__.pop(self.name, None)


class ModuleScope:
    """Forward/backward module attribution for one model."""

    def __init__(self, model: nn.Module, on_error: Callable[[BaseException], None]) -> None:
        self.model = model
        # A wrapper and the module it wraps share one shown name; the wrapped one comes later and takes the entry.
        self.shown: dict[str, str] = display_names(model)
        raw_modules = dict(model.named_modules())
        self.modules: dict[str, nn.Module] = {self.shown[n]: m for n, m in raw_modules.items()}
        self.raw_names: dict[str, str] = {self.shown[n]: n for n in raw_modules}
        # Modules inside a TE module: their aten GEMMs are the TE adapter's, never counted twice.
        te_names = {n for n, m in self.modules.items() if is_te_module(m)}
        self.te_scoped: set[str] = {n for n in self.modules if self._has_te_ancestor(n, te_names)}
        self.ran: set[str] = set()  # modules whose forward ran while attached
        self.weights_used: set[str] = set()  # a GEMM used their weight outside their forward (MHA's out_proj)
        self._local = threading.local()
        self._handles: list[Any] = []
        self._on_error = on_error
        # te.ops: the fuser calls its ops' functional forward itself, never hooked.
        self.ops_owners: dict[int, tuple[str, str]] = te_ops_owners(self.modules)
        # The TE modules that run GEMMs themselves: the only owners the TE adapter needs named.
        self.te_gemm_set = {n for n, m in self.modules.items() if is_te_module(m) and bears_gemm(m)}
        self._current_seq = next_seq_reader()
        self._keep: list[Any] = []
        self.enabled = True
        self.owner_thread: int | None = None  # start()'s thread: the only one the dispatch mode sees
        self._thread_said = False

    def note_other_thread(self) -> None:
        """Said once: the dispatch mode is thread-local, so another thread's aten GEMMs go unrecorded."""
        if not self._thread_said:
            self._thread_said = True
            log.warning("te-gemm: the model runs on a thread other than the one that started the profiler: "
                        "its aten GEMMs are not recorded there (the capture hooks one thread); start the "
                        "profiler on the training thread")

    @staticmethod
    def _has_te_ancestor(name: str, te_names: set[str]) -> bool:
        parts = name.split(".") if name else []
        return any(".".join(parts[:i]) in te_names for i in range(len(parts) + 1))

    @property
    def seq_stack(self) -> list[int]:
        return self._local.__dict__.setdefault("seq", [])

    @property
    def stack(self) -> list[str]:
        return self._local.__dict__.setdefault("stack", [])

    def attach(self, names: Iterable[str] | None = None) -> None:
        """Hook every module, or only ``names`` (a leaf owner's tag walk covers only its own nodes)."""
        chosen = None if names is None else set(names)
        for raw, module in self.model.named_modules():
            name = self.shown[raw]
            # A wrapper runs no GEMM of its own: the module it wraps, under the same name, is hooked.
            if (chosen is not None and name not in chosen) or wrapper_attr(module) is not None:
                continue
            # Hook objects, not closures: a deepcopy or pickle of the model gets inert ones (guards.py).
            self._handles.append(register(module, _Pre(self, name)))
            # always_call: pop even when forward raises, so the stack never drifts.
            self._handles.append(register(module, _Post(self, name), always_call=True))
            if name in self.te_gemm_set and callable(getattr(type(module), "backward_dw", None)) \
                    and "backward_dw" not in module.__dict__:
                module.backward_dw = _BackwardDw(self, name, module.backward_dw)  # type: ignore[method-assign]
                self._handles.append(_DeleteAttr(module, "backward_dw"))

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self.stack.clear()
        self.seq_stack.clear()
        self.release()

    def _tag(self, output: Any, name: str, start: int) -> None:
        # Walk back over the nodes this forward created; an older node ends the walk.
        todo = _grad_nodes(output)
        seen: set[int] = set()
        while todo:
            node = todo.pop()
            if node is None or node._sequence_nr() < start or id(node) in seen:
                continue
            seen.add(id(node))
            # Inner modules tagged first: keep the innermost owner, but walk on through their nodes.
            node.metadata.setdefault(TAG, name)
            # The metadata can live on the Python wrapper: keep it alive until the step ends
            # (docs/results/h200.md, facts the code relies on: node metadata).
            self._keep.append(node)
            todo.extend(nxt for nxt, _ in node.next_functions
                        if nxt is not None and type(nxt).__name__ != "AccumulateGrad")

    def release(self) -> None:
        """Drop the node references of finished steps (their backward has run)."""
        self._keep.clear()

    def current(self) -> tuple[str | None, bool]:
        """(owning module name or None, True if a forward is running on this thread)."""
        if st := self.stack:
            return st[-1], True
        node = torch._C._current_autograd_node() if in_backward() else None
        # metadata: a property, typed as a method
        return (node.metadata.get(TAG) if node is not None else None), False  # type: ignore[attr-defined]

    def module(self, name: str | None) -> nn.Module | None:
        return self.modules.get(name) if name is not None else None

    def param_name(self, raw: str) -> str:
        """A parameter's qualified name (``named_parameters``) with its module's name as shown."""
        module, dot, attr = raw.rpartition(".")
        if not dot:
            return raw
        mod = self.shown.get(module, module)
        return f"{mod}.{attr}" if mod else attr

    def param_name_in(self, module_name: str, rel: str) -> str:
        """The shown name of parameter ``rel`` of the module shown as ``module_name``."""
        raw_module = self.raw_names.get(module_name, module_name)
        return self.param_name(f"{raw_module}.{rel}" if raw_module else rel)

    def ops_owner(self, depth: int = 12) -> str | None:
        """The te.ops op running the GEMM now, read from the calling frames' ``self`` or ``linear_op``."""
        f: FrameType | None = sys._getframe(2)
        owners = self.ops_owners
        for _ in range(depth):
            if f is None:
                return None
            for key in ("self", "linear_op"):
                v = f.f_locals.get(key)
                if v is None:
                    continue
                hit = owners.get(id(v))
                if hit is None:
                    found = [owners[id(o)] for o in getattr(v, "basic_ops", ()) if id(o) in owners]
                    hit = found[0] if len(found) == 1 else None
                if hit is not None:
                    self.weights_used.update(hit)
                    return hit[0]
            f = f.f_back
        return None


class _Pre(HookFn):
    """Forward pre-hook: push the module on this thread's stack (attributes bound once: it runs a lot)."""

    __slots__ = ("scope", "name", "local", "peek", "grad_on")
    kind = PRE

    def __init__(self, scope: ModuleScope, name: str) -> None:
        self.scope, self.name, self.local = scope, name, scope._local
        self.peek, self.grad_on = scope._current_seq, torch.is_grad_enabled

    def __call__(self, module: nn.Module, args: Any) -> None:
        scope = self.scope
        if scope.enabled:
            try:
                try:
                    st, seqs = self.local.stack, self.local.seq
                except AttributeError:  # first forward on this thread
                    st, seqs = scope.stack, scope.seq_stack
                    if scope.owner_thread is not None and threading.get_ident() != scope.owner_thread:
                        scope.note_other_thread()
                st.append(self.name)
                seqs.append(self.peek() if self.grad_on() else -1)
            except Exception as err:  # never break the job: report and stop capturing
                scope._on_error(err)


class _Post(HookFn):
    """Forward hook: pop the module, tag the autograd nodes its forward made."""

    __slots__ = ("scope", "name", "local", "grad_on", "ran")
    kind = POST

    def __init__(self, scope: ModuleScope, name: str) -> None:
        self.scope, self.name, self.local = scope, name, scope._local
        self.grad_on, self.ran = torch.is_grad_enabled, scope.ran

    def __call__(self, module: nn.Module, args: Any, output: Any) -> None:
        scope, name = self.scope, self.name
        if not scope.enabled:
            return
        st = getattr(self.local, "stack", None)
        start = -1
        if st and st[-1] == name:
            st.pop()
            start = self.local.seq.pop()
        self.ran.add(name)
        try:
            if start >= 0 and self.grad_on():
                scope._tag(output, name, start)
        except Exception as err:  # never break the job: report and stop capturing
            scope._on_error(err)


class _BackwardDw(StandIn):
    """TE's ``delay_wgrad_compute``: the wgrad GEMMs of the job's ``backward_dw()`` call belong to its module."""

    __slots__ = ("scope", "name")

    def __init__(self, scope: ModuleScope, name: str, fn: Callable) -> None:
        self.scope, self.name, self.fn = scope, name, fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        scope, name, fn = self.scope, self.name, self.fn
        if not scope.enabled:
            return fn(*args, **kwargs)
        st, seqs = scope.stack, scope.seq_stack
        st.append(name)
        seqs.append(-1)  # nothing to tag: no autograd node is made here
        try:
            return fn(*args, **kwargs)
        finally:
            if st and st[-1] == name:
                st.pop()
                seqs.pop()
