"""Labels a user reads: the pass of every GEMM (no weight gradient where there is no weight), the
owner of every GEMM (MultiheadAttention's projections apart, no wrapper prefixes), and a bench
that times exactly the (owner, pass) pairs the job ran. FLOPs are checked against torch's own
FlopCounterMode, which shares no code with the capture."""

import collections

import pytest
import torch
import torch.nn.functional as F
from helpers.oracles import flop_counter_mm
from torch import nn

from te_gemm_callback import GemmProfiler
from te_gemm_callback.capture.capture_file import GemmCapture
from te_gemm_callback.capture.scope import display_names
from te_gemm_callback.files.specs import PASS_NAMES as SPEC_PASS_NAMES
from te_gemm_callback.microbench.cache import ResultCache
from te_gemm_callback.microbench.engine import run_bench
from te_gemm_callback.microbench.items import items_from_capture, passes_of
from te_gemm_callback.microbench.results import step_ms
from te_gemm_callback.shapes import PASS_NAMES, GemmOp, GemmShape, backward_shapes, fprop_of

LINEAR_PASSES = {"fprop", "dgrad", "wgrad"}
WEIGHTLESS_PASSES = {"fprop", "dgrad_a", "dgrad_b"}


class MhaNet(nn.Module):
    """A first layer (its input needs no gradient), self-attention, and a head."""

    def __init__(self, e=32, heads=4):
        super().__init__()
        self.embed = nn.Linear(16, e)
        self.attn = nn.MultiheadAttention(e, heads, batch_first=True)
        self.head = nn.Linear(e, 8)

    def forward(self, x):
        h = self.embed(x)
        return self.head(self.attn(h, h, h)[0])


class EinsumAttention(nn.Module):
    """Eager attention written with einsum (QK^T) and matmul (PV): batched GEMMs of activations.
    seq 6, head_dim 8: the gradient of QK^T's left input and of PV's right input have the same
    sizes (6 x 6 x 8), so sizes alone cannot tell these passes apart."""

    def __init__(self, e=32, heads=4):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(e, e) for _ in range(4))

    def forward(self, x):
        b, s, e = x.shape
        split = lambda t: t.view(b, s, self.heads, e // self.heads).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        p = torch.einsum("bhqd,bhkd->bhqk", q, k).softmax(-1)
        return self.o((p @ v).transpose(1, 2).reshape(b, s, e))


def profile(model, step, steps=1):
    with GemmProfiler(model) as prof:
        for i in range(steps):
            step()
            if i < steps - 1:
                prof.step()
    return prof.capture


def passes(cap, name):
    return {r.op for r in cap.records if r.name == name}


def check_weightless(cap):
    """Every batched GEMM's backward is its two input gradients, of the derived sizes, as often as
    its forward ran; none is called a weight gradient."""
    batched = [r for r in cap.records if r.batch > 1 and not r.recompute]
    assert batched
    assert {r.op for r in batched} == WEIGHTLESS_PASSES
    got = collections.Counter((r.name, r.op, r.shape) for r in batched for _ in range(r.calls))
    want = collections.Counter()
    for r in batched:
        if r.op == "fprop":
            for s in (r.shape, *backward_shapes(r.shape, weight=False)):
                want[(r.name, str(s.op), s)] += r.calls
    assert got == want


def test_mha_projections_owned_apart_and_passes_right():
    torch.manual_seed(0)
    model = MhaNet()
    x = torch.randn(2, 6, 16)  # the input needs no gradient: embed runs no dgrad
    step = lambda: model(x).sum().backward()  # noqa: E731
    total, _ = flop_counter_mm(step)
    cap = profile(model, step)
    assert cap.flops_per_step == total
    assert cap.coverage["never_ran"] == []
    owners = {r.name for r in cap.records}
    assert owners == {"embed", "attn.in_proj", "attn.out_proj", "attn", "head"}
    # out_proj is the submodule whose weight F.multi_head_attention_forward used; in_proj is the
    # attention module's own packed weight.
    assert {(r.module, r.gemm) for r in cap.records if r.name.startswith("attn.")} == {
        ("attn", "in_proj"), ("attn.out_proj", "")}
    assert {r.module_type for r in cap.records if r.name == "attn.out_proj"} == {"NonDynamicallyQuantizableLinear"}
    for name in ("attn.in_proj", "attn.out_proj", "head"):
        assert passes(cap, name) == LINEAR_PASSES, name
        (f,) = [r.shape for r in cap.records if r.name == name and r.op == "fprop"]
        assert {r.shape for r in cap.records if r.name == name and r.op != "fprop"} == set(backward_shapes(f))
    assert passes(cap, "embed") == {"fprop", "wgrad"}  # no dgrad: nothing needed the input's gradient
    assert [r.shape for r in cap.records if r.name == "attn.in_proj" and r.op == "fprop"] == [GemmShape(12, 32, 96)]
    check_weightless(cap)


def test_mha_with_separate_kv_weights_names_each_projection():
    # kdim/vdim other than embed_dim: MultiheadAttention holds q_proj_weight, k_proj_weight and
    # v_proj_weight, each its own GEMM. Keys and values need no gradient: their projections have none.
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 2, batch_first=True, kdim=12, vdim=10)
    q, k, v = torch.randn(2, 5, 16, requires_grad=True), torch.randn(2, 7, 12), torch.randn(2, 7, 10)
    step = lambda: mha(q, k, v)[0].sum().backward()  # noqa: E731
    total, _ = flop_counter_mm(step)
    cap = profile(mha, step)
    assert cap.flops_per_step == total
    assert passes(cap, ".q_proj") == LINEAR_PASSES
    assert passes(cap, ".k_proj") == passes(cap, ".v_proj") == {"fprop", "wgrad"}
    assert passes(cap, "out_proj") == LINEAR_PASSES
    assert {r.shape for r in cap.records if r.name == ".k_proj" and r.op == "fprop"} == {GemmShape(14, 12, 16)}
    check_weightless(cap)


