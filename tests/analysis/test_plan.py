"""The precision plan from a hand-made microbenchmark (TE cannot run on CPU, so the bench's cells are
written out: which module wins or loses in FP8 is then known exactly)."""

import json

import pytest
import torch
from helpers.fakes import fake_te_sweep
from helpers.three_modules import bench, capture
from torch import nn

from te_gemm_callback.analysis.plan import ModuleChoice, PrecisionPlan, apply_precision_plan, make_plan
from te_gemm_callback.capture.capture_file import GemmCapture
from te_gemm_callback.cli import main


def test_plan_keeps_the_losers_and_the_unrunnable_in_bf16():
    plan = make_plan(capture(), bench())
    assert plan.recipe == "Float8CurrentScaling" and sorted(plan.keep_bf16) == ["router", "small"]
    by = {m.module: m for m in plan.modules}
    assert by["small"].fp8_loss_ms == pytest.approx(3 * 0.02) and by["router"].fp8_ms is None
    # GEMM time per step: BF16 3.09; the single recipe 1.5 + 0.09 + 0.06 (router at BF16); the plan 1.5 + 0.03 + 0.06.
    assert plan.gemm_ms["BF16"] == pytest.approx(3.09)
    assert plan.gemm_ms["Float8CurrentScaling"] == pytest.approx(1.65)
    assert plan.gemm_ms["plan"] == pytest.approx(1.59)
    # Amdahl on the clean step (10 ms) and the kernels step's GEMM time (3.06 ms), job in BF16.
    assert plan.predicted_step_ms["plan"] == pytest.approx(10 - 3.06 + 3.06 * 1.59 / 3.09)
    assert plan.predicted_step_ms["plan"] < plan.predicted_step_ms[plan.best_single]
    assert plan.best_single == "Float8CurrentScaling" and plan.same_as is None  # a mixed plan


def test_a_plan_that_gains_too_little_is_the_best_single_recipe():
    """The mixed plan gains 0.06 ms of GEMM time per step, 0.59% of the 10 ms step: below a 1%
    threshold it is not worth a departure from the single recipe."""
    plan = make_plan(capture(), bench(), min_gain=0.01)
    assert plan.same_as == "Float8CurrentScaling" and plan.keep_bf16 == ["router"]  # TE cannot run the router
    assert plan.predicted_step_ms["plan"] == pytest.approx(plan.predicted_step_ms["Float8CurrentScaling"])


def test_bf16_everywhere_when_fp8_loses_on_every_module():
    b = bench()
    for r in b.results:
        if r.precision != "BF16" and r.median_ms is not None:
            r.median_ms *= 5  # "big" now loses too
    plan = make_plan(capture(), b)
    assert plan.same_as == "BF16" and sorted(plan.keep_bf16) == ["big", "router", "small"]
    assert plan.best_single == "BF16"
    assert plan.predicted_step_ms["plan"] == pytest.approx(plan.predicted_step_ms["BF16"])
    from te_gemm_callback.reporting.report_tables import plan_table

    assert plan_table(plan).title == "Precision plan: BF16 everywhere"


def test_everything_in_fp8_when_fp8_wins_everywhere():
    b = bench()
    for r in b.results:  # "small" no longer loses; the router stays BF16 (it cannot run)
        if sorted((r.m, r.k, r.n)) == [32, 32, 64] and r.precision != "BF16":
            r.median_ms = 0.005
    plan = make_plan(capture(), b)
    assert plan.keep_bf16 == ["router"] and plan.same_as == plan.recipe
    assert plan.gemm_ms["plan"] == pytest.approx(plan.gemm_ms[plan.recipe])  # the plan is the single recipe


def _cli_on_run(tmp_path, capsys, command, b=None):
    """A run folder with the capture and bench above, ``te-gemm <command>`` on it: (folder, output)."""
    run = tmp_path / "run"
    capture().save(run / "gemm_capture.json")
    (b or bench()).save(run / "bench.json")
    assert main([command, str(run)]) == 0
    return run, capsys.readouterr().out


