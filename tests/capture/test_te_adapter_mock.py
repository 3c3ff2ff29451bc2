"""The TE adapter against a stand-in for transformer_engine.pytorch.

Transformer Engine cannot be installed on a CPU-only machine, so this test builds the smallest
fake that has TE's shape where the adapter touches it: ``general_gemm``/``general_grouped_gemm``
defined in ``cpp_extensions.gemm`` and imported by name into module files, autograd Functions that
call them with TE's layouts (fprop "TN", dgrad "NN", wgrad "NT"), and a quantized-storage class.
The real thing is exercised by tests/test_gpu.py on the GPU host.
"""

import logging
import sys
import types

import pytest
import torch
from torch import nn

from te_gemm_callback import GemmProfiler, capture_steps
from te_gemm_callback.capture import te_adapter


class Float8TensorStorage:
    """Stands in for TE's per-tensor FP8 storage: logical shape via size()."""

    def __init__(self, t, quantizer):
        self._t, self._quantizer, self._fp8_dtype = t, quantizer, "DType.kFloat8E4M3"

    def size(self):
        return self._t.size()


class Float8CurrentScalingQuantizer:
    pass


def _general_gemm(A, B, out_dtype=None, quantization_params=None, gelu=False, gelu_in=None, alpha=1.0,
                  beta=None, accumulate=False, layout="TN", out=None, bias=None,
                  use_split_accumulator=False, grad=False):
    a = A._t if isinstance(A, Float8TensorStorage) else A
    b = B._t if isinstance(B, Float8TensorStorage) else B
    if layout == "TN":
        return (b @ a.t(),)
    if layout == "NN":
        return (b @ a,)
    return (b.reshape(-1, b.shape[-1]).t() @ a.reshape(-1, a.shape[-1]),)


def _general_grouped_gemm(A, B, out, quantization_params, out_dtype, layout="TN", m_splits=None,
                          grad=False, **kw):
    return [(_general_gemm(a, b, layout=layout)[0]) for a, b in zip(A, B)]


@pytest.fixture
def fake_te(monkeypatch):
    gemm = types.ModuleType("transformer_engine.pytorch.cpp_extensions.gemm")
    gemm.general_gemm, gemm.general_grouped_gemm = _general_gemm, _general_grouped_gemm
    linear = types.ModuleType("transformer_engine.pytorch.module.linear")
    linear.general_gemm = gemm.general_gemm  # imported by name, as TE's module files do
    grouped = types.ModuleType("transformer_engine.pytorch.module.grouped_linear")
    grouped.general_grouped_gemm = gemm.general_grouped_gemm
    mods = {"transformer_engine": types.ModuleType("transformer_engine"),
            "transformer_engine.pytorch": types.ModuleType("transformer_engine.pytorch"),
            gemm.__name__: gemm, linear.__name__: linear, grouped.__name__: grouped}
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
    from te_gemm_callback.precisions import import_te

    import_te.cache_clear()
    yield linear, grouped
    import_te.cache_clear()  # the stand-in must not stay cached as "TE" for later tests


class _LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, fp8, lin):
        ctx.save_for_backward(x, w)
        ctx.fp8, ctx.lin = fp8, lin
        wq = Float8TensorStorage(w, Float8CurrentScalingQuantizer()) if fp8 else w
        return lin.general_gemm(wq, x, layout="TN")[0]

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        dx = ctx.lin.general_gemm(w, dy, layout="NN", grad=True)[0]
        dw = ctx.lin.general_gemm(x, dy, layout="NT", grad=True)[0]
        return dx, dw, None, None


def _te_class(name, **methods):
    cls = type(name, (nn.Module,), methods)
    cls.__module__ = "transformer_engine.pytorch.module.linear"
    return cls


def make_linear(lin, k, n, fp8=False):
    def __init__(self):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.randn(n, k) / k**0.5)

    def forward(self, x):
        return _LinearFn.apply(x, self.weight, fp8, lin)

    return _te_class("Linear", __init__=__init__, forward=forward)()


