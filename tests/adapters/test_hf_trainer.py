"""The Hugging Face Trainer adapter on a tiny HF Llama, CPU: the same schedule, outputs and sweep as
the Lightning callback, gradient accumulation counted as one step, training left as it was."""

import json
from types import SimpleNamespace

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # the Trainer needs it

from helpers.fakes import profiler_that_cannot_start, start_warnings  # noqa: E402
from helpers.hf import SEQ, Tokens, tiny_llama  # noqa: E402
from helpers.oracles import flop_counter_mm  # noqa: E402

from te_gemm_callback import GemmCapture  # noqa: E402
from te_gemm_callback.adapters.hf import GemmProfilerTrainerCallback  # noqa: E402


def train(tmp_path, callbacks, max_steps=6, **more):
    torch.manual_seed(0)
    model = tiny_llama()
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "hf"), max_steps=max_steps,
                                          per_device_train_batch_size=2, gradient_accumulation_steps=2,
                                          report_to=[], save_strategy="no", logging_steps=1000, use_cpu=True,
                                          disable_tqdm=True, seed=0, **more)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Tokens(64), callbacks=callbacks)
    trainer.train()
    return model


def test_trainer_capture_sweep_and_report(tmp_path):
    cb = GemmProfilerTrainerCallback(wait=1, warmup=1, active=3, output_dir=tmp_path / "te_gemm", verbose=False,
                                     sweep=["BF16"], sweep_steps=2)
    trained = train(tmp_path, [cb])
    cap = GemmCapture.load(tmp_path / "te_gemm" / "gemm_capture.json")
    assert [s.kind for s in cap.steps] == ["instrumented", "clean", "clean"]
    assert all(s.micro_batches == 2 for s in cap.steps) and cap.meta["accumulate_grad_batches"] == 2
    by = {(r.module, r.op): r for r in cap.records}
    q = by[("model.layers.0.self_attn.q_proj", "fprop")]
    assert (q.m, q.k, q.n) == (2 * SEQ, 32, 32) and q.calls_per_step == 2  # two micro-batches per step
    assert {op for (m, op) in by if m == "model.layers.1.mlp.down_proj"} == {"fprop", "dgrad", "wgrad"}
    assert cap.meta["global_step_end"] == 5 and cb.done
    # FLOPs per optimizer step against torch's FlopCounterMode over the same two micro-batches.
    oracle = tiny_llama()
    ids = Tokens(4).ids

    def two_micro_batches():
        for mb in (ids[:2], ids[2:]):
            oracle(input_ids=mb, labels=mb).loss.backward()

    total, _ = flop_counter_mm(two_micro_batches)
    assert cap.flops_per_step == total
    # Nothing of ours is left on the model once the window closed.
    assert not any(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks
                   for m in trained.modules())
    from torch.nn.modules import module as nn_module

    assert not nn_module._global_forward_hooks and not nn_module._global_forward_pre_hooks
    # The sweep ran once training ended; te-gemm report turns the folder into verdicts.
    assert (tmp_path / "te_gemm" / "sweep" / "BF16" / "gemm_capture.json").exists()
    assert "te_gemm/sweep_step_ms/BF16" in cb.metrics and "te_gemm/step_ms" in cb.metrics
    from te_gemm_callback import report

    rr = report(tmp_path / "te_gemm")
    assert rr.report.current_recipe == "BF16" and json.loads(rr.files["report"].read_text())["step_ms"] > 0
    # Training is what it would have been without the callback (the sweep put everything back).
    plain = train(tmp_path / "plain", [])
    for (n, a), (_, b) in zip(trained.state_dict().items(), plain.state_dict().items()):
        assert torch.equal(a, b), n


def test_trainer_window_never_reached_warns(tmp_path, caplog):
    import logging

    cb = GemmProfilerTrainerCallback(wait=4, warmup=1, active=2, output_dir=tmp_path / "te_gemm", verbose=False)
    with caplog.at_level(logging.WARNING, logger="te_gemm_callback"):
        train(tmp_path, [cb], max_steps=3)
    msgs = [r.getMessage() for r in caplog.records if r.name == "te_gemm_callback"]
    assert any("ends before the capture window" in m for m in msgs)
    assert any("training ended after 3 step(s), before the capture window" in m and "nothing was captured" in m
               for m in msgs)
    assert not (tmp_path / "te_gemm" / "gemm_capture.json").exists()


