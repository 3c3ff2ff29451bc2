"""The sweep leaves no trace in the job: every RNG it can draw from, and the Python state its
training_step keeps on the module, are as they would be without the callback.

A Lightning job in the idioms of Lightning's own docs: its training_step draws from NumPy, Python's
random and a torch.Generator of its own (dropout from torch's), appends each loss to
``self.training_step_outputs`` and averages them in ``on_train_epoch_end``, and counts its calls.
Fitted with and without the callback (with the in-fit sweep), everything must be bitwise equal.
"""

import random
import sys

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
from torch import nn

from te_gemm_callback import GemmProfilerCallback
from te_gemm_callback.sweep.host_state import HostState


class Job(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.Dropout(0.1), nn.GELU(), nn.Linear(32, 16))
        self.noise = torch.Generator().manual_seed(7)
        self.training_step_outputs = []
        self.calls = 0
        self.epoch_means = []
        self.draws = []

    def training_step(self, batch, i):
        self.calls += 1
        jitter = float(np.random.rand()) + random.random() + float(torch.rand(1, generator=self.noise))
        loss = self.net(batch + 1e-3 * jitter).square().mean()
        self.training_step_outputs.append(loss.detach())
        return loss

    def on_train_epoch_end(self):
        self.epoch_means.append(float(torch.stack(self.training_step_outputs).mean()))
        self.training_step_outputs.clear()

    def on_train_end(self):
        # What the job draws next from each stream: the sweep must not have advanced any of them.
        self.draws = [float(np.random.rand()), random.random(), float(torch.rand(1, generator=self.noise)),
                      float(torch.rand(1))]

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def fit(tmp_path, callbacks):
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    job = Job()
    data = [torch.randn(8, 16, generator=torch.Generator().manual_seed(i)) for i in range(8)]
    tr = pl.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks,
                    default_root_dir=str(tmp_path))
    tr.fit(job, torch.utils.data.DataLoader(data, batch_size=None))
    return job


def test_a_fit_with_the_sweep_is_bitwise_the_fit_without_it(tmp_path):
    plain = fit(tmp_path / "a", [])
    cb = GemmProfilerCallback(wait=1, warmup=1, active=4, output_dir=str(tmp_path / "te"), sweep=["BF16"],
                              sweep_steps=2, sweep_rounds=2, sweep_budget_s=0, verbose=False, report=False)
    swept = fit(tmp_path / "b", [cb])
    assert (tmp_path / "te" / "sweep").is_dir()  # the sweep ran inside the fit
    assert swept.calls == plain.calls == 16
    assert swept.epoch_means == plain.epoch_means  # the metric the job computes from its own list
    assert swept.draws == plain.draws  # NumPy, Python, its own generator, torch's: none advanced
    for (n, p), q in zip(plain.named_parameters(), swept.parameters()):
        assert torch.equal(p, q), n


def test_host_state_puts_containers_back_in_the_same_objects():
    m = Job()
    outputs = m.training_step_outputs
    outputs.append(1)
    state = HostState(m)
    m.training_step_outputs.append(2)
    m.calls = 5
    m.added = [3]
    assert sorted(state.restore()) == ["Job.added", "Job.calls", "Job.training_step_outputs"]
    assert m.training_step_outputs is outputs and outputs == [1] and m.calls == 0 and not hasattr(m, "added")


def test_private_counters_and_a_torchmetrics_like_count_are_put_back():
    class Counter(torch.nn.Module):  # as torchmetrics' Metric keeps _update_count
        def __init__(self):
            super().__init__()
            self._update_count = 0

    m = Job()
    m.counter = Counter()
    m._calls, m._seen = 0, [1]
    seen = m._seen
    state = HostState(m)
    m._calls, m.counter._update_count = 3, 7
    m._seen.append(2)
    m._lazy_cache = {"made": "by a library during the sweep"}
    assert sorted(state.restore()) == ["Counter._update_count", "Job._calls", "Job._seen"]
    assert (m._calls, m.counter._update_count, m._seen) == (0, 0, [1]) and m._seen is seen
    assert m._lazy_cache  # a private name the steps added may be a library's cache: left
    assert m._parameters is not None and m._forward_hooks is not None  # torch's own, never touched