def make_layernorm_mlp(lin, h, i):
    def __init__(self):
        nn.Module.__init__(self)
        self.fc1_weight = nn.Parameter(torch.randn(i, h) / h**0.5)
        self.fc2_weight = nn.Parameter(torch.randn(h, i) / i**0.5)

    def forward(self, x):
        return _LinearFn.apply(torch.relu(_LinearFn.apply(x, self.fc1_weight, False, lin)),
                               self.fc2_weight, False, lin)

    return _te_class("LayerNormMLP", __init__=__init__, forward=forward)()


def test_te_gemms_shapes_passes_precision_and_owner(fake_te):
    lin, _ = fake_te
    model = nn.Sequential()
    model.add_module("qkv", make_linear(lin, 16, 48, fp8=True))
    model.add_module("mlp", make_layernorm_mlp(lin, 48, 64))
    model.add_module("head", nn.Linear(48, 10))  # a plain torch layer beside TE ones
    x = torch.randn(3, 5, 16, requires_grad=True)  # (seq, batch, hidden): M = 15
    with GemmProfiler(model) as prof:
        model(x).sum().backward()
    assert getattr(lin.general_gemm, "__te_gemm_wrapped__", False) is False  # restored
    recs = {(r.name, r.op): r for r in prof.capture.records}
    q = recs[("qkv", "fprop")]
    assert (q.m, q.k, q.n, q.source, q.kernel) == (15, 16, 48, "te", "general_gemm")
    assert q.precision == "fp8_current+fp32" and q.operands[0].startswith("Float8TensorStorage")
    assert (recs[("qkv", "dgrad")].m, recs[("qkv", "dgrad")].k, recs[("qkv", "dgrad")].n) == (15, 48, 16)
    assert (recs[("qkv", "wgrad")].m, recs[("qkv", "wgrad")].k, recs[("qkv", "wgrad")].n) == (16, 15, 48)
    # LayerNormMLP's two GEMMs are told apart by their weights.
    for sub, shape in (("fc1", (15, 48, 64)), ("fc2", (15, 64, 48))):
        r = recs[(f"mlp.{sub}", "fprop")]
        assert (r.m, r.k, r.n, r.module_type) == (*shape, "LayerNormMLP")
        assert {op for (name, op) in recs if name == f"mlp.{sub}"} == {"fprop", "dgrad", "wgrad"}
    # The torch layer is seen by the dispatch adapter; nothing inside TE modules is counted twice.
    assert {r.source for r in prof.capture.records if r.module == "head"} == {"torch"}
    assert {r.source for r in prof.capture.records if r.module != "head"} == {"te"}
    assert len(prof.capture.records) == 9 + 3


def test_te_owners_carry_no_wrapper_prefix(fake_te):
    # Activation checkpointing wraps each layer (``_checkpoint_wrapped_module``): the TE GEMMs, the
    # recompute included, are the layer's, under the name the model gives it.
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    lin, _ = fake_te
    model = nn.Sequential(checkpoint_wrapper(make_linear(lin, 16, 32)), checkpoint_wrapper(make_linear(lin, 32, 8)))
    x = torch.randn(4, 16, requires_grad=True)
    with GemmProfiler(model) as prof:
        model(x).sum().backward()
    cap = prof.capture
    assert {(r.name, r.op) for r in cap.records if not r.recompute} == {
        (m, op) for m in ("0", "1") for op in ("fprop", "dgrad", "wgrad")}
    assert {r.module_type for r in cap.records} == {"Linear"}
    assert cap.coverage["never_ran"] == [] and cap.coverage["gemm_modules"] == 2


