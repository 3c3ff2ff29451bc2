"""The Lightning adapter on Lightning's own demo Transformer and on the bundled demo model."""

import logging

import pytest
import pytorch_lightning as pl
import torch
from helpers.lightning import DemoTransformer, FakeKernelProfile
from torch.utils.data import DataLoader

from te_gemm_callback import GemmCapture, GemmProfilerCallback
from te_gemm_callback.recipes.demo import DemoConfig, DemoLM, RandomTokens


def hooks_left(model):
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def fit(tmp_path, model, accumulate=1, max_steps=6, **cb):
    callback = GemmProfilerCallback(output_dir=tmp_path / "gemm", verbose=False, **cb)
    trainer = pl.Trainer(max_steps=max_steps, accumulate_grad_batches=accumulate, accelerator="cpu",
                         callbacks=[callback],
                         logger=pl.loggers.CSVLogger(tmp_path, name="log"), enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         limit_val_batches=2, val_check_interval=2, num_sanity_val_steps=0)
    trainer.fit(model)
    return trainer, callback


def test_fit_writes_capture_and_leaves_no_hooks(tmp_path):
    model = DemoTransformer()
    trainer, cb = fit(tmp_path, model, wait=1, warmup=1, active=3)
    cap = GemmCapture.load(tmp_path / "gemm" / "gemm_capture.json")
    assert len(cap.steps) == 3 and cap.meta["accumulate_grad_batches"] == 1
    mods = {r.module for r in cap.records}
    assert "model.decoder" in mods and "model.transformer.encoder.layers.0.linear1" in mods
    # Validation ran inside the active window (val_check_interval=2) but is not captured:
    # every GEMM ran exactly once per step, fprop + dgrad + wgrad for the decoder.
    dec = {r.op: r.calls_per_step for r in cap.records if r.module == "model.decoder"}
    assert dec == {"fprop": 1, "dgrad": 1, "wgrad": 1}
    assert hooks_left(model) == 0
    metrics = (tmp_path / "log" / "version_0" / "metrics.csv").read_text()
    assert "te_gemm/gemm_tflop_per_step" in metrics


def test_gradient_accumulation_counts_optimizer_steps(tmp_path):
    _, cb1 = fit(tmp_path / "a", DemoTransformer(), accumulate=1, max_steps=4, wait=0, warmup=1, active=2)
    _, cb2 = fit(tmp_path / "b", DemoTransformer(), accumulate=2, max_steps=4, wait=0, warmup=1, active=2)
    c1, c2 = cb1.capture, cb2.capture
    assert [s.micro_batches for s in c2.steps] == [2, 2]
    assert c2.flops_per_step == 2 * c1.flops_per_step
    r1 = {(r.module, r.op): r.calls_per_step for r in c1.records}
    r2 = {(r.module, r.op): r.calls_per_step for r in c2.records}
    assert r2 == {k: 2 * v for k, v in r1.items()}


def test_state_survives_checkpoint_resume(tmp_path):
    sched = dict(wait=1, warmup=1, active=2)
    trainer, cb = fit(tmp_path / "a", DemoTransformer(), max_steps=2, **sched)
    assert cb.steps_seen == 2 and cb.capture is None  # stopped before the active steps
    trainer.save_checkpoint(tmp_path / "mid.ckpt")
    # The same output: the callback's state in the checkpoint is keyed by the file it writes.
    callback = GemmProfilerCallback(output_dir=tmp_path / "a" / "gemm", verbose=False, **sched)
    trainer = pl.Trainer(max_steps=5, accelerator="cpu", callbacks=[callback], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, limit_val_batches=0)
    trainer.fit(DemoTransformer(), ckpt_path=tmp_path / "mid.ckpt")
    # The count continued where it stopped; the new process warmed up again (step 3) before its
    # active steps 4 and 5: its first step pays TE and cuBLAS initialisation.
    assert callback.steps_seen == 5 and callback.done
    assert len(callback.capture.steps) == 2


