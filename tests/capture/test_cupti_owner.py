"""Another profiler owns CUPTI: Nsight Systems, Nsight Compute, another injection, the job's own
torch.profiler. The capture recognises it from what each tool sets in the process (the variables
below are those nsys and ncu 2025.3.1 set on the H200 host, read 2026-12-02), times GEMMs by
events instead of kernel records, says so in one line, and never reports records "lost".

A stand-in kernel recorder plays torch.profiler's CUDA activity, which cannot run without a GPU:
under an owner it must never be started."""

import contextlib
import logging
import sys
import uuid
from types import SimpleNamespace

import pytest
import test_te_adapter_mock
import torch
from helpers.fakes import Clock, FakeKernels
from helpers.models import MLP, run
from helpers.scripts import benchmark

from te_gemm_callback import GemmProfiler, torch_cuda
from te_gemm_callback.capture.cupti import EVENTS, NONE, cupti_owner
from te_gemm_callback.capture.kernel_profile import KernelProfile

NSYS_TOOLS = "/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64"


def nsys_env(session: str) -> dict[str, str]:
    """What `nsys profile -t cuda,nvtx` set for python on the H200 host (the ones that matter)."""
    return {"NSYS_PROFILING_SESSION_ID": session,
            "CUDA_INJECTION64_PATH": f"{NSYS_TOOLS}/libToolsInjection64.so",
            "NVTX_INJECTION64_PATH": f"{NSYS_TOOLS}/libToolsInjection64.so",
            "LD_PRELOAD": f"{NSYS_TOOLS}/libToolsInjectionProxy64.so", "QUADD_INJECTION_PROXY": "NVTX"}


NCU_ENV = {"NV_COMPUTE_PROFILER_PERFWORKS_DIR":
           "/opt/nvidia/nsight-compute/2025.3.1/target/linux-desktop-glibc_2_11_3-x64/.",
           "NV_TPS_LAUNCH_TOKEN": "Interactive Profile", "NV_NSIGHT_INJECTION_TRANSPORT_TYPE": "uds",
           "NV_CUDA_START_SUSPENDED": "1"}
OWNER_VARS = ("NSYS_PROFILING_SESSION_ID", "NV_COMPUTE_PROFILER_PERFWORKS_DIR", "NV_TPS_LAUNCH_TOKEN",
              "CUDA_INJECTION64_PATH", "CUDA_INJECTION32_PATH")


@pytest.fixture
def no_owner(monkeypatch):
    for var in OWNER_VARS:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def never():
    return False


def test_each_tool_is_recognised_from_its_environment():
    nsys = cupti_owner(nsys_env("10558"), never)
    assert (nsys.name, nsys.timing, nsys.evidence) == ("Nsight Systems", EVENTS, "NSYS_PROFILING_SESSION_ID=10558")
    ncu = cupti_owner(NCU_ENV, never)
    assert (ncu.name, ncu.timing) == ("Nsight Compute", NONE)
    # nsys's injection library alone (a session variable stripped by a launcher) still names it.
    assert cupti_owner({"CUDA_INJECTION64_PATH": f"{NSYS_TOOLS}/libToolsInjection64.so"}, never).name == \
        "Nsight Systems"
    other = cupti_owner({"CUDA_INJECTION64_PATH": "/opt/tool/libmytracer.so"}, never)
    assert other.name == "a CUPTI tool (libmytracer.so)" and other.timing == EVENTS
    assert cupti_owner({"NVTX_INJECTION64_PATH": "/x/libnvtx_tool.so", "PATH": "/usr/bin"}, never) is None
    assert cupti_owner({}, never) is None
    assert cupti_owner({}, lambda: True).name == "torch.profiler"


def test_nsys_sampling_cpus_is_said_in_the_line_that_names_it(tmp_path):
    # nsys's session folder, as nsys 2025.3.1 left it for the process it launched on the H200 host:
    # a linuxperf entry with nsys's defaults (or -s none alone), none with -s none --cpuctxsw=none.
    env = {**nsys_env("10571"), "NSYS_SESSION_TEMP_DIR": str(tmp_path)}
    for entry in ("injection_files", "streams", "profiled_process_pids.txt"):
        (tmp_path / entry).mkdir()
    quiet = cupti_owner(env, never)
    assert quiet.note == "" and "linuxperf" not in quiet.line()
    (tmp_path / "linuxperf").mkdir()
    loud = cupti_owner(env, never)
    assert "-s none --cpuctxsw=none" in loud.line() and loud.line().startswith(quiet.line() + "; ")
    assert loud.meta() == quiet.meta()  # the capture file keeps who profiles, not the advice
    assert cupti_owner({**NCU_ENV, "NSYS_SESSION_TEMP_DIR": str(tmp_path)}, never).note == ""


