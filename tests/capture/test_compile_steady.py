"""Steady state only, and never change how the job runs (capture/steady.py).

torch.compile on a CPU (aot_eager: no C++ toolchain needed, the same dynamo front end): a compiled
plain loop profiled from its first step still compiles and keeps running compiled; compile and
recompile steps (dynamo's counters), CUDA graph captures and outliers are never clean steps; a
capture that cannot reach steady state says so in its meta and once in the log."""

import logging
import os
import statistics
import time

import pytest
import torch
from helpers.fakes import Clock
from helpers.models import MLP
from torch import nn
from torch._dynamo.utils import counters
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode

from te_gemm_callback import GemmProfiler, capture_steps
from te_gemm_callback.capture.steady import OUTLIER_FACTOR, outliers
from te_gemm_callback.capture.torch_adapter import GemmDispatchMode


def counting_backend(calls):
    """aot_eager, counting each run of the compiled code: whether a step ran compiled or eager."""
    from torch._dynamo.backends.debugging import aot_eager

    def backend(gm, example_inputs):
        fn = aot_eager(gm, example_inputs)

        def run(*args):
            calls[0] += 1
            return fn(*args)

        return run

    return backend


class Wide(nn.Module):
    """A few ms per training step on one CPU thread (64 x 512 -> 768 -> 768 -> 512)."""

    def __init__(self, d=512, h=768):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(d, h), nn.Linear(h, h), nn.Linear(h, d)

    def forward(self, x):
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


def graphs():
    return counters["stats"]["unique_graphs"], counters["frames"]["ok"]