def test_trainer_capture_that_cannot_start_is_reported_once(tmp_path, caplog, monkeypatch):
    import logging

    import te_gemm_callback.schedule as schedule  # the adapters drive the schedule, which builds the profiler

    profiler_that_cannot_start(monkeypatch, schedule)
    cb = GemmProfilerTrainerCallback(wait=1, warmup=1, active=3, output_dir=tmp_path / "te_gemm", verbose=False)
    with caplog.at_level(logging.WARNING, logger="te_gemm_callback"):
        train(tmp_path, [cb], max_steps=6)
    assert len(start_warnings(caplog)) == 1
    assert cb.capture is None and not (tmp_path / "te_gemm" / "gemm_capture.json").exists()


def test_trainer_callback_arguments_checked_at_construction():
    with pytest.raises(ValueError, match="not a string"):
        GemmProfilerTrainerCallback(sweep="BF16")
    with pytest.raises(ValueError, match="active must be"):
        GemmProfilerTrainerCallback(active=0)
    with pytest.raises(ValueError, match="names BF16 more than once: give each recipe once"):
        GemmProfilerTrainerCallback(sweep=["BF16", "Float8CurrentScaling", "bf16"])
    with pytest.raises(TypeError, match=r"GemmProfilerTrainerCallback\(\) takes no 'name'"):
        GemmProfilerTrainerCallback(name="x")


class MaskingCollator:
    """A collator that draws from its own generator (as a masking collator does), which the Trainer's
    loader holds four attributes down (loader, base loader, collate_fn, data collator)."""

    def __init__(self):
        self.generator = torch.Generator().manual_seed(1)

    def __call__(self, rows):
        batch = {k: torch.stack([r[k] for r in rows]) for k in rows[0]}
        keep = torch.rand(batch["labels"].shape, generator=self.generator) > 0.1
        batch["labels"] = torch.where(keep, batch["labels"], -100)
        return batch


def test_trainer_sweep_leaves_the_model_mode_and_the_collators_stream(tmp_path):
    """With a sweep and an evaluation at the last step: the model stays in the eval mode the job left
    it in, the collator's own generator and accelerate's registered loaders are as without the
    callback, and a dangling link under output_dir/runs (an old TensorBoard run) breaks nothing."""
    def run(folder, callbacks):
        torch.manual_seed(0)
        model = tiny_llama()
        collate = MaskingCollator()
        runs = folder / "hf" / "runs" / "old"
        runs.mkdir(parents=True)
        (runs / "events.out.tfevents.1.host").symlink_to(folder / "gone")
        args = transformers.TrainingArguments(output_dir=str(folder / "hf"), max_steps=5, per_device_train_batch_size=2,
                                              report_to=[], save_strategy="no", logging_steps=1000, use_cpu=True,
                                              disable_tqdm=True, seed=0, eval_strategy="steps", eval_steps=5)
        trainer = transformers.Trainer(model=model, args=args, train_dataset=Tokens(32), eval_dataset=Tokens(4),
                                       data_collator=collate, callbacks=callbacks)
        trainer.train()
        grad_state = trainer.accelerator.gradient_state
        return model.training, collate.generator.get_state(), len(grad_state.dataloader_references)

    plain = run(tmp_path / "plain", [])
    cb = GemmProfilerTrainerCallback(wait=1, warmup=1, active=2, output_dir=tmp_path / "te_gemm", verbose=False,
                                     sweep=["BF16"], sweep_steps=2)
    ours = run(tmp_path / "ours", [cb])
    assert cb.sweep_result is not None and not plain[0]  # the sweep ran; the job ended in eval mode
    assert ours[0] == plain[0] and torch.equal(ours[1], plain[1]) and ours[2] == plain[2]


