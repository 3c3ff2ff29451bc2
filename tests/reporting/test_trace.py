"""The kernels step as a Chrome trace (reporting/trace.py), from the kernel timeline a capture keeps.

CUDA kernel records need a GPU (torch.profiler's CUDA activity is CUPTI's), so the kernel recorder is
the one thing stood in for: a fake that hands the real profiler the KernelSteps CUPTI would give for
these steps (GEMM kernels between the job's other kernels, on two streams). Everything after it runs
as on a GPU: the step plan, the launch-order join, the timeline in the capture, the file and the trace.
"""

import json
import logging

import pytest
import torch
from helpers.fakes import Clock, FakeKernels
from helpers.models import MLP, run
from torch import nn

from te_gemm_callback import GemmCapture, GemmProfiler
from te_gemm_callback.capture import results
from te_gemm_callback.capture.kernel_profile import KernelStep, kernel_calls, kernel_records, split_at_marks
from te_gemm_callback.capture.kernels import classify_kernel, kernel_intervals
from te_gemm_callback.reporting.trace import TRACE_SCHEMA, gemm_name, no_trace_reason, trace_events, write_trace

MAIN, COMM = 7, 13  # the job's compute stream and its NCCL stream
# The job's other kernels, as CUDA names them, one of each category the breakdown knows.
OTHERS = ["void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>>",
          "fmha_cutlassF_f32_aligned_64x64_rf_sm80", "cast_transpose_kernel<float, __nv_fp8_e4m3>",
          "void layer_norm_fwd_kernel<float>"]
SPLIT_K = "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize64x64x8_execute_split_k_kernel__5x_cublas"


class TwoStreamKernels(FakeKernels):
    """A kernel recorder that returns, per marked step, what CUPTI records for ``gemms`` GEMM calls:
    before each GEMM kernel (stream 7) one of the job's other kernels; an NCCL all-reduce on stream
    13 overlapping the second half of the step; a split-K reduction after GEMM ``split_k``; the
    optimizer last. ``streams=False``: records that name no stream (a torch without them)."""

    def __init__(self, gemms, streams=True, split_k=2):
        super().__init__(gemms=gemms)
        self.with_streams, self.split_k = streams, split_k

    def stop(self):
        self.running = False
        ks, st, t = [], [], 100.0
        for step in range(self.marks + 1):  # the first: the warm-up step, before any marker
            if step:
                ks.append(("at::cuda::(anonymous namespace)::spin_kernel(long)", t, t + 2.0))
                st.append(MAIN)
            t0 = t
            for i in range(self.gemms):
                ks.append((OTHERS[i % len(OTHERS)], t + 3.0, t + 8.0))
                ks.append((f"nvjet_hsh_{i}_gemm", t + 10.0, t + 10.0 + (i + 1) * 10.0))
                st += [MAIN, MAIN]
                if i == self.split_k:
                    ks.append((SPLIT_K, t + 12.0 + (i + 1) * 10.0, t + 20.0 + (i + 1) * 10.0))
                    st.append(MAIN)
                t += 200.0
            ks.append(("ncclDevKernel_AllReduce_Sum_f32_RING_LL", t0 + (t - t0) / 2, t + 50.0))
            st.append(COMM)
            ks.append(("multi_tensor_apply_kernel<AdamFunctor<float>>", t + 60.0, t + 90.0))
            st.append(MAIN)
            t += 500.0
        order = sorted(range(len(ks)), key=lambda j: ks[j][1])
        ks, st = [ks[j] for j in order], [st[j] for j in order]
        return split_at_marks(ks, self.marks, st if self.with_streams else None)


class Shared(nn.Module):
    """MLP with one more layer run twice on the same shapes: its GEMMs run twice a step."""

    def __init__(self):
        super().__init__()
        self.mlp, self.sq = MLP(), nn.Linear(16, 16)

    def forward(self, x):
        return self.sq(torch.relu(self.sq(self.mlp(x))))