@pytest.mark.parametrize("square", [False, True], ids=["seq6-dim8", "seq8-dim8"])
def test_bmm_and_einsum_attention_has_no_weight_gradient(square):
    torch.manual_seed(0)
    model = EinsumAttention()
    x = torch.randn(2, 8 if square else 6, 32, requires_grad=True)
    step = lambda: model(x).square().sum().backward()  # noqa: E731
    total, _ = flop_counter_mm(step)
    cap = profile(model, step)
    assert cap.flops_per_step == total
    for name in ("q", "k", "v", "o"):
        assert passes(cap, name) == LINEAR_PASSES, name
    assert not [r for r in cap.records if r.batch > 1 and r.op in ("dgrad", "wgrad")]
    check_weightless(cap)


def test_hf_attention_bmm_labels_match_flop_counter():
    # GPT-2 splits one packed qkv tensor: Q and K are views of one storage, so the operands cannot
    # tell the two gradients apart there and the sizes do. Bert's eager attention uses matmul.
    transformers = pytest.importorskip("transformers")
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    for model in (transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=32, n_head=4, n_layer=2,
                                                                       vocab_size=128, bos_token_id=0,
                                                                       eos_token_id=0,
                                                                       attn_implementation="eager")),
                  transformers.BertForMaskedLM(transformers.BertConfig(hidden_size=32, intermediate_size=64,
                                                                       num_attention_heads=4, num_hidden_layers=2,
                                                                       vocab_size=128,
                                                                       attn_implementation="eager"))):
        step = lambda m=model: m(input_ids=ids, labels=ids).loss.backward()  # noqa: E731
        total, _ = flop_counter_mm(step)
        cap = profile(model, step)
        assert cap.flops_per_step == total
        check_weightless(cap)


