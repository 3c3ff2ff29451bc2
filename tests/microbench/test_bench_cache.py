"""Bench cells that are too noisy to trust: measured again, marked, never cached as good; cells
reused from the cache marked in results and tables; a CPU cell's cache key names the CPU.

The host clock is scripted (no real noise): each build of a job starts the next measurement of
it, and the clock returns that attempt's samples."""

import json

import pytest
import torch
from rich.console import Console

from te_gemm_callback.microbench import engine, jobs, timing
from te_gemm_callback.microbench.cache import ResultCache
from te_gemm_callback.microbench.cells import SPREAD_LIMIT, BenchResult, cell_key
from te_gemm_callback.microbench.engine import run_bench
from te_gemm_callback.microbench.items import WorkItem
from te_gemm_callback.microbench.results import BenchResults, pool_parts
from te_gemm_callback.microbench.timing import stats
from te_gemm_callback.reporting.bench_tables import pass_table, run_summary, totals_table
from te_gemm_callback.shapes import GemmOp, GemmShape

cpu_path = pytest.mark.skipif(torch.cuda.is_available(), reason="scripts the CPU host clock (TorchJob on CPU)")


def quiet(n):
    return [0.03] * n


def noisy(n):  # a third of the calls host-starved: the user's cell, 5.6 ms where fresh runs give 0.03 ms
    return [5.6 if i % 3 == 0 else 0.03 for i in range(n)]


def less_noisy(n):  # a quarter of the calls 3x slow: still above the limit, quieter than `noisy`
    return [0.09 if i % 4 == 0 else 0.03 for i in range(n)]


ITEMS = [WorkItem("fc1", GemmShape(32, 64, 48))]


@pytest.fixture
def clock(monkeypatch):
    """``clock(a, b, ...)``: the next run's k-th measurement of its (one) job takes samples from
    the k-th function (the last one repeats)."""
    state = {"builds": 0, "script": [quiet]}

    class Job(jobs.TorchJob):
        def __init__(self, *a, **kw):
            state["builds"] += 1
            super().__init__(*a, **kw)

    def time_cpu(fn, n):
        return state["script"][min(state["builds"], len(state["script"])) - 1](n)

    monkeypatch.setattr(jobs, "TorchJob", Job)
    monkeypatch.setattr(jobs, "time_cpu", time_cpu)

    def script(*fns):
        state.update(builds=0, script=list(fns))

    return script


def bench(path, items=ITEMS):
    return run_bench(items, ["BF16"], ["autocast"], cache=ResultCache(path), progress=False)


def text(*renderables):
    c = Console(width=240, record=True)
    for r in renderables:
        c.print(r)
    return c.export_text()


@cpu_path
def test_a_high_spread_cell_is_not_reused_from_the_cache(tmp_path, clock):
    # A cache written before the spread limit existed holds the user's cell: 143% spread, median
    # 5.6 ms where fresh runs give 0.03 ms. It must be measured again, not reused, and the file heal.
    path = tmp_path / "cache.json"
    clock(quiet)
    bench(path)
    data = json.loads(path.read_text())
    key = next(k for k in data["results"] if "|fprop:" in k)
    old = {k: v for k, v in data["results"][key].items() if k not in ("attempts", "noisy", "cached")}
    data["results"][key] = dict(old, median_ms=5.6, q1_ms=0.6, q3_ms=8.6)  # (8.6 - 0.6) / 5.6 = 143%
    path.write_text(json.dumps(data))

    clock(quiet)
    res = bench(path)
    fprop = res.get(GemmShape(32, 64, 48), "BF16", "autocast")
    assert not fprop.cached and fprop.median_ms == 0.03  # measured again, not the stored 5.6 ms
    assert res.meta["cache_refused_noisy"] == 1 and res.meta["timeline_s"]["jobs"]
    assert "1 cached cells refused (spread above 50%) and measured again" in run_summary(res)
    healed = json.loads(path.read_text())["results"][key]
    assert healed["median_ms"] == 0.03 and healed["q3_ms"] == 0.03

    clock(noisy)  # the healed cell is good now: reused, the clock never read
    again = bench(path)
    assert all(r.cached and r.median_ms == 0.03 for r in again.results) and not again.meta["timeline_s"]["jobs"]


