"""When the job's step or our own code fails during a sweep or a capture, the job is left as it was:
nothing of ours stays on the model, every part of its state that can be put back is, and a part that
cannot is said as an error, never silently."""

import logging
import random

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from te_gemm_callback import GemmSchedule, JobStep, SweepJob
from te_gemm_callback.capture.profiler import GemmProfiler
from te_gemm_callback.capture.recorder import Recorder
from te_gemm_callback.sweep.engine import run_sweep
from te_gemm_callback.sweep.host_state import HostState
from te_gemm_callback.sweep.state import RestoreError


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _ours_on(model):
    """What of ours is on the model and the thread: dispatch modes, hooks, a forward wrapper."""
    hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())
    return len(_get_current_dispatch_mode_stack()), hooks, "forward" in vars(model)


@pytest.mark.parametrize("where", ["loss", "before"])
def test_a_sweep_step_that_raises_takes_everything_of_ours_off(where):
    """A step that raised outside the model's forward (in its loss) left the dispatch mode, the
    hooks and the forward wrapper on: every later step ran 3-8x slower and the recorder grew."""
    model, x = _mlp(), torch.randn(4, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    calls = [0]

    def step():
        calls[0] += 1
        if where == "before" and calls[0] == 3:
            raise RuntimeError("the job's step raised before its forward")
        out = model(x)
        if where == "loss" and calls[0] == 3:
            raise RuntimeError("the job's loss raised")
        return out.square().mean()

    with pytest.raises(RuntimeError, match="the job's"):
        run_sweep(model, step, ["BF16"], steps=2, warmup=1, rounds=0, profile_kernels=False, optimizers=[opt])
    assert _ours_on(model) == (0, 0, False)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))