def test_plan_files_and_cli(tmp_path, capsys):
    run, out = _cli_on_run(tmp_path, capsys, "plan")
    assert "Precision plan: Float8CurrentScaling, 2 module(s) kept in BF16" in out and "stays BF16" in out
    plan = PrecisionPlan.load(run / "precision_plan.json")
    assert sorted(plan.keep_bf16) == ["router", "small"]
    yaml = (run / "precision_plan_nvdlfw.yaml").read_text()
    assert "DisableFP8Layer" in yaml and "layer_name_regex_pattern: '^(small|router)$'" in yaml
    assert json.loads((run / "precision_plan.json").read_text())["schema"] == "te-gemm-plan/1"


def test_the_report_writes_the_plan_beside_the_verdicts(tmp_path, capsys):
    run, out = _cli_on_run(tmp_path, capsys, "report")
    # No kernels step with host calls here: no replay, so the figure is named GEMMs alone.
    assert "precision plan: Float8CurrentScaling with 2 module(s) kept in BF16, GEMMs alone" in out
    assert sorted(PrecisionPlan.load(run / "precision_plan.json").keep_bf16) == ["router", "small"]
    assert (run / "precision_plan_nvdlfw.yaml").exists()


def test_no_plan_from_a_bench_without_fp8(tmp_path, capsys):
    b = bench()
    b.results = [r for r in b.results if r.precision == "BF16"]  # a CPU host's bench
    run, out = _cli_on_run(tmp_path, capsys, "report", b)
    assert "precision plan" not in out and not (run / "precision_plan.json").exists()


def test_apply_precision_plan_leaves_no_hooks_and_changes_no_weights():
    model = nn.Sequential()
    model.add_module("big", nn.Linear(8, 8))
    model.add_module("small", nn.Linear(8, 8))
    x = torch.randn(2, 8)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    expected = model(x)
    handle = apply_precision_plan(model, PrecisionPlan("Float8CurrentScaling", ["small"]))
    assert torch.equal(model(x), expected)  # BF16 autocast off is a no-op without TE
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    assert "forward" in model.small.__dict__
    handle.remove()
    assert "forward" not in model.small.__dict__
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    with pytest.raises(ValueError, match="does not have: nope"):
        apply_precision_plan(model, PrecisionPlan("Float8CurrentScaling", ["nope"]))


def test_sweep_measures_the_plan_beside_the_single_recipes(monkeypatch, tmp_path):
    from te_gemm_callback.analysis import verdicts as analysis

    sweep, fake = fake_te_sweep(monkeypatch)
    torch.manual_seed(0)
    seen = []

    class Probe(nn.Linear):  # notes the precision its own forward runs under
        def forward(self, x):
            seen.append(fake.stack[-1])
            return super().forward(x)

    model = nn.Sequential(nn.Linear(16, 64), Probe(64, 16))
    x = torch.randn(8, 16)
    weights = [p.detach().clone() for p in model.parameters()]
    plan = PrecisionPlan("Float8CurrentScaling", ["1"], predicted_step_ms={"plan": 1.0},
                         predicted_speedup={"plan": 1.25})
    res = sweep.run_sweep(model, lambda: model(x).square().mean(), ["BF16", "Float8CurrentScaling"],
                          steps=2, warmup=1, profile_kernels=False, plan=plan, out_dir=tmp_path, rounds=0)
    assert list(res.captures) == ["BF16", "Float8CurrentScaling", "plan"]
    per = len(seen) // 3  # the same number of forwards per entry
    assert seen[per - 1] == "BF16" and set(seen[per:2 * per]) == {"Float8CurrentScaling"}
    assert set(seen[2 * per:]) == {"BF16"}  # the plan keeps module 1 out of FP8, inside the FP8 autocast
    assert "forward" not in model[1].__dict__  # the plan is removed after its steps
    assert all(torch.equal(a, b) for a, b in zip(weights, model.parameters()))
    meta = GemmCapture.load(res.paths["plan"]).meta["plan"]
    assert meta == {"recipe": "Float8CurrentScaling", "keep_bf16": ["1"], "predicted_speedup": 1.25,
                    "predicted_step_ms": 1.0,  # no TE here: not as TE's own per-module recipe
                    "applied": "te.autocast(enabled=False) around each module kept BF16"}
    caps = list(res.captures.values())
    rep = analysis.analyze(caps[0], None, caps[1:])
    a = next(r for r in rep.recipes if r.recipe == "plan")
    # The plan file's figure is GEMMs alone: shown as such, never as the predicted step.
    assert a.predicted_gemms_alone == 1.25 and a.predicted_step_speedup is None
    assert a.observed_step_speedup == pytest.approx(
        caps[0].step_ms() / caps[2].step_ms())
    assert a.evidence[0] == "Float8CurrentScaling with 1 module(s) kept in BF16: 1"
    assert any(e.startswith("best single recipe observed:") for e in a.evidence)


