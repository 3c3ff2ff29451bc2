"""Benchmark engine on the CPU path (torch BF16), caching, skip reasons, CLI and figures."""

import json
import statistics

import pytest
import torch

from te_gemm_callback.cli import main
from te_gemm_callback.microbench import timing
from te_gemm_callback.microbench.cache import ResultCache
from te_gemm_callback.microbench.cells import BenchResult, result_key
from te_gemm_callback.microbench.engine import run_bench
from te_gemm_callback.microbench.items import WorkItem, items_from_capture, items_from_config, items_from_shapes
from te_gemm_callback.microbench.results import BenchResults
from te_gemm_callback.microbench.timing import adaptive_iters, heat_seconds, stats
from te_gemm_callback.reporting.bench_tables import step_ms, swapped_items
from te_gemm_callback.shapes import GemmOp, GemmShape, ModelConfig, gemm_passes

CFG = ["--hidden-size", "64", "--intermediate-size", "128", "--num-attention-heads", "4",
       "--num-hidden-layers", "3", "--micro-batch-size", "2", "--sequence-length", "16"]


def test_items_dedupe_and_sources():
    cfg = ModelConfig(hidden_size=64, intermediate_size=64, num_attention_heads=4, num_hidden_layers=3,
                      micro_batch_size=2, sequence_length=16)
    items = items_from_config(cfg)
    assert [i.name for i in items] == ["qkv", "proj", "fc1", "fc2"] and all(i.count == 3 for i in items)
    # proj, fc1 (I = H) and fc2 share one shape: one job, three work items.
    assert len({i.key for i in items}) == 2
    wgrad = GemmShape(64, 32, 192, GemmOp.WGRAD)
    assert items_from_shapes([wgrad])[0].fprop == GemmShape(32, 64, 192)


def test_cache_key_separates_every_condition(tmp_path):
    s = GemmShape(8, 16, 32, GemmOp.DGRAD)
    base = result_key("H200", "torch 2.11, TE 2.20", s, None, "BF16", "autocast", False)
    variants = [result_key("B200", "torch 2.11, TE 2.20", s, None, "BF16", "autocast", False),
                result_key("H200", "torch 2.11, TE 2.21", s, None, "BF16", "autocast", False),
                result_key("H200", "torch 2.11, TE 2.20", GemmShape(8, 16, 32, GemmOp.WGRAD), None, "BF16", "autocast",
                           False),
                result_key("H200", "torch 2.11, TE 2.20", s, (4, 4), "BF16", "autocast", False),
                result_key("H200", "torch 2.11, TE 2.20", s, None, "DelayedScaling", "autocast", False),
                result_key("H200", "torch 2.11, TE 2.20", s, None, "BF16", "prequantized", False),
                result_key("H200", "torch 2.11, TE 2.20", s, None, "BF16", "autocast", True)]
    assert len({base, *variants}) == 8
    cache = ResultCache(tmp_path / "c.json")
    ok = BenchResult(8, 16, 32, "dgrad", "BF16", "autocast", median_ms=1.0)
    bad = BenchResult(8, 16, 32, "dgrad", "BF16", "autocast", error="OOM")
    cache.put("a", ok)
    cache.put("b", bad)
    cache.save()
    again = ResultCache(tmp_path / "c.json")
    hit = again.get("a")
    assert hit.cached and hit == BenchResult(**{**ok.__dict__, "cached": True})  # says it came from the cache
    assert again.get("b") is None  # failures are re-measured
    # A cache written by an older timing (no version: bursts partly at the boost clock) is dropped.
    stale = json.loads((tmp_path / "c.json").read_text())
    del stale["timing_version"]
    stale["peaks"] = {"H200": {"bf16": 790.0}}
    (tmp_path / "c.json").write_text(json.dumps(stale))
    old = ResultCache(tmp_path / "c.json")
    assert old.get("a") is None and old.data["peaks"] == {}
    old.save()
    assert json.loads((tmp_path / "c.json").read_text()) == stale  # another version's file: never rewritten


cpu_path = pytest.mark.skipif(torch.cuda.is_available(),
                              reason="covers the CPU/torch path; tests/test_gpu.py covers TE")


@cpu_path
def test_cpu_bf16_end_to_end_with_skip_reasons_and_cache(tmp_path):
    items = [WorkItem("a", GemmShape(32, 64, 48), 2.0), WorkItem("moe", GemmShape(24, 16, 32), 1.0, (8, 0, 16))]
    cache = ResultCache(tmp_path / "cache.json")
    res = run_bench(items, ["bf16", "DelayedScaling", "NVFP4BlockScaling"], ["autocast", "prequantized"],
                    cache=cache, progress=False)
    assert res.precisions == ["BF16"]
    assert set(res.skipped) == {"DelayedScaling", "NVFP4BlockScaling"}
    if not torch.cuda.is_available():
        assert all("no CUDA device" in why for why in res.skipped.values())
    assert len(res.results) == 2 * 3 * 2 and all(r.ok for r in res.results)
    r = res.get(GemmShape(32, 48, 64, GemmOp.DGRAD), "BF16", "autocast")
    assert r.median_ms > 0 and r.q1_ms <= r.median_ms <= r.q3_ms and r.conditions["device"]
    assert res.get(GemmShape(16, 24, 32, GemmOp.WGRAD), "BF16", "prequantized", (8, 0, 16)).m_splits == [8, 0, 16]
    assert step_ms(res, items, "BF16", "autocast") > 0
    assert not any(r.cached for r in res.results)
    # A second run is served from the cache: identical numbers, marked cached. A cell that stayed
    # noisy on this host (spread above SPREAD_LIMIT every time) was not cached: its job (one per
    # shape, every pass and mode) is measured again, its quiet cells with it (a loaded 2-core host:
    # a quiet dgrad beside a noisy fprop came back measured, which a per-cell check failed).
    again = run_bench(items, ["BF16"], ["autocast", "prequantized"], cache=ResultCache(tmp_path / "cache.json"),
                      progress=False)
    job_of = lambda r: next(it.fprop.mkn for it in items if r.shape in gemm_passes(it.fprop))  # noqa: E731
    noisy = {job_of(r) for r in res.results if r.noisy}
    for r1, r2 in zip(res.results, again.results):
        assert r2.cached == (job_of(r1) not in noisy) and (job_of(r1) in noisy or r2.median_ms == r1.median_ms)
    back = BenchResults.load(res.save(tmp_path / "r.json"))
    assert back.results == res.results and back.skipped == res.skipped