def test_a_running_torch_profiler_is_seen(no_owner):
    # The real autograd profiler state, not a stand-in: the job's own session on the CPU.
    assert cupti_owner() is None
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        assert cupti_owner().name == "torch.profiler"
    assert cupti_owner() is None


def kernel_warnings(caplog):
    return [r.getMessage() for r in caplog.records if "kernel records" in r.getMessage() or "lost" in r.getMessage()]


def test_under_nsys_the_kernels_steps_run_instrumented_and_events_time_every_gemm(no_owner, caplog):
    session = uuid.uuid4().hex[:8]  # a line said once per process: a new session id says it again
    for k, v in nsys_env(session).items():
        no_owner.setenv(k, v)
    model, x, clock, kp = MLP(), torch.randn(4, 16, requires_grad=True), Clock(), FakeKernels()
    with caplog.at_level(logging.WARNING, logger="te_gemm_callback"):
        prof = GemmProfiler(model, kernel_profile=kp, clock=clock)
        cap, seen = run(prof, model, x, clock, n=5)
    # As many steps as planned (1 instrumented, 1 warm-up, 1 kernels, 1 settle, then clean): the
    # warm-up, kernels and settle steps run instrumented (no records' sync to settle after).
    assert [s.kind for s in cap.steps] == ["instrumented"] * 4 + ["clean"]
    assert kp.started == 0  # CUPTI is nsys's: our records never start
    assert all(len(r.times_ms) == 4 for r in cap.records)  # one time per instrumented step
    assert cap.meta["gemm_time_source"] == "host_clock"  # CUDA events on a GPU; the host clock here
    assert cap.meta["cupti_owner"] == f"Nsight Systems (NSYS_PROFILING_SESSION_ID={session})"
    assert cap.meta["kernel_join"].startswith("no kernel records: Nsight Systems holds CUPTI")
    said = [r.getMessage() for r in caplog.records if session in r.getMessage()]
    assert len(said) == 1 and "CUDA events around each GEMM" in said[0]
    assert [m for m in kernel_warnings(caplog) if session not in m] == []  # no "lost", no second line


def test_under_ncu_no_gemm_is_timed_and_shapes_stay(no_owner, caplog):
    for k, v in NCU_ENV.items():
        no_owner.setenv(k, v)
    no_owner.setenv("NV_TPS_LAUNCH_TOKEN", uuid.uuid4().hex)  # a fresh line for this test
    model, x, clock, kp = MLP(), torch.randn(4, 16, requires_grad=True), Clock(), FakeKernels()
    with caplog.at_level(logging.WARNING, logger="te_gemm_callback"):
        cap, _ = run(GemmProfiler(model, kernel_profile=kp, clock=clock), model, x, clock, n=4)
    assert kp.started == 0 and len(cap.records) == 6
    assert all(r.times_ms == [] for r in cap.records) and cap.meta["timing"] == "none"
    assert "no GEMM is timed" in cap.meta["kernel_join"]
    said = [r.getMessage() for r in caplog.records if "Nsight Compute" in r.getMessage()]
    assert len(said) == 1 and "replays the kernels" in said[0]


def test_a_torch_profiler_started_after_construction_is_seen_at_start(no_owner, caplog):
    model, x, clock, kp = MLP(), torch.randn(4, 16, requires_grad=True), Clock(), FakeKernels()
    prof = GemmProfiler(model, kernel_profile=kp, clock=clock)
    assert prof.plan.kernels == 1 and prof.cupti is None
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        cap, _ = run(prof, model, x, clock, n=5)
    assert kp.started == 0 and cap.meta["cupti_owner"].startswith("torch.profiler")
    assert [s.kind for s in cap.steps] == ["instrumented"] * 4 + ["clean"]
    # The next capture, with the job's session closed, plans its kernels step again.
    cap2, _ = run(prof, model, x, clock, n=5)
    assert kp.started == 1 and cap2.meta["cupti_owner"] is None and cap2.meta["gemm_time_source"] == "kernel_records"


