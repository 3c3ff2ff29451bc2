import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.procs import ddp_env

from te_gemm_callback import GemmCapture

pytestmark = pytest.mark.multiprocess  # DDP ranks / spawned workers


@pytest.mark.parametrize("world", [2, 3])  # 3: an odd world size, nothing assumes pairs of ranks
def test_ddp_ranks_gathered_and_no_hang_when_one_capture_fails(tmp_path, world):
    job = Path(__file__).resolve().parents[1] / "ddp_job.py"
    env = ddp_env()
    # Lightning's "ddp" launcher re-runs this script for ranks 1..; a hang fails the timeout.
    proc = subprocess.run([sys.executable, str(job), str(tmp_path), str(world)], capture_output=True, text=True,
                          timeout=240, env=env, cwd=job.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rank 0 done" in proc.stdout
    ranks = [GemmCapture.load(tmp_path / "ranks" / f"rank{r}.json") for r in range(world)]
    assert [c.meta["rank"] for c in ranks] == list(range(world)) and ranks[0].meta["world_size"] == world
    assert all(c.records and c.coverage["error"] is None for i, c in enumerate(ranks) if i != 1)
    assert ranks[1].coverage["error"] == "RuntimeError: injected on rank 1"
    # Every rank gathered at the same step, after its (stand-in) kernels step.
    assert all("kernel_breakdown_ms" in c.meta and c.meta["global_step_end"] == 3 for c in ranks)
    assert all([s.kind for s in c.steps] == ["instrumented", "kernels"] for c in ranks)
    summary = json.loads((tmp_path / "ranks" / "summary.json").read_text())["ranks"]
    assert [r["rank"] for r in summary] == list(range(world)) and summary[1]["error"]
    assert GemmCapture.load(tmp_path / "gemm_capture.json").meta["rank"] == 0


@pytest.mark.parametrize("world, experts", [(2, 4), (8, 8)])
def test_moe_recipe_expert_parallel(tmp_path, world, experts):
    """The MoE recipe under Lightning DDP with its experts split over the ranks (gloo, CPU): each
    rank's capture holds its own experts (2 of 4 on 2 ranks; 1 of 8 on 8 ranks, the EP=8 layout of
    the Mixtral-like run); together they account for every routed row, and rank 0 gathers all."""
    recipe = Path(__file__).resolve().parents[2] / "recipes" / "moe.py"
    env = ddp_env()
    proc = subprocess.run([sys.executable, str(recipe), "--tiny", "--steps", "5", "--sweep", "BF16", "--no-bench",
                           "--devices", str(world), "--experts", str(experts), "--expert-parallel", "--no-te",
                           "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=480, env=env, cwd=recipe.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [GemmCapture.load(tmp_path / "ranks" / f"rank{r}.json") for r in range(world)]
    rows = []
    for c in ranks:
        fc1 = [r for r in c.records if r.kernel == "aten._grouped_mm" and r.op == "fprop" and r.n == 2 * 48]
        assert fc1 and all(len(s) == experts // world for r in fc1 for s in r.m_splits)  # local experts
        rows.append([sum(s) for r in fc1 for s in r.m_splits])
    # Per step, all ranks' experts together received all rows: ranks x 32 tokens x top-2.
    assert [sum(step) for step in zip(*rows)] == [world * 32 * 2] * len(rows[0])
    summary = json.loads((tmp_path / "ranks" / "summary.json").read_text())["ranks"]
    assert [r["rank"] for r in summary] == list(range(world))


def test_fsdp2_model_parallel_strategy_two_ranks(tmp_path):
    """FSDP2 (fully_shard) under Lightning's ModelParallelStrategy, 2 ranks on CPU: parameters are
    sharded between steps, yet each rank's capture holds the full layer shapes, the same as an
    unsharded model's, and rank 0 gathers both."""
    job = Path(__file__).resolve().parents[1] / "fsdp_job.py"
    env = ddp_env()
    proc = subprocess.run([sys.executable, str(job), str(tmp_path)], capture_output=True, text=True,
                          timeout=240, env=env, cwd=job.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [GemmCapture.load(tmp_path / "ranks" / f"rank{r}.json") for r in (0, 1)]
    shapes = [{(r.module, r.op, r.m, r.k, r.n) for r in c.records} for c in ranks]
    assert shapes[0] == shapes[1]
    lin1 = {(r.op, r.m, r.k, r.n) for r in ranks[0].records if r.module == "model.transformer.encoder.layers.0.linear1"}
    # DemoTransformer: d_model 32, feed-forward 48, 2 x 24 tokens per rank: unsharded 32 -> 48.
    assert lin1 == {("fprop", 48, 32, 48), ("dgrad", 48, 48, 32), ("wgrad", 32, 48, 48)}


def test_report_renders_the_gathered_ranks(tmp_path):
    """`te-gemm report` on a multi-rank run folder: the per-rank table and ranks.png, recomputed
    from ranks/rank<N>.json (the captures of tests/ddp_job.py's shape, written by hand here)."""
    import shutil

    from te_gemm_callback.capture.capture_file import GemmRecord, StepTime
    from te_gemm_callback.reporting.run import render_run

    def cap(rank, step, gemm, comm):
        rec = GemmRecord(module="fc", gemm="", op="fprop", m=64, k=32, n=16, batch=1, precision="bf16",
                         operands=[], source="torch", kernel="aten.mm", recompute=False, module_type="Linear",
                         calls=2, calls_per_step=1.0, flops=2 * 64 * 32 * 16, times_ms=[gemm, gemm])
        c = GemmCapture([rec], [StepTime(i, wall_ms=step, gpu_ms=step, gemm_ms=gemm) for i in range(2)],
                        {"device": "test", "rank": rank, "world_size": 2, "comm_ms": comm, "comm_exposed_ms": comm / 2,
                         "kernel_breakdown_window": "the step after the active ones"})
        return c

    caps = [cap(0, 10.0, 4.0, 2.0), cap(1, 12.0, 5.0, 1.0)]
    caps[0].save(tmp_path / "gemm_capture.json")
    for c in caps:
        c.save(tmp_path / "ranks" / f"rank{c.meta['rank']}.json")
    from te_gemm_callback.reporting.console import console

    con = console()
    with con.capture() as out:
        files = render_run(tmp_path, con)
    text = out.get()
    assert files["ranks"].stat().st_size > 0
    assert "Per-rank capture" in text and "12.000" in text and "the step after the active ones" in text
    shutil.rmtree(tmp_path / "ranks")
    assert "ranks" not in render_run(tmp_path)


def test_dense_recipe_fsdp2_under_bf16_autocast_matches_one_process(tmp_path):
    """The dense recipe with --strategy fsdp (FSDP2 fully_shard per block, ModelParallelStrategy),
    2 ranks on CPU, in BF16 autocast: dgrad's weight operand is the autocast copy of a parameter
    FSDP2 all-gathered after the capture started. Each rank's records (shape, pass, calls per step)
    must equal a one-process run's; before the fix, square dgrads were taken for wgrads."""
    recipe = Path(__file__).resolve().parents[2] / "recipes" / "dense.py"
    common = ["--tiny", "--steps", "5", "--sweep", "BF16", "--no-bench", "--no-te"]
    env = ddp_env()
    for out, extra in ((tmp_path / "one", []), (tmp_path / "fsdp", ["--devices", "2", "--strategy", "fsdp"])):
        proc = subprocess.run([sys.executable, str(recipe), *common, *extra, "--out", str(out)], capture_output=True,
                              text=True, timeout=240, env=env, cwd=recipe.parent)
        assert proc.returncode == 0, proc.stderr[-3000:]
    key = lambda c: sorted((r.name, r.op, r.m, r.k, r.n, r.calls_per_step) for r in c.records)  # noqa: E731
    one = key(GemmCapture.load(tmp_path / "one" / "gemm_capture.json"))
    assert {r[1] for r in one} == {"fprop", "dgrad", "wgrad"}
    for r in (0, 1):
        assert key(GemmCapture.load(tmp_path / "fsdp" / "ranks" / f"rank{r}.json")) == one


def test_tensor_parallel_strategy_needs_te_layers():
    recipe = Path(__file__).resolve().parents[2] / "recipes" / "dense.py"
    proc = subprocess.run([sys.executable, str(recipe), "--tiny", "--devices", "2", "--strategy", "tp", "--no-te"],
                          capture_output=True, text=True, timeout=120, cwd=recipe.parent)
    assert proc.returncode == 2 and "--strategy tp needs TE layers" in proc.stderr.strip().splitlines()[-1]


def test_a_bench_longer_than_the_groups_timeout_does_not_kill_the_job(tmp_path):
    """Rank 0 benchmarked right after the capture while the other rank trained on to its next
    all-reduce: a bench longer than the process group's timeout (8 s here, 15 s of bench) killed
    the whole job. In a multi-process job the report waits for the end of training."""
    job = Path(__file__).resolve().parents[1] / "ddp_slow_bench_job.py"
    env = ddp_env()
    proc = subprocess.run([sys.executable, str(job), str(tmp_path)], capture_output=True, text=True,
                          timeout=240, env=env, cwd=job.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rank 0 done after 8 steps" in proc.stdout and "rank 1 done after 8 steps" in proc.stdout, proc.stdout
    assert (tmp_path / "bench_ran").read_text() == "0"
    assert "the benchmarks and report run on rank 0 when training ends" in proc.stderr


@pytest.mark.parametrize("mode, failing", [("stop", 1), ("pause", 1), ("start", 1), ("stop", 0)])
def test_ddp_no_hang_when_one_rank_has_no_capture_at_the_window_end(tmp_path, mode, failing):
    """One rank has no capture to send when the window ends (its stop() raised; its capture was
    dropped inside the window's last step; it never started): it still takes part in the gather with
    an empty capture that says so, so no rank is left waiting, and rank 0 writes every rank's (its
    own run folder capture only where its own capture holds steps)."""
    job = Path(__file__).resolve().parents[1] / "ddp_job.py"
    env = ddp_env()
    proc = subprocess.run([sys.executable, str(job), str(tmp_path), "2", mode, str(failing)], capture_output=True,
                          text=True, timeout=240, env=env, cwd=job.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rank 0 done" in proc.stdout and "rank 1 done" in proc.stdout
    assert "RuntimeError: injected" in proc.stderr
    ranks = [GemmCapture.load(tmp_path / "ranks" / f"rank{r}.json") for r in (0, 1)]
    ok, bad = ranks[1 - failing], ranks[failing]
    assert ok.records and ok.steps and ok.coverage["error"] is None
    assert not bad.records and not bad.steps and "failed" in bad.coverage["error"]
    assert [c.meta["global_step_end"] for c in ranks] == [3, 3]  # both at the window's end
    assert (tmp_path / "gemm_capture.json").is_file() == (failing == 1)
