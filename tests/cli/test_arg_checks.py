"""A hostile tester's small findings: arguments and inputs that were taken, or reported wrongly,
where they should have been refused (or named) in one line. One test per finding, CPU only; each
docstring says what went wrong."""

import json
import logging
import os
import stat
import warnings
from pathlib import Path

import pytest
import torch
from helpers.cli import one_line_error
from torch import nn

from te_gemm_callback import GemmProfiler, GemmProfilerCallback
from te_gemm_callback.cli import main
from te_gemm_callback.schedule import GemmSchedule, JobStep

REPO = Path(__file__).resolve().parents[2]
RUN_5B = REPO / "docs" / "results" / "h200" / "5b"


def te_warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "te_gemm_callback" and r.levelno >= logging.WARNING]


def small_capture(model=None, steps=3):
    model = model or nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 8))
    with GemmProfiler(model) as prof:
        for _ in range(steps):
            model(torch.randn(4, 8, requires_grad=True)).sum().backward()
            prof.step()
    return prof.capture


def test_project_with_a_bench_of_other_shapes_says_why_and_fails(tmp_path, capsys):
    """`te-gemm project` on a run whose bench.json measured other shapes than its capture's printed
    an empty table, wrote the projection and exited 0, with no reason."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "gemm_capture.json").write_bytes((RUN_5B / "gemm_capture.json").read_bytes())
    bench = json.loads((RUN_5B / "bench.json").read_text())
    for c in bench["results"]:  # the cells of another model: no shape of the capture's
        c["m"] += 8
    (run / "bench.json").write_text(json.dumps(bench))
    assert main(["project", str(run), "--gpu", "B300"]) == 1
    one_line_error(capsys, "no recipe's GEMM time can be projected", "not measured", "te-gemm bench --capture")
    assert not (run / "projection-B300.json").exists()


def test_a_model_on_the_meta_device_is_not_called_a_cpu_job(caplog, monkeypatch):
    """A model on the meta device was captured as a CPU job: host-clock "GEMM times" of calls that
    ran nothing, and the report's trace line said "a CPU job has no GPU kernel records"."""
    from te_gemm_callback import precisions
    from te_gemm_callback.analysis.verdicts import analyze
    from te_gemm_callback.reporting.trace import no_trace_reason

    monkeypatch.setattr(precisions, "_WARNED", set())
    model = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 8)).to("meta")
    with caplog.at_level(logging.WARNING, logger="te_gemm_callback"):
        with GemmProfiler(model) as prof:
            model(torch.randn(4, 8, device="meta")).sum().backward()
    cap = prof.capture
    assert cap.records and cap.meta["device"] == "meta device"
    assert all(s.gemm_ms is None for s in cap.steps) and cap.gemm_clock() is None
    said = [m for m in te_warnings(caplog) if "meta device" in m]
    assert len(said) == 1 and "nothing can be timed" in said[0] and "\n" not in said[0]
    assert "meta device" in no_trace_reason(cap) and "CPU" not in no_trace_reason(cap)
    with pytest.raises(ValueError, match="meta device: nothing runs there"):
        analyze(cap)


def test_a_model_without_gemms_is_told_no_gemm_ran(tmp_path, capsys):
    """A model with no GEMM at all got "the capture has no GEMM times (captured on CPU?): time it on
    the GPU": it sent the user to a GPU, where the same model runs no GEMM either."""
    cap = small_capture(nn.Sequential(nn.LayerNorm(8), nn.ReLU()))
    assert not cap.records
    path = cap.save(tmp_path / "gemm_capture.json")
    assert main(["compare", str(path), str(cap.save(tmp_path / "again.json"))]) == 1
    err = one_line_error(capsys, "no GEMM ran in the captured steps")
    assert "CPU" not in err and "GPU" not in err


def _callbacks():
    from te_gemm_callback.adapters.hf import GemmProfilerTrainerCallback

    return GemmProfilerCallback, GemmProfilerTrainerCallback, GemmSchedule