def test_the_kernel_recorder_does_not_fight_the_jobs_torch_profiler(no_owner):
    kp = KernelProfile()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        assert kp.start() is False
    assert "torch.profiler" in kp.error and not kp.running


class Range:
    """cudaProfilerStart/Stop as the profiler calls them (torch.cuda.profiler), with the step open."""

    def __init__(self):
        self.calls, self.prof = [], None

    def start(self):
        self.calls.append(("start", self.prof._steps[-1].kind if self.prof._steps else None))

    def stop(self):
        self.calls.append(("stop", self.prof._steps[-1].kind))


def test_nsys_capture_brackets_the_profiled_steps_until_the_capture_is_built(no_owner, monkeypatch):
    model, x, clock = MLP(), torch.randn(4, 16, requires_grad=True), Clock()
    prof = GemmProfiler(model, kernel_profile=FakeKernels(), clock=clock, nsys_capture=True)
    prof._range_api = rng = Range()  # a CPU has no CUDA profiler API to call
    rng.prof = prof
    built = []
    import te_gemm_callback.capture.profiler as profiler

    real_build = profiler.build_capture
    monkeypatch.setattr(profiler, "build_capture", lambda p: built.append(len(rng.calls)) or real_build(p))
    run(prof, model, x, clock, n=6)
    # Started before the first step opened; stopped after the capture was built, never inside a
    # step: nsys's default range end stops the job at the Stop, so nothing may be left to compute.
    assert rng.calls == [("start", None), ("stop", "clean")] and built == [1] and not prof._range_open


def test_a_held_range_ends_when_the_caller_says(no_owner):
    model, x, clock = MLP(), torch.randn(4, 16, requires_grad=True), Clock()
    prof = GemmProfiler(model, kernel_profile=FakeKernels(), clock=clock, nsys_capture="held")
    prof._range_api = rng = Range()
    rng.prof = prof
    run(prof, model, x, clock, n=3)
    assert [c[0] for c in rng.calls] == ["start"]
    prof.end_nsys_range()
    prof.end_nsys_range()  # once only
    assert [c[0] for c in rng.calls] == ["start", "stop"]


def test_the_callback_ends_the_range_once_the_capture_file_is_written(no_owner, tmp_path):
    # Lightning fit: the Stop comes after gemm_capture.json exists (nsys may end the job there).
    import pytorch_lightning as pl
    from helpers.lightning import DemoTransformer

    from te_gemm_callback import GemmProfilerCallback
    from te_gemm_callback.capture import profiler as profiler_module

    seen = []

    class Api:
        def start(self):
            seen.append(("start", (tmp_path / "gemm" / "gemm_capture.json").exists()))

        def stop(self):
            seen.append(("stop", (tmp_path / "gemm" / "gemm_capture.json").exists()))

    real_init = profiler_module.GemmProfiler.__init__

    def init(self, *a, **kw):
        real_init(self, *a, **kw)
        if kw.get("nsys_capture"):
            self._range_api = Api()

    no_owner.setattr(profiler_module.GemmProfiler, "__init__", init)
    cb = GemmProfilerCallback(wait=1, warmup=1, active=3, output_dir=tmp_path / "gemm", verbose=False,
                              nsys_capture=True, sweep=None, report=False)
    trainer = pl.Trainer(max_steps=7, accelerator="cpu", callbacks=[cb], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)
    trainer.fit(DemoTransformer())
    assert seen == [("start", False), ("stop", True)]


def test_dispatch_step_event_times_give_way_to_lighter_steps():
    # The dispatch mode costs Python time per aten op: its event pairs can hold GPU idle time.
    from te_gemm_callback.capture.capture_file import GemmEvent
    from te_gemm_callback.capture.results import _prefer_light_steps
    from te_gemm_callback.shapes import GemmOp

    def ev(step, ms, module="a"):
        return GemmEvent(module=module, gemm="", op=GemmOp.FPROP, m=4, k=4, n=4, precision="bf16",
                         operands=(), source="te", kernel="general_gemm", module_type="Linear", step=step, time_ms=ms)

    evs = [ev(0, 1.3), ev(1, 1.0), ev(2, 1.01), ev(0, 2.0, "lm_head")]
    _prefer_light_steps(evs, {0})
    assert [e.time_ms for e in evs] == [None, 1.0, 1.01, 2.0]  # lm_head was timed on step 0 only: kept