def test_grouped_gemm_records_m_splits(fake_te):
    _, grouped = fake_te

    class GroupedFn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, splits):
            ctx.save_for_backward(x, w)
            ctx.splits = splits
            xs = x.split(splits)
            ws = [w] * len(splits)
            return torch.cat(grouped.general_grouped_gemm(ws, xs, [], [], None, m_splits=splits))

        @staticmethod
        def backward(ctx, dy):
            x, w = ctx.saved_tensors
            dys, xs = dy.split(ctx.splits), x.split(ctx.splits)
            dx = torch.cat(grouped.general_grouped_gemm([w] * len(xs), dys, [], [], None, layout="NN",
                                                        m_splits=ctx.splits, grad=True))
            dws = grouped.general_grouped_gemm(xs, dys, [], [], None, layout="NT", m_splits=ctx.splits,
                                               grad=True)
            return dx, sum(dws), None

    class GroupedLinear(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight0 = nn.Parameter(torch.randn(12, 8))

        def forward(self, x, splits):
            return GroupedFn.apply(x, self.weight0, splits)

    GroupedLinear.__module__ = "transformer_engine.pytorch.module.grouped_linear"
    model = GroupedLinear()
    x = torch.randn(10, 8, requires_grad=True)
    with GemmProfiler(model) as prof:
        model(x, [3, 0, 7]).sum().backward()
    recs = {r.op: r for r in prof.capture.records}
    assert (recs["fprop"].m, recs["fprop"].k, recs["fprop"].n) == (10, 8, 12)
    assert (recs["dgrad"].m, recs["dgrad"].k, recs["dgrad"].n) == (10, 12, 8)
    assert (recs["wgrad"].m, recs["wgrad"].k, recs["wgrad"].n) == (8, 10, 12)
    assert all(r.m_splits == [[3, 0, 7]] and r.kernel == "general_grouped_gemm" for r in recs.values())
    # Later instrumented steps take the owner by launch order (no hooks) while the token splits
    # change from step to step: each step's splits are still recorded.
    splits = iter([[3, 0, 7], [5, 5, 0], [1, 2, 7]])
    cap = capture_steps(model, lambda: model(x, next(splits)).sum().backward(), 0, instrumented_steps=3,
                        kernel_steps=0, dispatch_steps=0)
    assert cap.meta["owners_by_launch_order"] == {"steps": [1, 2], "failed": []}
    assert all(r.m_splits == [[3, 0, 7], [5, 5, 0], [1, 2, 7]] and r.calls_per_step == 1 for r in cap.records)
    # Kernel records: each grouped call launched a kernel per expert with rows (2 of 3 here).
    from helpers.fakes import FakeKernels

    # No dispatch mode: this stand-in runs its experts as aten mm calls, which TE's C++ GEMM does not.
    cap = capture_steps(model, lambda: model(x, [3, 0, 7]).sum().backward(), 0,
                        kernel_profile=FakeKernels(gemms=6), dispatch_steps=0)
    assert cap.meta["kernel_join"] == "joined by launch order"
    # FakeKernels: GEMM kernel i spans 10 -> 10 + (i + 1) * 100 µs from its own start 1000 µs apart.
    assert {r.op: r.times_ms for r in cap.records} == {"fprop": [pytest.approx(1.2)], "dgrad": [pytest.approx(1.4)],
                                                        "wgrad": [pytest.approx(1.6)]}


def _te_net(lin):
    model = nn.Sequential()
    model.add_module("qkv", make_linear(lin, 16, 48))
    model.add_module("mlp", make_layernorm_mlp(lin, 48, 64))
    return model


def _hooks(model):
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def test_later_instrumented_steps_take_owners_by_launch_order(fake_te):
    # The first instrumented step is hooked; the next ones run with no module hook at all and give
    # the same records: owners, shapes, passes, calls per step.
    lin, _ = fake_te
    model, x = _te_net(lin), torch.randn(4, 16, requires_grad=True)
    hooks = []

    def step():
        hooks.append(_hooks(model))
        model(x).sum().backward()

    caps = [capture_steps(model, step, 1, instrumented_steps=3, kernel_steps=0, reuse_owners=reuse)
            for reuse in (True, False)]
    assert caps[0].meta["owners_by_launch_order"] == {"steps": [1, 2], "failed": []}
    assert caps[1].meta["owners_by_launch_order"] == {"steps": [], "failed": []}
    assert hooks[:4] == [2 * 3, 0, 0, 0] and hooks[5:7] == [2 * 2, 2 * 2]  # dispatch step: every module

    def table(cap):
        return sorted((r.name, r.op, r.m, r.k, r.n, r.calls_per_step, r.recompute) for r in cap.records)

    assert table(caps[0]) == table(caps[1])
    assert {r.name for r in caps[0].records} == {"qkv", "mlp.fc1", "mlp.fc2"}
    assert all(r.calls_per_step == 1 for r in caps[0].records)

    # A plain torch head beside the TE layers: seen by the dispatch step only, counted per its step.
    model.add_module("head", nn.Linear(48, 10))
    cap = capture_steps(model, step, 1, instrumented_steps=3, kernel_steps=0)
    assert cap.meta["owners_by_launch_order"] == {"steps": [1, 2], "failed": []}
    assert {(r.module, r.source) for r in cap.records} == {("qkv", "te"), ("mlp", "te"), ("head", "torch")}
    assert all(r.calls_per_step == 1 for r in cap.records)


def test_by_order_steps_label_checkpoint_recompute_like_hooked_steps(fake_te):
    # Under activation checkpointing the MLP's forward GEMMs run again in backward. A step by
    # launch order takes each call's site and recompute flag from the hooked step's call at the
    # same position (no autograd query): the records match a capture hooked on every step.
    from torch.utils.checkpoint import checkpoint

    lin, _ = fake_te
    model, x = _te_net(lin), torch.randn(4, 16, requires_grad=True)

    def step():
        h = model.qkv(x)
        checkpoint(model.mlp, h, use_reentrant=False).sum().backward()

    caps = [capture_steps(model, step, 1, instrumented_steps=3, kernel_steps=0, reuse_owners=reuse)
            for reuse in (True, False)]
    assert caps[0].meta["owners_by_launch_order"] == {"steps": [1, 2], "failed": []}

    def table(cap):
        return sorted((r.name, r.op, r.m, r.k, r.n, r.calls_per_step, r.recompute) for r in cap.records)

    assert table(caps[0]) == table(caps[1])
    assert {r.name for r in caps[0].records if r.recompute} == {"mlp.fc1", "mlp.fc2"}
    assert all(r.calls_per_step == 1 for r in caps[0].records)


def test_a_loop_that_steps_after_every_iteration_leaves_no_step_out(fake_te, caplog):
    # step() after the last iteration opens a step that never runs: not a mismatch.
    lin, _ = fake_te
    model, x = _te_net(lin), torch.randn(4, 16, requires_grad=True)
    with GemmProfiler(model, instrumented_steps="all", kernel_steps=0) as prof:
        for _ in range(3):
            model(x).sum().backward()
            prof.step()
    assert prof.capture.meta["owners_by_launch_order"] == {"steps": [1, 2], "failed": []}
    assert "did not follow" not in caplog.text and len(prof.capture.steps) == 3


def test_a_step_off_the_first_steps_order_is_left_out_and_hooks_return(fake_te, caplog):
    # Step 2 changes the batch: its calls do not match step 0's, so its GEMMs are left out (their
    # owners are unknown), and step 3 is hooked again and captured with its owners.
    lin, _ = fake_te
    model = _te_net(lin)
    xs = iter([torch.randn(4, 16, requires_grad=True)] * 2 + [torch.randn(8, 16, requires_grad=True)] * 2)
    hooks = []

    def step():
        hooks.append(_hooks(model))
        model(next(xs)).sum().backward()

    cap = capture_steps(model, step, 0, instrumented_steps=4, kernel_steps=0, dispatch_steps=0)
    assert cap.meta["owners_by_launch_order"] == {"steps": [1], "failed": [2]}
    assert hooks == [4, 0, 0, 4]
    assert "did not follow the first instrumented step's order" in caplog.text
    assert all(r.module in ("qkv", "mlp") for r in cap.records)
    rows = {(r.name, r.op): [] for r in cap.records}
    for r in cap.records:
        rows[(r.name, r.op)].append((r.m, r.calls))
    assert rows[("qkv", "fprop")] == [(4, 2), (8, 1)]  # steps 0 and 1, then step 3


def make_delayed_linear(lin, k, n):
    """TE's ``delay_wgrad_compute=True``: backward leaves the wgrad GEMM in a store, and the job
    runs it later with ``backward_dw()`` (Megatron's pipeline schedules overlap it this way)."""

    class DelayedFn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, store):
            ctx.save_for_backward(x, w)
            ctx.store = store
            return lin.general_gemm(w, x, layout="TN")[0]

        @staticmethod
        def backward(ctx, dy):
            x, w = ctx.saved_tensors
            ctx.store.append((x, dy, w))
            return lin.general_gemm(w, dy, layout="NN", grad=True)[0], None, None

    def __init__(self):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.randn(n, k) / k**0.5)
        self.wgrad_store = []

    def forward(self, x):
        return DelayedFn.apply(x, self.weight, self.wgrad_store)

    def backward_dw(self):
        while self.wgrad_store:
            x, dy, w = self.wgrad_store.pop()
            w.grad = lin.general_gemm(x, dy, layout="NT", grad=True)[0]

    return _te_class("Linear", __init__=__init__, forward=forward, backward_dw=backward_dw)()


