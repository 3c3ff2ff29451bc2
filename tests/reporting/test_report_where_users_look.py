"""The report without another command, where users already look: a Lightning fit and an HF Trainer
run with the callbacks' defaults leave the report in the run folder, and hand metrics, figures and
the verdict table to the job's own logger (TensorBoard read back with its own event reader)."""

import logging

import pytest
import pytorch_lightning as pl
import torch
from helpers.lightning import DemoTransformer

from te_gemm_callback import GemmProfilerCallback

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def _events(folder):
    """Scalars, images and text tags of every TensorBoard event file under ``folder``."""
    tags = {"scalars": set(), "images": set(), "tensors": set()}
    for f in folder.rglob("events.out.tfevents.*"):
        acc = event_accumulator.EventAccumulator(str(f), size_guidance={"images": 0, "tensors": 0})
        acc.Reload()
        for kind in tags:
            tags[kind] |= set(acc.Tags().get(kind, []))
    return tags


def _scalars(folder):
    """{tag: [values]} of every scalar in the event files below ``folder``."""
    from tensorboard.backend.event_processing import event_accumulator

    out = {}
    for f in folder.rglob("events.out.tfevents.*"):
        ea = event_accumulator.EventAccumulator(str(f))
        ea.Reload()
        for t in ea.Tags()["scalars"]:
            out.setdefault(t, []).extend(e.value for e in ea.Scalars(t))
    return out


def test_a_lightning_fit_with_the_defaults_leaves_the_report_and_logs_it(tmp_path, caplog):
    cb = GemmProfilerCallback(wait=1, warmup=1, active=3, output_dir=tmp_path / "gemm", verbose=False)
    logger = pl.loggers.TensorBoardLogger(tmp_path, name="tb")
    trainer = pl.Trainer(max_steps=6, accelerator="cpu", callbacks=[cb], logger=logger, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)
    with caplog.at_level(logging.INFO, logger="te_gemm_callback"):
        trainer.fit(DemoTransformer())
    out = tmp_path / "gemm"
    for name in ("gemm_capture.json", "bench.json", "report.json", "report.md", "speedups.png"):
        assert (out / name).is_file(), name
    # The cost is said, with how to move it or turn it off.
    assert any("wrote the report" in r.getMessage() and "report=False" in r.getMessage() for r in caplog.records)
    tags = _events(tmp_path / "tb")
    assert {"te_gemm/gemm_share", "te_gemm/report/gemm_speedup/BF16"} <= tags["scalars"]
    # One GEMM share, and a GEMM time beside the step time only where it is of the same steps.
    assert [t for t in tags["scalars"] if t.endswith("gemm_share")] == ["te_gemm/gemm_share"]
    acc = _scalars(tmp_path / "tb")
    if "te_gemm/gemm_ms_per_step" in acc:
        assert acc["te_gemm/gemm_ms_per_step"][-1] <= acc["te_gemm/step_ms"][-1]
    assert all(len(v) == 1 for k, v in acc.items() if k.startswith("te_gemm/")), acc
    assert "te_gemm/speedups" in tags["images"] and any("te_gemm/report" in t for t in tags["tensors"])


def test_report_false_writes_no_report_and_end_defers_it(tmp_path):
    for report, written in ((False, False), ("end", True)):
        out = tmp_path / str(report)
        cb = GemmProfilerCallback(wait=1, warmup=1, active=3, output_dir=out, verbose=False, report=report)
        pl.Trainer(max_steps=6, accelerator="cpu", callbacks=[cb], logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0).fit(DemoTransformer())
        assert (out / "gemm_capture.json").is_file() and (out / "report.json").is_file() == written


def test_a_bad_report_argument_is_refused_at_construction():
    with pytest.raises(ValueError, match="report must be True, False or 'end'"):
        GemmProfilerCallback(report="yes")


def test_an_hf_run_reports_to_tensorboard_through_report_to(tmp_path, monkeypatch):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from helpers.hf import Tokens, tiny_llama

    from te_gemm_callback.adapters.hf import GemmProfilerTrainerCallback

    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))  # the Trainer's and ours
    torch.manual_seed(0)
    cb = GemmProfilerTrainerCallback(wait=1, warmup=1, active=3, output_dir=tmp_path / "te_gemm", verbose=False,
                                     sweep=["BF16"], sweep_steps=1, sweep_rounds=0)
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "hf"), max_steps=6, per_device_train_batch_size=2,
                                          report_to=["tensorboard"], save_strategy="no", logging_steps=1000,
                                          use_cpu=True, disable_tqdm=True)
    transformers.Trainer(model=tiny_llama(), args=args, train_dataset=Tokens(32), callbacks=[cb]).train()
    assert (tmp_path / "te_gemm" / "report.json").is_file() and (tmp_path / "te_gemm" / "report.md").is_file()
    tags = _events(tmp_path / "tb")
    assert "te_gemm/observed_step_speedup/BF16" in tags["scalars"] and "te_gemm/gemm_share" in tags["scalars"]
    assert "te_gemm/speedups" in tags["images"]
    # Each scalar once: the capture's were logged again with the sweep's at the end of training.
    ours = {k: v for k, v in _scalars(tmp_path / "tb").items() if k.startswith("te_gemm/")}
    assert ours and all(len(v) == 1 for v in ours.values()), ours


