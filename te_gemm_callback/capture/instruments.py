"""Light instruments: CUDA-event pairs and NVTX ranges.

Event pairs are recorded on the stream that runs the GEMM and read back only after the profiled
steps (one synchronize, outside every step), so timing never stalls the job.
"""

from __future__ import annotations

import importlib
import os
import statistics
import time
from collections.abc import Callable
from typing import Any, Protocol

import torch

from te_gemm_callback import torch_cuda

NVTX_DOMAIN = "te_gemm"


class MidMark:
    """One mark inside each step that :func:`boundary_times` times (the sweep marks the end of
    backward, before the optimizer step): host clock and, on CUDA, an event. ``part_ms`` then holds
    (host ms, GPU ms or None) from each step's start boundary to its mark."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.marks: list[tuple[float, Any]] = []
        self.part_ms: list[tuple[float, float | None]] = []

    def __call__(self) -> None:
        ev = None
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
        self.marks.append((time.perf_counter(), ev))


def boundary_times(step: Callable[[], Any], n: int, cuda: bool | None = None,
                   mid: MidMark | None = None) -> list[tuple[float, float | None]]:
    """(host ms, GPU ms or None) of each of ``n`` back-to-back calls of ``step``: the host clock
    and, on CUDA, an event at every step boundary, with no sync inside the block (the clocks of the
    profiler's clean steps); one sync after the last boundary, outside every timed step. ``mid``:
    a :class:`MidMark` that ``step`` calls once; its ``part_ms`` is filled from the same boundaries."""
    cuda = torch.cuda.is_available() if cuda is None else cuda
    evs: list[Any] = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)] if cuda else [None] * (n + 1)
    marks = []
    if mid is not None:
        mid.marks.clear()
    for i in range(n + 1):
        if i:
            step()
        marks.append(time.perf_counter())
        if cuda:
            evs[i].record()
    if cuda:
        torch.cuda.synchronize()
    if mid is not None and len(mid.marks) == n:
        mid.part_ms = [((t - a) * 1e3, e0.elapsed_time(ev) if cuda and ev is not None else None)
                       for a, e0, (t, ev) in zip(marks, evs, mid.marks)]
    elif mid is not None:
        mid.part_ms = []  # the step did not mark once per call: no split to report
    return [((b - a) * 1e3, e0.elapsed_time(e1) if cuda else None)
            for a, b, e0, e1 in zip(marks, marks[1:], evs, evs[1:])]


# GPU cycles of the spin kernel that stands in for the gate (:mod:`.gate`) where Triton is missing:
# ~50 us at the 1.7-2.0 GHz SM clocks of H100/H200/B200, more than a plain host takes to record the
# event and launch the GEMM through TE. Not longer: a spin is GPU idle time inside the step, and
# longer spins let a power-capped GPU clock its GEMMs faster than in the job
# (docs/results/h200.md, facts the code relies on: spin lead).
LEAD_CYCLES = 100_000
FLOOR_PAIRS = 20  # pairs around a fill kernel that measure the pairs' floor (calibrate)


class Timer(Protocol):
    """A per-GEMM time source, chosen once when the profiler is built (:func:`gemm_timer`): the
    recorder opens a pair before each GEMM (:meth:`start`), closes it after (:meth:`stop`), and
    reads it after the steps (:meth:`read`). Kernel records, the third source, time whole steps
    (:class:`~.kernel_profile.KernelProfile`), not calls."""

    cuda: bool
    enabled: bool  # switched per step by the profiler
    lead: bool  # likewise: something ahead of each start (CUDA only)
    kind: str  # what the capture names the source: "cuda_events", "host_clock" or "none"
    gates: dict[int, Any]
    floors: dict[int, float]
    leads: set[str]
    devices: set[int]

    def kind_for(self, timed: bool) -> str: ...
    def prepare(self, devices: Any = ()) -> None: ...
    def start(self) -> Any: ...
    def stop(self, start: Any) -> Any: ...
    def read(self, pair: Any) -> tuple[float | None, str | None]: ...
    def elapsed_ms(self, pair: Any) -> float | None: ...
    def calibrate(self) -> None: ...


def gemm_timer(enabled: bool) -> Timer:
    """CUDA-event pairs where CUDA is, else host-clock pairs."""
    return EventTimer(enabled) if torch.cuda.is_available() else HostClockTimer(enabled)


class HostClockTimer:
    """Host-clock pairs around GEMMs on a CPU-only machine: CPU kernels run synchronously, so the
    host clock is their time."""

    cuda = False

    def __init__(self, enabled: bool, lead: bool = True) -> None:
        self.enabled, self.lead = enabled, lead
        self.kind = self.kind_for(enabled)
        self.gates: dict[int, Any] = {}
        self.floors: dict[int, float] = {}
        self.leads: set[str] = set()
        self.devices: set[int] = set()

    def kind_for(self, timed: bool) -> str:
        return "host_clock" if timed else "none"

    def prepare(self, devices: Any = ()) -> None:
        """Nothing to build: no GPU to lead."""

    def start(self) -> Any:
        return time.perf_counter() if self.enabled else None

    def stop(self, start: Any) -> Any:
        return None if start is None else (start, time.perf_counter())

    def read(self, pair: Any) -> tuple[float | None, str | None]:
        return (None, None) if pair is None else ((pair[1] - pair[0]) * 1e3, None)

    def elapsed_ms(self, pair: Any) -> float | None:
        return self.read(pair)[0]

    def calibrate(self) -> None:
        """No floor: the host clock holds the call alone."""


class EventTimer:
    """CUDA-event pairs around GEMMs.

    ``lead``: something goes ahead of each start event so that the GPU reaches it only once the host
    has launched the GEMM. Without it, a GPU that runs dry before the GEMM is launched stamps the
    start event early, and the pair also holds the host's time to launch the GEMM
    (docs/results/h200.md, facts the code relies on: spin lead). The lead is the current device's
    GPU gate (:mod:`.gate`, built by :meth:`prepare`), which waits for the host's word however slow
    the host is; where there is none, a spin kernel of ``LEAD_CYCLES``, which covers ~50 us of host
    time and no more. The profiler turns the lead on only where the pairs give the GEMM times, never
    on a clean step.

    A pair still reads more than the kernel it holds: the events' own time and the GPU's launch of
    the kernel between them. :meth:`calibrate` measures a pair around a one-element fill kernel on
    each device in the process after the steps, and :meth:`read` takes it off every pair
    (``floors``), the fill's own ~1 us with it: a kernel shorter than that reads nothing. The fill's
    pair brings GEMMs closer to their kernel records than an empty pair does, short GEMMs least
    (docs/results/h200.md, facts the code relies on: event-pair floor)."""

    def __init__(self, enabled: bool, lead: bool = True) -> None:
        self.cuda = torch.cuda.is_available()
        self.enabled = enabled  # switched per step by the profiler
        self.kind = self.kind_for(enabled)
        self.lead = lead  # switched per step by the profiler
        self.gates: dict[int, Any] = {}  # device -> its HostGate (None: none could be built)
        self.floors: dict[int, float] = {}  # device -> its pairs' floor, ms (calibrate)
        self.leads: set[str] = set()  # what led the pairs so far: "gate", "spin"
        self.devices: set[int] = set()  # the devices pairs were recorded on
        # Blocking launches (CUDA_LAUNCH_BLOCKING=1): each launch returns once its kernel is done,
        # so a start event cannot run ahead of the GEMM and nothing need lead it (prepare).
        self.blocking = False

    def kind_for(self, timed: bool) -> str:
        """The time source this timer gives where GEMMs are ``timed``."""
        return "cuda_events" if timed else "none"

    def prepare(self, devices: Any = ()) -> None:
        """Build the GPU gates of ``devices`` (default: the current one) once per process and
        device (the first build compiles the kernel), before the steps whose pairs they lead:
        outside every step's time. A device without one gets the spin."""
        if not self.cuda:
            return
        self.blocking = os.environ.get("CUDA_LAUNCH_BLOCKING", "0") not in ("", "0")
        from te_gemm_callback.capture.gate import host_gate

        for d in set(devices) or {torch_cuda.current_device()}:
            if d not in self.gates:
                self.gates[d] = host_gate(d)

    def start(self) -> Any:
        if not self.enabled:
            return None
        gate = n = None
        dev = torch_cuda.current_device()
        # Not while a CUDA graph is being captured: the lead would join the job's graph.
        if self.lead and not self.blocking and not torch.cuda.is_current_stream_capturing():
            gate, n = self._lead(dev)
            self.leads.add("gate" if gate is not None else "spin")
        self.devices.add(dev)
        return _record(), gate, n, dev

    def _lead(self, dev: int) -> tuple[Any, int | None]:
        """Put the device's lead on the current stream, ahead of a start event: (gate, its number),
        or (None, None) behind the spin."""
        gate = self.gates.get(dev)
        if gate is not None:
            return gate, gate.close()
        torch.cuda._sleep(LEAD_CYCLES)
        return None, None

    def stop(self, start: Any) -> Any:
        if start is None:
            return None
        ev, gate, n, dev = start
        end = _record()
        if gate is not None:
            # After the end event's launch: opened before it, the GPU could finish a short GEMM
            # before the end event is queued, and the pair would hold the host's time at its end.
            gate.open(n)
        return ev, end, gate, n, dev

    def read(self, pair: Any) -> tuple[float | None, str | None]:
        """(ms, why not): the pair's time less its device's floor, or None and why: "gave up" (its
        gate let the stream go before the host's word: the pair may hold host time) or "below
        floor" (a kernel too short for a pair to tell: under ~1 us). After a synchronize."""
        if pair is None:
            return None, None
        start, end, gate, n, dev = pair
        if gate is not None and not gate.held(n):
            return None, "gave up"
        ms = float(start.elapsed_time(end)) - self.floors.get(dev, 0.0)
        return (ms, None) if ms > 0 else (None, "below floor")

    def elapsed_ms(self, pair: Any) -> float | None:
        return self.read(pair)[0]

    def calibrate(self) -> None:
        """Measure each device's floor: the median of ``FLOOR_PAIRS`` pairs around a one-element
        fill kernel behind that device's lead. After the steps (it synchronizes), never inside one."""
        if not self.cuda:
            return
        for dev in self.devices or {torch_cuda.current_device()}:
            with torch.cuda.device(dev):
                fill = _fill_target()
                pairs = []
                for _ in range(FLOOR_PAIRS):
                    gate, n = self._lead(dev) if not self.blocking else (None, None)
                    start = _record()
                    fill.zero_()  # the least a kernel can be: what the pair adds around one
                    pairs.append((start, _record()))
                    if gate is not None:
                        gate.open(n)
                torch.cuda.synchronize()
                self.floors[dev] = statistics.median(float(a.elapsed_time(b)) for a, b in pairs)


def _fill_target() -> torch.Tensor:
    """One element on the current device: its fill is the smallest kernel a pair can hold."""
    return torch.zeros(1, device=torch.device("cuda", torch_cuda.current_device()))


def _record() -> Any:
    """A timing event recorded on the current stream (autograd sets it to the forward's stream in
    backward too), read through the private fast path: ``Event.record()`` without a stream looks
    the stream up through ``torch.cuda.current_stream()``, most of a record's host cost."""
    ev = torch.cuda.Event(enable_timing=True)
    ev.record(torch_cuda.current_stream())
    return ev


class Nvtx:
    """NVTX ranges in the ``te_gemm`` domain, so they can be filtered in Nsight Systems.

    Uses the ``nvtx`` package (domains, start/end ranges that may close on another thread); falls
    back to ``torch.cuda.nvtx`` (no domains: names are prefixed ``te_gemm:`` instead). A custom
    backend with ``start(name) -> handle``, ``end(handle)``, ``push(name)``, ``pop()`` can be given.
    """

    def __init__(self, enabled: bool | str, backend: Any = None) -> None:
        if enabled == "auto":
            enabled = backend is not None or tool_attached()
        self.enabled = bool(enabled)
        self.backend: Any = backend if backend is not None else (_default_backend() if enabled else None)
        self.enabled = self.enabled and self.backend is not None

    def start(self, name: str) -> Any:
        return self.backend.start(name) if self.enabled else None

    def end(self, handle: Any) -> None:
        if self.enabled and handle is not None:
            self.backend.end(handle)

    def push(self, name: str) -> None:
        if self.enabled:
            self.backend.push(name)

    def pop(self) -> None:
        if self.enabled:
            self.backend.pop()


def tool_attached() -> bool:
    """Whether an NVTX tool (Nsight Systems, a CUPTI injection) is listening. NVTX loads a tool
    from the library named by ``NVTX_INJECTION64_PATH`` (``NVTX_INJECTION32_PATH``), which Nsight
    Systems sets for the process it launches; without one every NVTX call is a no-op, and the
    ranges would be host time per GEMM that nothing reads."""
    return bool(os.environ.get("NVTX_INJECTION64_PATH") or os.environ.get("NVTX_INJECTION32_PATH"))


class _NvtxPackage:
    def __init__(self, nvtx: Any) -> None:
        self.nvtx = nvtx
        self.domain = nvtx.get_domain(NVTX_DOMAIN)
        self._attrs: dict[str, Any] = {}

    def start(self, name: str) -> Any:
        attrs = self._attrs.get(name)
        if attrs is None:  # registered once per distinct name: keeps the per-GEMM cost low
            attrs = self._attrs[name] = self.domain.get_event_attributes(message=name)
        # start/end (not push/pop): backward GEMMs run on autograd's device threads.
        return self.domain.start_range(attrs)

    def end(self, handle: Any) -> None:
        self.domain.end_range(handle)

    def push(self, name: str) -> None:
        self.domain.push_range(self.domain.get_event_attributes(message=name))

    def pop(self) -> None:
        self.domain.pop_range()


class _TorchNvtx:
    def start(self, name: str) -> Any:
        return torch.cuda.nvtx.range_start(f"{NVTX_DOMAIN}: {name}")

    def end(self, handle: Any) -> None:
        torch.cuda.nvtx.range_end(handle)

    def push(self, name: str) -> None:
        torch.cuda.nvtx.range_push(f"{NVTX_DOMAIN}: {name}")

    def pop(self) -> None:
        torch.cuda.nvtx.range_pop()


class ProfilerRanges:
    """An ``nvtx_backend`` for GemmProfiler that opens a torch.profiler range per GEMM
    (``"te_gemm: <range name>"``), so a torch.profiler trace attributes each GEMM's kernels to it
    (benchmarks/validate_capture.py and benchmarks/bench_vs_job.py kernels read them). Step ranges are left out."""

    def start(self, name: str) -> Any:
        rf = torch.autograd.profiler.record_function(f"{NVTX_DOMAIN}: {name}")
        rf.__enter__()
        return rf

    def end(self, handle: Any) -> None:
        handle.__exit__(None, None, None)

    def push(self, name: str) -> None:
        pass

    def pop(self) -> None:
        pass


def _default_backend() -> Any:
    try:
        return _NvtxPackage(importlib.import_module("nvtx"))
    except Exception:  # not installed, or an old version without domains
        pass
    if torch.cuda.is_available():
        return _TorchNvtx()
    return None


def range_name(module: str, gemm: str, op: str, mkn: str, precision: str, recompute: bool) -> str:
    """What a person reading the timeline sees: module, pass, shape, precision."""
    who = f"{module}.{gemm}" if gemm else (module or "<top>")
    return f"{who} {op}{' (recompute)' if recompute else ''} {mkn} {precision}"