@cpu_path
def test_a_cell_that_stays_noisy_is_measured_again_then_marked_and_never_cached(tmp_path, clock):
    path = tmp_path / "cache.json"
    attempts = engine.REMEASURES + 1
    clock(noisy)
    res = bench(path)
    assert all(r.ok and r.noisy and r.attempts == attempts and r.spread > SPREAD_LIMIT for r in res.results)
    assert [j.get("attempt", 1) for j in res.meta["timeline_s"]["jobs"]] == list(range(1, attempts + 1))
    assert json.loads(path.read_text())["results"] == {}  # nothing stored as good
    saved = json.loads(res.save(tmp_path / "bench.json").read_text())
    assert all(r["noisy"] and r["attempts"] == attempts for r in saved["results"])
    assert saved["meta"]["spread_limit"] == SPREAD_LIMIT
    assert BenchResults.load(tmp_path / "bench.json").results == res.results

    # A stored noisy entry (marked, or above the limit) is refused, and dropped from the file when
    # the new measurement is no better either.
    cache = ResultCache(path)
    key = cell_key(res.results[0].conditions, res.results[0].shape, None, "BF16", "autocast")
    cache.data["results"][key] = dict(res.results[0].__dict__, noisy=False)  # above the limit, unmarked
    assert cache.get(key) is None and key in cache.refused
    cache.put(key, res.results[0])
    cache.save()
    assert key not in json.loads(path.read_text())["results"]

    clock(quiet)
    fresh = bench(path)
    assert not any(r.cached or r.noisy for r in fresh.results) and all(r.attempts == 1 for r in fresh.results)


@cpu_path
def test_measuring_again_keeps_the_quieter_measurement(tmp_path, clock):
    path = tmp_path / "cache.json"
    clock(noisy, quiet)  # quiet on the second try: kept, good, cached
    res = bench(path)
    assert all(r.attempts == 2 and not r.noisy and r.median_ms == 0.03 for r in res.results)
    assert len(json.loads(path.read_text())["results"]) == 3
    assert "3 cells measured again (their job had a spread above 50%), the quieter kept" in run_summary(res)

    clock(noisy, less_noisy, noisy)  # never quiet: the least noisy try is kept, marked, not cached
    res = run_bench([WorkItem("fc2", GemmShape(32, 48, 64))], ["BF16"], ["autocast"], cache=ResultCache(path),
                    progress=False)
    for r in res.results:
        assert r.noisy and r.attempts == 3
        assert (r.median_ms, r.q1_ms, r.q3_ms) == pytest.approx(stats(less_noisy(r.iters)))
    assert len(json.loads(path.read_text())["results"]) == 3  # only the first item's cells


@cpu_path
def test_cached_and_noisy_cells_are_marked_in_results_and_tables(tmp_path, clock):
    path = tmp_path / "cache.json"
    clock(quiet)
    fresh = bench(path)
    out = text(pass_table(fresh, ITEMS, GemmOp.FPROP, "autocast"), totals_table(fresh, ITEMS, "autocast"))
    assert not any(r.cached for r in fresh.results) and "*" not in out and "from the cache" not in out

    clock(quiet)
    hit = bench(path)
    assert all(r.cached for r in hit.results)
    assert all(r["cached"] for r in json.loads(hit.save(tmp_path / "b.json").read_text())["results"])
    out = text(pass_table(hit, ITEMS, GemmOp.FPROP, "autocast"))
    assert "0.030 (1.00x)*" in out and "* from the cache: measured by an earlier run" in out
    out = text(totals_table(hit, ITEMS, "autocast"))
    assert out.count("0.090 (1.00x)*") == 2 and "* from the cache" in out  # the layer and the step
    assert run_summary(hit).endswith("3 of 3 cells reused from the cache (*)")

    clock(noisy)
    bad = run_bench(ITEMS, ["BF16"], ["autocast"], cache=ResultCache(enabled=False), progress=False)
    out = text(pass_table(bad, ITEMS, GemmOp.FPROP, "autocast"), totals_table(bad, ITEMS, "autocast"))
    assert "0.030 (1.00x)!" in out and "! noisy: spread (IQR/median) still above 50%" in out
    assert "3 noisy cells (!): spread still above 50% after 3 measurements, not cached" in run_summary(bad)


