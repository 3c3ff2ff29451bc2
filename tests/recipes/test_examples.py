"""Each training recipe's --tiny run on CPU, as an end-to-end test of the tool."""


import pytest
import torch
from helpers import import_example

from te_gemm_callback import GemmCapture


def run(name, tmp_path, *extra):
    mod = import_example(name)
    out = tmp_path / name
    assert mod.main(["--tiny", "--steps", "5", "--sweep", "BF16", "--no-bench", "--out", str(out), *extra]) == 0
    return GemmCapture.load(out / "gemm_capture.json"), out


def by(cap):
    return {(r.module, r.op): r for r in cap.records}


def test_dense_tiny(tmp_path):
    cap, out = run("dense", tmp_path, "--no-te")  # the torch build's module names, also on a TE host
    r = by(cap)
    qkv = r[("blocks.0.qkv", "fprop")]
    assert (qkv.m, qkv.k, qkv.n) == (2 * 32, 64, (4 + 2 * 2) * 16)  # GQA: 4 q heads + 2 x 2 kv heads
    assert r[("blocks.1.fc1", "fprop")].n == 2 * 128  # SwiGLU, gate+up fused
    assert r[("lm_head", "wgrad")].shape.mkn == "64x64x128"
    assert (out / "sweep" / "BF16" / "gemm_capture.json").exists()


def test_moe_tiny_splits_add_up_to_tokens_times_top_k(tmp_path):
    cap, _ = run("moe", tmp_path, "--no-te")
    tokens, top_k = 2 * 16, 2
    grouped = [r for r in cap.records if r.kernel == "aten._grouped_mm"]
    assert {r.op for r in grouped} == {"fprop", "dgrad", "wgrad"}
    for r in grouped:
        assert r.m_splits and all(len(s) == 4 and sum(s) == tokens * top_k for s in r.m_splits)
    # Routing is learned: the splits are not all equal.
    assert any(len(set(s)) > 1 for r in grouped for s in r.m_splits)
    router = by(cap)[("blocks.0.moe.router", "fprop")]
    assert (router.m, router.k, router.n) == (tokens, 32, 4)


def test_moe_fp8_padding_does_not_change_the_output():
    moe_mod = import_example("moe")
    torch.manual_seed(0)
    layer = moe_mod.MoEMLP(16, 24, 4, 2, te_experts=False)
    x = torch.randn(20, 16)
    plain = layer(x)
    layer.recipe = "DelayedScaling"  # FP8: expert rows padded to 16
    padded = layer(x)
    assert all(n % 16 == 0 for n in layer.padded) and sum(layer.routed) == 40
    torch.testing.assert_close(padded, plain)


def test_hf_tiny(tmp_path):
    pytest.importorskip("transformers")
    cap, _ = run("hf", tmp_path)
    r = by(cap)
    assert r[("model.model.layers.0.self_attn.k_proj", "fprop")].n == 2 * 8  # GQA: 2 kv heads x 8
    assert r[("model.model.layers.1.mlp.down_proj", "wgrad")].op == "wgrad"
    assert not cap.coverage["never_ran"]


def test_accelerate_loop_counts_accumulated_micro_batches_as_one_step(tmp_path):
    pytest.importorskip("accelerate")
    pytest.importorskip("transformers")
    mod = import_example("accelerate_loop")
    assert mod.main(["--tiny", "--steps", "4", "--accumulate", "2", "--out", str(tmp_path)]) == 0
    cap = GemmCapture.load(tmp_path / "gemm_capture.json")
    assert [(s.kind, s.micro_batches) for s in cap.steps] == [("instrumented", 2)] + [("clean", 2)] * 3
    q = next(r for r in cap.records if r.module.endswith("layers.0.self_attn.q_proj") and r.op == "fprop")
    assert (q.m, q.calls_per_step) == (2 * 16, 2)  # micro-batch 2 x 16 tokens, two micro-batches a step


@pytest.mark.parametrize("flags, says", [(["--sweep", "Foo"], "unknown precision 'Foo'"),
                                         (["--sweep-plan", "missing.json"], "te-gemm plan RUN_DIR"),
                                         (["--sweep-rounds", "-1"], "sweep_rounds must be an integer >= 0")])
def test_recipe_bad_input_is_one_line(tmp_path, flags, says):
    import subprocess
    import sys
    from pathlib import Path

    recipe = Path(__file__).resolve().parents[2] / "recipes" / "dense.py"
    proc = subprocess.run([sys.executable, str(recipe), "--tiny", "--no-bench", "--out", str(tmp_path), *flags],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and "warn" not in ln.lower()]
    assert proc.returncode == 2 and lines[-1].startswith("error: ") and says in lines[-1], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_job_kinds_compiled_model_captured_like_eager(tmp_path, capsys):
    """recipes/job_kinds.py compile: the compiled MLP's six GEMMs, said to be compiled, and no
    dynamo recompile or new graph while the profiler was attached (aot_eager on CPU)."""
    mod = import_example("job_kinds")
    assert mod.main(["compile", "--steps", "4", "--out", str(tmp_path)]) == 0
    cap = GemmCapture.load(tmp_path / "compile" / "gemm_capture.json")
    assert cap.meta["compiled"] is True
    shapes = sorted((r.module.removeprefix("_orig_mod."), r.op, (r.m, r.k, r.n)) for r in cap.records)
    assert shapes == [("0", "dgrad", (64, 1024, 256)), ("0", "fprop", (64, 256, 1024)), ("0", "wgrad", (256, 64, 1024)),
                      ("2", "dgrad", (64, 256, 1024)), ("2", "fprop", (64, 1024, 256)), ("2", "wgrad", (1024, 64, 256))]
    assert "dynamo counters that grew while profiling: none" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="the one-line refusal is for hosts without a GPU")
@pytest.mark.parametrize("job", ["graphs", "ops"])
def test_job_kinds_without_te_is_one_line(job, capsys):
    mod = import_example("job_kinds")
    with pytest.raises(SystemExit) as e:
        mod.main([job])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs Transformer Engine on a GPU" in err[0], err


@pytest.mark.parametrize("recipe, flags, says", [
    ("dense.py", ["--tiny", "--recipe", "DelayedScaling"], "--recipe DelayedScaling needs TE layers"),
    ("moe.py", ["--tiny", "--recipe", "Float8CurrentScaling"], "--recipe Float8CurrentScaling needs TE layers"),
    ("hf.py", ["--tiny", "--precision", "transformer-engine"], "this run needs transformer-engine on a CUDA host")])
def test_a_recipe_that_needs_te_says_so_in_one_line_here(tmp_path, recipe, flags, says):
    """Without TE (CPU CI): an FP8 recipe or Lightning's TE plugin is refused in one line before
    anything trains, not a traceback after it."""
    import subprocess
    import sys
    from pathlib import Path

    from te_gemm_callback.precisions import te_available

    if te_available()[0] and __import__("torch").cuda.is_available():
        pytest.skip("TE runs here")
    path = Path(__file__).resolve().parents[2] / "recipes" / recipe
    proc = subprocess.run([sys.executable, str(path), "--no-bench", "--out", str(tmp_path / "run"), *flags],
                          capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert proc.returncode == 2 and says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "run" / "gemm_capture.json").exists()
