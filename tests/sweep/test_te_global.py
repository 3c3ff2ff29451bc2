"""TE's process-global DelayedScaling buffers: the sweep keeps its DelayedScaling steps' entries apart from the
other recipes' steps and gives the job exactly its own back; the in-fit bench puts them back too.

TE cannot run on a CPU, so its FP8GlobalStateManager is stood in for by a module under TE's own import name
holding a copy of TE 2.20's FP8GlobalState fields; ``_register`` does what add_fp8_tensors_to_global_buffer
does for one module, and ``_update`` what every FP8 autocast's exit does (reduce_and_update_fp8_tensors).
"""

import sys
import types
from collections import deque
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from te_gemm_callback.sweep import te_global
from te_gemm_callback.sweep.state import RecipeStates
from tests.helpers.fakes import fake_te_sweep


@dataclass
class _State:  # the fields of TE 2.20's FP8GlobalState
    fp8_enabled: bool = False
    autocast_depth: int = 0
    global_amax_buffer: dict = field(default_factory=dict)
    global_amax_history_buffer: dict = field(default_factory=dict)
    global_scale_buffer: dict = field(default_factory=dict)
    fp8_tensors_recompute_buffer: list = field(default_factory=list)
    autocast_arguments: dict = field(default_factory=dict)


class _Manager:
    quantization_state = _State()

    @classmethod
    def reset(cls):
        cls.quantization_state = _State()


DS_KEY = "forward_recipe=DelayedScaling(),group=None"


@pytest.fixture
def te(monkeypatch):
    _Manager.reset()
    mod = types.ModuleType("transformer_engine.pytorch.quantization")
    mod.FP8GlobalStateManager = _Manager
    monkeypatch.setitem(sys.modules, "transformer_engine.pytorch.quantization", mod)
    return _Manager


def _register(te, amax):
    q = te.quantization_state
    for name in ("global_amax_buffer", "global_amax_history_buffer", "global_scale_buffer"):
        getattr(q, name).setdefault(DS_KEY, []).append(amax)
    q.autocast_arguments["recipe=DelayedScaling(),group=None"] = ("DelayedScaling", None)


def _entries(te):
    return {k: list(v) for k, v in te.quantization_state.global_amax_buffer.items() if v}


def test_a_non_delayed_job_gets_no_entry_of_the_sweeps_delayed_steps(te):
    keep = RecipeStates(nn.Linear(2, 2))
    keep.switch("BF16")
    keep.switch("DelayedScaling")
    a = torch.zeros(1)
    _register(te, a)
    amax_list = te.quantization_state.global_amax_buffer[DS_KEY]
    keep.switch("Float8CurrentScaling")
    assert _entries(te) == {}  # its steps' autocast exits update nothing of DelayedScaling's
    keep.switch("DelayedScaling")
    # The same list, with the module that joined it once: DelayedScaling's scales keep updating.
    assert te.quantization_state.global_amax_buffer[DS_KEY] is amax_list and amax_list == [a]
    keep.switch("DelayedScaling plan")  # a plan of DelayedScaling shares its buffers
    assert te.quantization_state.global_amax_buffer[DS_KEY] is amax_list
    keep.switch("Float8BlockScaling")
    assert _entries(te) == {}
    keep.restore_job()
    assert _entries(te) == {} and te.quantization_state.autocast_arguments == {}


def test_a_delayed_job_gets_its_own_entries_back_in_the_same_lists(te):
    a, b = torch.zeros(1), torch.ones(1)
    _register(te, a)  # the job's module
    job_list = te.quantization_state.global_amax_buffer[DS_KEY]
    keep = RecipeStates(nn.Linear(2, 2))
    keep.switch("BF16")
    assert _entries(te) == {}
    keep.switch("DelayedScaling")
    assert te.quantization_state.global_amax_buffer[DS_KEY] is job_list and job_list == [a]
    _register(te, b)  # a module that joined during the sweep
    keep.switch("Float8CurrentScaling")
    assert _entries(te) == {}
    keep.restore_job()
    got = te.quantization_state.global_amax_buffer[DS_KEY]
    assert got is job_list and len(got) == 1 and got[0] is a
    assert [t is a for t in te.quantization_state.global_scale_buffer[DS_KEY]] == [True]