def test_timing_helpers():
    assert stats([1.0, 2.0, 3.0, 4.0, 100.0])[0] == 3.0
    assert adaptive_iters(100.0) == 7 and adaptive_iters(0.001) == 60 and adaptive_iters(5.0) == 8


def test_heat_before_a_burst_only_on_an_idle_gpu_and_within_bounds(monkeypatch):
    # A timed burst that finds the GPU idle (its boost back) follows dense load: HEAT_PER_BURST
    # times the burst, capped; never shorter than the hold the host needs to queue it. A busy GPU
    # gets the hold only.
    monkeypatch.setattr(timing, "HEAT_PER_BURST", 4.0)
    monkeypatch.setattr(timing, "HEAT_MAX_S", 0.15)
    assert heat_seconds(0.001, idle=True, burst_s=0.01) == pytest.approx(0.04)
    assert heat_seconds(0.001, idle=True, burst_s=1.0) == pytest.approx(0.15)
    assert heat_seconds(0.001, idle=True) == pytest.approx(0.15)  # unknown burst: assume a long one
    assert heat_seconds(0.3, idle=True, burst_s=0.01) == pytest.approx(0.3)
    assert heat_seconds(0.004, idle=False, burst_s=1.0) == pytest.approx(0.004)


@pytest.mark.parametrize("visits", [1, 2, 4])
def test_job_plan_gives_every_cell_at_least_10_samples_over_its_visits(visits):
    # Planned from a FLOP model (no timed trial: a synchronize would idle the GPU): whatever the
    # shape and recipe, the visits together pool at least 10 samples per cell.
    from te_gemm_callback.microbench.jobs import plan_job

    shapes = [GemmShape(15872, 4096, 4096), GemmShape(15872, 16384, 4096), GemmShape(16384, 28672, 8192),
              GemmShape(128, 64, 64), GemmShape(4096, 1024, 2048)]
    for shape in shapes:
        for precision in ("BF16", "Float8CurrentScaling", "NVFP4BlockScaling"):
            plan = plan_job(WorkItem("x", shape), precision, ["autocast", "prequantized"], share=1 / visits)
            assert visits * plan.iters >= 10 and visits * plan.repeats >= 10
    small = plan_job(WorkItem("x", GemmShape(128, 64, 64)), "BF16", ["prequantized"])
    assert small.repeats == 50 and small.timed_s < 1e-3  # tiny GEMMs: the cap, and almost no heat


def test_heater_falls_back_to_smaller_sizes_then_a_spin_when_gpu_memory_is_full(monkeypatch):
    # No CUDA here: the device index and the heater's allocation are stand-ins; what is tested is
    # that a full GPU never makes the microbenchmark crash, and that the user is told what it costs.
    tried = []

    class Full:
        def __init__(self, n):
            tried.append(n)
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(timing, "_Heater", Full)
    monkeypatch.setattr(timing, "_HEATERS", {})
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    with pytest.warns(UserWarning, match="boost clock"):
        h = timing._heater()
    assert tried == [8192, 4096, 2048] and isinstance(h, timing._Spin)
    assert timing._heater() is h  # decided once per device


def test_items_from_capture_cover_attention_bmm_as_batched_gemms():
    from te_gemm_callback import GemmProfiler

    model = torch.nn.MultiheadAttention(16, 2, batch_first=True)
    x = torch.randn(2, 4, 16, requires_grad=True)
    with GemmProfiler(model) as prof:
        model(x, x, x)[0].sum().backward()
    items = items_from_capture(prof.capture)
    # The projections are linear layers; the attention bmm (Q K^T, P V) is timed as the batched
    # GEMM of two activations it is, never dropped, never given a weight gradient.
    linear = [i for i in items if i.fprop.batch == 1]
    batched = [i for i in items if i.fprop.batch > 1]
    assert {i.name for i in linear} == {".in_proj", "out_proj"} and all(i.runs_recipe for i in linear)
    assert len(batched) == 2 and not any(i.weight or i.runs_recipe for i in batched)
    assert all(i.ops == (GemmOp.FPROP, GemmOp.DGRAD_A, GemmOp.DGRAD_B) for i in batched)
    assert {i.fprop.batch for i in batched} == {2 * 2}  # batch x heads