@pytest.mark.parametrize("kw,needle", [
    (dict(output_dir="te_gemm\x00x"), "output_dir must not hold a NUL"),
    (dict(output_dir=Path("a\x00b")), "output_dir must not hold a NUL"),
    (dict(nvtx="maybe"), "nvtx must be True, False or 'auto'"),
    (dict(nvtx=None), "nvtx must be True, False or 'auto'"),
    (dict(verbose="no"), "verbose must be True or False"),
    (dict(nsys_capture="yes"), "nsys_capture must be True or False"),
    (dict(kernel_breakdown=None), "kernel_breakdown must be True or False"),
    (dict(sweep=["FP8"]), r"sweep: 'FP8' names 4 recipes"),
    (dict(sweep=["BF16", "fp8"]), r"sweep: 'fp8' names 4 recipes"),
    (dict(output_dir=None), "output_dir must be a folder path"),  # was a TypeError naming no argument
])
def test_callback_arguments_of_the_wrong_kind_are_refused_at_construction(kw, needle):
    """An output_dir holding a NUL was taken and the capture lost when training ended; nvtx="maybe",
    verbose="no", nsys_capture="yes" and kernel_breakdown=None were taken for what their truth value
    says; sweep=["FP8"] silently swept DelayedScaling, where `--precisions FP8` is refused."""
    for cls in _callbacks():
        with pytest.raises(ValueError, match=needle) as e:
            cls(**kw)
        assert "\n" not in str(e.value), cls
    # What they accept stays accepted.
    for cls in _callbacks():
        cls(nvtx="auto", verbose=False, nsys_capture=False, kernel_breakdown=False, sweep=["BF16", "fp8_current"])
        cls(nvtx=True)


@pytest.mark.parametrize("bad", [JobStep(global_step="x"), JobStep(global_step=1.5), JobStep(accumulate=0),
                                 JobStep(writes="yes"), JobStep(writes=torch.tensor([True, False])),
                                 JobStep(log_metrics=5), "step 3"])
def test_a_bad_jobstep_turns_the_capture_off_and_never_reaches_the_loop(tmp_path, caplog, bad):
    """`GemmSchedule.step_end(JobStep(global_step="x"))` raised ValueError into the user's training
    loop when the window ended (int("x") while publishing)."""
    model = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 8))
    sched = GemmSchedule(wait=0, warmup=1, active=2, output_dir=tmp_path / "out", report=False, verbose=False)
    with caplog.at_level(logging.WARNING, logger="te_gemm_callback"):
        for _ in range(5):
            sched.step_begin(model)
            model(torch.randn(4, 8)).sum().backward()
            sched.step_end(bad)
        sched.train_end(bad)
    said = [m for m in te_warnings(caplog) if "capture turned off" in m]
    assert len(said) == 1 and "training goes on" in said[0] and "\n" not in said[0]  # once, not per step
    assert sched.done and sched.capture is None and not (tmp_path / "out" / "gemm_capture.json").exists()
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())  # nothing left on it


def test_control_characters_in_plot_labels_are_shown_as_text(tmp_path):
    """A module name holding ESC reached a plot label: matplotlib's "Glyph 27 missing from font"
    warning printed the raw ESC (it drives the terminal) and the PNG showed a missing glyph."""
    from te_gemm_callback.microbench.cells import BenchResult
    from te_gemm_callback.microbench.items import WorkItem
    from te_gemm_callback.microbench.results import BenchResults
    from te_gemm_callback.reporting.figures import stacked_gemm_figure
    from te_gemm_callback.shapes import GemmShape

    res = BenchResults([BenchResult(64, 64, 64, op, "BF16", "autocast", median_ms=1.0, iters=3)
                        for op in ("fprop", "dgrad", "wgrad")], meta={"device": "CPU\x1b]0;title\x07"})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        path = stacked_gemm_figure(res, [WorkItem("blocks.0\x1b[2J.fc1", GemmShape(64, 64, 64))], "autocast",
                                   tmp_path / "gemm.png")
    said = [str(w.message) for w in caught]
    assert not [m for m in said if "Glyph" in m or "\x1b" in m], said
    assert path.stat().st_size > 0


