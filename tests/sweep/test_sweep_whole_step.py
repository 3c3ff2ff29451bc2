"""The sweep times whole training steps (optimizer included) and leaves the job as it found it.

TE cannot run on a CPU: where a recipe other than BF16 is swept, its autocast is a stand-in
(helpers.fakes.fake_te_sweep) and TE's per-recipe state is a stand-in module that reproduces the
mechanism TE 2.20 has (a module joins the global DelayedScaling buffers once, with its first
state's tensors; a recipe switch replaces the state objects). tests/test_gpu.py checks the real one.
"""

import time

import pytest
import torch
from helpers.fakes import fake_te_sweep
from torch import nn

from te_gemm_callback.analysis import verdicts as analysis
from te_gemm_callback.sweep.state import RecipeStates


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))


def _train(model, opt, xs, sweep_after=None, sweep_kw=None):
    """Losses of a plain loop with AdamW and clipping; with ``sweep_after``, a sweep after that step."""
    from te_gemm_callback.sweep.engine import run_sweep

    losses = []
    for i, x in enumerate(xs):
        opt.zero_grad(set_to_none=True)
        loss = model(x).square().mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
        losses.append(loss.detach().clone())
        if i == sweep_after:
            def optimizer_step():
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
                opt.step()

            run_sweep(model, lambda: model(xs[0]).square().mean(), ["BF16"], steps=2, warmup=1,
                      profile_kernels=False, optimizers=[opt], optimizer_step=optimizer_step, **(sweep_kw or {}))
    return losses


def test_training_after_a_whole_step_sweep_is_bitwise_the_same():
    torch.manual_seed(1)
    xs = [torch.randn(8, 16) for _ in range(8)]
    a = _mlp()
    plain = _train(a, torch.optim.AdamW(a.parameters(), lr=1e-2), xs)
    b = _mlp()
    opt = torch.optim.AdamW(b.parameters(), lr=1e-2)
    swept = _train(b, opt, xs, sweep_after=2)
    assert all(torch.equal(p, q) for p, q in zip(plain, swept)), [float(p - q) for p, q in zip(plain, swept)]
    assert all(int(st["step"]) == 8 for st in opt.state.values())  # the sweep's optimizer steps are undone


def test_optimizer_state_the_sweep_creates_is_dropped():
    from te_gemm_callback.sweep.engine import run_sweep

    model = _mlp()
    opt = torch.optim.AdamW(model.parameters())  # no step yet: no state
    x = torch.randn(4, 16)
    run_sweep(model, lambda: model(x).sum(), ["BF16"], steps=1, warmup=1, profile_kernels=False, optimizers=[opt])
    assert len(opt.state) == 0


def test_the_swept_step_is_the_whole_step(monkeypatch):
    """An optimizer step of 20 ms is inside every timed step, and the forward+backward part beside it."""
    sweep, fake = fake_te_sweep(monkeypatch)
    model = _mlp()
    x = torch.randn(4, 16)

    def optimizer_step():
        time.sleep(0.02)

    res = sweep.run_sweep(model, lambda: model(x).sum(), ["BF16", "Float8CurrentScaling"], steps=2, warmup=1,
                          rounds=2, budget_s=0, profile_kernels=False, optimizer_step=optimizer_step)
    for cap in res.captures.values():
        assert cap.meta["sweep_step"].startswith("whole training step")
        timed = [s for s in cap.steps if s.round is not None]
        assert timed and all(s.ms >= 20 for s in timed)
        assert all(s.fwd_bwd_ms is not None and s.fwd_bwd_ms < s.ms - 15 for s in timed)
    bf16, fp8 = (analysis.observe(res.captures[r]) for r in ("BF16", "Float8CurrentScaling"))
    a = analysis.RecipeAnalysis("Float8CurrentScaling", predicted_step_speedup=1.0, observed_step_speedup=1.0)
    _, ev = analysis.verdict(a, fp8, bf16)
    assert any(e.startswith("forward+backward") and "the optimizer step and the rest of the step" in e for e in ev)
    # Without an optimizer the captures say what their step is.
    res = sweep.run_sweep(model, lambda: model(x).sum(), ["BF16"], steps=1, profile_kernels=False)
    assert res.captures["BF16"].meta["sweep_step"].startswith("forward+backward only")