def test_a_buffer_a_step_replaces_with_a_grown_one_is_put_back():
    """A history buffer a forward replaces by a longer one: putting it back failed on its shape,
    and the optimizer state, gradients and RNGs after it were never put back."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.drop = nn.Linear(8, 8), nn.Dropout(0.2)
            self.register_buffer("seen", torch.zeros(0))

        def forward(self, x):
            out = self.drop(self.lin(x))
            self.seen = torch.cat([self.seen, out.detach().mean().reshape(1)])
            return out

    def train(sweep_at):
        torch.manual_seed(0)
        model = Net()
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        xs = [torch.randn(4, 8, generator=torch.Generator().manual_seed(i)) for i in range(6)]
        losses = []
        for i, x in enumerate(xs):
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.detach())
            if i == sweep_at:
                run_sweep(model, lambda: model(xs[0]).square().mean(), ["BF16"], steps=2, warmup=1, rounds=0,
                          profile_kernels=False, optimizers=[opt])
        return losses, model.seen

    plain, swept = train(None), train(2)
    assert all(torch.equal(a, b) for a, b in zip(plain[0], swept[0]))
    assert torch.equal(plain[1], swept[1])


def test_a_part_that_cannot_be_put_back_is_said_and_the_others_are_put_back(monkeypatch):
    model = _mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    params = [p.detach().clone() for p in model.parameters()]
    moments = [st["exp_avg"].clone() for st in opt.state.values()]

    def broken(self):
        raise RuntimeError("cannot")

    monkeypatch.setattr(HostState, "restore", broken)
    x = torch.randn(4, 8)
    with pytest.raises(RestoreError, match=r"could not put back the random streams .*RuntimeError: cannot"):
        run_sweep(model, lambda: model(x).square().mean(), ["BF16"], steps=2, warmup=1, rounds=0,
                  profile_kernels=False, optimizers=[opt])
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), params))
    assert all(torch.equal(st["exp_avg"], m) for st, m in zip(opt.state.values(), moments))


def test_a_schedule_says_a_state_it_could_not_put_back_as_an_error(monkeypatch, caplog, tmp_path):
    def broken(self):
        raise RuntimeError("cannot")

    monkeypatch.setattr(HostState, "restore", broken)
    model, x = _mlp(), torch.randn(4, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = GemmSchedule(wait=0, warmup=0, active=2, report=False, verbose=False, output_dir=tmp_path,
                         sweep=["BF16"], sweep_rounds=0)
    with caplog.at_level(logging.INFO, logger="te_gemm_callback"):
        for i in range(3):
            sched.step_begin(model)
            model(x).sum().backward()
            opt.step()
            sched.step_end(JobStep(global_step=i + 1, sweep=lambda: SweepJob(model, lambda: model(x).sum(), [opt])))
        sched.train_end(JobStep(global_step=3))
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "could not put back the random streams" in errors[0], errors


def test_numpy_and_python_generators_on_a_module_are_put_back():
    model = _mlp()
    model.np_gen, model.np_state = np.random.default_rng(0), np.random.RandomState(1)
    model.py_rng, model.torch_gen = random.Random(2), torch.Generator().manual_seed(3)

    def draw():
        return (model.np_gen.random(), model.np_state.rand(), model.py_rng.random(),
                float(torch.rand(1, generator=model.torch_gen)))

    kept = HostState(model)
    first = draw()
    draw()  # what a sweep step draws
    kept.restore()
    assert draw() == first


def test_an_error_when_a_gemm_ends_turns_capture_off_once(monkeypatch, caplog):
    """Recorder.end ran outside the dispatch mode's guard: its error reached the job as the job's own."""
    def broken(self, token):
        raise RuntimeError("ours")

    monkeypatch.setattr(Recorder, "end", broken)
    model, x = _mlp(), torch.randn(4, 8)
    with caplog.at_level(logging.WARNING, logger="te_gemm_callback"):
        prof = GemmProfiler(model).start()
        for _ in range(3):
            model(x).sum().backward()
        cap = prof.stop()
    said = [r.getMessage() for r in caplog.records if "ours" in r.getMessage()]
    assert len(said) == 1 and "capture turned off" in said[0]
    assert cap.coverage.get("error") or prof.error
    assert _ours_on(model) == (0, 0, False)


@pytest.mark.parametrize("method", ["pause", "resume", "step"])
def test_a_failure_of_the_profiler_turns_capture_off_for_the_run(method, monkeypatch, caplog, tmp_path):
    """After a failure of pause, resume or step the schedule started a new profiler at the next
    window step: the same error said at every step, the hooks put on again each time."""
    calls = [0]

    def broken(self, *args, **kwargs):
        calls[0] += 1
        raise RuntimeError("ours")

    monkeypatch.setattr(GemmProfiler, method, broken)
    model, x = _mlp(), torch.randn(4, 8)
    sched = GemmSchedule(wait=1, warmup=2, active=5, report=False, verbose=False, output_dir=tmp_path)
    with caplog.at_level(logging.WARNING, logger="te_gemm_callback"):
        for i in range(10):
            sched.step_begin(model)
            model(x).sum().backward()
            sched.pause()
            sched.step_end(JobStep(global_step=i + 1))
        sched.train_end(JobStep(global_step=10))
    assert calls[0] == 1
    assert sum("ours" in r.getMessage() for r in caplog.records) == 1
    assert sched.capture is None and _ours_on(model) == (0, 0, False)


def test_a_generator_three_attributes_down_and_a_system_random_are_handled():
    """A loader's batch sampler's sampler's generator was found before the NumPy and Python streams
    were added, and then not; a random.SystemRandom (no state: it reads the OS) failed the sweep."""
    from torch.utils.data import BatchSampler, DataLoader, RandomSampler

    data = list(range(32))
    loader = DataLoader(data, batch_sampler=BatchSampler(
        RandomSampler(data, generator=torch.Generator().manual_seed(0)), 4, False))
    model = _mlp()
    model.system = random.SystemRandom()
    kept = HostState(model, [loader])
    first = next(iter(loader)).tolist()
    kept.restore()
    assert next(iter(loader)).tolist() == first


def test_a_buffer_a_sweep_step_adds_stops_nothing_else_from_going_back():
    """A buffer first registered by a sweep step raised KeyError in the put-back and stopped the rest
    of the parameters and buffers."""

    class Lazy(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            if not hasattr(self, "stats"):
                self.register_buffer("stats", torch.zeros(8))
            return self.lin(x)

    torch.manual_seed(0)
    model, x = Lazy(), torch.randn(4, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    run_sweep(model, lambda: model(x).square().mean(), ["BF16"], steps=2, warmup=1, rounds=0,
              profile_kernels=False, optimizers=[opt])
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))
