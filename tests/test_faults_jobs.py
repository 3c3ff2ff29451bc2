"""Fault injection on the job and the run folder: what a hostile-but-fair user does to a training job
under the profiler and to the folders it writes, and that neither the job nor a file of theirs is
changed, and no result is silently wrong. CPU only; nothing is mocked."""

import copy
import json
import logging
import os
import pickle
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import matplotlib
import pytest
import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from helpers.cli import one_line_error
from helpers.lightning import DemoTransformer
from helpers.three_modules import bench, capture

from te_gemm_callback import GemmCapture, GemmProfiler, GemmProfilerCallback
from te_gemm_callback.analysis.runs import analyze_run
from te_gemm_callback.cli import main

REPO = Path(__file__).resolve().parents[1]


def warnings_of(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "te_gemm_callback" and r.levelno >= logging.WARNING]


def run_folder(root):
    capture().save(root / "gemm_capture.json")
    bench().save(root / "bench.json")
    return root


def users_png(path):
    """A PNG the user made themselves (matplotlib's own metadata, not ours)."""
    fig = plt.figure(figsize=(1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path.read_bytes()


def fit(cb, model=None, steps=6, callbacks=(), **kw):
    trainer = pl.Trainer(max_steps=steps, accelerator="cpu", callbacks=[cb, *callbacks], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         limit_val_batches=0, **kw)
    trainer.fit(model or DemoTransformer())
    return trainer


def our_hooks(model):
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


# 1. Writes stay inside the run folder, never through a link, never over a file of the user's.
@pytest.mark.parametrize("modes", [["x/../../../victim"], "autocast"])
def test_bench_modes_never_name_a_file_outside_the_run(tmp_path, capsys, modes):
    run = run_folder(tmp_path / "a" / "b" / "c" / "run")
    d = json.loads((run / "bench.json").read_text())
    d["meta"]["modes"] = modes
    (run / "bench.json").write_text(json.dumps(d))
    assert main(["report", str(run)]) == 1
    one_line_error(capsys, "bench.json", "meta.modes")
    assert sorted(p.name for p in tmp_path.rglob("*.png")) == []
    # The figure writer itself takes only plain names: a caller that skips the file's checks too.
    from te_gemm_callback.reporting.speedups import report_targets

    for bad in (["x/../../../victim"], ["a\\b"], ["a\x1b[31m"]):
        with pytest.raises(ValueError, match="not a plain file name"):
            report_targets(run, bad)


def test_report_never_writes_through_a_link_nor_over_a_users_png(tmp_path, capsys):
    run = run_folder(tmp_path / "run")
    victim = tmp_path / "bashrc"
    victim.write_text("export PS1='$ '\n")
    (run / "speedups.png").symlink_to(victim)
    assert main(["report", str(run)]) == 1
    one_line_error(capsys, "speedups.png", "symbolic link")
    assert victim.read_text() == "export PS1='$ '\n" and not (run / "report.json").exists()  # refused before any write
    (run / "speedups.png").unlink()
    mine = users_png(run / "step_split.png")
    assert main(["report", str(run)]) == 1
    one_line_error(capsys, "step_split.png", "did not write")
    assert (run / "step_split.png").read_bytes() == mine
    (run / "step_split.png").unlink()
    assert main(["report", str(run)]) == 0  # our own figures: replaced on every report
    assert main(["report", str(run)]) == 0
    capsys.readouterr()


def test_run_refuses_a_users_png_before_training(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    mine = users_png(tmp_path / "out" / "speedups.png")
    assert main(["run", "--out", str(tmp_path / "out"), "--steps", "3"]) == 1
    one_line_error(capsys, "speedups.png", "did not write")
    assert (tmp_path / "out" / "speedups.png").read_bytes() == mine
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["speedups.png"]  # nothing trained


def test_a_figure_that_cannot_be_written_keeps_the_old_one_and_names_the_file(tmp_path):
    run = run_folder(tmp_path / "run")
    assert main(["report", str(run)]) == 0
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.suffix == ".png"}
    limit = 1 + len((run / "report.json").read_bytes()) + 2048  # report.json fits, no figure does
    assert all(len(b) > limit for b in before.values())

    def small_files():  # `ulimit -f`: Python ignores SIGXFSZ, so a write past it raises EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    p = subprocess.run([sys.executable, "-m", "te_gemm_callback.cli", "report", str(run)], capture_output=True,
                       text=True, preexec_fn=small_files, cwd=REPO, timeout=300)
    assert p.returncode == 1, p.stderr
    err = p.stderr.strip()
    assert "\n" not in err and "Traceback" not in err and "File too large" in err and str(run) in err, err
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.suffix == ".png"} == before
    assert not [p for p in run.iterdir() if p.name.startswith(".")]  # no temporaries left