def test_sweep_plan_argument(tmp_path):
    from te_gemm_callback import GemmProfilerCallback

    with pytest.raises(ValueError, match="te-gemm plan"):
        GemmProfilerCallback(sweep_plan=tmp_path / "missing.json")
    path = PrecisionPlan("DelayedScaling", ["lm_head"]).save(tmp_path / "precision_plan.json")
    cb = GemmProfilerCallback(sweep=["Float8CurrentScaling"], sweep_plan=path)
    assert cb.sweep == ["Float8CurrentScaling", "BF16", "DelayedScaling"] and cb.sweep_plan.keep_bf16 == ["lm_head"]


def test_a_module_fp8_cannot_run_stays_bf16_even_if_its_bench_cell_says_fast():
    """A bench cell that ran (TE padded, or another build) must not put an 8-wide router in FP8:
    TE's FP8 GEMMs need every dimension a multiple of 16."""
    from te_gemm_callback.analysis.plan import fp8_shape_ok

    res = bench()
    changed = 0
    for r in res.results:
        if 8 in (r.m, r.k, r.n) and r.precision != "BF16":
            r.median_ms, r.error = 0.001, None  # "fast", and no error
            changed += 1
    assert changed == 6  # the router's three passes in both FP8 recipes
    plan = make_plan(capture(), res)
    assert "router" in plan.keep_bf16
    router = next(c for c in plan.modules if c.module == "router")
    assert router.fp8_ms is None and router.keep_bf16
    from te_gemm_callback.microbench.items import WorkItem
    from te_gemm_callback.shapes import GemmOp, GemmShape

    assert not fp8_shape_ok(WorkItem("x", GemmShape(1000, 1024, 1024, GemmOp.FPROP)))
    assert fp8_shape_ok(WorkItem("x", GemmShape(1000, 1024, 1024, GemmOp.FPROP), m_splits=(500, 500)))


def test_a_delayed_scaling_plan_runs_right_after_delayed_scaling(monkeypatch):
    """The plan runs right after its own recipe, next to the run it differs from."""
    sweep, _ = fake_te_sweep(monkeypatch)
    model = nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 16))
    x = torch.randn(4, 16)
    res = sweep.run_sweep(model, lambda: model(x).sum(), ["Float8CurrentScaling", "DelayedScaling", "BF16"],
                          steps=1, profile_kernels=False, plan=PrecisionPlan("DelayedScaling", ["1"]))
    assert list(res.captures) == ["BF16", "DelayedScaling", "plan", "Float8CurrentScaling"]
    assert not res.skipped and "forward" not in model[1].__dict__


def test_a_plan_that_is_a_single_recipe_is_not_timed_twice(monkeypatch):
    sweep, _ = fake_te_sweep(monkeypatch)
    model = nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 16))
    x = torch.randn(4, 16)
    everywhere = [ModuleChoice("0", 1.0, 2.0, True), ModuleChoice("1", 1.0, 2.0, True)]
    res = sweep.run_sweep(model, lambda: model(x).sum(), ["BF16", "DelayedScaling"], steps=1,
                          profile_kernels=False, plan=PrecisionPlan("DelayedScaling", ["0", "1"], everywhere))
    assert list(res.captures) == ["BF16", "DelayedScaling"]
    assert "the plan is BF16 everywhere" in res.skipped["plan"]


