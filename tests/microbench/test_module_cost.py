"""The module cost benchmark's parts that run without a GPU: the marker cut of one profiler session
into its recipes' kernels, and the rows kept in the bench's cache beside the GEMM cells (a bench
found whole in the cache measures nothing and needs no TE). Its measurement runs on the GPU:
tests/test_gpu.py and benchmarks/replay_check.py."""

import json

import pytest

from te_gemm_callback.capture.module_specs import spec_key
from te_gemm_callback.microbench import module_cost
from te_gemm_callback.microbench.cache import ResultCache
from te_gemm_callback.microbench.module_cost import CostCache, _segments, measure_module_costs

SPEC = {"class": "Linear", "gemms": {"": [64, 32, 16]}, "use_bias": False, "dtype": "bfloat16"}
ROW = {"host_fwd_us": 300.0, "host_bwd_us": 400.0, "gpu_gemm_us": 10.0, "gpu_other_us": 2.0, "kernels": 8}


def test_one_session_is_cut_into_its_recipes_at_the_markers():
    m = "spin_kernel"
    recs = [(m, 0, 1), ("warm", 2, 3), (m, 4, 5), ("gemm_a", 6, 8), ("cast_a", 8, 9), (m, 10, 11),
            ("warm", 12, 13), (m, 14, 15), ("gemm_b", 16, 18), (m, 19, 20)]
    segs = _segments(list(reversed(recs)), 2)  # CUPTI's order is not promised: cut by start time
    assert [[r[0] for r in s] for s in segs] == [["gemm_a", "cast_a"], ["gemm_b"]]
    assert _segments([], 2) == []
    # The recording-tax calls after the last run's closing marker: the same kernel, in no run's segment.
    tax = [(m, 21 + i, 21.5 + i) for i in range(5)] + [("add", 30, 31)]
    assert [[r[0] for r in s] for s in _segments(recs + tax, 2)] == [["gemm_a", "cast_a"], ["gemm_b"]]
    # Host rounds on the captured input leave the GPU rows no first pass: nothing between two markers.
    bare = [(m, 0, 1), (m, 2, 3), ("gemm_a", 4, 5), (m, 6, 7), (m, 8, 9), ("gemm_b", 10, 11), (m, 12, 13)]
    assert [[r[0] for r in s] for s in _segments(bare, 2)] == [["gemm_a"], ["gemm_b"]]


def _filled(tmp_path, recipes):
    cache = ResultCache(tmp_path / "cache.json")
    cc = CostCache(cache, "NVIDIA H200|Xeon|torch 2.11, TE 2.20")
    for r in recipes:
        cc.put(ROW, spec_key(SPEC), r)
    cc.put({"cupti_call_tax_us": 1.5, "profiler_op_tax_us": 3.0}, "recording-tax")
    assert cache.save() is None
    return cache


def test_a_bench_found_in_the_cache_measures_nothing_and_needs_no_te(tmp_path, monkeypatch):
    recipes = ["BF16", "DelayedScaling"]
    _filled(tmp_path, recipes)
    monkeypatch.setattr("te_gemm_callback.precisions.import_te",
                        lambda: pytest.fail("a cached bench imported TE to measure"))
    again = ResultCache(tmp_path / "cache.json")  # another run, the file read back
    got = measure_module_costs({"l0": SPEC, "l1": SPEC}, recipes,
                               CostCache(again, "NVIDIA H200|Xeon|torch 2.11, TE 2.20"))
    assert got["kinds"][spec_key(SPEC)] == {r: ROW for r in recipes}
    assert got["cupti_call_tax_us"] == 1.5 and got["cached"] == 2 + 1
    assert got["modules"] == {"l0": spec_key(SPEC), "l1": spec_key(SPEC)}