def _lit_len(n: int) -> tuple[int, bytes]:
    """An LZ4 length field: the token's nibble and the bytes after it (255s, then the rest)."""
    if n < 15:
        return n, b""
    n -= 15
    return 15, b"\xff" * (n // 255) + bytes([n % 255])


def test_the_recorded_file_reader_expands_lz4_back_references():
    # nsys stores its event stream LZ4-compressed: a range name sharing a prefix with an earlier one
    # is a back-reference, not a string. Hand-encoded per the LZ4 block format.
    nc = benchmark("nsys_check")
    pad = bytes(range(256)) * 20  # 5120 literal bytes: a run the reader keeps (over 4 KiB)
    first = b"blocks.0.fc1 fprop 8x8x8 bf16|"
    hi, ext = _lit_len(len(pad) + len(first))
    seq1 = bytes([hi << 4 | 3]) + ext + pad + first + (30).to_bytes(2, "little")  # match "blocks." (7)
    seq2 = bytes([1 << 4 | 15]) + b"1" + (30).to_bytes(2, "little") + bytes([2])  # match 21 bytes, 4+15+2
    data = b"header" + seq1 + seq2 + b"\x00"
    text = nc.lz4_expand(data)
    assert b"blocks.1.fc1 fprop 8x8x8 bf16" in text and b"blocks.1.fc1 fprop" not in data
    assert text.endswith(first + b"blocks.1.fc1 fprop 8x8x8 bf16")


@pytest.mark.parametrize("capturing", [False, True])
def test_a_start_event_waits_behind_a_spin(monkeypatch, capturing):
    # The CUDA calls are stand-ins (no GPU here); what is checked is which of them the timer makes,
    # in which order: a spin before every start event, none inside a graph capture, none when off.
    # tests/test_gpu.py times real GEMMs against their kernel records.
    from te_gemm_callback.capture import instruments

    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing)
    monkeypatch.setattr(torch_cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: calls.append(("spin", cycles)))
    monkeypatch.setattr(instruments, "_record", lambda: calls.append(("event",)) or len(calls))
    timer = instruments.EventTimer(True)
    timer.stop(timer.start())
    assert calls == ([] if capturing else [("spin", instruments.LEAD_CYCLES)]) + [("event",), ("event",)]
    calls.clear()
    instruments.EventTimer(True, lead=False).start()
    assert calls == [("event",)]


def test_the_spin_runs_only_where_event_pairs_give_the_gemm_times(no_owner, monkeypatch):
    # With kernels steps planned, the first step's pairs are a fallback: no spin. Under nsys the
    # pairs are the times: a spin on every instrumented step.
    for env, want in (({}, {False}), (nsys_env(uuid.uuid4().hex[:8]), {True})):
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        model, leads = MLP(), set()
        with GemmProfiler(model, instrumented_steps=2, kernel_profile=FakeKernels()) as prof:
            for i in range(4):
                model(torch.randn(4, 16)).sum().backward()
                leads.add(prof.recorder.timer.lead)
                if i < 3:
                    prof.step()
        assert leads == want, (env, leads)


fake_te = test_te_adapter_mock.fake_te  # the TE stand-in's fixture, shared


class _Event:
    """A CUDA event stand-in: every pair reads ``_Event.ms``."""

    ms = 0.0

    def elapsed_time(self, end: object) -> float:
        return _Event.ms


class _GateGPU:
    """The gate kernel as the GPU runs it, in Python: a launch is queued, and runs (reads the host's
    slot, writes what it saw) when the test says the GPU gets there; one that finds its slot short
    has given up."""

    def __init__(self) -> None:
        self.queued: list[tuple] = []

    def __call__(self, flag, flag_slot, want, seen, seen_slot, timeout_ns) -> None:
        self.queued.append((flag, flag_slot, want, seen, seen_slot))

    def run(self) -> None:
        import ctypes

        for flag, flag_slot, want, seen, seen_slot in self.queued:
            v = ctypes.c_int32.from_address(flag.data_ptr() + 4 * flag_slot).value
            seen[seen_slot] = want if v >= want else -want
        self.queued.clear()