def test_a_replaced_file_keeps_its_mode(tmp_path):
    """A report.json the user had made 0600 became 0644 (the umask's) each time it was rewritten."""
    from te_gemm_callback.files.jsonio import write_json

    path = tmp_path / "report.json"
    write_json(path, {"schema": "te-gemm-report/1", "recipes": []})
    os.chmod(path, 0o600)
    write_json(path, {"schema": "te-gemm-report/1", "recipes": [1]})
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and json.loads(path.read_text())["recipes"] == [1]
    old = os.umask(0o022)
    try:  # a new file: the umask's, as before
        assert stat.S_IMODE(write_json(tmp_path / "new.json", {"schema": "x/1"}).stat().st_mode) == 0o644
    finally:
        os.umask(old)


@pytest.mark.parametrize("devices", ["2", "3"])
def test_bench_devices_beyond_the_hosts_gpus_are_refused_alike(capsys, no_measuring, monkeypatch, devices):
    """On a host without GPUs `te-gemm bench --devices 2` ran two CPU processes while 3 was refused."""
    from te_gemm_callback.microbench import parallel

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")  # no nvidia-smi: a host without GPUs, whatever runs the tests
    monkeypatch.setattr(parallel, "_launch", lambda *a: pytest.fail("launched"))
    assert main(["bench", "--shapes", "8x8x8", "--precisions", "BF16", "--no-cache", "--devices", devices]) == 2
    one_line_error(capsys, f"--devices {devices}, but this host has 1 visible GPU")


def test_show_refuses_a_step_kind_that_report_refuses(tmp_path, capsys):
    """`te-gemm show` printed a capture whose step kind was "zzz", exit 0, where `te-gemm report`
    refused the same file."""
    path = small_capture().save(tmp_path / "run" / "gemm_capture.json")
    d = json.loads(path.read_text())
    for s in d["steps"]:
        s["kind"] = "zzz"
    path.write_text(json.dumps(d))
    for cmd in (["show", str(path)], ["report", str(path.parent)]):
        assert main(cmd) == 1, cmd
        one_line_error(capsys, "step 0 has an unknown kind 'zzz'")


def test_report_of_a_folder_with_no_run_near_its_top_is_refused_without_walking_it(tmp_path, capsys, monkeypatch):
    """`te-gemm report /` searched every folder of the filesystem for gemm_capture.json (minutes on
    a real host) before refusing."""
    deep = tmp_path / "top"
    small_capture().save(deep / "a" / "b" / "c" / "gemm_capture.json")
    walked = []
    monkeypatch.setattr(Path, "rglob", lambda self, pattern: walked.append(self) or iter(()))
    for cmd in ("report", "plan"):
        assert main([cmd, str(deep)]) == 1
        one_line_error(capsys, f"{deep} holds no gemm_capture.json, nor do its subfolders")
    assert walked == []


def test_plan_outputs_on_stdout_or_the_same_file_are_refused_or_printed(tmp_path, capsys, monkeypatch):
    """`plan --yaml -` wrote a file named "-" into the current folder; `--json F --yaml F` wrote the
    plan, then refused the YAML over it naming a wrong cause."""
    from helpers.three_modules import bench, capture

    run = tmp_path / "run"
    capture().save(run / "gemm_capture.json")
    bench().save(run / "bench.json")
    monkeypatch.chdir(tmp_path)
    assert main(["plan", str(run), "--yaml", "-", "--json", str(tmp_path / "p.json")]) == 0
    out = capsys.readouterr().out
    assert "DisableFP8Layer" in out and not (tmp_path / "-").exists() and (tmp_path / "p.json").is_file()
    for argv in (["--json", "same.json", "--yaml", "same.json"], ["--json", "-", "--yaml", "-"]):
        assert main(["plan", str(run), *argv]) == 2, argv
        one_line_error(capsys, "name the same")
        assert not (tmp_path / "same.json").exists()


def test_a_cache_path_that_is_a_folder_leaves_no_lock_beside_it(tmp_path):
    from te_gemm_callback.microbench.cache import ResultCache

    folder = tmp_path / "d"
    folder.mkdir()
    err = ResultCache(folder).save()
    assert err and "is a folder" in err and not (tmp_path / "d.lock").exists()