def _timed_sweep(monkeypatch, noise, rounds=6, budget_s=60.0, max_rounds=None):
    """A sweep whose timed steps read BF16 10 ms and Float8CurrentScaling 8 ms (1.25x), each times a
    seeded random factor of +-``noise``: the boundary clock is replaced, everything else is real."""
    import random

    sweep, fake = fake_te_sweep(monkeypatch)
    rng = random.Random(0)
    if max_rounds:
        monkeypatch.setattr(sweep, "MAX_ROUNDS", max_rounds)

    def fake_times(step, n, cuda=None, mid=None):
        for _ in range(n):
            step()
        base = {"BF16": 10.0, "Float8CurrentScaling": 8.0}[current[0]]
        return [(base * (1 + rng.uniform(-noise, noise)), None) for _ in range(n)]

    current = ["BF16"]
    model = nn.Linear(8, 8)
    x = torch.randn(4, 8)

    def step():
        current[0] = fake.stack[-1]
        return model(x).sum()

    monkeypatch.setattr(sweep, "boundary_times", fake_times)
    res = sweep.run_sweep(model, step, ["BF16", "Float8CurrentScaling"], steps=1, warmup=1, rounds=rounds,
                          budget_s=budget_s, profile_kernels=False)
    rep = analysis.analyze(res.captures["BF16"], None, [res.captures["Float8CurrentScaling"]])
    return res, next(a for a in rep.recipes if a.recipe == "Float8CurrentScaling")


def test_rounds_stop_once_every_interval_is_within_two_percent(monkeypatch):
    res, a = _timed_sweep(monkeypatch, noise=0.005)
    assert res.rounds == 6 and "within +-2%" in res.stopped
    lo, hi = a.observed_ci
    assert lo <= 1.25 <= hi and hi / lo < 1.04 and a.observed_rounds == 6


def test_noisy_rounds_go_on_until_the_budget_or_the_cap(monkeypatch):
    res, a = _timed_sweep(monkeypatch, noise=0.2, max_rounds=14)
    assert res.rounds == 14 and "rounds (the most" in res.stopped
    res, a = _timed_sweep(monkeypatch, noise=0.2, budget_s=0)
    assert res.rounds == 6 and "time budget (0 s) with intervals up to" in res.stopped
    assert a.observed_ci is not None and a.observed_ci[0] < 1.25 < a.observed_ci[1]


def test_a_verdict_whose_interval_straddles_its_line_is_undecided():
    from te_gemm_callback.capture.capture_file import GemmCapture, StepTime

    def cap(recipe, ms):
        return GemmCapture([], [StepTime(k, wall_ms=t, kind="clean", round=k) for k, t in enumerate(ms)],
                           {"recipe": recipe})

    bf16 = analysis.observe(cap("BF16", [10.0] * 8))
    # Per-round ratios 1.10 .. 1.30x around a prediction of 1.25x: the interval reaches below 1.19x.
    ratios = (1.10, 1.15, 1.2, 1.22, 1.24, 1.26, 1.28, 1.3)
    fp8 = analysis.observe(cap("Float8CurrentScaling", [10 / r for r in ratios]))
    a = analysis.RecipeAnalysis("Float8CurrentScaling", predicted_step_speedup=1.25,
                                observed_step_speedup=analysis.observed_speedup(bf16, fp8))
    verdict, ev = analysis.verdict(a, fp8, bf16)
    assert verdict.startswith("undecided") and "95% interval" in " ".join(ev)
    # The same rounds, tight around 1.24x: decided.
    ratios = (1.23, 1.235, 1.24, 1.24, 1.245, 1.25, 1.24, 1.24)
    fp8 = analysis.observe(cap("Float8CurrentScaling", [10 / r for r in ratios]))
    verdict, _ = analysis.verdict(a, fp8, bf16)
    assert verdict.startswith("GEMM-bound")


class _Registry:
    """TE's global DelayedScaling buffers: the scale tensors of every registered module, updated
    after each DelayedScaling step (FP8GlobalStateManager.reduce_and_update_fp8_tensors)."""

    def __init__(self):
        self.scales = []

    def update(self):
        for s in self.scales:
            s.add_(1.0)


class _TEStyleLinear(nn.Linear):
    """A module that keeps its quantization state the way TE 2.20's TransformerEngineBaseModule
    does: a recipe change makes new state objects (set_meta_tensor), and the module joins the
    global buffers once, with the state it has then (add_fp8_tensors_to_global_buffer)."""

    def __init__(self, fake, registry):
        super().__init__(8, 8)
        self.fake, self.registry = fake, registry
        self.fp8_meta, self.quantizers, self.fp8_initialized = {}, {"scaling_fwd": []}, False
        # The test's record of the scales each DelayedScaling step used, kept where the sweep's
        # restore of the job's own containers (sweep/host_state.py) leaves it: behind a function.
        scales: list[float] = []
        self.record = lambda: scales

    @property
    def used_scales(self):
        return self.record()

    def forward(self, x):
        recipe = self.fake.stack[-1] if self.fake.stack else "BF16"
        if recipe != "BF16":
            if self.fp8_meta.get("recipe") != recipe:
                state = {"scale": torch.ones(1)}
                self.fp8_meta.update(recipe=recipe, scaling_fwd=state)
                self.quantizers["scaling_fwd"] = [state["scale"]]
            if recipe == "DelayedScaling" and "buffer_index_and_autocast_key" not in self.fp8_meta:
                self.fp8_meta["buffer_index_and_autocast_key"] = [len(self.registry.scales)]
                self.registry.scales.append(self.fp8_meta["scaling_fwd"]["scale"])
            if recipe == "DelayedScaling":
                self.used_scales.append(float(self.quantizers["scaling_fwd"][0]))
                self.registry.update()
        return super().forward(x)