def cpu_gate():
    """The real HostGate, its slots in CPU memory and its kernel the stand-in above (no GPU here);
    whoever reads what a gate saw reads it after the GPU reached every queued gate (a sync)."""
    from te_gemm_callback.capture.gate import HostGate

    gpu = _GateGPU()

    class OnCPU(HostGate):
        def held(self, n):
            gpu.run()
            return super().held(n)

    return OnCPU(device="cpu", kernel=gpu, pinned=False), gpu


def test_each_gate_opens_on_its_own_slot_and_one_that_gave_up_is_told(monkeypatch):
    # The host side of the real HostGate (numbers, slots, what the gate saw); the kernel and the GPU
    # are a Python stand-in that runs each queued gate when told. tests/test_gpu.py runs the kernel.
    from te_gemm_callback.capture import gate as gate_mod

    monkeypatch.setattr(gate_mod, "SEEN_SLOTS", 8)  # small, to wrap
    g, gpu = cpu_gate()
    a, b = g.close(), g.close()  # two threads' gates, say backward's and the main thread's
    g.open(b)  # b's host is first: that must not open a
    gpu.run()
    assert g.held(b) and not g.held(a)  # a gave up before its host's word
    g.open(a)
    c = g.close()
    g.open(c)
    assert g.held(c)
    for _ in range(8):  # a later gate on a's slot of what-it-saw: a stays not held, never guessed held
        n = g.close()
        g.open(n)
    assert not g.held(a) and g.held(n)


def test_a_gated_pair_opens_after_its_end_event_drops_when_its_gate_gave_up_and_loses_its_floor(monkeypatch):
    # Stand-ins for the CUDA calls (no GPU here) around the real HostGate's host side: the order the
    # timer makes its calls in, which pairs it keeps, and the floor it takes off.
    from te_gemm_callback.capture import instruments

    calls = []
    g, gpu = cpu_gate()
    launch = g._kernel
    g._kernel = lambda *a: (calls.append(("gate", a[2])), launch(*a))
    opened = g.open
    g.open = lambda n: (calls.append(("open", n)), opened(n))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(torch_cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: calls.append(("spin", cycles)))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    monkeypatch.setattr(instruments, "_record", lambda: calls.append(("event",)) or _Event())
    monkeypatch.setattr(instruments, "_fill_target", lambda: SimpleNamespace(zero_=lambda: calls.append(("fill",))))
    monkeypatch.setattr(_Event, "ms", 0.0)
    timer = instruments.EventTimer(True)
    timer.gates = {0: g}
    n0 = g.close() + 1  # the numbers the timer's gates will take
    g.open(n0 - 1)
    calls.clear()
    first = timer.stop(timer.start())
    # Opened only once the end event is queued: a short GEMM could otherwise end before it.
    assert calls == [("gate", n0), ("event",), ("event",), ("open", n0)]
    gpu.run()
    second = timer.start()  # the GPU reaches this gate before its host's word: it gives up
    gpu.run()
    second = timer.stop(second)
    _Event.ms = 0.003
    calls.clear()
    timer.calibrate()  # pairs around a fill kernel behind the same gate, none behind a spin
    assert calls[:4] == [("gate", n0 + 2), ("event",), ("fill",), ("event",)] and calls[4][0] == "open"
    assert timer.floors == {0: pytest.approx(0.003)} and not any(c[0] == "spin" for c in calls)
    _Event.ms = 0.050
    assert timer.read(first) == (pytest.approx(0.050 - 0.003), None)
    assert timer.read(second) == (None, "gave up")  # the host's time may be in it
    _Event.ms = 0.002  # no longer than the floor: no time, and said why (never 0, never the raw pair)
    assert timer.read(first) == (None, "below floor")
    assert timer.leads == {"gate"}
    # A device without a gate: the spin leads its pairs.
    monkeypatch.setattr(torch_cuda, "current_device", lambda: 1)
    calls.clear()
    timer.stop(timer.start())
    assert calls[0] == ("spin", instruments.LEAD_CYCLES) and timer.leads == {"gate", "spin"}
    # Blocking launches: nothing leads (the launch returns once the GEMM is done).
    monkeypatch.setenv("CUDA_LAUNCH_BLOCKING", "1")
    timer.prepare([0])
    calls.clear()
    timer.stop(timer.start())
    assert calls == [("event",), ("event",)]