def test_items_from_capture_weigh_each_pass_by_its_own_calls():
    # A layer run twice per step, once under no_grad (its backward runs once), and a layer whose
    # backward alone was captured: each pass counts at the calls the job made of it.
    from te_gemm_callback.capture.capture_file import GemmCapture
    from te_gemm_callback.shapes import gemm_passes

    def record(name, s, calls):
        return {"module": name, "gemm": "", "op": str(s.op), "m": s.m, "k": s.k, "n": s.n, "batch": 1,
                "precision": "bf16", "operands": [], "source": "torch", "kernel": "aten.mm", "recompute": False,
                "module_type": "Linear", "calls": calls, "calls_per_step": float(calls), "flops": s.flops}

    f, d, w = gemm_passes(GemmShape(32, 16, 24))
    cap = GemmCapture.from_dict({"schema": "te-gemm-capture/1", "steps": [{"index": 0, "wall_ms": 5.0}], "records": [
        record("twice", f, 2), record("twice", d, 1), record("twice", w, 1), record("late", w, 3)]})
    twice, late = items_from_capture(cap)
    assert (twice.count, twice.passes) == (2.0, ((GemmOp.FPROP, 1.0), (GemmOp.DGRAD, 0.5), (GemmOp.WGRAD, 0.5)))
    assert (late.fprop, late.count, late.passes) == (f, 3.0, ((GemmOp.WGRAD, 1.0),))
    cells = [BenchResult(s.m, s.k, s.n, str(s.op), "BF16", "autocast", median_ms=ms)
             for s, ms in ((f, 1.0), (d, 10.0), (w, 100.0))]
    res = BenchResults(cells, {}, {"modes": ["autocast"]})
    assert step_ms(res, [twice], "BF16", "autocast") == pytest.approx(2 * 1.0 + 10.0 + 100.0)
    assert step_ms(res, [late], "BF16", "autocast") == pytest.approx(3 * 100.0)


@cpu_path
def test_bench_times_batched_and_weightless_items_as_what_they_are(tmp_path):
    # A bmm item (4 products of 8x16 @ 16x8) without a weight: fprop and its two input gradients,
    # each a batched cell; a first layer whose input needs no gradient: fprop and wgrad, no dgrad.
    bmm = WorkItem("attn", GemmShape(8, 16, 8, batch=4), 2.0, None, False,
                   ((GemmOp.FPROP, 1.0), (GemmOp.DGRAD_A, 1.0), (GemmOp.DGRAD_B, 1.0)))
    first = WorkItem("fc1", GemmShape(32, 16, 24), 1.0, passes=((GemmOp.FPROP, 1.0), (GemmOp.WGRAD, 1.0)))
    res = run_bench([bmm, first], ["BF16"], ["autocast"], cache=ResultCache(tmp_path / "c.json"), progress=False)
    cells = sorted((r.op, r.batch, r.m, r.k, r.n, r.backend) for r in res.results)
    assert cells == [("dgrad_a", 4, 8, 8, 16, "torch"), ("dgrad_b", 4, 16, 8, 8, "torch"),
                     ("fprop", 1, 32, 16, 24, "torch"), ("fprop", 4, 8, 16, 8, "torch"),
                     ("wgrad", 1, 16, 32, 24, "torch")]
    assert all(r.ok for r in res.results)
    # FLOPs of a batched cell count every product.
    fprop = res.get(GemmShape(8, 16, 8, batch=4), "BF16", "autocast")
    assert fprop.tflops == pytest.approx(2 * 4 * 8 * 16 * 8 / (fprop.median_ms * 1e-3) / 1e12)
    total = sum(r.median_ms for r in res.results if r.batch == 4)
    assert step_ms(res, [bmm], "BF16", "autocast") == pytest.approx(2.0 * total)
    back = BenchResults.load(res.save(tmp_path / "r.json"))  # the new passes and batch load back
    assert back.results == res.results