def test_delayed_wgrad_gemms_are_owned_by_their_module(fake_te):
    # The wgrad GEMM runs in backward_dw(), after backward and outside any forward or autograd
    # node: owned by its module, in hooked steps and in steps that take owners by launch order.
    lin, _ = fake_te
    model = nn.Sequential()
    model.add_module("proj", make_delayed_linear(lin, 16, 32))
    model.add_module("out", make_linear(lin, 32, 8))
    x = torch.randn(4, 16, requires_grad=True)

    def step():
        model(x).sum().backward()
        model.proj.backward_dw()

    cap = capture_steps(model, step, 1, instrumented_steps=3, kernel_steps=0)
    assert cap.meta["owners_by_launch_order"] == {"steps": [1, 2], "failed": []}
    ops = {(r.module, r.op): r for r in cap.records}
    assert set(ops) == {(m, op) for m in ("proj", "out") for op in ("fprop", "dgrad", "wgrad")}
    w = ops[("proj", "wgrad")]
    assert (w.m, w.k, w.n, w.calls_per_step) == (16, 4, 32, 1)
    assert "backward_dw" not in model.proj.__dict__  # the wrapper is gone with the hooks


def test_operand_formats():
    assert te_adapter.operand_format(torch.zeros(1, dtype=torch.bfloat16))[0] == "bf16"

    class Float8Quantizer:
        pass

    assert te_adapter.operand_format(Float8TensorStorage(torch.zeros(1), Float8Quantizer()))[0] == "fp8_delayed"
    assert te_adapter.precision_of(torch.zeros(1), torch.zeros(1)) == ("fp32", ("Tensor[torch.float32]",) * 2)

    class IdentityTensorStorage:  # TE's high-precision slot of a CustomRecipe: not a torch.Tensor
        def __init__(self, data):
            self._hp_data = data

    class IdentityTensor(IdentityTensorStorage):
        pass

    # Read as its data's precision (it was "unknown"): a module a per-module recipe keeps in BF16.
    assert te_adapter.operand_format(IdentityTensor(torch.zeros(1, dtype=torch.bfloat16))) == (
        "bf16", "IdentityTensor[torch.bfloat16]")