class _DropoutLM(pl.LightningModule):
    """Dropout draws from the global RNG every step: a report inside the fit that moved the RNG
    would change every later loss."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Dropout(0.2), torch.nn.Linear(64, 16))
        self.losses = []

    def training_step(self, batch, batch_idx):
        loss = self.net(batch[0]).square().mean()
        self.losses.append(loss.detach().clone())
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)

    def train_dataloader(self):
        x = torch.randn(64, 16, generator=torch.Generator().manual_seed(0))
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x), batch_size=4)


def test_the_report_inside_the_fit_leaves_training_bitwise_the_same(tmp_path):
    def fit(callbacks):
        torch.manual_seed(0)
        model = _DropoutLM()
        pl.Trainer(max_steps=10, accelerator="cpu", callbacks=callbacks, logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False).fit(model)
        return model.losses

    plain = fit([])
    cb = GemmProfilerCallback(wait=1, warmup=1, active=3, output_dir=tmp_path, verbose=False)
    with_report = fit([cb])
    assert (tmp_path / "report.json").is_file()  # the report ran after step 5, inside the fit
    assert len(plain) == len(with_report) == 10 and all(torch.equal(a, b) for a, b in zip(plain, with_report))


def test_a_lightning_fit_hands_figures_and_the_verdict_table_to_wandb(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")  # the run's files stay on disk, read back below
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.chdir(tmp_path)
    logger = pl.loggers.WandbLogger(project="te-gemm-test", save_dir=str(tmp_path), offline=True)
    cb = GemmProfilerCallback(wait=1, warmup=1, active=3, output_dir=tmp_path / "gemm", verbose=False)
    pl.Trainer(max_steps=6, accelerator="cpu", callbacks=[cb], logger=logger, enable_checkpointing=False,
               enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0).fit(DemoTransformer())
    wandb.finish()
    media = [p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("files/media/**/*") if p.is_file()]
    assert sum("images/te_gemm/figures" in m for m in media) == 4  # speedups, step split, both GEMM figures
    assert any("table/te_gemm/report" in m for m in media)


def test_report_false_beside_an_earlier_report_says_it_is_not_this_runs(tmp_path, caplog):
    def fit(report):
        cb = GemmProfilerCallback(wait=1, warmup=1, active=3, output_dir=tmp_path, verbose=False, report=report)
        pl.Trainer(max_steps=6, accelerator="cpu", callbacks=[cb], logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0).fit(DemoTransformer())

    fit(True)
    with caplog.at_level(logging.WARNING, logger="te_gemm_callback"):
        fit(False)
    assert any("holds an earlier run's report" in r.getMessage() for r in caplog.records)


def test_hf_tensorboard_scalars_go_into_the_trainers_own_run_and_two_jobs_stay_apart(tmp_path, monkeypatch):
    """Our TensorBoard data went to a fixed run of its own, output_dir/runs/te_gemm, where a second
    job with the same output_dir landed on the same curves. Now it goes into the run the Trainer's
    TensorBoard callback made for the job (output_dir/runs/<time>_<host>)."""
    import time

    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    pytest.importorskip("tensorboard")
    from helpers.hf import Tokens, tiny_llama

    from te_gemm_callback.adapters.hf import GemmProfilerTrainerCallback

    monkeypatch.delenv("TENSORBOARD_LOGGING_DIR", raising=False)
    out = tmp_path / "hf"
    for job in range(2):
        if job:
            time.sleep(1.1)  # the Trainer names its run to the second
        torch.manual_seed(0)
        cb = GemmProfilerTrainerCallback(wait=1, warmup=1, active=2, output_dir=tmp_path / f"te_gemm{job}",
                                         verbose=False, report=False)
        args = transformers.TrainingArguments(output_dir=str(out), max_steps=4, per_device_train_batch_size=2,
                                              report_to=["tensorboard"], save_strategy="no", logging_steps=1,
                                              use_cpu=True, disable_tqdm=True)
        transformers.Trainer(model=tiny_llama(), args=args, train_dataset=Tokens(32), callbacks=[cb]).train()
    runs = sorted(d for d in (out / "runs").iterdir() if d.is_dir())
    assert len(runs) == 2, runs  # the Trainer's two runs, none of ours beside them
    for run in runs:
        tags = set(_scalars(run))
        assert "te_gemm/step_ms" in tags and any(t.startswith("train/") for t in tags), (run, tags)
        assert all(len(v) == 1 for k, v in _scalars(run).items() if k.startswith("te_gemm/"))
