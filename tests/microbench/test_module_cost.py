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
    assert [[r[0] for r in s] for s in _segments(recs + tax, 2, 5)] == [["gemm_a", "cast_a"], ["gemm_b"]]
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

        def start(self):
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


def _stand_ins(monkeypatch, gpu_rows, build=None):
    """module_cost's GPU parts stood in for (no CUDA here): the splitting, the host rounds' grouping
    and the row assembly are real. Returns the calls to _host_rows: (modules, round_s, passes)."""
    import types

    import torch

    host_calls = []

    def host_rows(runs, torch_, round_s, passes):
        host_calls.append(([(run.mod, run.recipe) for run in runs], round_s, passes))
        return [{"host_fwd_us": float(len(run.recipe)), "host_bwd_us": float(len(run.mod))} for run in runs]

    monkeypatch.setattr(module_cost, "_build", build or (lambda spec, te, dtype: (spec["name"], 8, 4)))
    monkeypatch.setattr(module_cost, "_gpu_rows", gpu_rows)
    monkeypatch.setattr(module_cost, "_host_rows", host_rows)
    monkeypatch.setattr(module_cost, "_opener", lambda te, torch_, dtype: lambda: None)
    fake_torch = types.SimpleNamespace(
        bfloat16=torch.bfloat16, randn=lambda m, k, device, dtype, requires_grad: torch.randn(m, k),
        cuda=types.SimpleNamespace(empty_cache=lambda: None))
    return host_calls, fake_torch


RECIPES = ["BF16", "DelayedScaling", "Float8BlockScaling"]
TODO = {"lin": ({"name": "lin"}, RECIPES), "mlp": ({"name": "mlp"}, RECIPES)}


def _gpu(run):
    """(GEMM µs, other µs, kernels, host µs, other by kernel): the MLP's kernels outlast its launches 3 times over."""
    return ((250.0, 50.0, 9, 100.0, {"cast": [2.0, 30.0], "norm": [1.0, 20.0]}) if run.mod == "mlp" else
            (20.0 + len(run.recipe), 5.0, 4, 100.0, {"cast": [1.0, 5.0]}))


def _row(key, recipe):
    return {"host_fwd_us": float(len(recipe)), "host_bwd_us": float(len(key)),
            "gpu_gemm_us": 250.0 if key == "mlp" else 20.0 + len(recipe), "gpu_other_us": 50.0 if key == "mlp" else 5.0,
            "kernels": 9 if key == "mlp" else 4,
            "other_by_kernel": {"cast": [2.0, 30.0], "norm": [1.0, 20.0]} if key == "mlp" else {"cast": [1.0, 5.0]}}


def test_one_session_for_every_cell_host_rounds_per_kind(monkeypatch):
    """Every kind and recipe in one GPU session; the host rounds one kind at a time (a round's
    launches stay few); each row is its own cell's; the first round's sleep is the kind's recorded
    host time for the passes it will run; GPU-heavy modules one pass per round."""
    sessions = []

    def gpu_rows(runs, torch_, tax):
        sessions.append([(run.mod, run.recipe) for run in runs])
        return [_gpu(run) for run in runs]

    host_calls, fake_torch = _stand_ins(monkeypatch, gpu_rows)
    got = module_cost._measure(TODO, None, fake_torch, {})
    assert got == {key: {r: _row(key, r) for r in RECIPES} for key in TODO}
    assert len(sessions) == 1 and len(sessions[0]) == 6
    assert host_calls == [([("lin", r) for r in RECIPES], 3 * 2 * 100.0 / 1e6, [2, 2, 2]),
                          ([("mlp", r) for r in RECIPES], 3 * 1 * 100.0 / 1e6, [1, 1, 1])]


def test_one_failing_recipe_is_measured_apart_and_the_others_keep_their_rows(monkeypatch):
    """When the one session fails, each kind alone, then each recipe alone: only the failing cell's
    row is an error."""
    sessions = []

    def gpu_rows(runs, torch_, tax):
        sessions.append(sorted((run.mod, run.recipe) for run in runs))
        if len(runs) > 1 and any(run.recipe == "Float8BlockScaling" for run in runs) or (
                runs[0].mod == "mlp" and runs[0].recipe == "Float8BlockScaling"):
            raise RuntimeError("no kernel image for this shape")
        return [_gpu(run) for run in runs]

    _, fake_torch = _stand_ins(monkeypatch, gpu_rows)
    got = module_cost._measure(TODO, None, fake_torch, {})
    want = {key: {r: _row(key, r) for r in RECIPES} for key in TODO}
    want["mlp"]["Float8BlockScaling"] = {"error": "RuntimeError: no kernel image for this shape"}
    assert got == want

    def one(key):
        return [[(key, r)] for r in RECIPES]

    # Every cell in one session; each kind alone; each of its recipes alone.
    assert sessions == [sorted((k, r) for k in ("lin", "mlp") for r in RECIPES),
                        sorted(("lin", r) for r in RECIPES), *one("lin"),
                        sorted(("mlp", r) for r in RECIPES), *one("mlp")]