# --- te.ops (fusible ops) -------------------------------------------------------------------
# The structure TE 2.20's te.ops has where the adapter touches it: te.ops.Sequential runs one
# autograd Function over its ops; each te.ops.Linear holds its BasicLinear in ``basic_ops``; the
# fuser makes fused ops that are not submodules of the model and call the linear's functional
# forward with a ``linear_op`` local; backward calls ``BasicLinear.op_backward``. No module forward
# of an op ever runs, so hooks cannot name the owner.
def _ops_class(name, module, base=nn.Module, **methods):
    cls = type(name, (base,), methods)
    cls.__module__ = f"transformer_engine.pytorch.ops.{module}"
    return cls


def make_te_ops(lin, h, i):
    def basic_init(self, k, n):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.randn(n, k) / k**0.5)

    def functional_forward(x, weight):  # a staticmethod in TE: no ``self`` in this frame
        return lin.general_gemm(weight, x, layout="TN")[0]

    def op_forward(self, x):
        return BasicLinear._functional_forward(x, self.weight)

    def op_backward(self, x, dy):
        dx = lin.general_gemm(self.weight, dy, layout="NN", grad=True)[0]
        dw = lin.general_gemm(x, dy, layout="NT", grad=True)[0]
        return dx, dw

    BasicLinear = _ops_class("BasicLinear", "basic.basic_linear", __init__=basic_init,
                             _functional_forward=staticmethod(functional_forward), op_forward=op_forward,
                             op_backward=op_backward)

    def linear_init(self, k, n):
        nn.Module.__init__(self)
        self.basic_ops = nn.ModuleList([BasicLinear(k, n)])

    Linear = _ops_class("Linear", "linear", __init__=linear_init)

    def fused_init(self, basic_ops):
        nn.Module.__init__(self)
        self.basic_ops = nn.ModuleList(basic_ops)

    def fuser_forward(self, x):
        linear_op = self.basic_ops[0]
        return torch.relu(BasicLinear._functional_forward(x, linear_op.weight))

    Fused = _ops_class("ForwardLinearBiasActivation", "fused.forward_linear_bias_activation",
                       __init__=fused_init, fuser_forward=fuser_forward)

    class FuserFn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, fused, second, *weights):
            y = fused.fuser_forward(x)
            ctx.save_for_backward(x, y)
            ctx.ops = (fused.basic_ops[0], second)
            return second.op_forward(y)

        @staticmethod
        def backward(ctx, dz):
            x, y = ctx.saved_tensors
            first, second = ctx.ops
            dy, dw2 = second.op_backward(y, dz)
            dx, dw1 = first.op_backward(x, dy * (y > 0))
            return dx, None, None, dw1, dw2

    def seq_init(self):
        nn.Module.__init__(self)
        self.add_module("0", Linear(h, i))
        self.add_module("1", Linear(i, h))

    def seq_forward(self, x):
        a, b = self._modules["0"].basic_ops[0], self._modules["1"].basic_ops[0]
        return FuserFn.apply(x, Fused([a]), b, a.weight, b.weight)

    return _ops_class("Sequential", "sequential", __init__=seq_init, forward=seq_forward)()


