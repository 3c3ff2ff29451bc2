"""One schedule for every adapter: a plain loop driving GemmSchedule gets what the Lightning and HF
callbacks get (the window, the step plan, the capture file, the sweep, the metrics), and the
adapters only map hooks onto it."""

import ast
import inspect
from pathlib import Path

import pytest
import torch

from te_gemm_callback import GemmCapture, GemmSchedule, JobStep, SweepJob

ADAPTERS = Path(__file__).resolve().parents[2] / "te_gemm_callback" / "adapters"


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))


def _hooks(model):
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def test_a_plain_loop_drives_the_schedule_to_a_capture_a_sweep_and_metrics(tmp_path):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(4, 16)
    logged = []
    sched = GemmSchedule(wait=1, warmup=1, active=3, output_dir=tmp_path, verbose=False, sweep=["BF16"],
                         sweep_rounds=0, sweep_steps=1, sweep_warmup=0)
    sched.fit_start(max_steps=6)
    for i in range(6):
        sched.step_begin(model)
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
        sched.step_end(JobStep(global_step=i + 1, log_metrics=logged.append,
                               sweep=lambda: SweepJob(model, lambda: model(x).sum(), [opt])))
    sched.train_end()
    cap = GemmCapture.load(tmp_path / "gemm_capture.json")
    assert [s.kind for s in cap.steps][0] == "instrumented" and len(cap.steps) == 3
    assert sorted({r.op for r in cap.records}) == ["dgrad", "fprop", "wgrad"]
    assert cap.meta["global_step_end"] == 5 and cap.meta["run_id"] == sched.run_id
    assert sched.done and _hooks(model) == 0
    # The sweep ran once, right after the window, on the loop's own model, optimizer and batch.
    assert sched.sweep_result is not None and set(sched.sweep_result.captures) == {"BF16"}
    assert (tmp_path / "sweep" / "BF16" / "gemm_capture.json").exists()
    # Handed to the loop's logger: the capture's and the sweep's metrics, then the report's.
    assert "te_gemm/sweep_step_ms/BF16" in logged[0] and "te_gemm/report/gemm_speedup/BF16" in logged[-1]
    assert (tmp_path / "report.json").is_file() and (tmp_path / "report.md").is_file()


def test_gradient_accumulation_counts_micro_batches_as_one_step(tmp_path):
    model = _model()
    x = torch.randn(2, 16)
    sched = GemmSchedule(wait=0, warmup=0, active=2, output_dir=tmp_path, verbose=False)
    for i in range(3):
        sched.step_begin(model)
        for micro in range(3):
            if micro:
                sched.micro_batch_begin()
            model(x).sum().backward()
            sched.pause()  # the loop leaves its step between micro-batches
        sched.step_end(JobStep(global_step=i + 1, accumulate=3))
    sched.train_end()
    cap = GemmCapture.load(tmp_path / "gemm_capture.json")
    assert cap.meta["accumulate_grad_batches"] == 3 and len(cap.steps) == 2
    assert all(s.micro_batches == 3 for s in cap.steps)


def test_a_failure_inside_the_schedule_never_reaches_the_loop(tmp_path, caplog):
    model = _model()
    sched = GemmSchedule(wait=0, warmup=0, active=2, output_dir=tmp_path, verbose=False)
    sched.step_begin(model)
    sched._prof.recorder.fail(RuntimeError("injected"))
    model(torch.randn(2, 16)).sum().backward()
    sched.step_end(JobStep(global_step=1))
    sched.step_begin(model)
    model(torch.randn(2, 16)).sum().backward()
    sched.step_end(JobStep(global_step=2))
    sched.train_end()
    assert _hooks(model) == 0


