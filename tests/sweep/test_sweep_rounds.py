"""The sweep's alternating rounds: which recipe runs when, and a speedup the host's drift cannot move.

TE cannot run on a CPU: its autocast is a stand-in that records which recipe a forward ran under
(helpers.fakes.fake_te_sweep); everything else (the sweep, the profiler, the analysis) is real.
"""

import functools
import types

import pytest
import torch
from helpers.fakes import fake_te_sweep
from torch import nn

from te_gemm_callback import GemmProfilerCallback
from te_gemm_callback.analysis import verdicts as analysis
from te_gemm_callback.capture.capture_file import GemmCapture, StepTime


class Probe(nn.Linear):
    """Notes the recipe each forward runs under."""

    def __init__(self, fake, seen):
        super().__init__(8, 8)
        # A bound method, not a list: the sweep puts the job's containers back as they were
        # (host_state.py), and this records what the sweep's steps ran.
        self.fake, self.note = fake, seen.append

    def forward(self, x):
        self.note(self.fake.stack[-1])
        return super().forward(x)


def test_rounds_alternate_every_entry_forward_then_reverse(monkeypatch, tmp_path):
    sweep, fake = fake_te_sweep(monkeypatch)
    seen = []
    model = nn.Sequential(Probe(fake, seen), nn.Linear(8, 8))
    weights = [p.detach().clone() for p in model.parameters()]
    x = torch.randn(4, 8)
    res = sweep.run_sweep(model, lambda: model(x).square().mean(), ["Float8CurrentScaling", "DelayedScaling", "BF16"],
                          steps=2, warmup=1, rounds=2, budget_s=0, profile_kernels=False, out_dir=tmp_path)
    # Captures (warm-up, instrumented, 2 clean: 4 forwards each) in sweep order, then rounds of
    # (switch + 2 timed) per entry, forward order then reversed: every recipe in every round, since
    # TE's per-recipe state is put back at each switch (sweep.state.RecipeStates).
    cap_, blk = 4, 3
    order = ["BF16", "DelayedScaling", "Float8CurrentScaling"]
    assert seen == [r for r in order for _ in range(cap_)] + [r for r in order + order[::-1] for _ in range(blk)]
    assert res.rounds == 2 and "time budget" in res.stopped
    for cap in res.captures.values():
        per_round = [s for s in cap.steps if s.round is not None]
        assert [s.round for s in per_round] == [0, 0, 1, 1] and all(s.kind == "clean" for s in per_round)
    saved = GemmCapture.load(res.paths["Float8CurrentScaling"])
    assert [s.round for s in saved.steps if s.round is not None] == [0, 0, 1, 1]
    assert saved.meta["sweep_rounds"]["rounds"] == 2
    assert all(torch.equal(a, b) for a, b in zip(weights, model.parameters()))


def _drifting_sweep(monkeypatch, rounds):
    """BF16 steps cost 8 ms, Float8CurrentScaling 6.4 ms (1.25x), times a host that gets 5% slower
    at every step: the host-bound H200 job's step drifted 41-98 ms over minutes. The cost goes on a
    virtual clock that the profiler and the rounds' boundaries read, not into real sleeps: a loaded
    2-core CI host overslept by milliseconds and the no-rounds figure read 0.76-1.34x (bound 1.15)."""
    from te_gemm_callback.capture import instruments

    sweep, fake = fake_te_sweep(monkeypatch)
    model = nn.Linear(8, 8)
    x = torch.randn(4, 8)
    calls, now = [0], [0.0]

    def clock():
        return now[0]

    def step():
        calls[0] += 1
        now[0] += {"BF16": 8e-3, "Float8CurrentScaling": 6.4e-3}[fake.stack[-1]] * (1 + 0.05 * calls[0])
        return model(x).sum()

    def boundary_times(*args, **kwargs):  # the real function, reading the virtual clock
        with pytest.MonkeyPatch.context() as m:
            m.setattr(instruments, "time", types.SimpleNamespace(perf_counter=clock))
            return instruments.boundary_times(*args, **kwargs)

    monkeypatch.setattr(sweep, "capture_steps", functools.partial(sweep.capture_steps, clock=clock))
    monkeypatch.setattr(sweep, "boundary_times", boundary_times)
    res = sweep.run_sweep(model, step, ["BF16", "Float8CurrentScaling"], steps=3, warmup=1, rounds=rounds,
                          budget_s=0, profile_kernels=False)
    caps = list(res.captures.values())
    rep = analysis.analyze(caps[0], None, caps[1:])
    return next(a for a in rep.recipes if a.recipe == "Float8CurrentScaling").observed_step_speedup


def test_the_rounds_speedup_holds_where_the_host_drifts(monkeypatch):
    # On the virtual clock: 1.248x. Rounds all in one order (no ABBA) read 1.16x: the bound tells
    # them apart, which +-0.1 did not.
    assert _drifting_sweep(monkeypatch, rounds=6) == pytest.approx(1.25, abs=0.02)
    # Without rounds, BF16 is timed before the host slowed and the FP8 recipe after: 1.03x.
    assert _drifting_sweep(monkeypatch, rounds=0) < 1.25 - 0.1