def test_bundled_demo_model_under_lightning(tmp_path):
    c = DemoConfig(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
                   num_hidden_layers=2, vocab_size=64, sequence_length=16, micro_batch_size=2)
    model = DemoLM(c)
    cb = GemmProfilerCallback(wait=0, warmup=1, active=2, output_dir=tmp_path, verbose=False)
    trainer = pl.Trainer(max_steps=3, accelerator="cpu", callbacks=[cb], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, DataLoader(RandomTokens(c, 6), batch_size=2))
    by = {(r.module, r.op): r for r in cb.capture.records}
    assert (by[("blocks.0.qkv", "fprop")].m, by[("blocks.0.qkv", "fprop")].n) == (2 * 16, (4 + 2 * 2) * 8)
    assert by[("blocks.0.fc1", "fprop")].n == 96 and by[("lm_head", "wgrad")].shape.mkn == "32x32x64"
    assert by[("blocks.0.qkv", "fprop")].precision == "bf16"  # autocast's bf16 copies of the weights
    assert by[("blocks.0.qkv", "dgrad")].op == "dgrad"
    # Every step saw the same GEMMs: autocast's weight copies are freed and their memory reused,
    # which must not turn a later activation into a "weight" (it once made wgrads look like dgrads).
    assert all(r.calls_per_step == 1 for r in cb.capture.records)
    assert len(by) == len(cb.capture.records)


def test_invalid_schedule():
    with pytest.raises(ValueError, match="active"):
        GemmProfilerCallback(active=0)
    with pytest.raises(ValueError, match="wait"):
        GemmProfilerCallback(wait=-1)


def test_sweep_leaves_training_state_unchanged(tmp_path):
    """Two identical fits, one with a recipe sweep after the active steps: same weights, same
    optimizer state, same loss curve afterwards. On CPU only BF16 runs; the FP8 recipes are
    skipped with their reason."""
    c = DemoConfig(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
                   num_hidden_layers=1, vocab_size=64, sequence_length=16, micro_batch_size=2)

    def fit_once(sweep):
        torch.manual_seed(0)
        model = DemoLM(c)
        cb = GemmProfilerCallback(wait=0, warmup=0, active=2, output_dir=tmp_path / str(bool(sweep)),
                                  verbose=False, sweep=sweep, sweep_steps=2)
        trainer = pl.Trainer(max_steps=4, accelerator="cpu", callbacks=[cb], logger=False,
                             enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
        torch.manual_seed(1)
        trainer.fit(model, DataLoader(RandomTokens(c, 8), batch_size=2, shuffle=True))
        opt = trainer.optimizers[0].state_dict()["state"]
        return model, cb, opt

    plain, _, opt_a = fit_once(None)
    swept, cb, opt_b = fit_once(["BF16", "DelayedScaling"])
    for (n, a), (_, b) in zip(plain.state_dict().items(), swept.state_dict().items()):
        assert torch.equal(a, b), n
    for k in opt_a:
        assert torch.equal(opt_a[k]["exp_avg"], opt_b[k]["exp_avg"])
    res = cb.sweep_result
    assert set(res.captures) == {"BF16"} and "DelayedScaling" in res.skipped
    sweep_cap = GemmCapture.load(tmp_path / "True" / "sweep" / "BF16" / "gemm_capture.json")
    # One instrumented step for shapes, then sweep_steps clean ones that time the recipe.
    assert sweep_cap.meta["sweep"] and [s.kind for s in sweep_cap.steps] == ["instrumented", "clean", "clean"]
    assert {r.op for r in sweep_cap.records} == {"fprop", "dgrad", "wgrad"}


class _AmaxLinear(torch.nn.Linear):
    """Stands in for a TE module (TE cannot run on CPU): forward updates an amax history kept as
    module extra state, and set_extra_state refuses pickled state unless
    NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE=1, as TE 2.20 does for DelayedScaling metadata."""

    def __init__(self):
        super().__init__(8, 8)
        self.amax_history = [0.0]

    def forward(self, x):
        self.amax_history.append(float(x.abs().max()))
        return super().forward(x)

    def get_extra_state(self):
        return {"amax_history": list(self.amax_history)}

    def set_extra_state(self, state):
        import os

        if os.environ.get("NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE") != "1":
            raise RuntimeError("Refusing to load pickled Transformer Engine extra state")
        self.amax_history = list(state["amax_history"])


def test_sweep_restores_module_extra_state_and_weights_bitwise():
    from te_gemm_callback.sweep.engine import run_sweep

    torch.manual_seed(0)
    model = torch.nn.Sequential(_AmaxLinear(), torch.nn.ReLU(), _AmaxLinear())
    x = torch.randn(4, 8)
    before = {k: v.clone() for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}
    model(x).sum().backward()  # a gradient the job has accumulated: must survive the sweep
    grads = [p.grad.clone() for p in model.parameters()]
    hist = [list(m.amax_history) for m in model if isinstance(m, _AmaxLinear)]
    res = run_sweep(model, lambda: model(x).square().sum(), ["BF16"], steps=2, profile_kernels=False)
    assert "BF16" in res.captures
    assert [m.amax_history for m in model if isinstance(m, _AmaxLinear)] == hist
    for k, v in before.items():
        assert torch.equal(model.state_dict()[k], v), k
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads))
    import os

    assert "NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE" not in os.environ  # put back as it was