def test_recipe_states_keep_delayed_scaling_updating_across_switches(monkeypatch):
    sweep, fake = fake_te_sweep(monkeypatch)
    reg = _Registry()
    lin = _TEStyleLinear(fake, reg)
    x = torch.randn(4, 8)

    def train_ds(n):
        for _ in range(n):
            with fake("DelayedScaling"):
                lin(x).sum().backward()

    # Without the keeper, TE's own behaviour: DelayedScaling -> Float8CurrentScaling -> DelayedScaling
    # leaves the module on a new scale that no global update reaches (stuck at 1.0).
    train_ds(3)
    with fake("Float8CurrentScaling"):
        lin(x)
    lin.used_scales.clear()
    train_ds(3)
    assert lin.used_scales == [1.0, 1.0, 1.0]

    reg2 = _Registry()
    lin = _TEStyleLinear(fake, reg2)
    train_ds(3)  # the job trains in DelayedScaling
    job_state = lin.fp8_meta["scaling_fwd"]
    res = sweep.run_sweep(lin, lambda: lin(x).sum(), ["BF16", "DelayedScaling", "Float8CurrentScaling"], steps=1,
                          warmup=1, rounds=3, budget_s=0, profile_kernels=False, job_recipe="DelayedScaling")
    assert set(res.captures) == {"BF16", "DelayedScaling", "Float8CurrentScaling"} and not res.skipped
    # Every DelayedScaling step of the sweep, rounds after Float8CurrentScaling included, used a
    # scale the global update reaches: it only grows.
    assert len(lin.used_scales) > 6 and all(b > a for a, b in zip(lin.used_scales, lin.used_scales[1:]))
    # The job's own state objects are back, and the job keeps updating them.
    assert lin.fp8_meta["scaling_fwd"] is job_state and lin.quantizers["scaling_fwd"][0] is job_state["scale"]
    lin.used_scales.clear()
    train_ds(2)
    assert lin.used_scales[1] > lin.used_scales[0] > 1.0


def test_recipe_states_without_te_modules_do_nothing():
    keep = RecipeStates(_mlp())
    keep.switch("DelayedScaling")
    keep.restore_job()
    assert keep.modules == 0


@pytest.mark.parametrize("bad", [-1, "10", float("nan"), True])
def test_bad_sweep_budget_is_refused_in_one_line(bad):
    from te_gemm_callback import GemmProfilerCallback

    with pytest.raises(ValueError, match="sweep_budget_s must be a number of seconds >= 0"):
        GemmProfilerCallback(sweep=["BF16"], sweep_budget_s=bad)


def test_the_framework_time_outside_the_training_step_is_measured_and_stated():
    from te_gemm_callback.analysis.notes import framework_note
    from te_gemm_callback.capture.capture_file import GemmCapture, StepTime

    job = GemmCapture([], [StepTime(i, wall_ms=12.0, kind="clean") for i in range(3)], {"recipe": "BF16"})
    sweep = GemmCapture([], [StepTime(i, wall_ms=10.0, kind="clean", round=i) for i in range(3)],
                        {"recipe": "BF16", "sweep": True, "sweep_step": "whole training step: forward, backward"})
    note = framework_note(job, sweep, {"BF16": 1.0, "Float8CurrentScaling": 1.25})
    # 2 ms outside the training step: 10 -> 8 ms becomes 12 -> 10 ms, 1.20x.
    assert "+2.00 ms (+20.0%)" in note and "Float8CurrentScaling 1.20x" in note
    # A forward+backward-only sweep is not the same kind of step: no note.
    sweep.meta["sweep_step"] = "forward+backward only: no optimizer was given to the sweep"
    assert framework_note(job, sweep, {"BF16": 1.0}) is None


def test_the_sweep_package_exports_its_entry_point_and_needs_torch_only_for_it():
    import subprocess
    import sys

    import te_gemm_callback
    from te_gemm_callback.sweep import SweepResult, engine, run_sweep

    assert run_sweep is engine.run_sweep is te_gemm_callback.run_sweep and SweepResult is engine.SweepResult
    # The report reads the sweep's intervals (analysis.intervals) on machines without torch's import cost.
    code = "import sys, te_gemm_callback.sweep.intervals; assert 'torch' not in sys.modules, 'torch imported'"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