def test_a_cell_that_failed_to_build_beside_the_others_is_built_again_alone(monkeypatch):
    """All modules are built at once for the one session: a cell that did not fit beside the others
    (out of memory) is built again with the others freed, not left an error."""
    sessions, built = [], []

    def build(spec, te, dtype):
        built.append(spec["name"])
        if len(built) == 6:  # the sixth module of the first attempt: no room beside the other five
            raise RuntimeError("CUDA out of memory")
        return spec["name"], 8, 4

    def gpu_rows(runs, torch_, tax):
        sessions.append(sorted((run.mod, run.recipe) for run in runs))
        return [_gpu(run) for run in runs]

    _, fake_torch = _stand_ins(monkeypatch, gpu_rows, build)
    got = module_cost._measure(TODO, None, fake_torch, {})
    assert got == {key: {r: _row(key, r) for r in RECIPES} for key in TODO}
    # No session with a cell missing: each kind alone, every cell in one of them.
    assert sessions == [sorted(("lin", r) for r in RECIPES), sorted(("mlp", r) for r in RECIPES)]


def test_a_cell_that_never_builds_is_its_rows_error(monkeypatch):
    def build(spec, te, dtype):
        if spec["name"] == "mlp" and build.recipe == "Float8BlockScaling":
            raise ValueError("Float8BlockScaling needs dimensions divisible by 128")
        return spec["name"], 8, 4

    real_build_runs = module_cost._build_runs

    def build_runs(todo, te, torch_):  # which recipe each build is for: _build is not told
        runs, failed = [], {key: {} for key in todo}
        for key, (spec, recipes) in todo.items():
            for r in recipes:
                build.recipe = r
                got, bad = real_build_runs({key: (spec, [r])}, te, torch_)
                runs += got
                failed[key].update(bad[key])
        return runs, failed

    _, fake_torch = _stand_ins(monkeypatch, lambda runs, torch_, tax: [_gpu(run) for run in runs], build)
    monkeypatch.setattr(module_cost, "_build_runs", build_runs)
    got = module_cost._measure(TODO, None, fake_torch, {})
    want = {key: {r: _row(key, r) for r in RECIPES} for key in TODO}
    want["mlp"]["Float8BlockScaling"] = {"error": "ValueError: Float8BlockScaling needs dimensions divisible by 128"}
    assert got == want


def test_a_lost_or_stray_marker_is_refused_not_cut_at_the_wrong_place():
    """The recording-tax calls launch the marker's own kernel after the last run: counted, so one
    marker record missing cannot be made up by a tax call and hand a run another's kernels."""
    m = "spin_kernel"
    recs = [(m, 0, 1), ("warm", 2, 3), (m, 4, 5), ("gemm_a", 6, 8), (m, 10, 11),
            ("warm", 12, 13), (m, 14, 15), ("gemm_b", 16, 18), (m, 19, 20)]
    tax = [(m, 21 + i, 21.5 + i) for i in range(3)]
    assert [[r[0] for r in s] for s in _segments(recs + tax, 2, 3)] == [["gemm_a"], ["gemm_b"]]
    lost = [r for r in recs if r[1] != 10]  # run a's closing marker dropped
    with pytest.raises(RuntimeError, match="7 marker kernels in the profile for 2 modules and 3 calls after"):
        _segments(lost + tax, 2, 3)
    with pytest.raises(RuntimeError, match="marker kernels"):
        _segments(recs + tax, 2, 2)  # a stray launch of the marker's kernel


def test_the_host_rounds_reuse_the_warm_up_gradient_on_the_captured_input():
    """With the host timed on the captured input, the first timed backward made its output gradient
    (two more launches in one of three samples): one gradient per input tensor, made untimed."""
    import torch

    x = torch.randn(8, 4, requires_grad=True)
    run = module_cost._Run(torch.nn.Linear(4, 4), "BF16", x, x)
    run.passes(1, "full")
    made = run.grad["full"]
    run.passes(2)
    assert list(run.grad) == ["full"] and run.grad["full"] is made
    half = x[:4].detach().requires_grad_()
    cut = module_cost._Run(torch.nn.Linear(4, 4), "BF16", half, x)
    cut.passes(1, "full")
    cut.passes(1)
    assert sorted(cut.grad) == ["full", "host"] and cut.grad["host"].shape == (4, 4)