def test_sweep_order():
    from te_gemm_callback.sweep.engine import sweep_order

    assert sweep_order(["Float8CurrentScaling", "DelayedScaling", "BF16", "fp8_block"]) == \
        ["BF16", "DelayedScaling", "Float8CurrentScaling", "Float8BlockScaling"]


def test_kernel_steps_fit_the_active_window():
    # What a window of each length holds after its instrumented step: the kernels step first,
    # then a clean step, then the settle step, then the warm-up (the one that only moves a clock).
    from te_gemm_callback.schedule import kernel_steps

    got = {n: kernel_steps(True, n, 1) for n in range(1, 7)}
    assert got[1] == {"kernel_steps": 0}
    assert got[2] == {"kernel_steps": 1, "settle_steps": 0, "kernel_warmup_steps": 0}  # kernels only
    assert got[3] == {"kernel_steps": 1, "settle_steps": 0, "kernel_warmup_steps": 0}  # + a clean step
    assert got[4] == {"kernel_steps": 1, "settle_steps": 1, "kernel_warmup_steps": 0}
    assert got[5] == got[6] == {"kernel_steps": 1, "settle_steps": 1, "kernel_warmup_steps": 1}
    assert kernel_steps(False, 6, 1) == {"kernel_steps": 0}


@pytest.mark.parametrize("active, max_steps", [(5, 9), (4, 8), (5, 5)])
def test_active_steps_are_instrumented_then_kernels_then_clean(tmp_path, active, max_steps, caplog):
    # wait 1, warmup 1, active 5: step 3 instrumented, 4 kernels warm-up, 5 kernels, 6 settle
    # (untimed, after the records' sync), 7 clean, then written. A window of 4 drops the warm-up,
    # not the settle step. With max_steps=5 training ends inside the window: what was captured is
    # written, with a warning.
    cb = FakeKernelProfile(wait=1, warmup=1, active=active, output_dir=tmp_path / "gemm", verbose=False)
    trainer = pl.Trainer(max_steps=max_steps, accelerator="cpu", callbacks=[cb], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         limit_val_batches=0)
    with caplog.at_level(logging.WARNING, logger="te_gemm_callback"):
        trainer.fit(DemoTransformer())
    cap = GemmCapture.load(tmp_path / "gemm" / "gemm_capture.json")
    assert cb.done and [r.started for r in cb.recorders] == [1]
    assert "kernel_breakdown_ms" in cap.meta
    if max_steps > 5:
        warm = ["kernels-warmup"] if active == 5 else []
        assert [s.kind for s in cap.steps] == ["instrumented", *warm, "kernels", "settle", "clean"]
        assert cap.meta["global_step_end"] == 2 + active and cap.step_ms() == cap.steps[-1].wall_ms
    else:
        assert [s.kind for s in cap.steps] == ["instrumented", "kernels-warmup", "kernels"]
        assert any("3 of 5 active step(s) captured" in r.message for r in caplog.records)


def test_a_fit_resumed_after_the_capture_says_why_it_captures_nothing(tmp_path, caplog):
    """Resuming into the same output_dir skipped the capture without a word."""
    import logging

    sched = dict(wait=0, warmup=1, active=2)
    trainer, cb = fit(tmp_path / "a", DemoTransformer(), max_steps=4, **sched)
    assert cb.done and cb.capture is not None
    trainer.save_checkpoint(tmp_path / "end.ckpt")
    callback = GemmProfilerCallback(output_dir=tmp_path / "a" / "gemm", verbose=False, **sched)
    trainer = pl.Trainer(max_steps=6, accelerator="cpu", callbacks=[callback], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, limit_val_batches=0)
    with caplog.at_level(logging.INFO, logger="te_gemm_callback"):
        trainer.fit(DemoTransformer(), ckpt_path=tmp_path / "end.ckpt")
    said = [r.getMessage() for r in caplog.records if "after the capture window (steps 2-3)" in r.getMessage()]
    assert len(said) == 1 and "nothing is captured again" in said[0] and "gemm_capture.json" in said[0], said
    assert callback.capture is None