class LoggingJob(Job):
    def training_step(self, batch, i):
        loss = super().training_step(batch, i)
        self.log("loss", loss)
        return loss


def test_our_metrics_sit_in_step_order_among_the_jobs_own(tmp_path):
    import csv

    cb = GemmProfilerCallback(wait=1, warmup=1, active=3, output_dir=str(tmp_path / "te"), verbose=False,
                              sweep=None, report=False)
    tr = pl.Trainer(max_steps=8, accelerator="cpu", callbacks=[cb], logger=pl.loggers.CSVLogger(tmp_path, name="log"),
                    log_every_n_steps=1, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False)
    data = [torch.randn(8, 16, generator=torch.Generator().manual_seed(i)) for i in range(8)]
    tr.fit(LoggingJob(), torch.utils.data.DataLoader(data, batch_size=None))
    rows = list(csv.DictReader(open(tmp_path / "log" / "version_0" / "metrics.csv")))
    steps = [int(r["step"]) for r in rows]
    ours = {int(r["step"]) for r in rows if any(k.startswith("te_gemm/") and v for k, v in r.items())}
    assert ours and steps == sorted(steps), steps  # Lightning logs the job's at _batches_that_stepped
    assert ours <= {int(r["step"]) for r in rows if r.get("loss")}  # beside a step the job logged


class RaisingLogger(pl.loggers.Logger):
    """A logger that fails on everything: listed first, it must not keep ours from the next one."""

    name, version, experiment = "raising", 0, None

    def log_metrics(self, metrics, step=None):
        raise RuntimeError("logging service down")

    def log_hyperparams(self, params, *args, **kwargs):
        pass


def test_a_logger_that_raises_stops_no_other_logger(tmp_path, caplog):
    import logging

    from helpers.lightning import DemoTransformer

    csv = pl.loggers.CSVLogger(tmp_path, name="log")
    cb = GemmProfilerCallback(wait=1, warmup=1, active=3, output_dir=str(tmp_path / "te"), verbose=False,
                              sweep=None, report=False)
    tr = pl.Trainer(max_steps=5, accelerator="cpu", callbacks=[cb], logger=[RaisingLogger(), csv],
                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                    limit_val_batches=0)
    with caplog.at_level(logging.WARNING, logger="te_gemm_callback"):
        tr.fit(DemoTransformer())
    assert "te_gemm/" in (tmp_path / "log" / "version_0" / "metrics.csv").read_text()
    assert any("RaisingLogger could not take the te_gemm metrics" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("state", [{"steps_seen": "abc", "done": False, "path": None},
                                   {"steps_seen": None, "done": False, "path": None},
                                   {"steps_seen": 2, "done": "no", "path": None},
                                   {"steps_seen": -3, "done": False, "path": None}, "not a dict"])
def test_a_damaged_checkpoint_state_is_said_and_the_capture_starts_afresh(state, caplog):
    import logging

    cb = GemmProfilerCallback(wait=1, warmup=1, active=2, verbose=False)
    with caplog.at_level(logging.WARNING, logger="te_gemm_callback"):
        cb.load_state_dict(state)  # Lightning calls this while restoring: it must not raise
    assert cb.steps_seen == 0 and not cb.done
    assert any("te-gemm state is damaged" in r.getMessage() for r in caplog.records)


def test_the_report_reaches_wandb_as_text_never_as_markup(tmp_path, monkeypatch):
    import sys
    import types

    from te_gemm_callback.reporting.loggers import to_report_to

    sent, how = [], []
    run = types.SimpleNamespace(log=lambda payload, **kw: (sent.append(payload), how.append(kw)))
    fake = types.SimpleNamespace(run=run, Html=lambda text: ("html", text), Image=lambda p: ("image", p))
    monkeypatch.setitem(sys.modules, "wandb", fake)  # W&B's client is not what is tested: what we hand it
    md = tmp_path / "report.md"
    md.write_text("## Verdicts\n\n- **<script>alert(1)</script>**: module <top> & co\n")
    assert to_report_to(["wandb"], None, {"te_gemm/step_ms": 1.0}, {"report_md": md}, step=3) == ["wandb"]
    kind, text = sent[0]["te_gemm/report"]
    assert kind == "html" and "<script>" not in text and "&lt;script&gt;" in text and "&lt;top&gt;" in text
    # Into the job's next row: a step of ours moved W&B's row counter, and every later row of the job with it.
    assert how == [{"commit": False}]


def cpu_run(tmp_path, edit=lambda text: text):
    """A run folder of a CPU job: its capture (its text through ``edit``) and its bench. No kernel
    timeline and no FP8 recipe: no trace, no precision plan."""
    from te_gemm_callback import GemmProfiler
    from te_gemm_callback.cli import main

    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))
    with GemmProfiler(model) as prof:
        for _ in range(3):
            model(torch.randn(8, 16)).sum().backward()
            prof.step()
    cap = tmp_path / "gemm_capture.json"
    prof.capture.save(cap)
    cap.write_text(edit(cap.read_text()))
    assert main(["bench", "--capture", str(cap), "--json", str(tmp_path / "bench.json")]) == 0
    return tmp_path