def test_a_dropped_pair_is_counted_against_its_step():
    # Recorder.resolve: a pair whose time came back None (its gate gave up) counts against its step,
    # whose GEMM total the capture then leaves out rather than sum short (results.py).
    from te_gemm_callback.capture.recorder import GemmSite, Recorder
    from te_gemm_callback.shapes import GemmOp

    class Timer:
        cuda, kind = False, "host_clock"

        def read(self, pair):
            why = {None: None, "gave up": "gave up", "tiny": "below floor"}
            return (1.0, None) if pair not in why else (None, why[pair])

    rec = Recorder(scope=None, timer=Timer(), nvtx=None)
    site = GemmSite(module="fc", gemm="", op=GemmOp.FPROP, m=4, k=8, n=16, batch=1, precision="fp32",
                    operands=(), source="torch", kernel="aten.mm", module_type="Linear")
    rec.raw += [(0, site, False, None, "ok"), (1, site, False, None, "gave up"), (1, site, False, None, "ok"),
                (2, site, False, None, None), (2, site, False, None, "tiny")]
    rec.resolve()
    assert rec.dropped == {1: 1} and [e.time_ms for e in rec.events] == [1.0, None, 1.0, None, None]
    assert rec.below_floor == 1  # too short to time: counted, its step's total kept


def test_without_triton_no_gate_is_built_the_spin_stands_in_and_it_is_said_once(monkeypatch, caplog):
    # No Triton on this CPU machine, as on a host whose torch lacks it: the gate's kernel cannot be
    # imported. The device lookup is a stand-in (no GPU here).
    from te_gemm_callback.capture import gate, instruments

    monkeypatch.setattr(gate, "_GATES", {})
    monkeypatch.setitem(sys.modules, "triton", None)  # import triton -> ImportError
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch_cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    with caplog.at_level(logging.WARNING, logger="te_gemm_callback"):
        timers = [instruments.EventTimer(True) for _ in range(2)]
        for t in timers:
            t.prepare()
    assert [t.gates for t in timers] == [{0: None}, {0: None}]
    said = [r.getMessage() for r in caplog.records if "no GPU gate" in r.getMessage()]
    assert len(said) == 1 and "pip install triton" in said[0] and "spin stands in" in said[0], said


def test_under_nsys_gemms_outside_te_get_a_second_dispatch_step_only_where_there_are_some(no_owner, fake_te):
    # A TE model's plain nn.Linear head is timed only on dispatch steps (TE GEMMs on the light ones):
    # under nsys one more step runs the dispatch mode, for two pairs rather than one; a model
    # whose GEMMs are all TE's keeps one dispatch step (the mode costs host time on every aten op).
    from torch import nn

    for k, v in nsys_env(uuid.uuid4().hex[:8]).items():
        no_owner.setenv(k, v)
    lin, _ = fake_te
    for head, want in ((False, [True, False, False, False]), (True, [True, True, False, False])):
        model, x, clock = test_te_adapter_mock._te_net(lin), torch.randn(4, 16, requires_grad=True), Clock()
        if head:
            model.add_module("head", nn.Linear(48, 10))
        cap, _ = run(GemmProfiler(model, kernel_profile=FakeKernels(), clock=clock), model, x, clock, n=5)
        assert [s.kind for s in cap.steps] == ["instrumented"] * 4 + ["clean"]
        assert [s.dispatch for s in cap.steps[:4]] == want, head
        for r in cap.records:
            # TE GEMMs: a time per instrumented step (host-clock pairs here; with CUDA events only the
            # light steps' are kept, results._prefer_light_steps); the head's: the dispatch steps'.
            assert len(r.times_ms) == (2 if r.source == "torch" else 4) and r.calls_per_step == 1, r
        assert {r.source for r in cap.records} == ({"te", "torch"} if head else {"te"})
    # One more dispatch step whatever the settle steps; none where nothing is timed.
    model, x, clock = test_te_adapter_mock._te_net(lin), torch.randn(4, 16, requires_grad=True), Clock()
    model.add_module("head", nn.Linear(48, 10))
    for kw, want in (({"settle_steps": 3}, [True, True] + [False] * 4), ({"timing": "none"}, [True])):
        prof = GemmProfiler(model, kernel_profile=FakeKernels(), clock=clock, **kw)
        cap, _ = run(prof, model, x, clock, n=len(want) + 1)
        assert [s.dispatch for s in cap.steps if s.kind == "instrumented"] == want, kw