def test_compare_names_the_capture_without_step_times(tmp_path, capsys):
    cap = small_capture()
    cap.save(tmp_path / "a.json")
    cap.steps = []
    cap.save(tmp_path / "b.json")
    assert main(["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 1
    one_line_error(capsys, "b.json has no step times")


def test_a_quiet_schedule_writes_nothing_to_the_jobs_stdout(tmp_path, capfd):
    """verbose=False: the bench's disabled progress bar still wrote a line break to stdout."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 16))
    sched = GemmSchedule(wait=0, warmup=1, active=2, output_dir=tmp_path)
    sched.fit_start(4)
    for i in range(4):
        sched.step_begin(model)
        model(torch.randn(8, 16)).sum().backward()
        sched.step_end(JobStep(global_step=i + 1))
    sched.train_end()
    assert (tmp_path / "report.json").is_file()
    assert capfd.readouterr().out == ""


def test_messages_name_the_real_fault(tmp_path, capsys):
    """--shapes "" was answered "missing config flags"; a folder given to nsys was "No such file";
    project=["FOO"] said "unknown GPU" without naming the argument."""
    assert main(["bench", "--shapes", "", "--precisions", "BF16"]) == 2
    one_line_error(capsys, "--shapes: no shapes given")
    cap = small_capture()
    cap.save(tmp_path / "c.json")
    (tmp_path / "rep").mkdir()
    assert main(["nsys", str(tmp_path / "c.json"), str(tmp_path / "rep"), "--nsys", "/bin/true"]) == 1
    one_line_error(capsys, "is a folder")
    for cls in _callbacks():
        with pytest.raises(ValueError, match="project: unknown GPU 'FOO'"):
            cls(project=["FOO"])


@pytest.mark.parametrize("active", [0, -5])
def test_active_zero_and_negative_get_one_message(active):
    """active=0 said "at least one step has to be captured", active=-5 "an integer >= 0": two
    wordings for one fault, and the second named a bound (0) that is itself refused."""
    with pytest.raises(ValueError) as err:
        GemmSchedule(active=active)
    assert str(err.value) == f"active must be an integer >= 1 (at least one step has to be captured), got {active}"


def test_shapes_refuses_a_size_no_gpu_runs(capsys):
    """`te-gemm shapes --hidden-size 100000000000000000000` printed 30-digit PFLOP tables."""
    base = ["shapes", "--intermediate-size", "4096", "--num-attention-heads", "32", "--num-hidden-layers", "2"]
    assert main([*base, "--hidden-size", "1" + "0" * 20, "--micro-batch-size", "1", "--sequence-length", "128"]) == 2
    one_line_error(capsys, "--hidden-size must be at most")
    assert main([*base, "--hidden-size", "4096", "--micro-batch-size", "1" + "0" * 7,
                 "--sequence-length", "1" + "0" * 7]) == 2
    one_line_error(capsys, "the GEMMs' M")


def test_a_bench_that_runs_for_minutes_on_a_cpu_says_so_first(monkeypatch):
    """`te-gemm bench --shapes 16384x16384x16384` on a CPU ran for an hour without a word."""
    from rich.console import Console

    from te_gemm_callback.cli.bench import warn_long_cpu_bench
    from te_gemm_callback.microbench.items import items_from_shapes
    from te_gemm_callback.shapes import parse_shapes

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = Console(record=True, width=200)
    big = warn_long_cpu_bench(items_from_shapes(parse_shapes("16384x16384x16384")), ["prequantized"], None, out)
    said = out.export_text()  # export_text() empties the record
    assert big > 600 and "minutes" in said and "Ctrl-C" in said and said.count("\n") == 1
    out = Console(record=True, width=200)
    assert warn_long_cpu_bench(items_from_shapes(parse_shapes("256x256x256")), ["prequantized"], None, out) < 1
    assert out.export_text() == ""


def test_an_empty_gemm_leaves_no_record_the_capture_file_refuses(tmp_path):
    """An MoE-style forward that runs a layer on zero tokens (x[:0]) left a 16x0x32 wgrad record:
    the capture was written, then refused by its own reader ("impossible dimensions")."""
    from te_gemm_callback.capture.capture_file import GemmCapture

    class Sparse(nn.Module):
        def __init__(self):
            super().__init__()
            self.l1, self.l2 = nn.Linear(32, 16), nn.Linear(32, 16)

        def forward(self, x):
            return self.l1(x).sum() + self.l2(x[:0]).sum()

    model, x = Sparse(), torch.randn(8, 32)
    with GemmProfiler(model, kernel_steps=0) as prof:
        for _ in range(2):
            model(x).backward()
            prof.step()
    path = prof.capture.save(tmp_path / "gemm_capture.json")
    cap = GemmCapture.load(path)
    assert {r.module for r in cap.records} == {"l1"} and all(0 not in (r.m, r.k, r.n) for r in cap.records)


def test_an_error_inside_a_hook_is_said_once_and_capture_stays_off(tmp_path, caplog, monkeypatch):
    """An error inside a hook was said three times (each capture window's profiler, then the
    sweep's), each with a traceback fragment, and a capture without GEMMs was still written."""
    from te_gemm_callback.capture import torch_adapter

    def boom(*a, **k):
        raise RuntimeError("injected")

    monkeypatch.setattr(torch_adapter.GemmDispatchMode, "_before", boom)
    model, opt = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 8)), None
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 8)
    sched = GemmSchedule(wait=1, warmup=1, active=3, output_dir=str(tmp_path / "te"), sweep=["BF16"], verbose=False)
    with caplog.at_level(logging.WARNING, logger="te_gemm_callback"):
        for i in range(7):
            sched.step_begin(model)
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
            sched.step_end(JobStep(global_step=i + 1))
        sched.train_end(JobStep(global_step=7))
    said = [m for m in te_warnings(caplog) if "capture turned off" in m]
    assert len(said) == 1 and "injected" in said[0] and "File " not in said[0], said
    assert not (tmp_path / "te" / "gemm_capture.json").exists()