def test_the_adapters_only_map_hooks_and_stay_small():
    files = sorted(ADAPTERS.glob("*.py"))
    assert sum(len(f.read_text().splitlines()) for f in files) < 350
    for f in files:  # no window, phase or publishing logic of their own: those are the schedule's
        tree = ast.parse(f.read_text())
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | \
                {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        assert not names & {"GemmProfiler", "phase", "gather_captures", "save_capture", "run_sweep", "wait",
                            "warmup", "active"}, f.name


def test_the_callbacks_show_the_schedules_arguments():
    from te_gemm_callback import GemmProfilerCallback

    want = [p for p in inspect.signature(GemmSchedule).parameters if p != "name"]
    assert list(inspect.signature(GemmProfilerCallback).parameters) == want


def test_a_sweep_step_holds_as_many_micro_batches_as_the_jobs_step():
    from te_gemm_callback.schedule import accumulated

    lin = torch.nn.Linear(4, 1, bias=False)
    xs = [torch.randn(3, 4) for _ in range(3)]
    calls = []

    def step():
        calls.append(1)
        return lin(xs[len(calls) - 1]).sum()

    accumulated(step, 3)().backward()  # the sweep's own backward on the last micro-batch's loss
    assert len(calls) == 3
    want = sum(x.sum(0) for x in xs) / 3  # what a job dividing each loss by 3 accumulates
    assert torch.allclose(lin.weight.grad[0], want)
    assert accumulated(step, 1) is step


def test_misuse_of_the_schedule_is_said_once(tmp_path, caplog):
    import logging

    sched = GemmSchedule(wait=0, warmup=0, active=2, output_dir=tmp_path, verbose=False, report=False)
    with caplog.at_level(logging.WARNING, logger="te_gemm_callback"):
        for i in range(3):
            sched.step_end(JobStep(global_step=i + 1))
    said = [r.getMessage() for r in caplog.records if "step_end called without step_begin" in r.getMessage()]
    assert len(said) == 1


def test_a_step_the_job_raised_in_is_not_called_unended_at_the_next_fit(tmp_path, caplog, monkeypatch):
    """After the job raised inside a step (exception()), the next fit's first step_begin was said to
    be "called twice without step_end"."""
    import logging

    from te_gemm_callback import precisions

    monkeypatch.setattr(precisions, "_WARNED", set())  # said once per process: not by an earlier test

    model = torch.nn.Linear(4, 4)
    sched = GemmSchedule(wait=0, warmup=1, active=2, output_dir=tmp_path, verbose=False, report=False)
    with caplog.at_level(logging.WARNING, logger="te_gemm_callback"):
        sched.step_begin(model)
        sched.exception()  # the job's step raised: no step_end comes
        sched.step_begin(model)
        sched.step_end(JobStep(global_step=1))
    assert not [r for r in caplog.records if "twice" in r.getMessage()]


def test_a_loop_that_raises_inside_with_schedule_leaves_nothing_behind(tmp_path):
    """A plain loop has no exception hook: ``with GemmSchedule(...)`` takes everything off when it
    raises mid-window (left on, the dispatch mode recorded every op of later work in the process)."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(RuntimeError, match="the job's own"):
        with GemmSchedule(wait=0, warmup=0, active=3, output_dir=tmp_path, verbose=False, report=False) as sched:
            for i in range(3):
                sched.step_begin(model)
                assert _get_current_dispatch_mode() is not None or i  # the first step is instrumented
                model(torch.randn(2, 4)).sum().backward()
                raise RuntimeError("the job's own error, in its optimizer step")
    assert _get_current_dispatch_mode() is None
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    assert "forward" not in model.__dict__ and not (tmp_path / "gemm_capture.json").exists()
    opt.step()  # the job's objects work on as before


@pytest.mark.parametrize("configured", [True, False])
def test_our_lines_follow_logging_the_job_configures_after_importing_us(tmp_path, configured):
    """A job that imports us first and configures logging in its main(): our warnings go to its log
    file at its level (INFO below it stays out), none to stderr; a job that configures nothing sees
    our INFO lines on stderr."""
    import subprocess
    import sys

    log_file = tmp_path / "job.log"
    script = (
        "import logging, sys\n"
        "import te_gemm_callback\n"
        "from te_gemm_callback import GemmSchedule\n"
        + (f"logging.basicConfig(filename={str(log_file)!r}, level=logging.WARNING)\n" if configured else "")
        + "GemmSchedule()\n"
        "log = logging.getLogger('te_gemm_callback.capture.recorder')\n"
        "log.warning('te-gemm: a warning for the job')\n"
        "log.info('te-gemm: an info line')\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    if configured:
        text = log_file.read_text()
        assert "a warning for the job" in text and "an info line" not in text
        assert "te-gemm:" not in out.stderr
    else:
        assert "a warning for the job" in out.stderr and "an info line" in out.stderr


def test_step_begin_without_a_model_says_what_it_needs(tmp_path, caplog, monkeypatch):
    """step_begin(None) (a loop that passes the wrong thing): one line naming what it needs, capture
    off, the loop untouched; not an AttributeError from inside the capture."""
    import logging

    from te_gemm_callback import precisions

    monkeypatch.setattr(precisions, "_WARNED", set())  # said once per process: not by an earlier test
    sched = GemmSchedule(wait=0, warmup=1, active=2, output_dir=tmp_path, verbose=False, report=False)
    with caplog.at_level(logging.WARNING, logger="te_gemm_callback"):
        for i in range(4):
            sched.step_begin(None)
            sched.step_end(JobStep(global_step=i + 1))
        sched.train_end(JobStep(global_step=4))
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "needs the torch.nn.Module the job trains, got NoneType" in said[0], said
    assert sched.done and sched.capture is None and not list(tmp_path.iterdir())


def test_a_job_step_whose_field_raises_an_unprintable_error_is_refused_in_words():
    from te_gemm_callback.schedule import _bad_job

    class Unprintable(Exception):
        def __str__(self):
            raise RuntimeError("no message")

    class Weird:
        def __eq__(self, other):
            raise Unprintable()

        __hash__ = object.__hash__

    why = _bad_job(JobStep(writes=Weird()))
    assert why is not None and "cannot be read" in why and "Unprintable" in why


def test_a_with_block_left_inside_the_window_ends_it_and_a_reused_schedule_warms_up(tmp_path):
    """Leaving ``with GemmSchedule`` with the window open left the capture on the model for the rest of the
    process; a schedule reused after its loop raised mid-window began its next window without a warm-up."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 4))

    def loop(sched, steps, fail_at=None):
        for i in range(steps):
            sched.step_begin(model)
            model(torch.randn(2, 4)).sum().backward()
            if i == fail_at:
                raise RuntimeError("the job's own")
            sched.step_end(JobStep(global_step=i + 1))

    with GemmSchedule(wait=1, warmup=0, active=10, output_dir=tmp_path, verbose=False, report=False) as sched:
        loop(sched, 4)
    assert "forward" not in model.__dict__ and _get_current_dispatch_mode() is None
    assert sched._prof is None and (tmp_path / "gemm_capture.json").is_file()  # ended as train_end() ends it

    again = GemmSchedule(wait=1, warmup=1, active=2, output_dir=tmp_path / "again", verbose=False, report=False)
    with pytest.raises(RuntimeError):
        with again:
            loop(again, 4, fail_at=2)  # raised in the window's first step
    with again:
        loop(again, 4)
    # The second run's own window: a warm-up step (its step 1), then 2 captured steps (2 and 3).
    assert len(again.capture.steps) == 2 and again.capture.meta["global_step_end"] == 3