def test_compiled_model_owners_have_no_orig_mod():
    torch.manual_seed(0)
    eager = MhaNet()
    x = torch.randn(2, 6, 16)
    want = profile(eager, lambda: eager(x).sum().backward())
    model = torch.compile(MhaNet(), backend="aot_eager")
    cap = profile(model, lambda: model(x).sum().backward(), steps=5)
    assert [s.kind for s in cap.steps].count("instrumented") == 1  # after the compile steps
    assert cap.records and not any("_orig_mod" in r.module for r in cap.records)
    assert {(r.name, r.op, r.shape) for r in cap.records} == {(r.name, r.op, r.shape) for r in want.records}
    assert cap.coverage["never_ran"] == [] and cap.coverage["gemm_modules"] == 3  # embed, out_proj, head


class UserNet(nn.Module):
    """A user's own submodule really named ``module``: not a wrapper's, so it keeps its name."""

    def __init__(self):
        super().__init__()
        self.module = nn.Linear(8, 16)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        return self.head(self.module(x))


@pytest.fixture
def gloo_group(tmp_path):
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_ddp_module_prefix_stripped_and_a_users_module_kept(gloo_group):
    # A real DistributedDataParallel over a gloo group of one process (CPU).
    torch.manual_seed(0)
    ddp = nn.parallel.DistributedDataParallel(UserNet())
    assert display_names(ddp) == {"": "", "module": "", "module.module": "module", "module.head": "head"}
    x = torch.randn(4, 8, requires_grad=True)
    cap = profile(ddp, lambda: ddp(x).sum().backward())
    assert {(r.module, r.op) for r in cap.records} == {(m, op) for m in ("module", "head") for op in LINEAR_PASSES}
    assert {r.module_type for r in cap.records} == {"Linear"}
    assert cap.coverage["never_ran"] == [] and cap.coverage["gemm_modules"] == 2


def test_checkpoint_and_fsdp_wrapper_prefixes_stripped(gloo_group):
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.fsdp import FullyShardedDataParallel

    torch.manual_seed(0)
    model = nn.Sequential(checkpoint_wrapper(nn.Linear(8, 16)), nn.ReLU(), nn.Linear(16, 4))
    x = torch.randn(4, 8, requires_grad=True)
    cap = profile(model, lambda: model(x).sum().backward())
    assert {r.module for r in cap.records} == {"0", "2"} and cap.coverage["never_ran"] == []
    with pytest.warns(UserWarning, match="NO_SHARD"):  # world size 1
        fsdp = FullyShardedDataParallel(UserNet(), device_id=torch.device("cpu"))
    assert display_names(fsdp)["_fsdp_wrapped_module.module"] == "module"
    cap = profile(fsdp, lambda: fsdp(x).sum().backward())
    assert {r.module for r in cap.records} == {"module", "head"} and cap.coverage["never_ran"] == []


def test_only_torchs_own_wrappers_are_stripped():
    class DistributedDataParallel(nn.Module):  # a user's class of that name is no wrapper of torch's
        def __init__(self):
            super().__init__()
            self.module = nn.Linear(4, 4)

    assert display_names(nn.Sequential(DistributedDataParallel())) == {"": "", "0": "0", "0.module": "0.module"}


def test_bench_items_are_exactly_the_captured_module_pass_pairs(tmp_path):
    torch.manual_seed(0)
    model = MhaNet()
    x = torch.randn(2, 6, 16)
    cap = profile(model, lambda: model(x).sum().backward())
    items = items_from_capture(cap)
    captured = {(r.name, r.op) for r in cap.records if not r.recompute}
    assert {(it.name, str(s.op)) for it in items for s in passes_of(it)} == captured
    assert ("embed", "dgrad") not in captured  # and so no item times one
    # The bench times every one of those passes, each at its shape, the batched ones batched.
    res = run_bench(items, ["BF16"], ["autocast"], cache=ResultCache(tmp_path / "c.json"), progress=False)
    assert {(r.op, r.shape) for r in res.results} == {(r.op, r.shape) for r in cap.records}
    assert all(r.ok for r in res.results)
    assert step_ms(res, items, "BF16", "autocast") > 0