def test_small_findings_of_a_second_probe(tmp_path, capsys):
    """`te-gemm nsys --pid abc` failed later naming something else; `te-gemm project --source-gpu
    H200` on a CPU run projected CPU times as if an H200's; a root module that never ran was named
    as nothing ("never ran while capturing: ")."""
    from te_gemm_callback.capture.coverage import _names

    with pytest.raises(SystemExit) as e:  # argparse's own refusal: exit 2, one line
        main(["nsys", "c.json", "r.nsys-rep", "--pid", "abc"])
    assert e.value.code == 2
    one_line_error(capsys, "expected a process id")
    run = tmp_path / "run"
    cap = small_capture()
    cap.save(run / "gemm_capture.json")
    assert main(["project", str(run), "--gpu", "B300", "--source-gpu", "H200"]) == 2
    one_line_error(capsys, "ran on a CPU")
    assert _names(["", "lm_head"]) == "(the model itself), lm_head"


def test_report_refuses_a_json_target_before_writing_the_run_folder(tmp_path, capsys):
    """`te-gemm report RUN --json foreign.json` wrote every file of the run folder, then refused
    the --json target and exited 1."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(REPO / "docs/results/h200/replay/main", run, ignore=shutil.ignore_patterns("sweep"))
    foreign = tmp_path / "foreign.json"
    foreign.write_text('{"acc": 0.9}')
    assert main(["report", str(run), "--json", str(foreign)]) == 1
    one_line_error(capsys)
    assert foreign.read_text() == '{"acc": 0.9}' and not (run / "report.json").exists()


def test_compare_refuses_what_it_cannot_compare_and_shows_the_runs_gemm_times(tmp_path, capsys):
    """compare X X and a lone capture exited 0 ("only BF16 was measured"; a lone run's verdict
    "predicted only"); two runs of one recipe dropped one without a word; the "GEMM ms" column was
    "-" in every row though the runs' own GEMM times are what it compares."""
    cap = small_capture()
    a, b = cap.save(tmp_path / "a.json"), cap.save(tmp_path / "b.json")
    assert main(["compare", str(a)]) == 2
    one_line_error(capsys, "compare needs two captures or more")
    assert main(["compare", str(a), str(tmp_path / "." / "a.json")]) == 2
    one_line_error(capsys, "is given twice")
    assert main(["compare", str(a), str(b)]) == 1
    one_line_error(capsys, "are both FP32 runs: give one capture per recipe")
    main_run = Path(__file__).resolve().parents[2] / "docs" / "results" / "h200" / "replay" / "main" / "sweep"
    assert main(["compare", str(main_run / "BF16" / "gemm_capture.json"),
                 str(main_run / "DelayedScaling" / "gemm_capture.json")]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if "DelayedScaling" in line and "│" in line)
    assert row.split("│")[2].strip() == "56.96", row