def test_a_delayed_scaling_plan_is_swept_on_a_job_in_another_fp8_recipe(monkeypatch):
    """A job that trains in another FP8 recipe: DelayedScaling and its plan are both timed (TE's
    per-recipe state is put back at each switch, sweep_state.RecipeStates)."""
    sweep, _ = fake_te_sweep(monkeypatch)
    model = nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 16))
    x = torch.randn(4, 16)
    res = sweep.run_sweep(model, lambda: model(x).sum(), ["DelayedScaling", "BF16"], steps=1, profile_kernels=False,
                          job_recipe="Float8CurrentScaling", plan=PrecisionPlan("DelayedScaling", ["1"]), rounds=0)
    assert list(res.captures) == ["BF16", "DelayedScaling", "plan"]
    assert not res.skipped and "forward" not in model[1].__dict__


def test_the_swept_plan_is_predicted_from_this_run_like_the_recipes():
    """The plan file's prediction is anchored on the run it was made from; beside the recipes, the
    report predicts the plan from this run's baseline and bench, the same way as theirs."""
    from te_gemm_callback.analysis import verdicts as analysis

    job = capture(step_ms=10.0, gemm_ms=3.06)  # the job ran BF16: the baseline
    job.meta["recipe"] = "BF16"
    planned = capture(step_ms=10.5, gemm_ms=1.6)
    planned.meta.update(recipe="plan", plan={"recipe": "Float8CurrentScaling", "keep_bf16": ["small", "router"],
                                             "predicted_speedup": 1.5, "predicted_step_ms": 7.0})
    rep = analysis.analyze(job, bench(), [planned])
    a = next(r for r in rep.recipes if r.recipe == "plan")
    # GEMM time per step: BF16 3.09, the plan 1.5 (big in FP8) + 0.03 + 0.06 (small, router in BF16).
    want = 10 - 3.06 + 3.06 * 1.59 / 3.09
    assert a.predicted_gemms_alone == pytest.approx(10 / want) and a.predicted_step_speedup is None
    assert a.observed_step_speedup == pytest.approx(10.0 / 10.5)
    assert any("the plan file's GEMMs alone 1.50x" in e for e in a.evidence)
    fcs = next(r for r in rep.recipes if r.recipe == "Float8CurrentScaling")
    assert fcs.predicted_gemms_alone == pytest.approx(10 / (10 - 3.06 + 3.06 * 1.65 / 3.09))  # the same baseline


def test_a_plain_torch_layer_in_a_te_job_is_not_given_a_recipe():
    """The plan table listed lm_head, a plain nn.Linear that ran in high precision in a TE job, as
    'runs in DelayedScaling': no recipe reaches it, whatever its microbenchmark says."""
    cap = capture()
    for r in cap.records:
        if r.module == "big":  # FP8 wins on it in the bench, but it is not a TE layer here
            r.source = "torch"
    plan = make_plan(cap, bench())
    big = next(m for m in plan.modules if m.module == "big")
    assert big.keep_bf16 and big.fp8_ms is None and "big" in plan.keep_bf16
    # A job with no TE layer at all is planned as if its layers were TE's.
    for r in cap.records:
        r.source = "torch"
    assert "big" not in make_plan(cap, bench()).keep_bf16