def test_a_job_labelled_another_recipe_keeps_its_delayed_entries_for_the_delayed_steps(te):
    """The job's recipe label is its GEMMs' majority: a module of it may still run DelayedScaling."""
    a = torch.zeros(1)
    _register(te, a)
    keep = RecipeStates(nn.Linear(2, 2))
    keep.switch("DelayedScaling")  # the job's world: its entries stay
    assert _entries(te) == {DS_KEY: [a]}
    keep.switch("Float8CurrentScaling")
    assert _entries(te) == {}
    keep.restore_job()
    assert _entries(te) == {DS_KEY: [a]}


def test_the_state_holder_and_the_recompute_buffer_come_back_when_te_rebinds_them(te):
    held = te.quantization_state
    d = deque(["x"])
    held.fp8_tensors_recompute_buffer.append(d)
    with te_global.te_global_kept():
        te.quantization_state.fp8_tensors_recompute_buffer = [deque(["y"])]  # TE binds a new list
        d.append("z")
        te.reset()  # FP8GlobalStateManager.reset(): a new holder
        _register(te, torch.zeros(1))
    assert te.quantization_state is held
    assert held.fp8_tensors_recompute_buffer[0] is d and list(d) == ["x"]
    assert _entries(te) == {}


def test_nothing_is_done_without_te_loaded(monkeypatch):
    monkeypatch.delitem(sys.modules, "transformer_engine.pytorch.quantization", raising=False)
    monkeypatch.delitem(sys.modules, "transformer_engine.pytorch.fp8", raising=False)
    assert te_global.take() is None
    with te_global.te_global_kept():
        pass
    keep = RecipeStates(nn.Linear(2, 2))
    keep.switch("DelayedScaling")
    keep.restore_job()


def test_a_job_without_te_loaded_before_the_sweep_has_no_entry_after_it(te, monkeypatch):
    monkeypatch.delitem(sys.modules, "transformer_engine.pytorch.quantization")
    keep = RecipeStates(nn.Linear(2, 2))  # TE not imported yet
    monkeypatch.setitem(sys.modules, "transformer_engine.pytorch.quantization",
                        SimpleNamespace(FP8GlobalStateManager=te))  # the sweep's first FP8 step imports it
    keep.switch("DelayedScaling")
    _register(te, torch.zeros(1))
    keep.restore_job()
    assert _entries(te) == {}


class _DelayedJoiner(nn.Linear):
    """Joins TE's global buffers on its first DelayedScaling forward, as TE's modules do; records how many
    entries each step's autocast would update."""

    def __init__(self, fake, te):
        super().__init__(4, 4)
        self.fake, self.te, self.joined = fake, te, False
        seen: list[tuple[str, int]] = []
        self.record = lambda: seen  # behind a function: the sweep puts the job's containers back

    def forward(self, x):
        recipe = self.fake.stack[-1] if self.fake.stack else "BF16"
        if recipe == "DelayedScaling" and not self.joined:
            self.joined = True
            _register(self.te, torch.zeros(1))
        self.record().append((recipe, sum(map(len, self.te.quantization_state.global_amax_buffer.values()))))
        return super().forward(x)


def test_the_sweep_steps_of_other_recipes_update_no_delayed_entry(te, monkeypatch):
    sweep, fake = fake_te_sweep(monkeypatch)
    lin = _DelayedJoiner(fake, te)
    x = torch.randn(2, 4)
    res = sweep.run_sweep(lin, lambda: lin(x).sum(), ["BF16", "DelayedScaling", "Float8CurrentScaling"], steps=1,
                          warmup=1, rounds=2, budget_s=0, profile_kernels=False, job_recipe="Float8CurrentScaling")
    assert set(res.captures) == {"BF16", "DelayedScaling", "Float8CurrentScaling"} and not res.skipped
    seen = lin.record()
    assert {n for r, n in seen if r == "DelayedScaling"} == {1}
    assert {n for r, n in seen if r != "DelayedScaling"} == {0}
    assert _entries(te) == {}  # the job after the sweep


def test_the_in_fit_bench_puts_tes_global_buffers_back(te, monkeypatch, tmp_path):
    from te_gemm_callback.reporting import run as run_folder
    from te_gemm_callback.reporting.config import ReportConfig
    from te_gemm_callback.schedule.publish import Publishing

    a = torch.zeros(1)
    _register(te, a)
    monkeypatch.setattr(run_folder, "bench_and_report", lambda *a, **kw: _register(te, torch.ones(1)) or {})
    Publishing._bench_and_report(SimpleNamespace(report_config=ReportConfig(output_dir=tmp_path),
                                                 path=tmp_path / "c.json"))
    assert _entries(te) == {DS_KEY: [a]}