def test_trainer_resumed_from_a_checkpoint_keeps_the_capture(tmp_path, caplog):
    """resume_from_checkpoint: past the window, nothing is captured again and the earlier capture
    stays as written; inside it, the new capture goes beside the earlier one (the Trainer keeps no
    callback state by default, so the window is placed against the job's step)."""
    import logging

    out = tmp_path / "te_gemm"

    def run(max_steps, resume=None):
        torch.manual_seed(0)
        args = transformers.TrainingArguments(output_dir=str(tmp_path / "hf"), max_steps=max_steps,
                                              per_device_train_batch_size=2, report_to=[], save_strategy="steps",
                                              save_steps=2, logging_steps=1000, use_cpu=True, disable_tqdm=True,
                                              seed=0)
        cb = GemmProfilerTrainerCallback(wait=0, warmup=1, active=2, output_dir=out, verbose=False)
        transformers.Trainer(model=tiny_llama(), args=args, train_dataset=Tokens(64),
                             callbacks=[cb]).train(resume_from_checkpoint=resume)
        return cb

    run(4)
    first = (out / "gemm_capture.json").read_bytes()
    assert GemmCapture.load(out / "gemm_capture.json").meta["global_step_end"] == 3
    with caplog.at_level(logging.INFO, logger="te_gemm_callback"):
        cb = run(6, str(tmp_path / "hf" / "checkpoint-4"))
    assert cb.capture is None and (out / "gemm_capture.json").read_bytes() == first
    assert not list(out.glob("gemm_capture.step*.json"))
    assert any("nothing is captured again" in r.getMessage() for r in caplog.records)
    run(6, str(tmp_path / "hf" / "checkpoint-2"))  # inside the window (steps 1-3): captured again, beside
    assert (out / "gemm_capture.json").read_bytes() == first
    assert len(list(out.glob("gemm_capture.step*.json"))) == 1


def test_trainer_with_torch_compile_captures_what_the_compiled_model_runs(tmp_path):
    # The Trainer runs a torch.compile wrapper its callbacks never see; the capture must find it, or the
    # compiled GEMMs land under the whole model and the run is not marked compiled. The eager backend
    # keeps dynamo's frames and wrapper without a C++ build. The sweep times the same compiled code: the
    # uncompiled model its observed column came from before was not the job's.
    def records(where, sweep=None, **more):
        cb = GemmProfilerTrainerCallback(wait=1, warmup=1, active=3, output_dir=where, verbose=False, report=False,
                                         sweep=sweep, sweep_steps=2, sweep_rounds=0)
        train(tmp_path / where.name, [cb], **more)
        cap = GemmCapture.load(where / "gemm_capture.json")
        return cap, sorted((r.module, r.op, r.m, r.k, r.n, r.calls_per_step) for r in cap.records)

    compiled, got = records(tmp_path / "compiled", ["BF16"], torch_compile=True, torch_compile_backend="eager")
    eager, want = records(tmp_path / "eager")
    assert compiled.meta["compiled"] and not eager.meta["compiled"]
    assert got == want and all(module for module, *_ in got)
    swept = GemmCapture.load(tmp_path / "compiled" / "sweep" / "BF16" / "gemm_capture.json")
    assert swept.meta["compiled"] and sorted((r.module, r.op) for r in swept.records) == [g[:2] for g in got]


def test_trainer_with_torch_compile_searches_for_the_wrapper_once(tmp_path, monkeypatch):
    # The search scans the whole heap: where nothing compiled the model it must not run every step.
    import te_gemm_callback.adapters.hf as hf

    calls = []
    monkeypatch.setattr(hf, "compiled_wrapper", lambda model, known=None: calls.append(model))
    cb = GemmProfilerTrainerCallback(wait=100, active=1, output_dir=tmp_path, verbose=False)
    args, model = SimpleNamespace(torch_compile=True), torch.nn.Linear(2, 2)
    for _ in range(3):
        cb.on_step_begin(args, None, None, model=model)
        cb.schedule.step_end(None)
    assert calls == [model]
