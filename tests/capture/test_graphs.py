"""CUDA-graphed modules. Graph capture needs a GPU, so on CPU a module's forward is replaced the
way ``te.make_graphed_callables`` and ``torch.cuda.make_graphed_callables`` replace it (a
``new_fwd`` closure holding ``graphed`` and ``orig_fwd``, chosen by training mode); the "replay"
here runs under no Python the profiler could see (the dispatch mode and hooks are suspended), as a
real replay runs none. The real thing runs in tests/test_gpu.py."""

import torch
from helpers.fakes import Clock, FakeKernels
from helpers.models import MLP
from torch import nn
from torch.utils._python_dispatch import _disable_current_modes

from te_gemm_callback import GemmProfiler
from te_gemm_callback.capture.graphs import graphed_modules, in_graphed
from te_gemm_callback.reporting.capture_tables import capture_table


def fake_graph(module, replays):
    orig = module.forward

    def graphed(*args):
        replays.append(1)
        with _disable_current_modes(), torch.no_grad():
            out = orig(*args)  # no GEMM the profiler can see, as in a replay
        return out.requires_grad_()

    def make_graphed_forward(func, graph_training_state, graphed, orig_fwd):
        def new_fwd(*user_args, **user_kwargs):
            if func.training == graph_training_state:
                return graphed(*user_args, **user_kwargs)
            return orig_fwd(*user_args, **user_kwargs)

        return new_fwd

    module.forward = make_graphed_forward(module, module.training, graphed, orig)
    return module


def test_graphed_modules_run_eagerly_on_instrumented_steps_only():
    model, x, clock = nn.Sequential(), torch.randn(4, 16, requires_grad=True), Clock()
    model.add_module("body", MLP())
    model.add_module("head", nn.Linear(16, 4))
    replays: list = []
    fake_graph(model.body, replays)
    graphed_fwd = model.body.forward
    assert list(graphed_modules(model)) == ["body"]
    prof = GemmProfiler(model, kernel_profile=FakeKernels(gemms=8), clock=clock).start()
    per_step = []
    for i in range(4):  # instrumented, kernels warm-up, kernels, clean
        before = len(replays)
        model(x).sum().backward()
        per_step.append(len(replays) - before)
        if i < 3:
            prof.step()
    cap = prof.stop()
    assert per_step == [0, 1, 1, 1]  # eager on the instrumented step, replays after
    assert model.body.forward is graphed_fwd  # put back
    assert cap.meta["graphed_modules"] == ["body"]
    owners = {r.module for r in cap.records}
    assert {"body.up", "body.down", "head"} <= owners and cap.coverage["never_ran"] == []
    table = capture_table(cap)
    rows = [(c0, c1) for c0, c1 in zip(table.columns[0].cells, table.columns[1].cells)]
    assert ("body.up", "fprop (graphed)") in rows and ("head", "fprop") in rows
    assert in_graphed("body.up", ["body"]) and not in_graphed("bodyx", ["body"])