def test_a_lone_surrogate_in_a_name_is_read_as_a_replacement_character(tmp_path, capsys):
    # "\udc80" in a capture file decodes to text no file can hold: the report must still be whole.
    import json

    from te_gemm_callback.cli import main

    cpu_run(tmp_path, lambda text: text.replace('"module": "0"', '"module": "bad\\udc80name"'))
    assert main(["report", str(tmp_path)]) == 0
    for name in ("report.md", "report.json", "trace.json"):
        if (tmp_path / name).exists():
            text = (tmp_path / name).read_bytes().decode("utf-8")  # strict: whole UTF-8
            assert "\\udc80" not in text, name
    assert "bad\ufffdname" in (tmp_path / "report.md").read_text()
    json.loads((tmp_path / "report.json").read_text())


def test_an_earlier_runs_trace_and_plan_go_and_its_projection_is_named(tmp_path, caplog):
    import json
    import logging

    from te_gemm_callback.analysis.plan import YAML_MARKER
    from te_gemm_callback.cli import main

    run = cpu_run(tmp_path)
    (run / "trace.json").write_text(json.dumps({"schema": "te-gemm-trace/1", "traceEvents": []}))
    (run / "precision_plan.json").write_text(json.dumps({"schema": "te-gemm-plan/1"}))
    (run / "precision_plan_nvdlfw.yaml").write_text(YAML_MARKER + "\n")
    (run / "projection-B300.json").write_text(json.dumps({"schema": "te-gemm-projection/1"}))
    with caplog.at_level(logging.WARNING, logger="te_gemm_callback"):
        assert main(["report", str(run)]) == 0
    assert not any((run / n).exists() for n in ("trace.json", "precision_plan.json", "precision_plan_nvdlfw.yaml"))
    assert (run / "projection-B300.json").exists()
    assert any("projection-B300.json" in r.getMessage() and "made before this report" in r.getMessage()
               for r in caplog.records)
    # A file of the user's under one of those names is theirs: left as it is.
    (run / "trace.json").write_text('{"traceEvents": []}')
    assert main(["report", str(run)]) == 0
    assert (run / "trace.json").read_text() == '{"traceEvents": []}'