@pytest.mark.parametrize("speed", ["1e308", "1e-300", "0", "-2", "inf", "nan", "x"])
def test_project_refuses_a_host_speed_no_host_has(speed, capsys):
    """1e-300 printed 300-digit step times in a table thousands of columns wide; 1e308 a host
    "1e+308x faster"."""
    run = Path(__file__).resolve().parents[2] / "docs" / "results" / "h200" / "replay" / "main"
    with pytest.raises(SystemExit) as e:
        main(["project", str(run), "--gpu", "B300", "--host-speed", speed])
    assert e.value.code == 2
    one_line_error(capsys, "--host-speed", "expected a factor from 0.01 to 100")


@pytest.mark.parametrize("where", ["a file", "below a file"])
def test_run_refuses_an_out_it_cannot_write_before_training(where, tmp_path, capsys, monkeypatch):
    """--out naming a file, or a folder that cannot be made, was found only after training."""
    import te_gemm_callback.recipes.demo as demo

    def trains(*args, **kwargs):
        raise AssertionError("trained before refusing --out")

    monkeypatch.setattr(demo, "run_demo", trains)
    (tmp_path / "afile").write_text("mine")
    out = tmp_path / "afile" if where == "a file" else tmp_path / "afile" / "run"
    assert main(["run", "--out", str(out), "--steps", "3"]) == 1
    one_line_error(capsys, f"--out {out}")
    assert (tmp_path / "afile").read_text() == "mine"


def test_small_flags_mean_what_their_help_says(capsys):
    """--modes both (the help offers it) was refused; --project B300,B300 projected twice and
    --project '' nothing without a word; --top-k 8 without experts was taken for a dense MLP."""
    import argparse

    from te_gemm_callback.cli import _gpus
    from te_gemm_callback.cli.bench import _modes

    assert _modes("both") == ["autocast", "prequantized"] == _modes("prequantized,autocast")
    assert _gpus("B300,b300, GB200") == ["B300", "GB200"]
    with pytest.raises(argparse.ArgumentTypeError, match="expected GPU names"):
        _gpus(" , ")
    assert main(["shapes", "--hidden-size", "64", "--intermediate-size", "128", "--num-attention-heads", "4",
                 "--num-hidden-layers", "1", "--micro-batch-size", "1", "--sequence-length", "64", "--top-k", "8"]) == 2
    one_line_error(capsys, "--top-k", "--num-experts")


def test_show_json_before_the_run_folder_says_which_way_round(tmp_path, capsys):
    """`--json` takes an optional PATH: `te-gemm show --json RUN` gave RUN to it and then asked for a
    capture argument, leaving the user to guess why."""
    small_capture().save(tmp_path / "run" / "gemm_capture.json")
    run = str(tmp_path / "run")
    assert main(["show", "--json", run]) == 2
    one_line_error(capsys, f"--json took {run} as the file to write", f"te-gemm show {run} --json")
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["gemm_capture.json"]
    assert main(["show"]) == 2
    one_line_error(capsys, "give a gemm_capture.json or a run folder")
    assert main(["show", run, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["schema"]


def test_a_missing_run_folder_gets_the_same_line_from_every_command(tmp_path, capsys):
    """`te-gemm project` said "no run folder X" where report and plan say "X is not a folder"."""
    missing = str(tmp_path / "nowhere")
    lines = {}
    for cmd in (["report"], ["plan"], ["project", "--gpu", "B300"]):
        assert main([cmd[0], missing, *cmd[1:]]) == 1
        lines[cmd[0]] = one_line_error(capsys, f"{missing} is not a folder").split(": ", 1)[1]
    assert len(set(lines.values())) == 1, lines