def test_the_plan_predicts_with_the_reports_replay_through_the_cli_and_the_api(tmp_path, capsys):
    """te-gemm plan printed Amdahl (0.97x on a host-bound job) beside a report that replayed 0.84x: the plan's
    predicted steps are the report's predicted column, with its bound, from the CLI and Run alike."""
    import shutil
    from pathlib import Path

    from te_gemm_callback import Run
    from te_gemm_callback.cli import main
    from te_gemm_callback.reporting.report_tables import plan_line

    run = tmp_path / "dense_host"
    shutil.copytree(Path(__file__).parents[2] / "docs/results/h200/replay/dense_host", run)
    api = Run(run)
    rep, plan = api.analysis().report, api.plan()
    for a in rep.recipes:
        if a.predicted_step_speedup is not None:
            assert plan.predicted_speedup[a.recipe] == pytest.approx(a.predicted_step_speedup)
            assert plan.meta["bound"][a.recipe] == a.predicted_bound
    assert plan.predicted_speedup["DelayedScaling"] == pytest.approx(0.84, abs=0.005)
    for a in rep.recipes:  # kept, named, and the report's GEMMs alone column
        assert plan.meta["gemms_alone"][a.recipe] == pytest.approx(a.predicted_gemms_alone)
    assert "(replay, host-bound" in plan_line(plan) and "Amdahl" not in plan_line(plan)
    assert main(["plan", str(run), "--limit", "1"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "DelayedScaling 70.73 ms (0.84x, host-bound)" in out and "Amdahl" not in out


@pytest.mark.parametrize("folder", ["h200/replay/dense_host", "h200/replay/main"])
def test_a_mixed_plan_is_replayed_between_its_recipe_and_bf16(tmp_path, monkeypatch, folder):
    """A mixed plan was given as GEMMs alone only. Its replay keeps the plan's modules in BF16 (their GEMMs, host
    and quantization costs): nothing kept is the recipe's replay, everything kept BF16's, half of it between;
    te-gemm plan then predicts it with its bound, as the recipes beside it."""
    import shutil
    from pathlib import Path

    import te_gemm_callback.analysis.plan as plan_mod
    from te_gemm_callback import Run
    from te_gemm_callback.sweep.plan import PrecisionPlan

    run = tmp_path / "run"
    shutil.copytree(Path(__file__).parents[2] / "docs/results" / folder, run)
    rr = Run(run).analysis()
    replay = rr.report.meta["replay"]
    te = sorted({r.module for r in rr.job.records if r.source == "te"})
    steps = [plan_mod._replay_mixed(rr, PrecisionPlan("DelayedScaling", keep)).step_ms
             for keep in ([], te[: len(te) // 2], te)]
    assert steps[0] == pytest.approx(replay["DelayedScaling"]["step_ms"])
    assert steps[2] == pytest.approx(replay["BF16"]["step_ms"])
    assert min(steps[0], steps[2]) < steps[1] < max(steps[0], steps[2])

    made = plan_mod.make_plan

    def mixed(*args, **kwargs):  # a plan keeping half the modules: the committed runs' plans are single recipes
        p = made(*args, **kwargs)
        return PrecisionPlan("DelayedScaling", te[: len(te) // 2], predicted_step_ms=dict(p.predicted_step_ms),
                             predicted_speedup=dict(p.predicted_speedup), meta=dict(p.meta))

    monkeypatch.setattr(plan_mod, "make_plan", mixed)
    plan = Run(run).plan()
    assert plan.same_as is None and "plan_not_replayed" not in plan.meta
    assert plan.predicted_step_ms["plan"] == pytest.approx(steps[1])
    assert plan.meta["bound"]["plan"] == replay["DelayedScaling"]["bound"]


def test_a_swept_mixed_plan_is_replayed_in_the_report(tmp_path):
    """The report's swept plan row was GEMMs alone, "a mixed plan is not replayed": it is the replay with the
    plan's modules in BF16, its band and bound, judged like the recipes (here a copy of the DelayedScaling run
    stands for the plan's run: what is checked is the prediction, not the timing)."""
    import shutil
    from pathlib import Path

    from te_gemm_callback import Run
    from te_gemm_callback.analysis.plan import _replay_mixed
    from te_gemm_callback.sweep.plan import PrecisionPlan

    run = tmp_path / "run"
    shutil.copytree(Path(__file__).parents[2] / "docs/results/h200/replay/dense_host", run)
    rr = Run(run).analysis()
    keep = sorted({r.module for r in rr.job.records if r.source == "te"})[:10]
    (run / "sweep" / "plan").mkdir()
    cap = json.loads((run / "sweep" / "DelayedScaling" / "gemm_capture.json").read_text())
    cap["meta"].update(recipe="plan", plan={"recipe": "DelayedScaling", "keep_bf16": keep})
    (run / "sweep" / "plan" / "gemm_capture.json").write_text(json.dumps(cap))
    row = next(a for a in Run(run).analysis().report.recipes if a.recipe == "plan")
    want = _replay_mixed(rr, PrecisionPlan("DelayedScaling", keep))
    assert row.predicted_by == "replay" and row.predicted_bound == want.bound and row.predicted_na is None
    assert row.predicted_step_ms == pytest.approx(want.step_ms)
    assert row.predicted_band[0] <= row.predicted_step_speedup <= row.predicted_band[1]
