"""Each option is one field of one stage's config (te_gemm_callback/options.py): the schedule and the
callbacks take exactly the configs' keywords, help() documents each, a bad value or an unknown
keyword fails in one line naming what the user wrote, and each field reaches what uses it."""

import dataclasses
import inspect

import pytest
import torch

from te_gemm_callback import GemmProfilerCallback, GemmSchedule, JobStep, SweepJob
from te_gemm_callback.capture.config import CaptureConfig
from te_gemm_callback.reporting.config import ReportConfig
from te_gemm_callback.schedule import CONFIGS
from te_gemm_callback.sweep.config import SweepConfig


def _keywords():
    return [kw for c in CONFIGS for kw in c.keywords()]


def test_the_schedule_and_the_callbacks_take_the_configs_keywords_documented():
    want = _keywords()
    assert len(want) == len(set(want))  # no keyword in two configs
    assert list(inspect.signature(GemmSchedule).parameters) == want
    assert list(inspect.signature(GemmProfilerCallback).parameters) == want
    for kw in want:
        assert f"        {kw}: " in GemmSchedule.__doc__ and f"        {kw}: " in GemmProfilerCallback.__doc__
    sched = GemmSchedule(active=3, sweep=["fp8_current"], sweep_rounds=2, output_dir="somewhere", verbose=True)
    assert sched.capture_config.active == 3 and sched.sweep_config.recipes == ["Float8CurrentScaling"]
    assert sched.sweep_config.rounds == 2 and sched.report_config.verbose is True
    assert str(sched.report_config.output_dir) == "somewhere"


def test_a_bad_option_is_refused_in_the_users_words():
    with pytest.raises(TypeError, match=r"^GemmProfilerCallback got an unexpected keyword argument 'sweep_round' "
                                        r"\(did you mean 'sweep_rounds'\?\)$"):
        GemmProfilerCallback(sweep_round=3)
    with pytest.raises(TypeError, match="unexpected keyword argument 'zzz'; it takes wait, warmup, active"):
        GemmSchedule(zzz=1)
    # The schedule's keyword, or the config's own field name where the config is built directly.
    with pytest.raises(ValueError, match="^sweep_steps must be an integer >= 1, got 0$"):
        GemmSchedule(sweep_steps=0)
    with pytest.raises(ValueError, match="^steps must be an integer >= 1, got 0$"):
        SweepConfig(steps=0)
    with pytest.raises(ValueError, match=r"^instrumented_steps \(3\) must not exceed active \(2\)$"):
        CaptureConfig(active=2, instrumented_steps=3)
    with pytest.raises(ValueError, match="^report must be True, False or 'end', got 1$"):
        ReportConfig(report=1)  # 1 == True, but not what the user should write


def test_the_sweeps_target_is_an_option_of_the_schedule():
    """sweep_target: one field of SweepConfig, taken, documented and checked wherever the schedule is."""
    assert GemmProfilerCallback(sweep_target=0.01).schedule.sweep_config.target == 0.01
    assert "sweep_target: the interval's half-width" in GemmProfilerCallback.__doc__
    with pytest.raises(ValueError, match="^sweep_target must be a fraction between 0 and 1"):
        GemmSchedule(sweep_target=2)


def test_configs_are_values():
    """Frozen: a schedule's options do not change under it; a changed copy is checked again."""
    c = SweepConfig(recipes=["BF16"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.steps = 5
    with pytest.raises(ValueError, match="steps must be"):
        dataclasses.replace(c, steps=-1)
    assert SweepConfig(recipes=["BF16"]) == c


def test_each_field_reaches_what_uses_it(tmp_path, monkeypatch):
    """The capture's profiler fields reach GemmProfiler by name, the sweep's config reaches the
    sweep whole (a field added there needs no other line to arrive)."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 8))
    sched = GemmSchedule(wait=0, warmup=0, active=1, adapters=["torch"], dispatch_steps=1, nvtx=False,
                         max_compile_steps=20, sweep=["BF16"], sweep_steps=2, sweep_warmup=0, sweep_rounds=0,
                         sweep_budget_s=0.5, output_dir=tmp_path, report=False)
    prof = sched._new_profiler(model, "active")
    try:
        assert prof.adapters == ("torch",) and prof.plan.dispatch == 1 and prof.max_compile_steps == 20
    finally:
        prof.stop()
    seen = {}
    import te_gemm_callback.sweep.engine as engine

    monkeypatch.setattr(engine, "run_sweep", lambda *a, **kw: seen.update(kw) or engine.SweepResult())
    sched.capture = None
    sched._run_sweep(JobStep(sweep=lambda: SweepJob(model, lambda: model(torch.randn(2, 8)).sum())))
    assert seen["config"] == sched.sweep_config and seen["nvtx"] is False


def test_the_profiler_takes_its_configs_fields_and_the_schedule_shares_them():
    from te_gemm_callback import GemmProfiler
    from te_gemm_callback.capture.config import ProfilerConfig

    fields = [f.name for f in dataclasses.fields(ProfilerConfig)]
    assert list(inspect.signature(GemmProfiler).parameters) == ["model", "config", *fields]
    for name in fields:
        assert f"        {name}: " in GemmProfiler.__doc__
    # The schedule's profiler options are the profiler's fields: one default, doc and check.
    for name in ("adapters", "dispatch_steps", "nvtx", "max_compile_steps"):
        mine = {f.name: f for f in dataclasses.fields(CaptureConfig)}[name]
        theirs = {f.name: f for f in dataclasses.fields(ProfilerConfig)}[name]
        assert mine.default == theirs.default and mine.metadata["doc"] == theirs.metadata["doc"]
        assert mine.metadata["check"] is theirs.metadata["check"] and mine.metadata["to"] == "profiler"
    model = torch.nn.Linear(4, 4)
    with pytest.raises(TypeError, match="unexpected keyword argument 'kernel_step'"):
        GemmProfiler(model, kernel_step=1)
    with pytest.raises(ValueError, match="^timing must be 'auto', 'events' or 'none', got 'fast'$"):
        GemmProfiler(model, timing="fast")
    prof = GemmProfiler(model, ProfilerConfig(timing=False, instrumented_steps=2))
    assert prof.timing == "none" and prof.plan.instrumented == 2