def test_gemms_timed_on_dispatch_steps_only_are_named_and_the_report_says_so():
    # Under nsys a TE model's plain lm_head has times from the dispatch-mode steps only, its TE
    # GEMMs from the light steps (the dispatch-step pairs of those dropped): the capture names the
    # former, and report.md's capture conditions say they are the least certain, with the pairs
    # dropped and a spin that stood in for the gate.
    from te_gemm_callback.capture.capture_items import GemmEvent
    from te_gemm_callback.capture.results import _prefer_light_steps
    from te_gemm_callback.reporting.markdown import _event_pair_notes
    from te_gemm_callback.shapes import GemmOp

    def ev(step, module, op, source, ms):
        return GemmEvent(step=step, module=module, gemm="", op=op, m=8, k=8, n=8, source=source, time_ms=ms)

    events = [ev(s, "blocks.0.qkv", GemmOp.FPROP, "te", 1.0 + s) for s in range(4)]
    events += [ev(s, "lm_head", op, "torch", 0.04) for s in (0, 1) for op in (GemmOp.FPROP, GemmOp.DGRAD)]
    only = _prefer_light_steps(events, dispatch_steps={0, 1})
    assert only == ["lm_head dgrad", "lm_head fprop"]
    assert [e.time_ms for e in events[:4]] == [None, None, 3.0, 4.0]  # TE: the light steps' pairs
    assert all(e.time_ms == 0.04 for e in events[4:])
    # Every instrumented step a dispatch step (a model without TE): nothing to single out.
    assert _prefer_light_steps([ev(0, "fc", GemmOp.FPROP, "torch", 0.1)], dispatch_steps={0}) == []
    notes = _event_pair_notes({"lead": "gate+spin", "dropped": 2, "below_floor": 3, "dispatch_steps_only": only})
    assert len(notes) == 4 and notes[0].startswith("lm_head dgrad, lm_head fprop: timed on the dispatch-mode steps")
    assert "2 event pair(s) dropped" in notes[1] and notes[2].startswith("some event pairs behind a 50 us spin")
    assert notes[3].startswith("3 GEMM call(s) shorter than the event pairs' floor")
    assert _event_pair_notes({"lead": "gate", "dropped": 0, "dispatch_steps_only": []}) == []


@pytest.mark.parametrize("bad, where", [("x", "meta.event_pairs:"), ({"lead": 3}, "meta.event_pairs.lead:"),
                                        ({"dispatch_steps_only": "lm_head"}, "meta.event_pairs.dispatch_steps_only:")])
def test_a_capture_with_a_malformed_event_pairs_entry_is_refused_in_one_line(tmp_path, bad, where):
    # A hand-edited or foreign capture: refused on load with the field named, never a crash in report.md.
    import json
    from pathlib import Path

    from te_gemm_callback import GemmCapture

    d = json.loads((Path(__file__).parents[2] / "docs/results/h200/dense/gemm_capture.json").read_text())
    d["meta"]["event_pairs"] = bad
    (tmp_path / "cap.json").write_text(json.dumps(d))
    with pytest.raises(ValueError, match=where.replace(".", r"\.")) as err:
        GemmCapture.load(tmp_path / "cap.json")
    assert "\n" not in str(err.value)