def test_cached_rows_belong_to_their_host_and_versions(tmp_path, monkeypatch):
    _filled(tmp_path, ["BF16"])
    wanted = []

    def measure(todo, te, torch, phases, tax=None):
        wanted.extend(r for _, recipes in todo.values() for r in recipes)
        return {key: {r: ROW for r in recipes} for key, (_, recipes) in todo.items()}

    class Tax:  # the recording taxes need CUDA: taken in the measurement's session
        fns, calls = (), 0

        def __init__(self, torch):
            pass

        def sample(self, recorded, times=1):
            pass

        def result(self):
            return {"cupti_call_tax_us": 1.0, "profiler_op_tax_us": 2.0}

    monkeypatch.setattr(module_cost, "_measure", measure)
    monkeypatch.setattr(module_cost, "_Tax", Tax)
    monkeypatch.setattr("te_gemm_callback.precisions.import_te", lambda: object())
    cache = ResultCache(tmp_path / "cache.json")
    # Another CPU (host times differ) finds nothing of the first one's.
    got = measure_module_costs({"l0": SPEC, "l1": SPEC}, ["BF16", "Float8CurrentScaling"],
                               CostCache(cache, "NVIDIA H200|EPYC|torch 2.11, TE 2.20"))
    assert wanted == ["BF16", "Float8CurrentScaling"] and got["cached"] == 0
    assert cache.save() is None
    stored = json.loads((tmp_path / "cache.json").read_text())["modules"]
    assert sum("EPYC" in k for k in stored) == 2 + 1 and sum("Xeon" in k for k in stored) == 1 + 1
    # The first host asks again for a recipe it lacks: only that one is measured.
    wanted.clear()
    measure_module_costs({"l0": SPEC}, ["BF16", "Float8CurrentScaling"],
                         CostCache(ResultCache(tmp_path / "cache.json"), "NVIDIA H200|Xeon|torch 2.11, TE 2.20"))
    assert wanted == ["Float8CurrentScaling"]


def test_a_failed_row_is_not_kept(tmp_path):
    cache = ResultCache(tmp_path / "cache.json")
    cc = CostCache(cache, "h")
    cc.put({"error": "RuntimeError: out of memory"}, "k", "BF16")
    cc.put(ROW, "k", "DelayedScaling")
    assert cc.get("k", "BF16") is None and cc.get("k", "DelayedScaling") == ROW


def test_one_failing_recipe_is_measured_apart_and_the_others_keep_their_rows(monkeypatch):
    """Every kind and recipe measured in one session; when it fails, each kind alone, then each recipe
    alone: only the failing cell's row is an error. GPU-heavy modules get one host pass per round.
    The GPU parts are stood in for (no CUDA here); the splitting and the row assembly are real."""
    import types

    import torch

    sessions = []

    def gpu_rows(runs, torch_, tax):
        sessions.append(sorted((run.mod, run.recipe) for run in runs))
        if len(runs) > 1 and any(run.recipe == "Float8BlockScaling" for run in runs) or (
                runs[0].mod == "mlp" and runs[0].recipe == "Float8BlockScaling"):
            raise RuntimeError("no kernel image for this shape")
        # (GEMM µs, other µs, kernels, host µs): the MLP's kernels outlast its launches 3 times over
        return [(250.0, 50.0, 9, 100.0) if run.mod == "mlp" else (20.0, 5.0, 4, 100.0) for run in runs]

    host_passes = []

    def host_rows(runs, torch_, round_s, passes):
        host_passes.append(dict(zip((run.mod for run in runs), passes)))
        return [{"host_fwd_us": 40.0, "host_bwd_us": 60.0} for _ in runs]

    monkeypatch.setattr(module_cost, "_build", lambda spec, te, dtype: (spec["name"], 8, 4))
    monkeypatch.setattr(module_cost, "_gpu_rows", gpu_rows)
    monkeypatch.setattr(module_cost, "_host_rows", host_rows)
    fake_torch = types.SimpleNamespace(
        bfloat16=torch.bfloat16, randn=lambda m, k, device, dtype, requires_grad: torch.randn(m, k),
        cuda=types.SimpleNamespace(empty_cache=lambda: None))
    recipes = ["BF16", "DelayedScaling", "Float8BlockScaling"]
    todo = {"lin": ({"name": "lin"}, recipes), "mlp": ({"name": "mlp"}, recipes)}
    got = module_cost._measure(todo, None, fake_torch, {})
    assert got["mlp"]["Float8BlockScaling"] == {"error": "RuntimeError: no kernel image for this shape"}
    for key in ("lin", "mlp"):
        for r in recipes:
            if (key, r) != ("mlp", "Float8BlockScaling"):
                assert got[key][r] == {"host_fwd_us": 40.0, "host_bwd_us": 60.0,
                                        "gpu_gemm_us": 250.0 if key == "mlp" else 20.0,
                                        "gpu_other_us": 50.0 if key == "mlp" else 5.0,
                                        "kernels": 9 if key == "mlp" else 4}, (key, r, got[key][r])

    def one(key):
        return [[(key, r)] for r in recipes]

    # Every cell in one session; each kind alone; each of its recipes alone.
    assert sessions == [sorted((k, r) for k in ("lin", "mlp") for r in recipes),
                        sorted(("lin", r) for r in recipes), *one("lin"),
                        sorted(("mlp", r) for r in recipes), *one("mlp")]
    # The MLP (kernels 3x its launches) gets one host pass per round, the Linear two.
    assert {"mlp": 1} in host_passes and {"lin": 2} in host_passes