def test_cpu_cache_key_names_the_cpu_model_and_thread_count(monkeypatch):
    shape = GemmShape(4096, 4096, 4096)
    # GPU keys are as they were: device name, versions, pass, mode, L2, duty.
    gpu = {"device": "NVIDIA H200", "torch": "2.11", "transformer_engine": "2.20.2", "gemm_duty": 0.75}
    assert cell_key(gpu, shape, None, "BF16", "autocast") == \
        "NVIDIA H200|torch 2.11, TE 2.20.2|fprop:4096x4096x4096|-|BF16|autocast|warm-l2|duty 0.75"
    if torch.cuda.is_available():
        return
    monkeypatch.setattr(timing, "cpu_model", lambda: "AMD EPYC 9654 96-Core Processor")
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = timing.device_conditions()
        torch.set_num_threads(2)
        two = timing.device_conditions()
    finally:
        torch.set_num_threads(threads)
    assert (one["cpu_threads"], two["cpu_threads"]) == (1, 2)
    k1, k2 = (cell_key(c, shape, None, "BF16", "autocast") for c in (one, two))
    assert k1 != k2 and "AMD EPYC 9654 96-Core Processor, 1 threads|" in k1 and ", 2 threads|" in k2
    other = cell_key(dict(one, cpu_model="Intel(R) Xeon(R) Platinum 8480+"), shape, None, "BF16", "autocast")
    assert other != k1


def test_cpu_model_from_proc_cpuinfo_with_a_fallback(monkeypatch, tmp_path):
    import builtins
    import io

    real_open = builtins.open
    cpuinfo = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC   7763 64-Core Processor\n"
    monkeypatch.setattr(timing, "open", lambda p, *a, **k: io.StringIO(cpuinfo) if p == "/proc/cpuinfo"
                        else real_open(p, *a, **k), raising=False)
    assert timing.cpu_model() == "AMD EPYC 7763 64-Core Processor"

    def missing(p, *a, **k):
        raise FileNotFoundError(p)

    monkeypatch.setattr(timing, "open", missing, raising=False)  # macOS, Windows: no /proc
    monkeypatch.setattr("platform.processor", lambda: "arm")
    assert timing.cpu_model() == "arm"
    monkeypatch.setattr("platform.processor", lambda: "")
    monkeypatch.setattr("platform.machine", lambda: "")
    assert timing.cpu_model() == "unknown CPU model"


@cpu_path
def test_a_cell_measured_with_other_threads_is_not_reused(tmp_path, clock):
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        clock(quiet)
        assert not any(r.cached for r in bench(tmp_path / "c.json").results)
        torch.set_num_threads(2)
        clock(quiet)
        assert not any(r.cached for r in bench(tmp_path / "c.json").results)  # another key: measured
        torch.set_num_threads(1)
        clock(quiet)
        assert all(r.cached for r in bench(tmp_path / "c.json").results)
    finally:
        torch.set_num_threads(threads)


def test_cache_stores_and_reuses_only_quiet_cells(tmp_path):
    cache = ResultCache(tmp_path / "c.json")
    ok = BenchResult(8, 16, 32, "fprop", "BF16", "autocast", median_ms=1.0, q1_ms=0.9, q3_ms=1.3)  # 40%
    wide = BenchResult(8, 16, 32, "dgrad", "BF16", "autocast", median_ms=1.0, q1_ms=0.7, q3_ms=1.3)  # 60%
    marked = BenchResult(8, 16, 32, "wgrad", "BF16", "autocast", median_ms=1.0, noisy=True)
    unknown = BenchResult(8, 16, 32, "wgrad", "BF16", "prequantized", median_ms=1.0)  # no quartiles: not judged
    for key, r in (("ok", ok), ("wide", wide), ("marked", marked), ("unknown", unknown)):
        cache.put(key, r)
    cache.save()
    again = ResultCache(tmp_path / "c.json")
    assert sorted(again.data["results"]) == ["ok", "unknown"]
    assert again.get("ok").cached and again.get("unknown").cached
    assert ok.spread == pytest.approx(0.4) and wide.spread == pytest.approx(0.6) and unknown.spread is None


def test_pooled_cell_is_judged_on_all_parts_samples():
    # Two GPUs each measured a quiet cell, at very different times: pooled, the spread is wide, so the
    # pooled cell is noisy and the caller's cache (microbench/parallel.py) does not store it.
    cell = BenchResult(64, 32, 16, "fprop", "BF16", "autocast", median_ms=0.03, tflops=1.0, attempts=2)
    p0 = BenchResults([cell], meta={"peaks_tflops": {}}, samples={cell.cell: ([0.03] * 6, [])})
    p1 = BenchResults([BenchResult(**{**cell.__dict__, "attempts": 1})], samples={cell.cell: ([5.6] * 6, [])})
    pooled = pool_parts([p0, p1])[0]
    assert pooled.noisy and pooled.attempts == 2 and pooled.iters == 12
    cache = ResultCache(enabled=False)
    cache.enabled, cache.data = True, ResultCache._empty()
    cache.put("k", pooled)
    assert cache.data["results"] == {}
    quiet_pool = pool_parts([p0, BenchResults([cell], samples={cell.cell: ([0.031] * 6, [])})])[0]
    assert not quiet_pool.noisy
