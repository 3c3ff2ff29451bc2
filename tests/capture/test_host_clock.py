"""The job's own host time per TE module (capture/host_clock.py), read on the settle step, and the
report's use of it (analysis/whatif.module_host). TE cannot run on CPU: a torch Linear whose class
is named and placed as TE's stands in for it (the clock reads class names and hooks only)."""

import pytest
import torch
from helpers.fakes import Clock, FakeKernels
from helpers.models import hooks_on, run
from torch import nn

from te_gemm_callback import GemmProfiler
from te_gemm_callback.analysis.whatif import _module_deltas, module_host
from te_gemm_callback.capture.host_clock import ModuleHostClock


class Linear(nn.Linear):
    """TE's class name and module path, torch's forward."""


Linear.__module__ = "transformer_engine.pytorch.module.linear"


class Attention(nn.Module):
    """q, k and v projections share their input, as in Llama: a hook on the input's gradient
    would fire only once all three are done."""

    def __init__(self, h=16):
        super().__init__()
        self.q, self.k, self.v = Linear(h, h), Linear(h, h), Linear(h, h)

    def forward(self, x):
        return self.q(x) * self.k(x) + self.v(x).view(-1, x.shape[-1])


def test_each_module_gets_its_own_forward_and_backward_and_the_gradients_do_not_move():
    torch.manual_seed(0)
    model, x = Attention(), torch.randn(8, 16, requires_grad=True)
    model(x).sum().backward()
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    ticks = iter(range(1000))
    clock = ModuleHostClock(dict(model.named_children()), clock=lambda: next(ticks) * 1e-6)
    clock.attach()
    model(x).sum().backward()
    got = clock.detach()
    assert all(torch.equal(p.grad, w) for p, w in zip(model.parameters(), want))
    assert set(got) == {"q", "k", "v"}
    # One tick between a forward's pre-hook and its hook; each backward is timed from its own
    # output's node to its own node (v's behind a view): a few ticks, never the span of all three.
    assert all(got[n]["fwd"] == 1.0 for n in got)
    assert all(1.0 <= got[n]["bwd"] <= 2.0 for n in got), got
    assert hooks_on(model) == 0
    model(x).sum().backward()  # detached: nothing more is read
    assert clock.detach() == got


def test_the_settle_step_reads_the_te_modules_and_leaves_no_hook_on_clean_steps():
    model, x, clock = nn.Sequential(Linear(16, 32), nn.ReLU(), Linear(32, 16)), torch.randn(4, 16), Clock()
    x.requires_grad_()
    prof = GemmProfiler(model, kernel_profile=FakeKernels(), clock=clock)
    cap, seen = run(prof, model, x, clock, n=6)
    kinds = ["instrumented", "kernels-warmup", "kernels", "settle", "clean", "clean"]
    assert [s.kind for s in cap.steps] == kinds
    assert [attached for _, attached in seen] == [k in ("instrumented", "settle") for k in kinds]
    assert set(cap.meta["module_host_us"]) == {"0", "2"}
    assert all(set(v) == {"fwd", "bwd"} for v in cap.meta["module_host_us"].values())
    assert hooks_on(model) == 0


def test_the_report_sets_the_jobs_module_host_time_beside_the_benchmarks():
    costs = {"modules": {"a": "K", "b": "K", "c": "K"},
             "kinds": {"K": {"DelayedScaling": {"host_fwd_us": 600.0, "host_bwd_us": 800.0, "gpu_other_us": 40.0},
                             "BF16": {"host_fwd_us": 400.0, "host_bwd_us": 500.0, "gpu_other_us": 10.0}}}}

    class Cap:
        meta = {"module_host_us": {"a": {"fwd": 280.0, "bwd": 380.0}, "b": {"fwd": 320.0, "bwd": 420.0},
                                   "c": {"fwd": 300.0}}}  # c's backward not read: left out of both sums

    assert module_host(Cap(), costs, "DelayedScaling") == {"modules": 2, "job_ms": 1.4, "bench_ms": 2.8}
    # The replay's differences are the benchmark's own, whatever the job's module times.
    d = _module_deltas(Cap(), costs, "BF16", "DelayedScaling")
    assert d["a"]["host_fwd"] == pytest.approx(-200.0) and d["a"]["host_bwd"] == pytest.approx(-300.0)
    Cap.meta = {}
    assert module_host(Cap(), costs, "DelayedScaling") is None