@cpu_path
def test_cli_bench_end_to_end(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TE_GEMM_CACHE", str(tmp_path / "cache.json"))
    fig, js = tmp_path / "fig.png", tmp_path / "r.json"
    assert main(["bench", *CFG, "--precisions", "BF16,Float8BlockScaling", "-o", str(fig), "--json", str(js),
                 "--compare-swapped"]) == 0
    out = capsys.readouterr().out
    assert "Fprop GEMMs" in out and "Wgrad GEMMs" in out and "full step" in out and "swapped" in out
    assert "Float8BlockScaling not run" in out
    assert fig.stat().st_size > 10_000
    data = json.loads(js.read_text())
    assert data["schema"] == "te-gemm-bench/1" and len(data["results"]) == 4 * 3  # 4 shapes x 3 passes


@pytest.mark.parametrize("args,needle,code", [
    (["--shapes", "8x8"], "bad shape", 2),
    (["--shapes", "8x8x8", *CFG], "exactly one", 2),
    (["--hidden-size", "64"], "missing config flags", 2),
    (["--capture", "/nonexistent.json"], "cannot read te-gemm capture /nonexistent.json", 1),  # an input, not usage
    (["--shapes", "8x8x8", "--precisions", "fp9"], "unknown precision", 2),
])
def test_cli_bench_errors(capsys, args, needle, code):
    assert main(["bench", *args]) == code
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1


def test_devices_all_counts_the_visible_gpus_without_torch(monkeypatch, capsys):
    import subprocess

    from te_gemm_callback.microbench import parallel

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,GPU-5c2a")
    assert parallel.local_gpu_count() == 3
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # every GPU hidden: one process, on the CPU
    assert parallel.local_gpu_count() == 1
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    listing = "GPU 0: NVIDIA H200 (UUID: GPU-1)\nGPU 1: NVIDIA H200 (UUID: GPU-2)\n"
    monkeypatch.setattr(parallel.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess([], 0, listing, ""))
    assert parallel.local_gpu_count() == 2

    def missing(*a, **k):
        raise FileNotFoundError("nvidia-smi")

    monkeypatch.setattr(parallel.subprocess, "run", missing)  # no driver tools: a CPU host
    assert parallel.local_gpu_count() == 1
    # `--devices all` on this CPU host: one process, the plain path.
    assert main(["bench", "--shapes", "16x16x16", "--precisions", "BF16", "--devices", "all", "--no-cache"]) == 0
    assert "over 2 devices" not in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:  # argparse's own one-line error
        main(["bench", "--shapes", "8x8x8", "--devices", "some"])
    assert exit_.value.code == 2 and "--devices: expected a positive integer, got 'some'" in capsys.readouterr().err


def test_swapped_items_are_forward_shapes_of_the_backward_passes():
    it = WorkItem("fc1", GemmShape(512, 64, 256))
    d, w = swapped_items([it])
    assert (d.fprop.m, d.fprop.k, d.fprop.n) == (512, 256, 64)
    assert (w.fprop.m, w.fprop.k, w.fprop.n) == (64, 512, 256)


def test_benchmark_script_takes_te_flags(tmp_path, capsys, monkeypatch):
    """scripts/benchmark.py: TE's benchmark_gemm.py flags, run as ``te-gemm bench``."""
    import importlib.util
    import pathlib

    monkeypatch.setenv("TE_GEMM_CACHE", str(tmp_path / "cache.json"))
    path = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "benchmark.py"
    spec = importlib.util.spec_from_file_location("te_flags_benchmark", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    fig = tmp_path / "fig.png"
    argv = mod.translate(["--hidden_size", "64", "--intermediate_size", "128", "--num_attention_heads", "4",
                          "--num_hidden_layers", "2", "--micro_batch_size", "2", "--sequence_length", "16",
                          "--pre-quantize", "--no-fp8", "--no-fp4", "-o", str(fig)])
    assert argv[:3] == ["bench", "--hidden-size", "64"] and "--precisions" in argv
    assert argv[argv.index("--precisions") + 1] == "BF16" and "--pre-quantize" in argv
    assert mod.translate(["--no-fp4"])[-2:] == ["--precisions", "BF16,DelayedScaling,Float8CurrentScaling,"
                                                "Float8BlockScaling,MXFP8BlockScaling"]
    assert mod.te_gemm(argv) == 0 and fig.stat().st_size > 10_000
    out = capsys.readouterr().out
    for section in ("Fprop GEMMs", "Dgrad GEMMs", "Wgrad GEMMs", "full step"):
        assert section in out


@cpu_path
def test_two_visits_pool_samples_and_reverse_the_order(monkeypatch):
    # A CPU job sizes its calls from a timed trial; on a loaded CI host the trial swings 300x (a test
    # failed with 50 vs 5 samples). A fixed host clock makes the sample arithmetic what is tested.
    from te_gemm_callback.microbench import jobs

    monkeypatch.setattr(jobs, "time_cpu", lambda fn, n: [0.01] * n)
    items = [WorkItem("a", GemmShape(32, 64, 48)), WorkItem("b", GemmShape(16, 32, 64))]
    one = run_bench(items, ["BF16"], ["autocast"], progress=False, visits=1)
    two = run_bench(items, ["BF16"], ["autocast"], progress=False, visits=2)
    jobs = [(j["item"], j["visit"]) for j in two.meta["timeline_s"]["jobs"]]
    assert jobs == [("32x64x48", 0), ("16x32x64", 0), ("16x32x64", 1), ("32x64x48", 1)]
    # Each visit takes about half of a cell's samples; pooled, a cell has as many as one visit of all.
    for r1, r2 in zip(one.results, two.results):
        assert (r1.m, r1.k, r1.n, r1.op) == (r2.m, r2.k, r2.n, r2.op) and r2.ok
        assert r2.iters == r1.iters == 50  # one visit of 50 calls, or two of 25


def test_visits_split_evenly_over_devices():
    from te_gemm_callback.microbench.parallel import visit_shares

    assert visit_shares(16, 2) == [8, 8] and visit_shares(16, 3) == [6, 5, 5] and sum(visit_shares(7, 8)) == 7
    assert visit_shares(1, 2) == [1]  # a device without a visit is not used


def test_pooled_cells_are_summarised_over_every_gpus_samples():
    # Two parts of a 2-GPU run measured the same cell; a third cell was cached (no samples) and one
    # failed on device 0 but ran on device 1. Pooling must give the statistics of all samples together.
    from te_gemm_callback.microbench.results import BenchResults, pool_parts

    def res(median, error=None, **kw):
        return BenchResult(64, 32, 16, "fprop", "BF16", "autocast", median_ms=median, tflops=None if error else
                           2 * 64 * 32 * 16 / (median * 1e-3) / 1e12, error=error, **kw)

    a, b = [1.0, 1.2, 1.1], [2.0, 2.2, 2.1]
    cached = BenchResult(8, 8, 8, "fprop", "BF16", "autocast", median_ms=5.0, iters=3)
    failed0 = BenchResult(8, 8, 8, "dgrad", "BF16", "autocast", error="OutOfMemoryError")
    ran1 = BenchResult(8, 8, 8, "dgrad", "BF16", "autocast", median_ms=0.5, tflops=2 * 8 ** 3 / 0.5e-3 / 1e12)
    p0 = BenchResults([res(1.1), cached, failed0], meta={"peaks_tflops": {"bf16": 1.0}},
                      samples={res(1.1).cell: (a, [1500.0])})
    p1 = BenchResults([res(2.1), cached, ran1],
                      samples={res(1.1).cell: (b, [1700.0]), ran1.cell: ([0.5, 0.7], [1600.0])})
    out = pool_parts([p0, p1])
    assert [r.cell for r in out] == [r.cell for r in p0.results]  # device 0's order
    pooled = out[0]
    assert pooled.iters == 6 and pooled.median_ms == pytest.approx(statistics.median(a + b))
    assert pooled.sm_clock_mhz == 1600.0
    assert pooled.tflops == pytest.approx(2 * 64 * 32 * 16 / (pooled.median_ms * 1e-3) / 1e12)
    assert pooled.peak_fraction == pytest.approx(pooled.tflops)
    assert out[1] is cached  # not measured by any part: as it was
    assert out[2].ok and out[2].median_ms == pytest.approx(0.6) and out[2].iters == 2


@pytest.mark.multiprocess
@cpu_path
def test_parallel_bench_same_cells_as_one_process(tmp_path):
    # On CPU the two workers are processes without GPUs: the split of the visits, the workers' own
    # measurements and the pooling are what is tested, not GPU agreement (benchmarks/h200x2.sh).
    from te_gemm_callback.microbench.parallel import run_bench_parallel

    # "moe" is a grouped GEMM: its cell identity carries the m_splits through the workers' JSON.
    items = [WorkItem("a", GemmShape(32, 64, 48)), WorkItem("b", GemmShape(16, 32, 64)),
             WorkItem("c", GemmShape(8, 16, 16)), WorkItem("moe", GemmShape(48, 32, 16), 1.0, (16, 32))]
    one = run_bench(items, ["BF16"], ["prequantized"], progress=False, visits=4)
    two = run_bench_parallel(items, ["BF16"], ["prequantized"], 2, visits=4)
    key = lambda r: (r.m, r.k, r.n, r.op, r.precision, r.mode)  # noqa: E731
    # Merged in the order one process lists them (tables and JSON diff cleanly).
    assert list(map(key, one.results)) == list(map(key, two.results))
    assert all(r.ok for r in two.results) and len(two.meta["devices"]) == 2
    assert two.meta["visits_per_device"] == [2, 2] and two.meta["device_indices"] == [0, 1]
    # Every worker ran every job, its two visits; each cell pooled both workers' samples.
    for t in two.meta["worker_timeline_s"]:
        assert sorted({j["item"] for j in t["jobs"]}) == ["16x32x64", "32x64x48", "48x32x16 groups=2", "8x16x16"]
        assert {j["visit"] for j in t["jobs"]} == {0, 1}
    # Pooled: every cell's samples are both workers' (on CPU each process sizes its calls from its
    # own timing, so counts are compared with what the parts measured, not with one process's).
    assert all(n > 0 for n in two.meta["samples_per_device"])
    assert sum(two.meta["samples_per_device"]) == sum(r.iters for r in two.results)
    assert [r.m_splits for r in two.results][-3:] == [[16, 32]] * 3


@pytest.mark.multiprocess
@cpu_path
def test_parallel_bench_fills_the_cache_and_a_cached_run_waits_for_no_worker(tmp_path):
    from te_gemm_callback.microbench.parallel import run_bench_parallel

    items = [WorkItem("a", GemmShape(32, 64, 48)), WorkItem("b", GemmShape(16, 32, 64))]
    cache = ResultCache(tmp_path / "c.json")
    first = run_bench_parallel(items, ["BF16"], ["autocast"], 2, cache=cache, visits=2)
    again = ResultCache(tmp_path / "c.json")
    hit = run_bench(items, ["BF16"], ["autocast"], cache=again, progress=False)
    # Every cell is a cache hit now, stored as pooled over both workers: no job ran. Except on a host
    # so loaded that a pooled cell stayed above SPREAD_LIMIT: that one was not cached, its job runs.
    job_of = lambda r: next(it.fprop.mkn for it in items if r.shape in gemm_passes(it.fprop))  # noqa: E731
    noisy = {job_of(r) for r in first.results if r.noisy}
    assert len(hit.results) == 6 and {j["item"] for j in hit.meta["timeline_s"]["jobs"]} == noisy
    for r0, r1 in zip(first.results, hit.results):
        assert job_of(r0) in noisy or (r1.cached and r1.median_ms == r0.median_ms)
    if noisy:
        return
    # The same run again over 2 devices: all cached, the worker is stopped, not waited for.
    cached = run_bench_parallel(items, ["BF16"], ["autocast"], 2, cache=ResultCache(tmp_path / "c.json"), visits=2)
    assert [r.median_ms for r in cached.results] == [r.median_ms for r in first.results]
    assert cached.meta["devices"] == [] and "failed_devices" not in cached.meta


def test_repeated_layers_grouped_in_the_stacked_figure():
    from te_gemm_callback.microbench.items import WorkItem
    from te_gemm_callback.reporting.figures import layer_groups
    from te_gemm_callback.shapes import GemmShape

    s, t = GemmShape(64, 32, 96), GemmShape(64, 96, 32)
    items = [WorkItem(f"blocks.{i}.fc1", s, 1.0) for i in range(3)] + [WorkItem("blocks.0.fc2", t, 1.0),
                                                                       WorkItem("lm_head", t, 1.0)]
    groups = layer_groups(items)
    assert [(label, len(g)) for label, g in groups] == [("blocks.*.fc1 (x3)", 3), ("blocks.*.fc2", 1), ("lm_head", 1)]


def test_clock_sampler_summarises_and_survives_a_failing_reader():
    import time

    from te_gemm_callback.capture.clocks import ClockSampler

    readings = iter([(1980.0, 400.0), (1700.0, 700.0), (1800.0, 690.0)])

    def reader():
        return next(readings)  # StopIteration after three: sampling ends, the work does not

    with ClockSampler(reader, period_s=0.001) as s:
        # Until the three reads are in, not a fixed sleep: on a loaded 2-core host they took up to
        # 21 ms of the 50 ms slept before.
        deadline = time.perf_counter() + 30
        while len(s.times) < 3 and time.perf_counter() < deadline:
            time.sleep(0.001)
    assert s.summary() == {"sm_clock_mhz_median": 1800.0, "sm_clock_mhz_min": 1700.0, "power_w_median": 690.0,
                           "power_w_max": 700.0, "samples": 3}
    # A window picks the samples taken inside it (the bench reports each job's clock this way).
    assert s.summary(since=s.times[1])["samples"] == 2 and s.summary(until=s.times[0])["samples"] == 1
    assert s.summary(since=s.times[-1] + 1.0) is None
    with ClockSampler(lambda: None, period_s=0.001) as garbage:  # a reader returning garbage stops at once
        time.sleep(0.01)
    assert garbage.summary() is None


def test_grouped_gemm_routing_that_changes_is_timed_at_representative_splits():
    from te_gemm_callback.microbench.items import representative_splits

    # Three distinct routings over four calls: each timed, weighted by how often it ran.
    calls = [[8, 8], [4, 12], [8, 8], [16, 0]]
    assert representative_splits(calls) == [((8, 8), 0.5), ((4, 12), 0.25), ((16, 0), 0.25)]
    # Nine distinct ones: four, from the most balanced to the most imbalanced, equal shares.
    many = [[8 + i, 8 - i] for i in range(9)]
    reps = representative_splits(many, k=4)
    assert [s for s, _ in reps] == [(8, 8), (11, 5), (13, 3), (16, 0)] and all(w == 0.25 for _, w in reps)


def test_stored_run_with_first_call_splits_still_totals():
    """A bench run made when only the first call's m_splits were timed: its totals still add up,
    the timed splits carrying all the layer's calls (keeps stored runs re-renderable)."""
    from te_gemm_callback.microbench.results import BenchResults, measured_items, step_ms

    shape = GemmShape(32, 16, 24)
    items = [WorkItem("moe.fc1", shape, 0.5, (8, 24)), WorkItem("moe.fc1", shape, 0.5, (20, 12))]
    cells = [BenchResult(m, k, n, op, "BF16", "autocast", m_splits=[16, 16], median_ms=1.0)
             for op, (m, k, n) in (("fprop", (32, 16, 24)), ("dgrad", (32, 24, 16)), ("wgrad", (16, 32, 24)))]
    res = BenchResults(cells, {}, {"modes": ["autocast"]})
    got = measured_items(res, items)
    assert [(it.m_splits, it.count) for it in got] == [((16, 16), 1.0)]
    assert step_ms(res, got, "BF16", "autocast") == 3.0
    assert step_ms(res, items, "BF16", "autocast") is None  # without the adjustment: nothing adds up


def test_run_summary_states_the_clock_the_cells_ran_at():
    from te_gemm_callback.reporting.bench_tables import run_summary

    res = BenchResults([], meta={"device": "NVIDIA H200", "wall_s": 9.34, "clocks_during_run": {
        "sm_clock_mhz_median": 1575.0, "sm_clock_mhz_min": 1455.0, "power_w_median": 616.0, "power_w_max": 700.0,
        "samples": 400}})
    assert run_summary(res) == ("0 cells on NVIDIA H200, measured in 9.3 s; SM clock median 1575 MHz (min 1455), "
                                "board power median 616 W (NVML)")
    assert run_summary(BenchResults([], meta={"device": "CPU", "wall_s": 0.01})).endswith("measured in 0.0 s")
    hot = BenchResults([], meta={"device": "NVIDIA H200", "wall_s": 9.34, "backend": "te", "gemm_duty": 0.75,
                                 "timeline_s": {"heat": {"heat_s": 2.45, "idle_holds": 17, "holds": 80}}})
    assert run_summary(hot).endswith("measured in 9.3 s; timed GEMMs at 0.75 of the GPU's time (--gemm-duty); "
                                     "2.5 s of dense load to keep every burst at the sustained clock "
                                     "(17 of 80 holds found the GPU idle)")


def test_holds_heat_only_an_idle_gpu_and_account_for_it(monkeypatch):
    # No CUDA here: the stream's idle query and the heater are stand-ins; what is tested is which
    # holds get the extra load and what the run's timeline is told it cost.
    loads, idle = [], iter([True, False, False, True])
    monkeypatch.setattr(timing, "_heater", lambda: type("H", (), {"load": lambda self, s: loads.append(s)})())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: type("S", (), {"query": lambda self: next(idle)})())
    monkeypatch.setattr(timing, "HEAT_LOG", {"heat_s": 0.0, "hold_s": 0.0, "idle_holds": 0, "holds": 0})
    timing.hold_gpu(0.002, burst_s=0.01)  # idle: 4 x the burst
    timing.hold_gpu(0.002, burst_s=0.01)  # busy: the hold alone
    timing.hold_gpu(0.0, burst_s=1.0)  # a job's start behind the previous job: nothing queued
    timing.hold_gpu(0.0, burst_s=1.0)  # a job's start on an idle GPU: capped
    assert loads == pytest.approx([0.04, 0.002, timing.HEAT_MAX_S])
    assert timing.HEAT_LOG == pytest.approx({"heat_s": 0.038 + timing.HEAT_MAX_S, "hold_s": 0.004,
                                             "idle_holds": 2, "holds": 4})


@cpu_path
def test_parallel_worker_that_dies_leaves_its_visits_out_and_the_run_goes_on(monkeypatch):
    import sys

    from te_gemm_callback.microbench.parallel import run_bench_parallel
    from te_gemm_callback.reporting.bench_tables import run_summary

    items = [WorkItem("a", GemmShape(32, 64, 48)), WorkItem("b", GemmShape(16, 32, 64))]
    monkeypatch.setattr(sys, "executable", "/bin/false")  # the worker's interpreter exits 1 at once
    res = run_bench_parallel(items, ["BF16"], ["autocast"], 2, visits=2)
    assert len(res.results) == 6 and all(r.ok for r in res.results)  # device 0's visit of every job
    assert res.meta["visits_per_device"] == [1] and "exit 1" in res.meta["failed_devices"][1]
    assert "GPU 1's worker failed (exit 1" in run_summary(res)


def test_run_summary_of_a_two_gpu_run_gives_each_gpus_clock():
    # 2 x H200: at one 700 W limit GPU 0 held 1575 MHz and GPU 1 1605 over a long run;
    # the pooled cells average the two, so the summary shows both, not device 0's alone.
    from te_gemm_callback.reporting.bench_tables import run_summary

    ck = lambda mhz, w: {"sm_clock_mhz_median": mhz, "sm_clock_mhz_min": 1080, "power_w_median": w}  # noqa: E731
    meta = {"device": "NVIDIA H200", "wall_s": 60.7, "visits_per_device": [8, 8], "device_indices": [0, 1],
            "clocks_per_device": [ck(1575, 688), ck(1605, 690)], "clocks_during_run": ck(1575, 688)}
    line = run_summary(BenchResults([], {}, meta))
    assert "over 2 devices (visits 8+8, samples pooled)" in line
    assert "SM clock median 1575 / 1605 MHz (GPU 0 / 1), board power median 688 / 690 W" in line


@cpu_path
def test_parallel_bench_with_more_devices_than_gpus_says_so_and_stops_its_workers(monkeypatch):
    # A host with one GPU, asked for two: the check runs after the workers have started (they start
    # before torch is imported, see below), so it must stop them. CUDA is faked in this process only
    # (the test host has no GPU); the worker is a real process.
    import subprocess

    from te_gemm_callback.microbench import parallel

    started = []

    class Popen(subprocess.Popen):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            started.append(self)

    monkeypatch.setattr(parallel.subprocess, "Popen", Popen)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match=r"--devices 2, but this host has 1 visible GPU"):
        parallel.run_bench_parallel([WorkItem("a", GemmShape(32, 64, 48))], ["BF16"], ["autocast"], 2)
    assert len(started) == 1 and started[0].returncode is not None  # stopped and reaped, not left running