def test_capture_with_dgrad_and_wgrad_on_bmm_still_loads_and_benches(tmp_path):
    # Written before the weightless pass names existed: the attention bmm's backward as dgrad/wgrad.
    def record(name, op, m, k, n, batch):
        return {"module": name, "gemm": "", "op": op, "m": m, "k": k, "n": n, "batch": batch, "precision": "fp32",
                "operands": [], "source": "torch", "kernel": "aten.bmm", "recompute": False, "module_type": "",
                "calls": 1, "calls_per_step": 1.0, "flops": 2 * batch * m * k * n}

    f = GemmShape(6, 8, 6, batch=8)
    d, w = backward_shapes(f)
    cap = GemmCapture.from_dict({"schema": "te-gemm-capture/1", "steps": [{"index": 0, "wall_ms": 5.0}],
                                 "records": [record("attn", str(s.op), s.m, s.k, s.n, 8) for s in (f, d, w)]})
    (item,) = items_from_capture(cap)
    assert item.fprop == f and item.ops == (GemmOp.FPROP, GemmOp.DGRAD, GemmOp.WGRAD) and not item.runs_recipe
    res = run_bench([item], ["BF16"], ["autocast"], cache=ResultCache(tmp_path / "c.json"), progress=False)
    assert {(r.op, r.batch) for r in res.results} == {("fprop", 8), ("dgrad", 8), ("wgrad", 8)}
    assert all(r.ok and r.backend == "torch" for r in res.results)


def test_pass_names_agree_everywhere():
    assert PASS_NAMES == SPEC_PASS_NAMES == ("fprop", "dgrad", "wgrad", "dgrad_a", "dgrad_b")
    f = GemmShape(6, 8, 10, batch=4)
    a, b = backward_shapes(f, weight=False)
    assert (a.op, a.m, a.k, a.n) == (GemmOp.DGRAD_A, 6, 10, 8) and (b.op, b.m, b.k, b.n) == (GemmOp.DGRAD_B, 8, 6, 10)
    assert fprop_of(a) == fprop_of(b) == f and a.flops == b.flops == f.flops
    assert a.op.sized_as is GemmOp.DGRAD and b.op.sized_as is GemmOp.WGRAD and b.op.weightless


def test_capture_with_weightless_passes_round_trips(tmp_path):
    model = EinsumAttention()
    x = torch.randn(2, 6, 32, requires_grad=True)
    cap = profile(model, lambda: model(x).sum().backward())
    back = GemmCapture.load(cap.save(tmp_path / "gemm_capture.json"))
    assert {(r.name, r.op) for r in back.records} == {(r.name, r.op) for r in cap.records}
    assert {"dgrad_a", "dgrad_b"} <= {r.op for r in back.records}


def test_functional_linear_in_a_parent_is_owned_by_the_weights_module():
    # The rule behind out_proj, in general: a parent that runs F.linear with a child's weight.
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(8, 8)

        def forward(self, x):
            return F.linear(x, self.proj.weight)

    model = Tied()
    x = torch.randn(3, 8, requires_grad=True)
    cap = profile(model, lambda: model(x).sum().backward())
    assert {(r.module, r.op) for r in cap.records} == {("proj", op) for op in LINEAR_PASSES}
    assert cap.coverage["never_ran"] == []


def test_the_compiled_wrapper_a_framework_runs_is_found_from_the_model_it_was_given():
    from te_gemm_callback.capture.scope import compiled_wrapper

    model, other = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    assert compiled_wrapper(model) is None  # nothing compiled it
    compiled = torch.compile(torch.nn.parallel.DataParallel(model), backend="eager")
    decoy = torch.compile(other, backend="eager")
    assert compiled_wrapper(model) is compiled and compiled_wrapper(other) is decoy
    assert compiled_wrapper(model, known=compiled) is compiled  # still wrapping it: no search
    assert compiled_wrapper(other, known=compiled) is decoy  # no longer the model's: searched again