def test_a_users_plan_yaml_is_a_warning_and_the_report_is_written(tmp_path, caplog, capsys):
    run = run_folder(tmp_path / "run")
    (run / "precision_plan_nvdlfw.yaml").write_text("# my own debug config\n")
    with caplog.at_level(logging.WARNING, logger="te_gemm_callback"):
        assert main(["report", str(run)]) == 0
    msgs = [m for m in warnings_of(caplog) if "precision plan not written" in m]
    assert len(msgs) == 1 and "precision_plan_nvdlfw.yaml" in msgs[0] and "\n" not in msgs[0]
    assert (run / "precision_plan_nvdlfw.yaml").read_text() == "# my own debug config\n"
    for name in ("report.json", "speedups.png", "step_split.png", "gemm_autocast.png"):
        assert (run / name).exists(), name
    capsys.readouterr()


# 2. The job is left as it was: an exception inside the window, a copy of the model.
def test_an_exception_in_a_trainers_forward_leaves_nothing_on_the_model(tmp_path, caplog):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from helpers.hf import Tokens, tiny_llama

    from te_gemm_callback.adapters.hf import GemmProfilerTrainerCallback

    class Boom(type(tiny_llama())):
        calls, boom_at = 0, None

        def forward(self, input_ids=None, labels=None, **kwargs):  # named: the Trainer keeps those columns
            type(self).calls += 1
            if self.calls == self.boom_at:
                raise RuntimeError("the user's forward failed")
            return super().forward(input_ids=input_ids, labels=labels, **kwargs)

    torch.manual_seed(0)
    model = Boom(tiny_llama().config)
    before = our_hooks(model)

    def train(steps):
        args = transformers.TrainingArguments(output_dir=str(tmp_path / "hf"), max_steps=steps,
                                              per_device_train_batch_size=2, gradient_accumulation_steps=2,
                                              report_to=[], save_strategy="no", logging_steps=1000, use_cpu=True,
                                              disable_tqdm=True, seed=0)
        transformers.Trainer(model=model, args=args, train_dataset=Tokens(64), callbacks=[cb]).train()

    cb = GemmProfilerTrainerCallback(wait=1, warmup=1, active=3, output_dir=tmp_path / "te_gemm", verbose=False)
    Boom.boom_at = 6  # 2 micro-batches a step: the second forward of step 2, the first active (instrumented) one
    with caplog.at_level(logging.WARNING, logger="te_gemm_callback"):
        with pytest.raises(RuntimeError, match="the user's forward failed"):
            train(6)
    assert our_hooks(model) == before and "forward" not in model.__dict__
    assert torch._C._len_torch_dispatch_stack() == 0  # the dispatch mode is off the thread
    assert [m for m in warnings_of(caplog) if "capture turned off" in m and "RuntimeError" in m]
    # A later train() of the same process: the callback drops the stale capture and captures again.
    Boom.boom_at = None
    train(8)
    assert our_hooks(model) == before and "forward" not in model.__dict__
    assert torch._C._len_torch_dispatch_stack() == 0
    assert cb.capture is not None and len(cb.capture.steps) == 3