def test_inside_fit_a_locked_cache_is_not_waited_for(tmp_path, monkeypatch):
    """Another process holding the shared cache's lock stalled the step after the capture window
    for 60 s (the in-fit bench waited for it). Inside fit() the cache is tried once: the cells are
    not kept, the job goes on at once, and the reason is given."""
    import time
    from types import SimpleNamespace

    from filelock import FileLock

    from te_gemm_callback.microbench.cache import ResultCache
    from te_gemm_callback.reporting import run as run_folder
    from te_gemm_callback.schedule.publish import Publishing

    path = tmp_path / "bench.json"
    seen = {}
    monkeypatch.setattr(run_folder, "bench_and_report", lambda *a, **kw: seen.update(kw) or {})
    from te_gemm_callback.reporting.config import ReportConfig

    Publishing._bench_and_report(SimpleNamespace(report_config=ReportConfig(output_dir=tmp_path),
                                                 path=tmp_path / "c.json"))
    cache = seen["cache"]
    assert cache.lock_timeout_s == 0
    cache.path = path
    cache.data["peaks"]["dev"] = {"bf16": 1.0}
    cache._new_modules["k"] = {"host_fwd_us": 1.0}
    with FileLock(f"{path}.lock"):  # another process's bench, saving
        t0 = time.perf_counter()
        err = cache.save()
        waited = time.perf_counter() - t0
    assert waited < 5.0, waited
    assert err and "held by another process" in err and not path.exists()
    assert ResultCache(path).save() is None  # outside fit() (te-gemm bench) it waits and saves as before


class ManualJob(Job):
    """Lightning's manual optimization: training_step steps its optimizer and scheduler itself."""

    def __init__(self):
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, i):
        opt, sch = self.optimizers(), self.lr_schedulers()
        opt.zero_grad()
        loss = super().training_step(batch, i)
        self.manual_backward(loss)
        opt.step()
        sch.step()
        return loss.detach()

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=1e-2)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, 3)]


def test_a_manual_optimization_job_gets_no_sweep_and_trains_as_without_it(tmp_path, caplog, monkeypatch):
    """The sweep ran a manual-optimization module's training_step, which stepped Adam and the
    scheduler once more (step 11 against 10): weights and logged losses differed from the fit
    without the callback. Such a module gets no sweep, said in one line."""
    import logging

    monkeypatch.setattr(sys.modules[__name__], "Job", ManualJob)
    plain = fit(tmp_path / "a", [])
    cb = GemmProfilerCallback(wait=1, warmup=1, active=4, output_dir=str(tmp_path / "te"), sweep=["BF16"],
                              sweep_steps=2, sweep_rounds=2, sweep_budget_s=0, verbose=False, report=False)
    with caplog.at_level(logging.WARNING, logger="te_gemm_callback"):
        swept = fit(tmp_path / "b", [cb])
    assert [r.getMessage() for r in caplog.records if "manual-optimization" in r.getMessage()]
    assert swept.calls == plain.calls and swept.epoch_means == plain.epoch_means and swept.draws == plain.draws
    for (n, p), q in zip(plain.named_parameters(), swept.parameters()):
        assert torch.equal(p, q), n


class Tracker:
    """A metrics helper of the job's own, held on the module."""

    def __init__(self):
        self.n = 0
        self.history = []


class NestedJob(Job):
    """State one level deeper than training_step_outputs: a list inside a dict, a deque, a helper
    object's counter and list, a running-sum tensor updated in place; and a learnable temperature
    the optimizer steps that is not one of the module's parameters."""

    def __init__(self, temperature):
        super().__init__()
        import collections

        self.nested = {"hist": []}
        self.recent = collections.deque(maxlen=100)
        self.tracker = Tracker()
        self.tsum = torch.zeros(())
        self.temperature = [temperature]  # in a list: not registered as the module's parameter

    def training_step(self, batch, i):
        loss = super().training_step(batch, i) * self.temperature[0]
        self.nested["hist"].append(float(loss))
        self.recent.append(float(loss))
        self.tracker.n += 1
        self.tracker.history.append(float(loss))
        self.tsum += loss.detach()
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW([*self.parameters(), self.temperature[0]], lr=1e-2)


