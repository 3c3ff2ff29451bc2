import logging
import os
import subprocess
import sys

import pytest
import torch
import torch.utils.checkpoint
from helpers.models import Net, step

from te_gemm_callback import GemmCapture, GemmProfiler
from te_gemm_callback.capture import torch_adapter


def hooks_left(model):
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
               for m in model.modules())


@pytest.mark.parametrize("mode", ["reentrant", "non_reentrant"])
def test_activation_checkpointing_recompute_is_recorded_and_labelled(mode):
    model, x = Net(ckpt=mode), torch.randn(4, 8, 16, requires_grad=True)
    # Non-reentrant checkpointing stops recomputing once the saved tensors it needs are back
    # (a.down's input comes from a.up alone); turn that off so the whole region is recomputed.
    with GemmProfiler(model) as prof, torch.utils.checkpoint.set_checkpoint_early_stop(False):
        step(model, x)
    cap = prof.capture
    recomputed = [r for r in cap.records if r.recompute]
    assert sorted(r.module for r in recomputed) == ["a.down", "a.up"]
    assert all(r.op == "fprop" and r.m == 32 for r in recomputed)
    # The recompute does not disturb the pass labels of the real backward.
    for name in ("a.up", "a.down", "b.up", "b.down"):
        ops = sorted(r.op for r in cap.by_module()[name])
        assert ops == (["dgrad", "fprop", "fprop", "wgrad"] if name.startswith("a") else ["dgrad", "fprop", "wgrad"])


def test_hf_gradient_checkpointing():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4,
                                   num_key_value_heads=2, num_hidden_layers=2, vocab_size=64)
    model = transformers.LlamaForCausalLM(cfg)
    model.gradient_checkpointing_enable()
    model.train()
    ids = torch.randint(0, 64, (2, 8))
    with GemmProfiler(model) as prof, torch.utils.checkpoint.set_checkpoint_early_stop(False):
        model(input_ids=ids, labels=ids).loss.backward()
    rec = {(r.module, r.op) for r in prof.capture.records if r.recompute}
    assert ("model.layers.0.mlp.down_proj", "fprop") in rec and len(rec) == 14  # 7 Linears x 2 layers


def test_steps_calls_and_roundtrip(tmp_path):
    model, x = Net(), torch.randn(4, 16)
    prof = GemmProfiler(model, instrumented_steps=3).start()
    for _ in range(3):
        step(model, x)
        prof.step()
    cap = prof.stop()
    assert len(cap.steps) == 3 and all(r.calls_per_step == 1 and r.calls == 3 for r in cap.records)
    assert cap.meta["device"] and cap.meta["torch"] == torch.__version__
    path = cap.save(tmp_path / "c.json")
    back = GemmCapture.load(path)
    assert back.records == cap.records and back.steps == cap.steps
    assert back.flops_per_step == cap.flops_per_step
    # Public members a user's script reads (GemmCapture is exported).
    assert back.num_steps == 3 and back.shapes() == [r.shape for r in cap.records] != []
    assert hooks_left(model) == 0
    assert not torch._C._is_torch_function_mode_enabled()
    with pytest.raises(ValueError, match="not a te-gemm capture"):
        GemmCapture.from_dict({"schema": "x"})


class Unprintable(RuntimeError):
    def __str__(self):
        raise ValueError("no message for you")


@pytest.mark.parametrize("error", [RuntimeError("injected"), Unprintable()])
def test_error_in_hook_never_breaks_the_step(monkeypatch, caplog, error):
    """Also an exception whose str() raises: its message cannot be read, and that must not reach the job either."""
    model, x = Net(), torch.randn(4, 16, requires_grad=True)
    said = "Unprintable: (its message could not be read)" if isinstance(error, Unprintable) else \
        "RuntimeError: injected"

    def boom(*a, **k):
        raise error

    monkeypatch.setattr(torch_adapter.GemmDispatchMode, "_before", boom)
    expected = [p.grad for p in model.parameters()]
    with caplog.at_level(logging.WARNING, logger="te_gemm_callback"):
        prof = GemmProfiler(model).start()
        for _ in range(2):
            model.zero_grad()
            step(model, x)  # must not raise
            prof.step()
        cap = prof.stop()
    assert prof.error == said
    assert sum("capture turned off" in r.message for r in caplog.records) == 1
    assert cap.records == [] and cap.coverage["error"] == said
    assert all(p.grad is not None for p in model.parameters()) and expected is not None
    assert hooks_left(model) == 0


class FakeNvtx:
    def __init__(self):
        self.ranges, self.open, self.pushed = [], {}, []

    def start(self, name):
        h = len(self.ranges)
        self.ranges.append(name)
        self.open[h] = name
        return h

    def end(self, h):
        del self.open[h]

    def push(self, name):
        self.pushed.append(name)

    def pop(self):
        pass