GEMMS = 12  # 4 forward calls (up, down, sq twice), a dgrad and a wgrad for each


def capture(streams=True, n=5, **kw):
    model, x, clock = Shared(), torch.randn(4, 16, requires_grad=True), Clock()
    cap, _ = run(GemmProfiler(model, kernel_profile=TwoStreamKernels(GEMMS, streams), clock=clock, **kw),
                 model, x, clock, n=n)
    return cap


def x_events(events):
    return [e for e in events if e["ph"] == "X"]


def tracks(events):
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    out = {}
    for e in x_events(events):
        out.setdefault(names[e["tid"]], []).append(e)
    return out


def check_chrome_events(events):
    """What Chrome's trace-event format requires of every event, and what a viewer needs to draw a
    track: ts non-negative and in order along it, events on it nested or apart, never half-overlapping."""
    assert events
    for e in events:
        assert {"name", "ph", "ts", "pid", "tid"} <= e.keys(), e
        assert e["ph"] in ("X", "M") and isinstance(e["name"], str) and e["ts"] >= 0
        if e["ph"] == "X":
            assert "dur" in e and e["dur"] >= 0, e
    for name, evs in tracks(events).items():
        ts = [e["ts"] for e in evs]
        assert ts == sorted(ts), name
        if name != "step":
            assert all(a["ts"] + a["dur"] <= b["ts"] for a, b in zip(evs, evs[1:])), name


def test_the_kernels_step_as_a_chrome_trace(tmp_path):
    cap = capture()
    assert cap.meta["kernel_join"] == "joined by launch order"
    tl = cap.kernel_timeline
    assert tl is not None and cap.steps[tl.step].kind == "kernels" and "kernel_timeline_cut" not in cap.meta
    # Every kernel of the marked step, none of the warm-up step's and not the marker.
    assert tl.total == len(tl.kernels) == 2 * GEMMS + 1 + 2
    path = write_trace(cap, tmp_path / "run" / "trace.json")
    doc = json.loads(path.read_text())
    assert doc["displayTimeUnit"] == "ms" and doc["schema"] == TRACE_SCHEMA
    events = doc["traceEvents"]
    check_chrome_events(events)
    assert events == trace_events(cap)
    by_track = tracks(events)
    assert set(by_track) == {"step", f"stream {MAIN}", f"stream {COMM}"}
    assert [e["cat"] for e in by_track[f"stream {COMM}"]] == ["communication"]
    # The step's span holds every kernel.
    [span] = by_track["step"]
    assert span["name"] == f"step {tl.step} (kernels)" and span["args"]["kernels"] == tl.total
    assert all(e["ts"] + e["dur"] <= span["ts"] + span["dur"] for e in x_events(events))
    # Every captured GEMM by its module, pass and precision, as many times as it ran in the step.
    names = [e["name"] for e in x_events(events)]
    want: dict[str, float] = {}
    for r in cap.records:
        want[gemm_name(r)] = want.get(gemm_name(r), 0) + r.calls_per_step
    assert len(want) == 6 + 3 and want["sq fprop fp32"] == 2
    assert {n: names.count(n) for n in want} == want
    gemm = next(e for e in x_events(events) if e["name"] == "mlp.up fprop fp32")
    up = next(r for r in cap.records if r.module == "mlp.up" and r.op == "fprop")
    assert gemm["cat"] == "gemm" and gemm["args"]["shape"] == f"{up.m} x {up.k} x {up.n}" == "4 x 16 x 48"
    assert gemm["args"]["flops"] == up.flops and gemm["args"]["step_kind"] == "kernels"
    assert gemm["args"]["batch"] == 1 and gemm["args"]["pass"] == "fprop" and gemm["args"]["stream"] == MAIN
    assert gemm["args"]["kernel"] == "nvjet_hsh_0_gemm"
    # The split-K reduction is the tail of its GEMM: named after it, as its second kernel.
    tail = next(e for e in x_events(events) if e["args"].get("kernel") == SPLIT_K)
    assert tail["name"].endswith("(kernel 2 of 2)") and tail["args"]["part"] == "2/2"
    # The job's other kernels are there too, each in its category.
    others = {e["cat"] for e in x_events(events) if e["cat"] not in ("gemm", "step")}
    assert others == {"attention", "quantization/cast", "norm", "communication", "optimizer", "other"}
    assert sum(e["cat"] == "gemm" for e in x_events(events)) == GEMMS + 1