def test_bench_cli_starts_gpu_workers_before_torch_loads():
    """`te-gemm bench --devices N` launches its workers before this process imports torch or TE
    (seconds each: docs/multi-gpu.md), so their start-up overlaps ours: the modules on that path
    must stay torch-free."""
    import subprocess
    import sys

    code = ("import sys, te_gemm_callback.cli, te_gemm_callback.microbench.parallel, "
            "te_gemm_callback.microbench.cells, te_gemm_callback.capture; "
            "from te_gemm_callback.precisions import canonical; canonical('fp8'); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]


@cpu_path
def test_visits_queue_every_job_before_reading_any_and_survive_errors(monkeypatch):
    # All visits of a batch are queued back to back and read after one wait (an idle GPU between
    # jobs would get its boost back); each job is built once, before any timing. On CPU the jobs are
    # stand-ins that log what happens when: what is tested is the order, the error paths and the
    # timeline, not GPU timing.
    from rich.progress import Progress

    from te_gemm_callback.capture.clocks import ClockSampler
    from te_gemm_callback.microbench import job_queue

    log, waits = [], []
    monkeypatch.setattr(job_queue.StreamClock, "wait", lambda self: log.append("wait"))
    monkeypatch.setattr(job_queue.StreamClock, "wait_for", lambda self, mark: waits.append(len(log)))

    class Job:
        setup_s = 0.01

        def __init__(self, name):
            if name == "bad":
                raise ValueError("K=8 is not a multiple of 16")
            self.name = name

        def queue(self):
            log.append(f"queue {self.name}")
            if self.name == "early":
                raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")
            if self.name == "late":
                return lambda: (_ for _ in ()).throw(RuntimeError("CUDA error: an illegal memory access"))
            return lambda: (log.append(f"read {self.name}"), {(GemmOp.FPROP, "autocast"): [1.0]})[1]

    names = ["a", "bad", "early", "late", "b"]
    pending = [job_queue.JobVisits(job_queue.PlannedJob(WorkItem(n, GemmShape(8, 8, 8)), "BF16")) for n in names]
    by_name = {v.job.item.name: v for v in pending}
    timeline = {}
    with Progress(disable=True) as prog:
        task = prog.add_task("x", total=10)
        queue = job_queue.JobQueue(lambda it, p: Job(it.name), 2, ClockSampler(reader=None), prog, task, timeline)
        batch = queue.build(pending)
        assert batch == pending and by_name["bad"].runner is None
        assert {n: v.error for n, v in by_name.items() if v.error} == {"bad": "ValueError: K=8 is not a multiple of 16"}
        assert [s["item"] for s in timeline["setup"]] == ["8x8x8"] * 4
        built = [v for v in batch if v.error is None]
        seq = [(n, v) for n in range(2) for v in (built if n == 0 else built[::-1])]
        jobs = queue.run(seq)
    assert log == ["queue a", "queue early", "queue late", "queue b", "queue b", "queue late", "queue a", "wait",
                   "read a", "read b", "read b", "read a"]
    assert waits == [2, 3, 4, 5, 6]  # from the third job on, for the job two back (one stays queued)
    assert by_name["early"].error == "OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB"
    assert by_name["late"].error == "RuntimeError: CUDA error: an illegal memory access"
    assert by_name["a"].times == {(GemmOp.FPROP, "autocast"): [1.0, 1.0]} and by_name["late"].times == {}
    assert [(j["visit"], "s" in j) for j in jobs] == [(0, True)] * 4 + [(1, True)] * 3  # early: not revisited


def test_a_job_that_does_not_fit_waits_for_the_next_batch():
    # No CUDA here: the out-of-memory error is raised by a stand-in job. With jobs already built, it
    # means they hold the memory, so the batch ends and that job is built again in the next one.
    from rich.progress import Progress

    from te_gemm_callback.capture.clocks import ClockSampler
    from te_gemm_callback.microbench import job_queue

    class Job:
        setup_s = 0.0

    made = []

    def make(it, p):
        made.append(it.name)
        if it.name == "c" and len(made) == 3:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return Job()

    pending = [job_queue.JobVisits(job_queue.PlannedJob(WorkItem(n, GemmShape(8, 8, 8)), "BF16")) for n in "abcd"]
    with Progress(disable=True) as prog:
        task = prog.add_task("x", total=4)
        queue = job_queue.JobQueue(make, 1, ClockSampler(reader=None), prog, task, {})
        first = queue.build(pending)
        assert first == pending[:2] and not any(v.error for v in pending)
        second = queue.build(pending[2:])
    assert second == pending[2:] and made == ["a", "b", "c", "c", "d"]


def test_gemm_duty_rests_between_calls_and_keys_the_cache(monkeypatch, capsys):
    # No CUDA here: the spin kernel is a stand-in that logs its cycles. What is tested is the duty
    # arithmetic (the timed call gets `duty` of the GPU time), the order flush-then-rest, the bounds,
    # and that a cell measured at another duty is another cache entry.
    spins, flushes = [], []
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: spins.append(cycles))
    assert timing.between_calls(None, 1.0, 1e-3) is None
    flush = lambda: flushes.append(len(spins))  # noqa: E731
    assert timing.between_calls(flush, 1.0, 1e-3) is flush
    rest = timing.between_calls(flush, 0.8, 2e-3)  # a 2 ms call at 80%: 0.5 ms of rest
    rest()
    assert flushes == [0] and spins == [pytest.approx(0.5e-3 * timing._SPIN_HZ, rel=1e-6)]
    for bad in (0.0, 1.5, -0.2):
        with pytest.raises(ValueError, match="gemm_duty must be in"):
            timing.between_calls(None, bad, 1e-3)
    cond = {"device": "NVIDIA H200", "torch": "2.11", "transformer_engine": "2.20.2"}
    shape = GemmShape(4096, 4096, 4096)
    from te_gemm_callback.microbench.cells import cell_key

    def key(c):
        return cell_key(c, shape, None, "BF16", "autocast")

    assert key(cond) == key(dict(cond, gemm_duty=1.0))
    assert key(cond) != key(dict(cond, gemm_duty=0.8))
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--shapes", "64x64x64", "--gemm-duty", "0"])
    assert exc.value.code == 2 and "expected a number from 0.05 to 1, got 0" in capsys.readouterr().err


def test_bench_takes_recipes_and_modes_as_the_command_line_does():
    """bench("64x64x64", ["FP8"]) ran DelayedScaling as "FP8" where the command line and the callback
    refuse the name; bench(..., "BF16", "autocast") said "modes must be among ('autocast', ...)"."""
    from te_gemm_callback import bench

    res = bench("64x64x64", "BF16", "autocast", cache=False)
    assert {(r.precision, r.mode) for r in res.results} == {("BF16", "autocast")}
    with pytest.raises(ValueError, match="'FP8' names 4 recipes"):
        bench("64x64x64", ["FP8"], ["autocast"], cache=False)