def _exit_update(te):
    """What every FP8 autocast's exit does, whatever its recipe: each registered history rolled and its
    scale recomputed, in place (reduce_and_update_fp8_tensors)."""
    q = te.quantization_state
    for key, hists in q.global_amax_history_buffer.items():
        for h, s in zip(hists, q.global_scale_buffer[key]):
            amax = float(h.max())
            h.copy_(torch.roll(h, -1, 0))
            h[0] = 0
            s.fill_(448.0 / amax if amax > 0 else float(s))


class _Recipe:  # TE's recipe objects: fp8_meta["recipe"] holds one, its class names the recipe
    def __init__(self, name):
        self.__class__ = type(name, (_Recipe,), {})


def _prepare_forward(m, te, recipe, state):
    """TE's prepare_forward for a recipe with DelayedScaling state: a new recipe builds new state objects,
    then add_fp8_tensors_to_global_buffer, which returns early once fp8_meta holds its buffer index."""
    m.fp8_meta.update(recipe=_Recipe(recipe), scaling_fwd=state)
    if "buffer_index_and_autocast_key" in m.fp8_meta:
        return
    q = te.quantization_state
    for name, t in (("global_amax_buffer", state.amax_history[0]), ("global_amax_history_buffer", state.amax_history),
                    ("global_scale_buffer", state.scale)):
        getattr(q, name).setdefault(DS_KEY, []).append(t)
    m.fp8_meta["buffer_index_and_autocast_key"] = [len(q.global_amax_buffer[DS_KEY]) - 1, DS_KEY]


def _ds_state():
    return SimpleNamespace(amax_history=torch.zeros(4, 1), scale=torch.ones(1))


def _te_module():
    m = nn.Linear(2, 2)
    m.fp8_meta = {}
    return m


def test_the_in_fit_bench_updates_none_of_the_jobs_delayed_scaling_values(te, monkeypatch, tmp_path):
    from te_gemm_callback.reporting import run as run_folder
    from te_gemm_callback.reporting.config import ReportConfig
    from te_gemm_callback.schedule.publish import Publishing

    job = _te_module()
    st = _ds_state()
    st.amax_history.copy_(torch.tensor([[0.0], [3.0], [100.0], [2.0]]))
    st.scale.fill_(4.48)
    _prepare_forward(job, te, "DelayedScaling", st)
    before = (st.amax_history.clone(), st.scale.clone())

    def bench(*a, **kw):  # four of the bench's FP8 autocasts exit
        for _ in range(4):
            _exit_update(te)
        return {}

    monkeypatch.setattr(run_folder, "bench_and_report", bench)
    Publishing._bench_and_report(SimpleNamespace(report_config=ReportConfig(output_dir=tmp_path),
                                                 path=tmp_path / "c.json"))
    assert torch.equal(st.amax_history, before[0]) and torch.equal(st.scale, before[1])
    assert te.quantization_state.global_amax_history_buffer[DS_KEY] == [st.amax_history]


def test_a_delayed_scaling_plan_after_delayed_scaling_joins_the_buffers_with_its_own_state(te):
    m = _te_module()
    keep = RecipeStates(m)
    keep.switch("BF16")
    keep.switch("DelayedScaling")
    ds = _ds_state()
    _prepare_forward(m, te, "DelayedScaling", ds)
    keep.switch("DelayedScaling plan")  # TE's CustomRecipe: new state objects
    plan = _ds_state()
    _prepare_forward(m, te, "CustomRecipe", plan)
    hist = te.quantization_state.global_amax_history_buffer[DS_KEY]
    assert any(h is plan.amax_history for h in hist)  # else the plan's scales never update
    keep.switch("DelayedScaling")  # DelayedScaling's own objects back, its index too: it does not join twice
    _prepare_forward(m, te, "DelayedScaling", ds)
    assert [h is ds.amax_history for h in te.quantization_state.global_amax_history_buffer[DS_KEY]].count(True) == 1


def test_the_jobs_own_delayed_module_does_not_join_twice(te):
    job = _te_module()
    ds = _ds_state()
    _prepare_forward(job, te, "DelayedScaling", ds)
    keep = RecipeStates(job)
    keep.switch("BF16")
    keep.switch("DelayedScaling")
    _prepare_forward(job, te, "DelayedScaling", ds)
    assert len(te.quantization_state.global_amax_history_buffer[DS_KEY]) == 1