def test_records_without_streams_give_one_track_with_overlaps_apart():
    cap = capture(streams=False)
    events = trace_events(cap)
    check_chrome_events(events)
    by_track = tracks(events)
    # The all-reduce overlaps the compute kernels after it: they go on a second lane of the one track.
    assert set(by_track) == {"step", "kernels (stream not recorded)", "kernels (stream not recorded) (overlapping, 2)"}
    kernels = [e for e in x_events(events) if e["cat"] != "step"]
    at = next(i for i, e in enumerate(kernels) if e["cat"] == "communication")
    assert kernels[at + 1]["ts"] < kernels[at]["ts"] + kernels[at]["dur"]
    assert kernels[at + 1]["tid"] != kernels[at]["tid"]
    assert all(r[3] is None for r in cap.kernel_timeline.kernels)


def test_the_timeline_survives_the_capture_file(tmp_path):
    cap = capture()
    back = GemmCapture.load(cap.save(tmp_path / "c.json"))
    assert back.kernel_timeline == cap.kernel_timeline and trace_events(back) == trace_events(cap)


def test_an_old_capture_without_a_timeline_loads_and_has_no_trace(tmp_path, caplog):
    cap = capture()
    data = cap.to_dict()
    del data["kernel_timeline"]  # what every capture before the field holds
    (tmp_path / "old.json").write_text(json.dumps(data))
    old = GemmCapture.load(tmp_path / "old.json")
    assert old.kernel_timeline is None and old.records == cap.records
    assert "kernel_timeline" not in old.to_dict()  # nor does saving it again add one
    caplog.set_level(logging.INFO, "te_gemm_callback")
    assert write_trace(old, tmp_path / "trace.json") is None and not (tmp_path / "trace.json").exists()
    assert "older capture file" in no_trace_reason(old)
    assert any("no kernel trace" in r.getMessage() and "\n" not in r.getMessage() for r in caplog.records)


def test_a_capture_without_kernel_records_gives_no_trace_and_says_why(tmp_path, caplog):
    caplog.set_level(logging.INFO, "te_gemm_callback")
    model, x, clock = MLP(), torch.randn(4, 16, requires_grad=True), Clock()
    cpu, _ = run(GemmProfiler(model, clock=clock), model, x, clock, n=3)  # a CPU job: no kernels step
    assert cpu.kernel_timeline is None and trace_events(cpu) == []
    assert write_trace(cpu, tmp_path / "trace.json") is None and not (tmp_path / "trace.json").exists()
    assert "CPU job" in no_trace_reason(cpu)
    assert [r.getMessage() for r in caplog.records if "no kernel trace" in r.getMessage()] == \
        [f"te-gemm: no kernel trace: {no_trace_reason(cpu)}"]
    # A kernels step whose GEMM kernels did not match the captured calls: nothing to name them by.
    odd, _ = run(GemmProfiler(model, kernel_profile=FakeKernels(gemms=7), clock=clock), model, x, clock, n=3)
    assert odd.kernel_timeline is None and "not joined" in no_trace_reason(odd)


def test_a_long_step_keeps_the_first_kernels_and_says_so(monkeypatch, tmp_path):
    monkeypatch.setattr(results, "MAX_TIMELINE_KERNELS", 10)
    cap = capture()
    tl = cap.kernel_timeline
    assert len(tl.kernels) == 10 and tl.total == 2 * GEMMS + 3
    assert cap.meta["kernel_timeline_cut"] == (f"the kernels step ran {tl.total} kernels; its timeline keeps the "
                                               "first 10 by start")
    events = trace_events(GemmCapture.load(cap.save(tmp_path / "c.json")))
    check_chrome_events(events)
    assert len([e for e in x_events(events) if e["cat"] != "step"]) == 10