def test_our_hooks_do_not_survive_a_deepcopy_or_a_pickle_of_the_model():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
    x = torch.randn(4, 8)
    with GemmProfiler(model, instrumented_steps=2) as prof:
        model(x).sum().backward()
        twin = copy.deepcopy(model)  # inside the instrumented step: every module hooked
        blob = pickle.dumps(model)
        # nn.DataParallel's replica of the root (replicate() itself needs GPUs; this is its per-module copy).
        replica = model._replicate_for_data_parallel()
        assert "forward" not in replica.__dict__ and replica.forward.__self__ is replica
        twin(x).sum().backward()  # the copy's hooks are not ours: its GEMMs are owned by no module of the model ...
        prof.step()
        model(x).sum().backward()
    assert our_hooks(model) == 0 and "forward" not in model.__dict__
    fprop = {r.module: r.calls_per_step for r in prof.capture.records if r.op == "fprop"}
    assert fprop["0"] == 1 and fprop["2"] == 1  # (the dispatch mode sees any GEMM of the step: the copy's as "")
    assert our_hooks(twin) == 0  # ... and its inert hooks took themselves off at that first call
    assert twin.forward.__self__ is twin  # its forward is its own, not ours or the original's
    for restored in (pickle.loads(pickle.dumps(twin)), pickle.loads(blob)):
        assert torch.equal(restored(x), model(x))
        assert our_hooks(restored) == 0


# 3. Silently wrong results.
def test_a_sweep_left_by_an_earlier_run_is_never_this_runs_baseline(tmp_path, caplog):
    out = tmp_path / "te_gemm"
    first = GemmProfilerCallback(wait=1, warmup=1, active=2, output_dir=out, verbose=False, sweep=["BF16"],
                                 sweep_steps=1, sweep_warmup=0, sweep_rounds=0, kernel_breakdown=False)
    fit(first, steps=4)
    old = GemmCapture.load(out / "sweep" / "BF16" / "gemm_capture.json")
    assert old.meta["run_id"] == first.run_id == GemmCapture.load(out / "gemm_capture.json").meta["run_id"]
    keep = tmp_path / "old_sweep"
    shutil.copytree(out / "sweep", keep)
    # A second run into the same folder, without a sweep: the first run's sweep goes.
    second = GemmProfilerCallback(wait=1, warmup=1, active=3, output_dir=out, verbose=False)
    with caplog.at_level(logging.WARNING, logger="te_gemm_callback"):
        fit(second, steps=5)
    assert not (out / "sweep").exists()
    assert [m for m in warnings_of(caplog) if "sweep capture(s) of an earlier run" in m]
    # Put back by hand (or left by an older version): named and ignored, never the baseline.
    shutil.copytree(keep, out / "sweep")
    rr = analyze_run(out)
    job = GemmCapture.load(out / "gemm_capture.json")
    assert rr.report.step_ms == pytest.approx(job.step_ms()) and len(rr.captures) == 1
    assert any("sweep captures of another run ignored" in w and "sweep/BF16/gemm_capture.json" in w
               for w in rr.report.warnings)


def test_report_over_a_parent_of_two_runs_is_refused(tmp_path, capsys):
    parent = tmp_path / "runs"
    capture(20.0, 3.0).save(parent / "a" / "gemm_capture.json")
    capture(20.0, 3.0).save(parent / "a" / "sweep" / "BF16" / "gemm_capture.json")
    capture(1.0, 0.3).save(parent / "b" / "gemm_capture.json")
    assert main(["report", str(parent)]) == 1
    one_line_error(capsys, "2 run folders", str(parent / "a"), str(parent / "b"))
    assert main(["report", str(parent / "b")]) == 0
    capsys.readouterr()