def test_nvtx_ranges_name_module_pass_shape_precision():
    fake, model, x = FakeNvtx(), Net(), torch.randn(4, 16, requires_grad=True)
    with GemmProfiler(model, nvtx_backend=fake):
        step(model, x)
    assert fake.open == {} and fake.pushed == ["step 0 (instrumented)"]
    assert "a.up fprop 4x16x48 fp32" in fake.ranges
    assert "b.down wgrad 48x4x16 fp32" in fake.ranges
    assert len(fake.ranges) == 12


def test_nvtx_ranges_only_where_a_tool_listens(monkeypatch):
    # NVTX calls are no-ops without a tool, so "auto" spends no host time on them; nsys sets the
    # injection variable for the process it launches.
    from te_gemm_callback.capture import instruments

    fake = FakeNvtx()
    monkeypatch.setattr(instruments, "_default_backend", lambda: fake)
    monkeypatch.delenv("NVTX_INJECTION64_PATH", raising=False)
    monkeypatch.delenv("NVTX_INJECTION32_PATH", raising=False)
    model, x = Net(), torch.randn(4, 16, requires_grad=True)
    with GemmProfiler(model) as prof:
        step(model, x)
    assert not prof.recorder.nvtx.enabled and fake.ranges == []
    assert GemmProfiler(model, nsys_capture=True).recorder.nvtx.enabled
    assert GemmProfiler(model, nvtx=True).recorder.nvtx.enabled
    monkeypatch.setenv("NVTX_INJECTION64_PATH", "/opt/nsys/libToolsInjection64.so")
    with GemmProfiler(model):
        step(model, x)
    assert len(fake.ranges) == 12
    assert not GemmProfiler(model, nvtx=False).recorder.nvtx.enabled


def test_sequence_number_getter_agrees_with_a_probe_node():
    # The tag walk's bound: the number the next autograd node gets, read without making a node.
    from te_gemm_callback.capture.scope import _probe_next_seq, next_seq_reader

    read, probe = next_seq_reader(), torch.zeros((), requires_grad=True)
    x = torch.randn(3, requires_grad=True)
    before = read()
    y = x * 2
    assert y.grad_fn._sequence_nr() == before and read() == before + 1
    nxt = _probe_next_seq(probe)  # the probe takes one number itself
    z = x + 1
    assert z.grad_fn._sequence_nr() == nxt and read() == nxt + 1


def test_bad_arguments():
    with pytest.raises(TypeError):
        GemmProfiler("not a model")
    with pytest.raises(ValueError, match="adapters"):
        GemmProfiler(Net(), adapters=("cuda",))
    with pytest.raises(RuntimeError, match="no capture yet"):
        _ = GemmProfiler(Net()).capture
    # Refused where they are given, naming the option (not a TypeError deep inside on first use).
    for bad in (5, "te", [], None):
        with pytest.raises(ValueError, match="^adapters must be"):
            GemmProfiler(Net(), adapters=bad)
    assert GemmProfiler(Net(), adapters={"te"}).config.adapters == ("te",)
    for bad in ("perf_counter", 5):
        with pytest.raises(ValueError, match="^clock must be a function"):
            GemmProfiler(Net(), clock=bad)
    with pytest.raises(TypeError, match="config must be a ProfilerConfig, got str"):
        GemmProfiler(Net(), config="x")


def test_profiler_ranges_backend_opens_a_torch_profiler_range_per_gemm():
    import torch
    from torch import nn

    from te_gemm_callback import GemmProfiler
    from te_gemm_callback.capture.instruments import ProfilerRanges

    model = nn.Linear(8, 8)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as tp:
        with GemmProfiler(model, nvtx_backend=ProfilerRanges()):
            model(torch.randn(4, 8, requires_grad=True)).sum().backward()  # input grad: a dgrad too
    names = [e.name for e in tp.events() if e.name.startswith("te_gemm: ")]
    assert len(names) == 3 and {n.split()[2] for n in names} == {"fprop", "dgrad", "wgrad"}


def test_a_capture_of_an_eager_job_leaves_torch_dynamo_unloaded():
    """torch's dispatch-mode wrapper imported torch._dynamo at the first captured GEMM: a second of the
    job's step, /tmp/torchinductor_<user> made and TORCHINDUCTOR_CACHE_DIR set for its children."""
    code = """if True:
        import os, sys, torch
        from te_gemm_callback import GemmProfiler
        m = torch.nn.Linear(8, 8)
        prof = GemmProfiler(m).start()
        m(torch.randn(2, 8, requires_grad=True)).sum().backward()
        ops = sorted(r.op for r in prof.stop().records)
        print(ops, 'torch._dynamo' in sys.modules, os.environ.get('TORCHINDUCTOR_CACHE_DIR'))
    """
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.stdout.split("\n")[-2] == "['dgrad', 'fprop', 'wgrad'] False None", out.stderr[-2000:]