def test_a_timeline_that_does_not_fit_is_dropped_not_the_capture(tmp_path, caplog):
    data = capture().to_dict()
    data["kernel_timeline"]["kernels"][1][4] = len(data["records"])  # a record past the last
    (tmp_path / "c.json").write_text(json.dumps(data))
    back = GemmCapture.load(tmp_path / "c.json")
    assert back.kernel_timeline is None and len(back.records) == len(data["records"])
    assert any("kernel timeline is dropped" in r.getMessage() for r in caplog.records)
    # A field of the wrong type is a damaged file, as anywhere else in it.
    data["kernel_timeline"]["kernels"][1][4] = "x"
    (tmp_path / "c.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"kernel_timeline\.kernels\[1\]\[4\]"):
        GemmCapture.load(tmp_path / "c.json")


def test_write_trace_never_overwrites_a_file_that_is_not_ours(tmp_path):
    cap = capture()
    theirs = tmp_path / "trace.json"
    theirs.write_text(json.dumps({"traceEvents": [], "schemaVersion": 1}))  # e.g. torch.profiler's own
    with pytest.raises(ValueError, match="refusing to overwrite"):
        write_trace(cap, theirs)
    assert json.loads(theirs.read_text()) == {"traceEvents": [], "schemaVersion": 1}
    ours = write_trace(cap, tmp_path / "ours.json")
    assert write_trace(cap, ours) == ours  # a trace of ours is replaced


def test_split_at_marks_keeps_each_kernels_stream_and_the_step_start():
    ks = [("warm_gemm", 0, 1), ("spin_kernel", 2, 3), ("a_gemm", 4, 5), ("spin_kernel", 6, 7), ("b_gemm", 8, 9)]
    a, b = split_at_marks(ks, 2, [1, 1, 2, 1, 3])
    assert (a.kernels, a.streams, a.start) == ([("a_gemm", 4, 5)], [2], 2)
    assert (b.kernels, b.streams, b.start) == ([("b_gemm", 8, 9)], [3], 6)
    assert split_at_marks(ks, 2)[0].streams == []  # streams not known


def test_kernel_calls_gives_each_kernel_its_call():
    step = KernelStep([("a_gemm", 0.0, 100.0), ("x", 100, 101), (SPLIT_K, 101.0, 110.0),
                       ("e0_gemm", 200.0, 400.0), ("e1_gemm", 250.0, 500.0), ("b_gemm", 800.0, 900.0)])
    assert kernel_calls(["a", "grouped", "b"], step, [(1,), (2, 1), (1,)]) == [0, None, 0, 1, 1, 2]
    assert kernel_calls(["a", None, "grouped", "b"], step, [(1,), (1,), (1,), (1,)]) == [0, None, 0, 1, 2, 3]
    assert kernel_calls(["a", "b"], step) is None
    assert classify_kernel(SPLIT_K) == "gemm"


def test_kernel_records_read_each_kernels_stream_from_the_raw_records():
    # The same records as kernel_intervals, with the resource each ran on (a CUDA kernel's stream;
    # on this CPU-only machine, CPU activity and its thread stand in).
    from types import SimpleNamespace

    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(32, 32)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(5):
            (x @ x).relu()
    recs = kernel_records(prof, "CPU")
    assert [r[:3] for r in recs] == kernel_intervals(prof, "CPU") and len(recs) >= 10
    assert all(isinstance(r[3], int) for r in recs)
    stand_in = SimpleNamespace(events=prof.events)  # no raw records: streams unknown
    assert all(r[3] is None for r in kernel_records(stand_in, "CPU"))