@pytest.mark.parametrize("wait,instrumented_mb", [(1, 5), (0, 2)])
def test_steps_short_of_the_accumulation_are_not_clean(tmp_path, wait, instrumented_mb):
    # 7 batches an epoch, accumulate 5: optimizer steps of 5 and 2 micro-batches, alternating.
    cb = GemmProfilerCallback(wait=wait, warmup=1, active=6, output_dir=tmp_path, verbose=False)
    fit(cb, steps=wait + 7, accumulate_grad_batches=5, limit_train_batches=7)
    cap = cb.capture
    by_kind = {}
    for s in cap.steps:
        by_kind.setdefault(s.kind, []).append(s)
    assert by_kind["instrumented"][0].micro_batches == instrumented_mb
    assert by_kind["clean"] and all(s.micro_batches == 5 for s in by_kind["clean"])
    assert by_kind["partial"] and all(s.micro_batches == 2 for s in by_kind["partial"])
    assert cap.step_ms() == pytest.approx(sorted(s.ms for s in by_kind["clean"])[len(by_kind["clean"]) // 2]
                                          if len(by_kind["clean"]) % 2 else
                                          sum(sorted(s.ms for s in by_kind["clean"])
                                              [len(by_kind["clean"]) // 2 - 1:len(by_kind["clean"]) // 2 + 1]) / 2)
    # GEMMs per full step, whichever step was instrumented: the decoder runs once a micro-batch.
    dec = {r.op: r.calls_per_step for r in cap.records if r.module == "model.decoder"}
    assert dec == {"fprop": 5, "dgrad": 5, "wgrad": 5}
    instr = by_kind["instrumented"][0]
    assert cap.gemm_ms_per_step() == pytest.approx(instr.gemm_ms * 5 / instrumented_mb)
    assert "partial_steps" in cap.meta


def test_a_capture_under_inference_mode_says_why_it_is_empty(caplog, monkeypatch):
    from te_gemm_callback import precisions

    monkeypatch.setattr(precisions, "_WARNED", set())  # said once per process: not by an earlier test
    model = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 8))
    with caplog.at_level(logging.WARNING, logger="te_gemm_callback"):
        for _ in range(3):  # a fit starts several captures (warm-up, active, sweep): one warning in all
            with torch.inference_mode(), GemmProfiler(model, instrumented_steps=2) as prof:
                for _ in range(3):
                    model(torch.randn(4, 8))
                    prof.step()
            assert prof.capture.records == []
    msgs = [m for m in warnings_of(caplog) if "inference_mode" in m]
    assert len(msgs) == 1 and "no_grad" in msgs[0] and "\n" not in msgs[0]


# 4. A capture is never lost to a module name, and names never drive the terminal.
class Named(pl.LightningModule):
    NAMES = ("[/b]", "\x1b[31mred\x1b[0m", "\x1b]0;pwned\x07title", "[link=file:///etc/passwd]x[/link]")

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleDict({n: nn.Linear(8, 8) for n in self.NAMES})

    def training_step(self, batch, batch_idx):
        x = batch[0]
        for layer in self.layers.values():
            x = layer(x)
        return x.square().mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(32, 8)), batch_size=4)


def test_markup_and_escapes_in_module_names_are_shown_as_text(tmp_path, capsys):
    cb = GemmProfilerCallback(wait=1, warmup=1, active=2, output_dir=tmp_path, verbose=True)
    fit(cb, Named(), steps=5)
    assert cb.path is not None and cb.path.exists()  # saved, and printed after
    out = capsys.readouterr().out
    assert main(["show", str(cb.path)]) == 0
    out += capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "layers.[/b]" in out and "[link=file:///etc/passwd]x[/link]" in out and "layers.?[31mred?[0m" in out


# 5. Empty paths.
@pytest.mark.parametrize("args", [["run", "--out", ""], ["report", ""], ["plan", " "], ["compare", ""],
                                  ["bench", "--capture", "", "--precisions", "BF16"]])
def test_empty_path_arguments_are_refused(tmp_path, monkeypatch, capsys, args):
    monkeypatch.chdir(tmp_path)  # where an empty path would have written
    with pytest.raises(SystemExit) as e:
        main(args)
    assert e.value.code == 2
    one_line_error(capsys, "empty string")
    assert list(tmp_path.iterdir()) == []