def test_nested_state_and_parameters_outside_the_module_are_put_back(tmp_path):
    """A hostile probe's findings: only the top level of a module's containers was put back (a list
    inside a dict kept the sweep's 6 losses, so did a deque, a helper's counter and an in-place
    tensor sum), and a parameter the optimizer steps outside the module kept the sweep's updates."""
    def run(folder, callbacks):
        torch.manual_seed(0)
        np.random.seed(0)
        random.seed(0)
        job = NestedJob(nn.Parameter(torch.ones(())))
        data = [torch.randn(8, 16, generator=torch.Generator().manual_seed(i)) for i in range(8)]
        pl.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks,
                   default_root_dir=str(folder)).fit(job, torch.utils.data.DataLoader(data, batch_size=None))
        return job

    plain = run(tmp_path / "a", [])
    cb = GemmProfilerCallback(wait=1, warmup=1, active=4, output_dir=str(tmp_path / "te"), sweep=["BF16"],
                              sweep_steps=2, sweep_rounds=2, sweep_budget_s=0, verbose=False, report=False)
    swept = run(tmp_path / "b", [cb])
    assert (tmp_path / "te" / "sweep").is_dir()
    assert swept.nested == plain.nested and len(plain.nested["hist"]) == 16
    assert list(swept.recent) == list(plain.recent)
    assert (swept.tracker.n, swept.tracker.history) == (plain.tracker.n, plain.tracker.history)
    assert torch.equal(swept.tsum, plain.tsum)
    assert torch.equal(swept.temperature[0], plain.temperature[0])
    for (n, p), q in zip(plain.named_parameters(), swept.parameters()):
        assert torch.equal(p, q), n


class DirectLoggingJob(Job):
    def training_step(self, batch, i):
        loss = super().training_step(batch, i)
        self.logger.log_metrics({"direct": float(loss)}, step=self.global_step)
        return loss


def test_a_training_step_that_logs_straight_to_the_logger_logs_only_the_jobs_steps(tmp_path):
    """self.logger.log_metrics(...) inside training_step wrote the sweep's 6 steps into the job's
    metrics file (27 rows where the fit has 21); self.log was already quiet in sweep steps."""
    import csv

    def run(folder, callbacks):
        torch.manual_seed(0)
        np.random.seed(0)
        random.seed(0)
        data = [torch.randn(8, 16, generator=torch.Generator().manual_seed(i)) for i in range(8)]
        logger = pl.loggers.CSVLogger(str(folder), name="job", version=0)
        tr = pl.Trainer(max_epochs=2, accelerator="cpu", logger=logger, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks,
                        log_every_n_steps=1, default_root_dir=str(folder))
        tr.fit(DirectLoggingJob(), torch.utils.data.DataLoader(data, batch_size=None))
        with open(folder / "job" / "version_0" / "metrics.csv") as f:
            return [r["direct"] for r in csv.DictReader(f) if r.get("direct")]

    plain = run(tmp_path / "a", [])
    cb = GemmProfilerCallback(wait=1, warmup=1, active=4, output_dir=str(tmp_path / "te"), sweep=["BF16"],
                              sweep_steps=2, sweep_rounds=2, sweep_budget_s=0, verbose=False, report=False)
    assert run(tmp_path / "b", [cb]) == plain and len(plain) == 16


def test_a_sweep_given_another_model_than_its_optimizer_steps_is_refused(tmp_path, caplog):
    """SweepJob(nn.Linear(3, 3), loss_of_the_real_model, [opt_of_the_real_model]) ran: the real
    model's weights changed, and nothing could put them back."""
    from te_gemm_callback.sweep.engine import run_sweep

    real, other = nn.Linear(4, 4), nn.Linear(3, 3)
    opt = torch.optim.SGD(real.parameters(), lr=0.1)
    before = [p.detach().clone() for p in real.parameters()]
    x = torch.randn(2, 4)
    with pytest.raises(ValueError, match="steps none of the given model's parameters"):
        run_sweep(other, lambda: real(x).square().mean(), ["BF16"], optimizers=[opt], profile_kernels=False,
                  rounds=0, budget_s=0)
    assert all(torch.equal(a, b) for a, b in zip(before, real.parameters()))


