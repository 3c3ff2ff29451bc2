"""Light instruments: CUDA-event pairs (read back after the profiled steps, never stalling the job) and NVTX ranges."""

from __future__ import annotations

import importlib
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from te_gemm_callback import torch_cuda
from te_gemm_callback.capture.gate import host_gate

NVTX_DOMAIN = "te_gemm"


class MidMark:
    """A mark a step calls once inside each step that :func:`boundary_times` times (the sweep: end of backward);
    ``part_ms`` then holds (host ms, GPU ms or None) from each step's start to it."""

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
    """(host ms, GPU ms or None) of ``n`` back-to-back calls of ``step``, timed as the profiler's clean steps."""
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
    if mid is not None:  # no split to report unless the step marked once per call
        mid.part_ms = [((t - a) * 1e3, e0.elapsed_time(ev) if cuda and ev is not None else None)
                       for a, e0, (t, ev) in zip(marks, evs, mid.marks)] if len(mid.marks) == n else []
    return [((b - a) * 1e3, e0.elapsed_time(e1) if cuda else None)
            for a, b, e0, e1 in zip(marks, marks[1:], evs, evs[1:])]


# The spin that stands in for the gate without Triton: longer than a GEMM's launch, and no longer, since it is
# GPU idle time (docs/results/h200.md, facts the code relies on: spin lead).
LEAD_CYCLES = 100_000
FLOOR_PAIRS = 20  # pairs around a fill kernel that measure the pairs' floor (calibrate)


class Timer:
    """A per-GEMM pair timer: :meth:`start` before each GEMM, :meth:`stop` after, :meth:`read` after the steps."""

    cuda = False
    source = "none"  # what the capture names the source where GEMMs are timed

    def __init__(self, enabled: bool, lead: bool = True) -> None:
        self.enabled = enabled  # switched per step by the profiler
        self.lead = lead  # likewise: something ahead of each start (CUDA only)
        self.kind = self.kind_for(enabled)
        self.gates: dict[int, Any] = {}  # device -> its HostGate (None: none could be built)
        self.floors: dict[int, float] = {}  # device -> its pairs' floor, ms (calibrate)
        self.leads: set[str] = set()  # what led the pairs so far: "gate", "spin"
        self.devices: set[int] = set()  # the devices pairs were recorded on

    def kind_for(self, timed: bool) -> str:
        return self.source if timed else "none"

    def prepare(self, devices: Any = ()) -> None:
        """Build what leads the pairs, outside every step's time."""

    def start(self) -> Any:
        raise NotImplementedError

    def stop(self, start: Any) -> Any:
        raise NotImplementedError

    def read(self, pair: Any) -> tuple[float | None, str | None]:
        """(ms, why not)."""
        raise NotImplementedError

    def elapsed_ms(self, pair: Any) -> float | None:
        return self.read(pair)[0]

    def calibrate(self) -> None:
        """Measure the pairs' floor, after the steps."""


def gemm_timer(enabled: bool) -> Timer:
    """CUDA-event pairs where CUDA is, else host-clock pairs."""
    return EventTimer(enabled) if torch.cuda.is_available() else HostClockTimer(enabled)


class HostClockTimer(Timer):
    """Host-clock pairs on a CPU-only machine: CPU kernels run synchronously. No lead, no floor."""

    source = "host_clock"

    def start(self) -> Any:
        return time.perf_counter() if self.enabled else None

    def stop(self, start: Any) -> Any:
        return None if start is None else (start, time.perf_counter())

    def read(self, pair: Any) -> tuple[float | None, str | None]:
        return (None, None) if pair is None else ((pair[1] - pair[0]) * 1e3, None)


class EventTimer(Timer):
    """CUDA-event pairs around GEMMs. ``lead``: the device's GPU gate (:mod:`.gate`), else a spin, goes ahead of each
    start event, so a GPU run dry does not stamp it before the GEMM is launched (docs/results/h200.md, facts the code
    relies on: spin lead). :meth:`read` takes each device's floor off every pair (docs/results/h200.md, facts the
    code relies on: event-pair floor)."""

    source = "cuda_events"

    def __init__(self, enabled: bool, lead: bool = True) -> None:
        super().__init__(enabled, lead)
        self.cuda = torch.cuda.is_available()
        # CUDA_LAUNCH_BLOCKING=1: a start event cannot run ahead of the GEMM; nothing need lead it.
        self.blocking = False

    def prepare(self, devices: Any = ()) -> None:
        """Build the GPU gates of ``devices`` (default: the current one); a device without one gets the spin."""
        if not self.cuda:
            return
        self.blocking = os.environ.get("CUDA_LAUNCH_BLOCKING", "0") not in ("", "0")
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
        """Put the device's lead on the current stream: (gate, its number), or (None, None) for the spin."""
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
            # After the end event's launch: else a short GEMM could finish before the end event is queued.
            gate.open(n)
        return ev, end, gate, n, dev

    def read(self, pair: Any) -> tuple[float | None, str | None]:
        """(ms, why not): the pair less its device's floor, or None and "gave up" (gate timed out) or "below floor"."""
        if pair is None:
            return None, None
        start, end, gate, n, dev = pair
        if gate is not None and not gate.held(n):
            return None, "gave up"
        ms = float(start.elapsed_time(end)) - self.floors.get(dev, 0.0)
        return (ms, None) if ms > 0 else (None, "below floor")

    def calibrate(self) -> None:
        """Each device's floor: the median of ``FLOOR_PAIRS`` pairs around a fill behind its lead (it syncs)."""
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
    return torch.zeros(1, device=torch.device("cuda", torch_cuda.current_device()))


def _record() -> Any:
    """A timing event on the current stream, given explicitly: looking it up is most of a record's host cost."""
    ev = torch.cuda.Event(enable_timing=True)
    ev.record(torch_cuda.current_stream())
    return ev


class Nvtx:
    """NVTX ranges in the ``te_gemm`` domain: the ``nvtx`` package, else ``torch.cuda.nvtx``, or a ``backend``
    with ``start(name) -> handle``, ``end(handle)``, ``push(name)``, ``pop()``."""

    def __init__(self, enabled: bool | str, backend: Any = None) -> None:
        if enabled == "auto":
            enabled = backend is not None or tool_attached()
        self.backend: Any = backend if backend is not None else (_default_backend() if enabled else None)
        self.enabled = bool(enabled) and self.backend is not None

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
    """Whether an NVTX tool (Nsight Systems, a CUPTI injection) is listening: else ranges are wasted host time."""
    return bool(os.environ.get("NVTX_INJECTION64_PATH") or os.environ.get("NVTX_INJECTION32_PATH"))


class _NvtxPackage:
    def __init__(self, nvtx: Any) -> None:
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
    """An ``nvtx_backend`` that opens a torch.profiler range per GEMM (``"te_gemm: <name>"``); no step ranges."""

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
        return _TorchNvtx() if torch.cuda.is_available() else None


def range_name(module: str, gemm: str, op: str, mkn: str, precision: str, recompute: bool) -> str:
    """What a person reading the timeline sees: module, pass, shape, precision."""
    who = f"{module}.{gemm}" if gemm else (module or "<top>")
    return f"{who} {op}{' (recompute)' if recompute else ''} {mkn} {precision}"