def warnings_of(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "te_gemm_callback" and r.levelno >= logging.WARNING]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    # Each test's model compiles from scratch (no cached code from another test's model).
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def one_thread():
    # One intra-op thread: on a 2-core CI machine a second torch thread competes with everything
    # else running there, and step times scatter several-fold.
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def profile_then_steady(n_clean):
    """README's plain loop under GemmProfiler from the first step of a freshly compiled model, then
    the same loop without the profiler after warm-up. Returns (capture, compiled calls per step while
    profiled, compiled calls of the warm-up steps after, two blocks of steady step ms, graphs before)."""
    calls = [0]
    model = Wide()
    cm = torch.compile(model, backend=counting_backend(calls))
    x = torch.randn(64, 512)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)

    def step():
        cm(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    before = graphs()
    per_step = []
    with GemmProfiler(cm) as prof:
        for _ in range(2 + 1 + n_clean):  # compile (compiles), compile (none: steady), instrumented, clean
            c = calls[0]
            step()
            per_step.append(calls[0] - c)
            prof.step()
    c = calls[0]
    for _ in range(3):  # warm-up of the unprofiled loop (already compiled: nothing new)
        step()
    after = calls[0] - c
    blocks = []
    for _ in range(2):  # two blocks: whether the host itself can resolve 10% right now
        times = []
        for _ in range(n_clean):
            t0 = time.perf_counter()  # the profiler's clock on a CPU
            step()
            times.append((time.perf_counter() - t0) * 1e3)
        blocks.append(times)
    return prof.capture, per_step, after, blocks, before


def test_compiled_plain_loop_from_its_first_step_compiles_and_times_its_steady_step(one_thread):
    """Acceptance: a compiled plain loop profiled from its first step still compiles (dynamo's counters
    show compiled frames, the model runs compiled after the capture), and its clean-step median is
    within 10% of its steady step. Before: 0 frames compiled and the whole job eager (torch 2.13), or
    the compile steps timed as clean (torch 2.14: median 40x the real step)."""
    ratios, noisy = [], []
    # Other jobs on a small shared host move whole blocks of steps (measured on 2 loaded cores: block
    # medians 0.5-1.8x of each other), and the blocks compared cannot be interleaved (the profiled one
    # must start at the job's first step). So: up to 5 attempts, each from a fresh compile; an attempt
    # on a host whose load average exceeds its cores, or in which the halves of the clean steps or two
    # steady blocks disagree by more than 5%, ran where 10% could not be resolved, and is not judged.
    for attempt in range(5):
        if attempt:
            torch._dynamo.reset()
        cap, per_step, after, blocks, (graphs0, ok0) = profile_then_steady(n_clean=20)
        kinds = [s.kind for s in cap.steps]
        assert counters["stats"]["unique_graphs"] > graphs0 and counters["frames"]["ok"] > ok0  # it compiled
        assert kinds[:3] == ["compile", "compile", "instrumented"], kinds
        assert set(kinds[3:]) <= {"clean", "outlier"} and kinds.count("clean") >= 16, kinds
        assert cap.meta["compiled"] is True and cap.meta["steady_state"].startswith("reached"), cap.meta["steady_state"]
        assert cap.meta["unsteady_steps"]["compile"] == [0, 1]
        # Compiled code ran on every step but the instrumented one (the model's eager forward there),
        # and on every step after the capture: the profiler left it compiled.
        assert per_step == [1, 1, 0] + [1] * (len(per_step) - 3) and after == 3
        # The input needs no grad: the first layer has no dgrad.
        assert sorted((r.module, r.op) for r in cap.records) == sorted(
            (m, op) for m in "abc" for op in ("fprop", "dgrad", "wgrad") if (m, op) != ("a", "dgrad"))
        clean = [s.ms for s in cap.steps if s.kind == "clean"]
        halves = [clean[: len(clean) // 2], clean[len(clean) // 2:]] + blocks
        c1, c2, b1, b2 = (statistics.median(h) for h in halves)
        ratio = cap.step_ms() / statistics.median(blocks[0] + blocks[1])
        busy = os.getloadavg()[0] > (os.cpu_count() or 1)  # other jobs want more cores than there are
        if busy or abs(b1 / b2 - 1) > 0.05 or abs(c1 / c2 - 1) > 0.05:
            noisy.append(round(ratio, 3))
            if busy:
                break  # the load average moves over a minute: more attempts now would not be judged
            continue
        ratios.append(ratio)
        if abs(ratio - 1) <= 0.10:
            break
    # One judged attempt off and none other judged: a load that moved between the profiled window and
    # the blocks after it (seen twice in about 60 runs on 2 loaded cores), not a finding; two agree on one.
    if not ratios or (len(ratios) == 1 and abs(ratios[0] - 1) > 0.10):
        pytest.skip(f"the host cannot resolve 10% now (overloaded, or its blocks of steps disagree by > 5%, in "
                    f"every attempt but {len(ratios)}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} "
                    f"cores; clean/steady ratios {ratios} judged, {noisy} not); everything but the timing was checked")
    assert abs(ratios[-1] - 1) <= 0.10, f"clean-step median / steady step: {ratios} (unjudged: {noisy})"


def test_a_recompile_during_a_clean_step_is_not_clean():
    """A new input shape in a clean step makes dynamo compile again: that step is a recompile step,
    out of the step time, though the (fake) clock gave it the same time as the others."""
    torch.manual_seed(0)
    cm = torch.compile(MLP(), backend="aot_eager", dynamic=False)
    x, other = torch.randn(4, 16, requires_grad=True), torch.randn(6, 16, requires_grad=True)
    clock = Clock()
    with GemmProfiler(cm, clock=clock) as prof:
        for i in range(7):
            cm(other if i == 4 else x).sum().backward()
            clock.t += 0.010 if i != 5 else 0.020
            if i < 6:
                prof.step()
    cap = prof.capture
    assert [s.kind for s in cap.steps] == ["compile", "compile", "instrumented", "clean", "recompile", "clean", "clean"]
    assert cap.meta["unsteady_steps"] == {"compile": [0, 1], "recompile": [4]}
    assert cap.step_ms() == pytest.approx(10.0)  # clean steps 3, 5, 6: 10, 20, 10 ms
    assert cap.meta["steady_state"] == "reached: 3 clean steps after 2 compile steps; left out: 1 recompile (step 4)"


def test_compile_steps_attach_nothing_and_the_instrumented_step_runs_eager():
    calls = [0]
    model = MLP()
    cm = torch.compile(model, backend=counting_backend(calls))
    x = torch.randn(4, 16, requires_grad=True)
    seen = []
    with GemmProfiler(cm) as prof:
        for _ in range(4):
            hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in cm.modules())
            seen.append((prof.step_kind, prof.plan_index, hooks > 0, _get_current_dispatch_mode() is not None))
            c = calls[0]
            cm(x).sum().backward()
            seen[-1] += (calls[0] > c,)
            prof.step()
    # (kind, plan index, hooks, dispatch mode, ran compiled)
    assert seen == [("compile", None, False, False, True), ("compile", None, False, False, True),
                    ("instrumented", 0, True, True, False), ("clean", 1, False, False, True)]
    assert cm.__dict__["forward"] is not model.__call__  # dynamo's wrapper is back
    assert sorted((r.module, r.op) for r in prof.capture.records) == sorted(
        (m, op) for m in ("up", "down") for op in ("fprop", "dgrad", "wgrad"))


@pytest.mark.parametrize("how", ["module.compile()", "forward replaced"])
def test_module_compiled_in_place_runs_eager_only_while_instrumented(how):
    """``model.compile()``, or ``model.forward = torch.compile(model.forward)`` (as Lightning compiles a
    LightningModule): seen as compiled, compiled before the plan, eager while instrumented, and the job keeps
    one graph and no break (a compiled forward first compiled under the hooks kept the breaks they made)."""
    calls = [0]
    model = MLP()
    if how == "module.compile()":
        model.compile(backend=counting_backend(calls))
    else:
        model.forward = torch.compile(model.forward, backend=counting_backend(calls))
    x = torch.randn(4, 16, requires_grad=True)
    breaks0 = sum(counters["graph_break"].values())
    ran = []
    with GemmProfiler(model) as prof:
        for _ in range(4):
            c = calls[0]
            model(x).sum().backward()
            ran.append(calls[0] - c)
            prof.step()
    assert [s.kind for s in prof.capture.steps] == ["compile", "compile", "instrumented", "clean"]
    assert ran == [1, 1, 0, 1]
    assert (model._compiled_call_impl is not None) == (how == "module.compile()")
    assert prof.capture.meta["compiled_modules"] == [""]
    assert sorted((r.module, r.op) for r in prof.capture.records) == sorted(
        (m, op) for m in ("up", "down") for op in ("fprop", "dgrad", "wgrad"))
    assert torch._dynamo.eval_frame._stance.stance == "default"
    c = calls[0]
    model(x).sum().backward()
    assert calls[0] == c + 1 and sum(counters["graph_break"].values()) == breaks0


def test_the_job_between_steps_runs_its_own_compiled_forward_and_stance():
    """Paused between steps (the job's validation, logging), a compiled forward ran under our force_eager stance
    and a compiled module ran its eager forward: both are the job's again until the next step resumes us."""
    from torch._dynamo import eval_frame

    calls = [0]
    model, other = MLP(), MLP()
    model.forward = torch.compile(model.forward, backend=counting_backend(calls))
    other.compile(backend=counting_backend(calls))
    x = torch.randn(4, 16, requires_grad=True)
    seen = []
    with GemmProfiler(nn.ModuleList([model, other])) as prof:
        for _ in range(4):
            model(x).sum().backward()
            other(x).sum().backward()
            prof.step()
            prof.pause()  # between steps: the job's own work
            c = calls[0]
            other(x)
            seen.append((prof.step_kind, eval_frame._stance.stance, calls[0] > c))
            prof.resume()
            seen[-1] += (eval_frame._stance.stance,)
    # (next step's kind, stance while paused, the compiled module ran compiled while paused, stance resumed)
    assert seen[1] == ("instrumented", "default", True, "force_eager"), seen
    assert all(s[1] == "default" and s[2] for s in seen), seen


def test_a_compiled_function_called_under_the_dispatch_step_still_compiles():
    """A compiled loss outside the model cannot run eagerly for the instrumented step: dynamo meets the
    dispatch mode. The mode ignores compile internals, so dynamo compiles with it off, runs the
    compiled code under it, and the loss stays compiled; the model's GEMMs are still captured."""
    calls = [0]
    loss = torch.compile(lambda y: y.square().mean(), backend=counting_backend(calls))
    model = MLP()
    x = torch.randn(4, 16, requires_grad=True)
    graphs0, _ = graphs()
    with GemmProfiler(model) as prof:
        for _ in range(3):
            loss(model(x)).backward()
            prof.step()
    assert [s.kind for s in prof.capture.steps] == ["instrumented", "clean", "clean"]
    assert prof.capture.steps[0].dispatch and calls[0] == 3 and counters["stats"]["unique_graphs"] > graphs0
    assert len(prof.capture.records) == 6
    loss(model(x))
    assert calls[0] == 4


def test_the_mechanism_a_plain_dispatch_mode_keeps_dynamo_from_compiling():
    """What the profiler avoids: dynamo skips a frame whose first call runs under a dispatch mode that
    does not ignore compile internals; torch 2.13 marks the code skipped for good (every compiled
    torch.nn module of the process shares that code), torch 2.14 only skips that call."""
    from torch.torch_version import TorchVersion

    class Plain(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    calls = [0]
    f = torch.compile(lambda y: (y @ y).relu(), backend=counting_backend(calls))
    y = torch.randn(8, 8)
    with Plain():
        f(y)
    assert calls[0] == 0  # ran eagerly under the mode
    f(y)
    if TorchVersion(torch.__version__) < "2.14":
        assert calls[0] == 0  # and stays eager
    assert GemmDispatchMode.ignore_compile_internals() is True


def test_outliers_are_left_out_of_the_step_time():
    model, x, clock = MLP(), torch.randn(4, 16, requires_grad=True), Clock()
    with GemmProfiler(model, clock=clock) as prof:
        for i, ms in enumerate([15, 10, 11, 45, 10, 9, 10]):
            model(x).sum().backward()
            clock.t += ms / 1e3
            if i < 6:
                prof.step()
    cap = prof.capture
    assert [s.kind for s in cap.steps] == ["instrumented", "clean", "clean", "outlier", "clean", "clean", "clean"]
    assert cap.step_ms() == pytest.approx(10.0)
    assert cap.meta["steady_state"] == ("reached: 5 clean steps; left out: 1 outlier (step 3) above "
                                        f"{OUTLIER_FACTOR:g}x the faster half's median (10 ms)")


def test_outlier_rule():
    # torch 2.14's compile steps timed as clean (ms): the plain median (190) would keep 239 and 190.
    assert outliers([1403, 239, 190, 4.6, 3.3]) == [0, 1, 2]
    assert outliers([239, 190, 4.6, 3.3]) == [0, 1]
    assert outliers([100, 101, 99, 102, 310]) == [4]
    assert outliers([100, 101, 99, 102, 290]) == []  # 2.9x: slow, not far above
    assert outliers([10, 500, 11]) == []  # three steps cannot tell an outlier from a noisy host


def test_every_step_compiled_is_not_steady_state_and_warns_once(caplog):
    cm = torch.compile(MLP(), backend="aot_eager", dynamic=False)
    with caplog.at_level(logging.WARNING, logger="te_gemm_callback"), GemmProfiler(cm) as prof:
        for n in (2, 3, 5):  # a new shape each step: dynamo compiles each time
            cm(torch.randn(n, 16, requires_grad=True)).sum().backward()
            prof.step()
    cap = prof.capture
    assert [s.kind for s in cap.steps] == ["compile"] * 3 and not cap.records
    assert cap.meta["steady_state"].startswith("not reached: dynamo compiled (or a CUDA graph was captured) in every")
    msgs = [m for m in warnings_of(caplog) if "steady state" in m]
    assert len(msgs) == 1 and "not reached" in msgs[0]


def test_a_wait_that_runs_out_goes_on_with_the_plan_and_says_so(caplog):
    cm = torch.compile(MLP(), backend="aot_eager", dynamic=False)
    with caplog.at_level(logging.WARNING, logger="te_gemm_callback"), \
            GemmProfiler(cm, max_compile_steps=2) as prof:
        for n in (2, 3, 4, 4, 4, 4):
            cm(torch.randn(n, 16, requires_grad=True)).sum().backward()
            prof.step()
    cap = prof.capture
    # Shape 4 ran eagerly on the instrumented step: dynamo first meets it on the step after.
    assert [s.kind for s in cap.steps] == ["compile", "compile", "instrumented", "recompile", "clean", "clean"]
    assert cap.meta["steady_state"] == ("not reached: still compiling after 2 compile steps (max_compile_steps); "
                                        "the plan ran after them anyway, 2 clean step(s) left; "
                                        "left out: 1 recompile (step 3)")
    assert len(cap.records) == 6 and len([m for m in warnings_of(caplog) if "steady state" in m]) == 1


def test_a_short_window_after_compiling_says_steady_state_was_not_reached(caplog):
    cm = torch.compile(MLP(), backend="aot_eager")
    x = torch.randn(4, 16, requires_grad=True)
    with caplog.at_level(logging.WARNING, logger="te_gemm_callback"), GemmProfiler(cm) as prof:
        for _ in range(4):
            cm(x).sum().backward()
            prof.step()
    assert [s.kind for s in prof.capture.steps] == ["compile", "compile", "instrumented", "clean"]
    assert prof.capture.meta["steady_state"].startswith("not reached: 1 clean step(s) left after 2 compile steps")
    assert len([m for m in warnings_of(caplog) if "steady state" in m]) == 1


def test_a_graph_capture_in_a_clean_step_is_not_clean(monkeypatch):
    """CUDA graph captures (inductor's reduce-overhead records, make_graphed_callables) are counted
    through CUDAGraph.capture_begin; a stand-in for it here, as no graph can be captured on a CPU."""
    captured = []
    monkeypatch.setattr(torch.cuda.CUDAGraph, "capture_begin", lambda self, *a, **k: captured.append(self))
    stand_in = torch.cuda.CUDAGraph.__dict__["capture_begin"]
    model, x = MLP(), torch.randn(4, 16, requires_grad=True)
    with GemmProfiler(model) as prof:
        for i in range(4):
            model(x).sum().backward()
            if i == 2:
                torch.cuda.CUDAGraph.capture_begin("graph")
            prof.step()
    assert captured == ["graph"] and torch.cuda.CUDAGraph.__dict__["capture_begin"] is stand_in  # put back
    assert [s.kind for s in prof.capture.steps] == ["instrumented", "clean", "graph-capture", "clean"]
    assert prof.capture.meta["unsteady_steps"] == {"graph-capture": [2]}


def test_capture_steps_runs_the_compile_steps_before_the_plan():
    cm = torch.compile(MLP(), backend="aot_eager")
    x = torch.randn(4, 16, requires_grad=True)
    cap = capture_steps(cm, lambda: cm(x).sum().backward(), 2)
    assert [s.kind for s in cap.steps] == ["compile", "compile", "instrumented", "clean", "clean"]
    assert cap.meta["steady_state"] == "reached: 2 clean steps after 2 compile steps"


def test_an_eager_model_is_unchanged():
    model, x = MLP(), torch.randn(4, 16, requires_grad=True)
    cap = capture_steps(model, lambda: model(x).sum().backward())
    assert [s.kind for s in cap.steps] == ["instrumented", "clean"]
    assert cap.meta["steady_state"] == "not checked: 1 clean step(s), 2 are needed to check it"
    assert cap.meta["compiled"] is False and cap.meta["unsteady_steps"] == {}