def test_an_optimizer_stepped_inside_backward_and_not_given_refuses_the_sweep(caplog):
    """The optimizer-in-backward pattern (one optimizer per parameter, stepped by a hook after its
    gradient): given no optimizer, the sweep's backward passes would step them all and nothing could
    put their state back; given them, it runs and puts everything back."""
    import logging

    from te_gemm_callback.sweep.engine import run_sweep

    torch.manual_seed(0)
    model, x = nn.Linear(4, 4), torch.randn(2, 4)
    opts = {p: torch.optim.AdamW([p], lr=0.1) for p in model.parameters()}

    def step_in_backward(p):
        opts[p].step()
        opts[p].zero_grad()

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(step_in_backward)
    weights = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError, match=r"2 parameter\(s\) \(weight, bias\) run a hook after their gradient"):
        run_sweep(model, lambda: model(x).square().mean(), ["BF16"], optimizers=[], profile_kernels=False,
                  rounds=0, budget_s=0)
    assert all(not o.state for o in opts.values())  # nothing stepped
    run_sweep(model, lambda: model(x).square().mean(), ["BF16"], optimizers=list(opts.values()),
              profile_kernels=False, rounds=0, budget_s=0, steps=2)
    assert all(torch.equal(a, b) for a, b in zip(weights, model.parameters()))
    assert all(not o.state for o in opts.values())  # the state the sweep created is dropped again
    # An optimizer's step hook (an EMA of the weights) runs in the sweep's steps: said before it runs.
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt.register_step_post_hook(lambda *a: None)
    with caplog.at_level(logging.WARNING, logger="te_gemm_callback"):
        run_sweep(nn.Linear(4, 4), lambda: model(x).sum(), ["BF16"], optimizers=[], profile_kernels=False,
                  rounds=0, budget_s=0, steps=2)
        assert not any("step hook" in r.getMessage() for r in caplog.records)
        model2 = nn.Linear(4, 4)
        opt2 = torch.optim.SGD(model2.parameters(), lr=0.1)
        opt2.register_step_post_hook(lambda *a: None)
        run_sweep(model2, lambda: model2(x).square().mean(), ["BF16"], optimizers=[opt2], profile_kernels=False,
                  rounds=0, budget_s=0, steps=2)
    assert any("run 1 step hook(s)" in r.getMessage() for r in caplog.records)


def test_a_training_step_that_changes_its_batch_in_place_leaves_the_dataset_as_without_the_sweep(tmp_path):
    """The sweep ran training_step on the job's own batch: a step that scales its batch in place, a
    view into a pre-batched dataset, scaled the dataset again at every sweep step."""
    from torch.utils.data import DataLoader, Dataset

    class Views(Dataset):
        def __init__(self):
            self.x = torch.randn(6, 8, 16, generator=torch.Generator().manual_seed(1))

        def __len__(self):
            return 6

        def __getitem__(self, i):
            return self.x[i]

    class InPlace(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Linear(16, 4)

        def training_step(self, x, i):
            x.mul_(0.9)
            return self.net(x).square().mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    def run(callbacks):
        torch.manual_seed(0)
        data, module = Views(), InPlace()
        pl.Trainer(max_steps=12, accelerator="cpu", logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False,
                   callbacks=callbacks).fit(module, DataLoader(data, batch_size=None))
        return data.x, [p.detach().clone() for p in module.parameters()]

    plain = run([])
    swept = run([GemmProfilerCallback(wait=1, warmup=1, active=2, output_dir=tmp_path, sweep=["BF16"], sweep_rounds=1,
                                      report=False, verbose=False)])
    assert torch.equal(plain[0], swept[0])
    assert all(torch.equal(p, q) for p, q in zip(plain[1], swept[1]))