def test_nsys_projection_puts_each_gemm_range_in_its_step_and_skips_dispatch_steps():
    # nsys's nvtx_gpu_proj_trace rows, written by hand (nsys cannot run here) with the header nsys
    # 2025.3.1 wrote: two steps, the first a dispatch-mode step; one TE GEMM timed on both, one torch
    # GEMM only the dispatch step saw; another process's step, another tool's ranges, a range
    # without GPU work and one outside every step.
    from te_gemm_callback.analysis import nsys as np

    head = ("Name", "Projected Start (ns)", "Projected Duration (ns)", "Orig Start (ns)", "Orig Duration (ns)",
            "Style", "PID", "TID")
    rows = [dict(zip(head, r)) for r in [
        ("te_gemm:step 0 (instrumented)", "0", "900", "0", "1000", "PushPop", "7", "7"),  # nsys's domain prefix
        ("te_gemm: fc1 fprop 8x8x8 bf16", "20", "300", "10", "5", "StartEnd", "7", "7"),  # torch.cuda.nvtx's
        ("te_gemm:lm_head fprop 8x8x4 bf16", "40", "50", "30", "5", "StartEnd", "7", "9"),  # autograd's thread
        ("te_gemm:step 1 (kernels)", "1000", "900", "1000", "1000", "PushPop", "7", "7"),
        ("step 2 (clean)", "2000", "900", "2000", "1000", "PushPop", "7", "7"),  # the job's own range
        (":nvte_cublas_gemm_v2", "1030", "200", "1011", "3", "PushPop", "7", "7"),  # TE's own, inside ours
        ("te_gemm:fc1 fprop 8x8x8 bf16", "1030", "200", "1010", "5", "StartEnd", "7", "7"),
        ("te_gemm:step 0 (instrumented)", "", "", "1005", "", "PushPop", "8", "8"),  # another rank, unfinished
        ("te_gemm:fc1 fprop 8x8x8 bf16", "1040", "900", "1020", "5", "StartEnd", "8", "8"),  # in no step of its PID
        ("te_gemm:fc1 dgrad 8x8x8 bf16", "", "", "1030", "5", "StartEnd", "7", "7"),  # no GPU work projected
    ]]
    proj, kinds, outside = np.per_step(rows)
    assert kinds == {0: "instrumented", 1: "kernels"} and outside == 1
    assert proj == {"fc1 fprop 8x8x8 bf16": {0: [0.0003], 1: [0.0002]}, "lm_head fprop 8x8x4 bf16": {0: [0.00005]}}
    got = np.compare(proj, {"fc1 fprop 8x8x8 bf16": 0.00021, "lm_head fprop 8x8x4 bf16": 0.00005,
                            "fc1 dgrad 8x8x8 bf16": 0.0001}, {0})
    fc1, head_row, dgrad = got
    assert fc1["nsys_proj_ms"] == 0.0002 and fc1["instances"] == 1  # the dispatch step's 0.0003 left out
    assert abs(fc1["capture_vs_nsys"] - 0.05) < 1e-9
    assert head_row["instances"] == 1 and head_row["capture_vs_nsys"] == 0.0  # only a dispatch step: kept
    assert dgrad["nsys_proj_ms"] is None and dgrad["capture_vs_nsys"] is None  # said, not dropped


@pytest.mark.parametrize("fail_range", [False, True])
def test_a_gemm_range_opens_after_the_start_event_and_a_failed_range_opens_the_gate(monkeypatch, fake_te,
                                                                                    fail_range):
    # nsys projects a range onto the GPU work launched inside it: the gate and the start event must
    # come before it, or the projection holds the gate's wait for the host. Both call sites: the TE
    # interception (fake TE here: no TE on a CPU machine) and the Recorder (the plain head). The
    # timer's calls are logged around the real ones (the host-clock timer on a CPU).
    from torch import nn

    from te_gemm_callback.capture import instruments

    log = []
    timer = instruments.HostClockTimer
    start, stop = timer.start, timer.stop
    monkeypatch.setattr(timer, "start", lambda self: (log.append("timer.start"), start(self))[1])
    monkeypatch.setattr(timer, "stop", lambda self, s: (log.append("timer.stop"), stop(self, s))[1])

    class Ranges:
        def start(self, name):
            log.append("range.start")
            if fail_range:
                raise RuntimeError("nvtx broke")
            return name

        def end(self, handle):
            log.append("range.end")

        def push(self, name):
            pass

        def pop(self):
            pass

    lin, _ = fake_te
    model = test_te_adapter_mock._te_net(lin)
    model.add_module("head", nn.Linear(48, 10))
    x = torch.randn(4, 16, requires_grad=True)
    with GemmProfiler(model, nvtx_backend=Ranges()) as prof:
        model(x).sum().backward()  # the job's step runs whatever the ranges do
    if fail_range:
        assert log == ["timer.start", "range.start", "timer.stop"]  # the gate opened, then capture off
        assert not prof.recorder.active
    else:
        assert log[:2] == ["timer.start", "range.start"] and log.count("range.start") >= 6
        assert log == ["timer.start", "range.start", "timer.stop", "range.end"] * (len(log) // 4)