# 6. Checks at construction, two callbacks, a copy of the callback.
def test_two_callbacks_in_one_trainer(tmp_path):
    a = GemmProfilerCallback(wait=1, warmup=1, active=2, output_dir=tmp_path / "a", verbose=False)
    b = GemmProfilerCallback(wait=2, warmup=1, active=2, output_dir=tmp_path / "b", verbose=False)
    fit(a, steps=5, callbacks=[b])
    assert a.path == tmp_path / "a" / "gemm_capture.json" and b.path == tmp_path / "b" / "gemm_capture.json"
    same = GemmProfilerCallback(output_dir=tmp_path / "a", verbose=False)
    with pytest.raises(RuntimeError, match="state_key"):  # Lightning refuses at Trainer(...), before any step
        pl.Trainer(accelerator="cpu", callbacks=[a, same], logger=False)


@pytest.mark.parametrize("kw,needle", [(dict(filename=".."), "plain file name"),
                                       (dict(filename="."), "plain file name"),
                                       (dict(set_recipe="x"), "set_recipe must be a function")])
def test_callback_arguments_that_would_lose_the_capture_are_refused(kw, needle):
    with pytest.raises(ValueError, match=needle) as e:
        GemmProfilerCallback(**kw)
    assert "\n" not in str(e.value)