def _cap(recipe, clean_ms, rounds_ms):
    steps = [StepTime(i, wall_ms=t, kind="clean") for i, t in enumerate(clean_ms)]
    steps += [StepTime(len(steps) + i, wall_ms=t, kind="clean", round=k) for i, (k, t) in enumerate(rounds_ms)]
    return GemmCapture([], steps, {"recipe": recipe})


def test_observed_speedup_is_the_median_of_the_rounds_ratios():
    # Captured on a fast host (BF16) and a slow one (FP8); then three rounds, 1.25x in each.
    bf16 = analysis.observe(_cap("BF16", [50, 50], [(0, 60), (1, 70), (2, 62)]))
    fp8 = analysis.observe(_cap("Float8CurrentScaling", [80, 80], [(0, 48), (1, 56), (2, 49.6)]))
    assert bf16.round_ms == {0: 60, 1: 70, 2: 62}
    assert analysis.observed_speedup(bf16, fp8) == pytest.approx(1.25)
    # The step time the table shows comes from the same rounds (medians of the rounds' medians:
    # 62 and 49.6 ms, 1.25x), not from every clean step (60 and 56 ms: 1.07x), so that it, its
    # non-GEMM time and the speedup beside it agree.
    assert (bf16.step_ms, fp8.step_ms) == (62, 49.6)
    # No common round (a capture without rounds): the ratio of the step times.
    assert analysis.observed_speedup(analysis.observe(_cap("BF16", [50], [])), fp8) == pytest.approx(50 / 49.6)
    # The verdict's evidence gives the rounds beside the median (3 rounds: too few for a 95% interval).
    a = analysis.RecipeAnalysis("Float8CurrentScaling", predicted_step_speedup=1.3, observed_step_speedup=1.25)
    verdict, evidence = analysis.verdict(a, fp8, bf16)
    assert "observed 1.25x (3 rounds: too few for a 95% interval)" in " ".join(evidence)
    assert verdict.startswith("GEMM-bound")  # every round within 5% of 1.3x
    # Rounds on both sides of the 5% band around the prediction: undecided, and why.
    fp8_mixed = analysis.observe(_cap("Float8CurrentScaling", [80], [(0, 48), (1, 60), (2, 49.6)]))
    a = analysis.RecipeAnalysis("Float8CurrentScaling", predicted_step_speedup=1.3,
                                observed_step_speedup=analysis.observed_speedup(bf16, fp8_mixed))
    verdict, evidence = analysis.verdict(a, fp8_mixed, bf16)
    assert verdict.startswith("undecided")
    assert "3 rounds (too few for a 95% interval) range 1.17-1.25x reaches across 1.23x" in " ".join(evidence)


def test_bad_sweep_rounds_is_refused_where_given(monkeypatch):
    with pytest.raises(ValueError, match="sweep_rounds must be an integer >= 0"):
        GemmProfilerCallback(sweep=["BF16"], sweep_rounds=-1)
    sweep, _ = fake_te_sweep(monkeypatch)
    with pytest.raises(ValueError, match="^rounds must be an integer >= 0, got 1.5$"):
        sweep.run_sweep(nn.Linear(2, 2), lambda: None, ["BF16"], rounds=1.5)


def test_a_swept_plan_keeps_its_modules_in_bf16_in_every_round(monkeypatch):
    from te_gemm_callback.analysis.plan import PrecisionPlan

    sweep, fake = fake_te_sweep(monkeypatch)
    seen = []
    kept = []
    model = nn.Sequential(Probe(fake, seen), Probe(fake, kept))
    x = torch.randn(4, 8)
    plan = PrecisionPlan("Float8CurrentScaling", ["1"])
    res = sweep.run_sweep(model, lambda: model(x).sum(), ["BF16", "Float8CurrentScaling"], steps=1, warmup=1,
                          rounds=2, budget_s=0, profile_kernels=False, plan=plan)
    assert sorted({s.round for s in res.captures["plan"].steps if s.round is not None}) == [0, 1]
    # Module 0 runs each entry's recipe; module 1, kept in BF16 by the plan, runs its forward in
    # BF16 inside the plan's FP8 autocast: FP8 forwards for module 0 under the recipe and the plan
    # alike (as many each), for module 1 under the recipe only.
    assert seen.count("Float8CurrentScaling") == 2 * kept.count("Float8CurrentScaling") > 0
    assert "forward" not in model[1].__dict__  # the plan is removed after its last round


def test_a_recipe_that_fails_loses_none_of_the_files_before_it(monkeypatch, tmp_path):
    sweep, fake = fake_te_sweep(monkeypatch)
    model = nn.Linear(8, 8)
    weights = [p.detach().clone() for p in model.parameters()]
    x = torch.randn(4, 8)

    def step():
        if fake.stack[-1] == "Float8CurrentScaling":
            raise RuntimeError("out of memory")
        return model(x).sum()

    with pytest.raises(RuntimeError, match="out of memory"):
        sweep.run_sweep(model, step, ["BF16", "DelayedScaling", "Float8CurrentScaling"], steps=1, rounds=2,
                        profile_kernels=False, out_dir=tmp_path)
    for label in ("BF16", "DelayedScaling"):  # captured before the failing recipe, written at once
        assert GemmCapture.load(tmp_path / label / "gemm_capture.json").steps
    assert not (tmp_path / "Float8CurrentScaling").exists()
    assert all(torch.equal(a, b) for a, b in zip(weights, model.parameters()))  # state put back