def test_the_measured_passes_run_after_the_autocasts_first_module_and_before_its_exit():
    """TE's once-per-step amax update runs in its autocast's first module's backward and at the exit: a job
    pays it once, not per module, so the opener takes it and the marks keep the exit out of the measurement."""
    import contextlib

    import torch

    events = []

    @contextlib.contextmanager
    def autocast(recipe):
        events.append(f"enter {recipe}")
        yield
        events.append("exit")

    class Mod(torch.nn.Linear):
        def forward(self, x):
            events.append("fwd")
            return super().forward(x)

    x = torch.randn(4, 3, requires_grad=True)
    run = module_cost._Run(Mod(3, 2), "DelayedScaling", x, x, opener=lambda: events.append("opener"))
    run.autocast = autocast
    fwd, bwd = run.passes(2, "full", mark=lambda: events.append("mark"))
    assert events == ["enter DelayedScaling", "opener", "mark", "fwd", "fwd", "mark", "exit"]
    assert len(fwd) == len(bwd) == 2
    events.clear()
    module_cost._Run(Mod(3, 2), "BF16", x, x).passes(1)  # BF16: no autocast of TE's to open, no marks asked
    assert events == ["fwd"]


def test_each_host_round_starts_at_the_next_recipe(monkeypatch):
    """The first passes after a round's sync run slower: every recipe takes every place in the rounds once."""
    import types

    order = []

    class Run:
        def __init__(self, name):
            self.name, self.x = name, {"host": 0, "full": 0}

        def passes(self, n):
            order.append(self.name)
            return [1.0] * n, [2.0] * n

    fake_torch = types.SimpleNamespace(cuda=types.SimpleNamespace(synchronize=lambda: None, _sleep=lambda c: None))
    monkeypatch.setattr(module_cost, "_cycles_per_s", lambda torch_: 1e9)
    rows = module_cost._host_rows([Run("a"), Run("b"), Run("c"), Run("d"), Run("e")], fake_torch, 0.01, [1] * 5)
    rounds = [order[i:i + 5] for i in range(0, len(order), 5)]
    assert rounds == [list("abcde"), list("bcdea"), list("cdeab"), list("deabc"), list("eabcd")]
    assert rows[0] == {"host_fwd_us": 1.0, "host_bwd_us": 2.0}
    order.clear()
    module_cost._host_rows([Run("a"), Run("b"), Run("c")], fake_torch, 0.01, [1] * 3)
    firsts = order[::3]
    assert len(firsts) == 6 and all(firsts.count(r) == 2 for r in "abc")  # at least 4 rounds, each first alike


def test_every_fp8_cell_gets_its_recipes_opener_and_bf16_none(monkeypatch):
    import types

    import torch

    made = []
    monkeypatch.setattr(module_cost, "_build", lambda spec, te, dtype: (spec["name"], 8, 4))
    monkeypatch.setattr(module_cost, "_opener", lambda te, torch_, dtype: made.append(dtype) or f"opener {len(made)}")
    fake_torch = types.SimpleNamespace(bfloat16=torch.bfloat16, float32=torch.float32,
                                       randn=lambda m, k, device, dtype, requires_grad: torch.randn(m, k))
    todo = {"lin": ({"name": "lin"}, RECIPES), "mlp": ({"name": "mlp"}, RECIPES),
            "f32": ({"name": "f32", "dtype": "float32"}, RECIPES)}
    runs, failed = module_cost._build_runs(todo, None, fake_torch)
    got = {(key, run.recipe): run.opener for key, run in runs}
    assert got[("lin", "BF16")] is None and got[("mlp", "BF16")] is None  # BF16: no TE autocast to open
    assert got[("lin", "DelayedScaling")] == got[("mlp", "DelayedScaling")] != got[("lin", "Float8BlockScaling")]
    assert got[("f32", "DelayedScaling")] not in (None, got[("lin", "DelayedScaling")])  # one per recipe and dtype
    assert made == [torch.bfloat16, torch.bfloat16, torch.float32, torch.float32] and not any(failed.values())


def test_a_kernels_key_drops_its_template_and_arguments():
    from te_gemm_callback.capture.kernels import kernel_key

    assert kernel_key("void transformer_engine::(anonymous namespace)::block_scaled_1d_cast_transpose_kernel<true, "
                      "float>(float const*, int)") == "transformer_engine::block_scaled_1d_cast_transpose_kernel"
    assert kernel_key("triton_poi_fused_add_mul_tanh_0") == "triton_poi_fused_add_mul_tanh_0"
    assert kernel_key("Memset (Device)") == "Memset"