def test_the_callback_can_be_deep_copied_inside_the_window(tmp_path):
    cb = GemmProfilerCallback(wait=1, warmup=1, active=3, output_dir=tmp_path, verbose=False)
    copies = []

    class CopyIt(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.global_step == 3:  # inside the active window, the profiler live
                assert cb.schedule._prof is not None
                copies.append(copy.deepcopy(cb))
                pickle.dumps(copies[-1])

    fit(cb, steps=6, callbacks=[CopyIt()])
    assert copies and copies[0].schedule._prof is None and copies[0].steps_seen == 3  # its place in the schedule kept
    assert cb.capture is not None and len(cb.capture.steps) == 3 and cb.path.exists()


def test_hf_callback_refuses_a_filename_that_is_a_folder():
    pytest.importorskip("transformers")
    from te_gemm_callback.adapters.hf import GemmProfilerTrainerCallback

    with pytest.raises(ValueError, match="plain file name"):
        GemmProfilerTrainerCallback(filename="..")
    cb = GemmProfilerTrainerCallback()
    assert copy.deepcopy(cb).schedule._prof is None and os.fspath(copy.deepcopy(cb).output_dir) == "te_gemm"


# Probe faults 1, 2, 19: the sweep folder's links, and what the sweep leaves on the module.
def test_stale_sweep_cleanup_never_deletes_through_a_linked_subfolder(tmp_path):
    out, elsewhere = tmp_path / "te_gemm", tmp_path / "precious"
    capture().save(elsewhere / "gemm_capture.json")  # a capture of ours, of another run, outside out
    (out / "sweep").mkdir(parents=True)
    (out / "sweep" / "old").symlink_to(elsewhere)
    fit(GemmProfilerCallback(wait=1, warmup=1, active=2, output_dir=out, verbose=False, kernel_breakdown=False),
        steps=4)
    assert (elsewhere / "gemm_capture.json").is_file() and (out / "sweep" / "old").is_symlink()


def test_the_sweep_never_writes_through_a_linked_folder_and_leaves_no_log_attribute(tmp_path, caplog):
    out, elsewhere = tmp_path / "te_gemm", tmp_path / "precious2"
    elsewhere.mkdir()
    (out / "sweep").mkdir(parents=True)
    (out / "sweep" / "BF16").symlink_to(elsewhere)
    model = DemoTransformer()
    assert "log" not in model.__dict__
    with caplog.at_level(logging.WARNING, logger="te_gemm_callback"):
        fit(GemmProfilerCallback(wait=1, warmup=1, active=2, output_dir=out, verbose=False, sweep=["BF16"],
                                 sweep_steps=1, sweep_warmup=0, sweep_rounds=0, kernel_breakdown=False),
            model=model, steps=4)
    assert list(elsewhere.iterdir()) == []
    assert any("symbolic link" in m for m in warnings_of(caplog))
    assert (out / "gemm_capture.json").is_file()  # the job's capture is still written
    assert "log" not in model.__dict__  # fault 19: the sweep's stand-in log is gone, not an instance attribute


def test_a_planned_model_pickles_deep_copies_and_its_copy_is_its_own():  # probe fault 3
    import io

    from te_gemm_callback.analysis.plan import PrecisionPlan, apply_precision_plan

    m = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    h = apply_precision_plan(m, PrecisionPlan("Float8CurrentScaling", ["0", "2"]))
    torch.save(m, io.BytesIO())
    back = pickle.loads(pickle.dumps(m))
    x = torch.randn(3, 8)
    assert torch.equal(back(x), m(x))
    c = copy.deepcopy(m)
    with torch.no_grad():
        for p in c.parameters():
            p.zero_()
    assert float(c(x).abs().sum()) == 0.0 and float(m(x).abs().sum()) > 0  # the copy runs its own weights
    c(x).sum().backward()
    assert all(p.grad is None for p in m.parameters())
    h.remove()
    assert "forward" not in m[0].__dict__ and torch.equal(c(x), torch.zeros(3, 4))


def test_a_plan_whose_gemm_time_exceeds_the_step_predicts_nothing_and_loads_back(tmp_path, capsys):  # fault 4
    from te_gemm_callback.analysis.plan import PrecisionPlan, make_plan, write_plan
    from te_gemm_callback.reporting.speedups import plan_line

    plan = make_plan(capture(step_ms=1.0, gemm_ms=3.06), bench())  # host-clock GEMMs over a clean step
    assert plan.predicted_step_ms == {} and plan.predicted_speedup == {}
    assert "exceeds the step" in plan.meta["prediction"] and "exceeds the step" in plan_line(plan)
    js, _ = write_plan(plan, tmp_path / "p.json", tmp_path / "p.yaml")
    assert PrecisionPlan.load(js).keep_bf16 == plan.keep_bf16
    run = tmp_path / "run"
    capture(step_ms=1.0, gemm_ms=3.06).save(run / "gemm_capture.json")
    bench().save(run / "bench.json")
    assert main(["plan", str(run)]) == 0
    assert "-" not in "".join(w for w in capsys.readouterr().out.split() if w.endswith("x)"))
    PrecisionPlan.load(run / "precision_plan.json")


@pytest.mark.parametrize("order", ["ab", "ba"])
def test_two_profilers_stopped_in_any_order_leave_no_guard(order):  # probe fault 6
    m = DemoTransformer()
    x = m.train_dataloader().dataset[0:2][0] if hasattr(m, "train_dataloader") else None
    a = GemmProfiler(m).start()
    b = GemmProfiler(m).start()
    (a if order == "ab" else b).stop()
    if x is not None:
        m.training_step((x, m.train_dataloader().dataset[0:2][1]), 0)  # the chain still runs
    (b if order == "ab" else a).stop()
    assert "forward" not in m.__dict__ and "_replicate_for_data_parallel" not in m.__dict__
    assert our_hooks(m) == 0


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, 10**30])
def test_micro_batches_the_capture_could_not_load_are_refused_at_step(tmp_path, bad):  # probe fault 8
    m = nn.Linear(8, 8)
    prof = GemmProfiler(m, adapters=["torch"]).start()
    m(torch.randn(2, 8)).sum().backward()
    with pytest.raises(ValueError, match="micro_batches must be a whole number"):
        prof.step(micro_batches=bad)
    with pytest.raises(ValueError, match="micro_batches must be a whole number"):
        prof.stop(micro_batches=bad)
    prof.step(micro_batches=2)
    m(torch.randn(2, 8)).sum().backward()
    cap = prof.stop()
    assert GemmCapture.load(cap.save(tmp_path / "c.json")).steps