@pytest.mark.parametrize("dispatch_steps", [0, 1])
def test_te_ops_gemms_are_owned_by_their_linear_ops(fake_te, caplog, dispatch_steps):
    lin, _ = fake_te
    model = make_te_ops(lin, 16, 32)
    x = torch.randn(6, 16, requires_grad=True)
    with caplog.at_level("WARNING", logger="te_gemm_callback"):
        with GemmProfiler(model, dispatch_steps=dispatch_steps) as prof:
            model(x).sum().backward()
    cap = prof.capture
    got = sorted((r.module, r.op, r.shape.mkn, r.module_type) for r in cap.records)
    assert got == sorted([("0", "fprop", "6x16x32", "Linear"), ("0", "dgrad", "6x32x16", "Linear"),
                          ("0", "wgrad", "16x6x32", "Linear"), ("1", "fprop", "6x32x16", "Linear"),
                          ("1", "dgrad", "6x16x32", "Linear"), ("1", "wgrad", "32x6x16", "Linear")])
    assert cap.coverage["never_ran"] == [] and not any("never ran" in r.message for r in caplog.records)


def test_modules_no_adapter_watched_are_not_reported_as_never_ran(fake_te, caplog):
    """Without a dispatch step, a plain nn.Linear's GEMMs are not seen: it is "not watched", not
    "never ran" (it did run), and one warning says why; with the dispatch step it is captured."""
    lin, _ = fake_te
    model = nn.Sequential(make_linear(lin, 8, 16), nn.Linear(16, 4))
    x = torch.randn(6, 8, requires_grad=True)

    def step():
        model(x).sum().backward()

    with caplog.at_level(logging.WARNING, logger="te_gemm_callback"):
        cap = capture_steps(model, step, 0, kernel_steps=0, dispatch_steps=0)
    assert cap.coverage["never_ran"] == [] and cap.coverage["not_watched"] == ["1"]
    assert {r.module for r in cap.records} == {"0"}
    msgs = [r.getMessage() for r in caplog.records if r.name == "te_gemm_callback"]
    assert len(msgs) == 1 and "not captured, no adapter watched them" in msgs[0] and msgs[0].endswith(": 1"), msgs
    cap = capture_steps(model, step, 0, kernel_steps=0)
    assert cap.coverage["never_ran"] == [] and cap.coverage["not_watched"] == []
    assert {r.module for r in cap.records} == {"0", "1"}