@pytest.mark.parametrize("kw,needle", [(dict(output_dir="/dev/null"), "not a folder"),
                                       (dict(output_dir=""), "folder path"),
                                       (dict(filename="x" * 300 + ".json"), "at most 200 bytes"),
                                       (dict(sweep=[None]), "list of recipe names"),
                                       (dict(sweep=[5]), "list of recipe names")])
def test_callback_arguments_refused_at_construction(tmp_path, kw, needle):  # probe fault 14
    from te_gemm_callback.adapters.hf import GemmProfilerTrainerCallback

    for cls in (GemmProfilerCallback, GemmProfilerTrainerCallback):
        with pytest.raises(ValueError, match=needle) as e:
            cls(**kw)
        assert "\n" not in str(e.value)
    (tmp_path / "f").write_text("mine\n")
    with pytest.raises(ValueError, match="not a folder"):
        GemmProfilerCallback(output_dir=tmp_path / "f")


def test_plan_yaml_quotes_module_names_and_refuses_control_characters():  # probe fault 11
    import re

    import yaml

    from te_gemm_callback.analysis.plan import PrecisionPlan

    names = ["blocks.0.it's", "a\"b", "x: y #z"]
    doc = yaml.safe_load(PrecisionPlan("Float8CurrentScaling", names).nvdlfw_yaml())
    pattern = doc["te_gemm_plan_keep_bf16"]["layers"]["layer_name_regex_pattern"]
    assert all(re.match(pattern, n) for n in names) and not re.match(pattern, "blocks.0.it")
    with pytest.raises(ValueError, match="control characters"):
        PrecisionPlan("Float8CurrentScaling", ["a\nb"]).nvdlfw_yaml()


def test_a_step_run_on_another_thread_says_why_it_is_empty(caplog):  # probe fault 20
    import threading

    m = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 4))
    prof = GemmProfiler(m, adapters=["torch"]).start()
    with caplog.at_level(logging.WARNING, logger="te_gemm_callback"):
        for _ in range(2):
            t = threading.Thread(target=lambda: m(torch.randn(2, 8)).sum().backward())
            t.start()
            t.join()
        cap = prof.stop()
    assert cap.records == []
    said = [w for w in warnings_of(caplog) if "thread other than the one that started" in w]
    assert len(said) == 1


def test_report_over_runs_of_different_models_or_one_recipe_twice_is_refused(tmp_path, capsys):
    """A parent folder of separate runs (no sweep) was compared as one model's recipes whatever
    the runs were: two models gave "GEMM speedup 920.86x, observed 34.31x", exit 0, and of two
    runs in one recipe one was dropped without a word."""
    parent = tmp_path / "runs"
    capture(20.0, 3.0).save(parent / "a" / "gemm_capture.json")
    other = capture(5.0, 1.0)
    for r in other.records:
        r.module = "encoder." + r.module
    other.meta["recipe"] = "DelayedScaling"
    other.save(parent / "b" / "gemm_capture.json")
    assert main(["report", str(parent)]) == 1
    one_line_error(capsys, "different models", str(parent / "a"), str(parent / "b"))
    twice = tmp_path / "twice"
    capture(20.0, 3.0).save(twice / "a" / "gemm_capture.json")
    capture(18.0, 3.0).save(twice / "b" / "gemm_capture.json")
    assert main(["report", str(twice)]) == 1
    one_line_error(capsys, "two runs in BF16", str(twice / "a"), str(twice / "b"))
    # One model in two recipes, each its own run: compared, as before.
    fine = tmp_path / "fine"
    capture(20.0, 3.0).save(fine / "bf16" / "gemm_capture.json")
    fp8 = capture(15.0, 1.6)
    fp8.meta["recipe"] = "DelayedScaling"
    fp8.save(fine / "fp8" / "gemm_capture.json")
    assert main(["report", str(fine)]) == 0
    capsys.readouterr()
