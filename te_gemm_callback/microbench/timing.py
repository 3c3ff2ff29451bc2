"""Microbenchmark timing: the clock training runs at, queued launches, per-call events, median and IQR."""

from __future__ import annotations

import math
import platform
import shutil
import subprocess
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

from te_gemm_callback.microbench.cells import stats
from te_gemm_callback.microbench.rates import gemm_seconds
from te_gemm_callback.precisions import te_version

# Hold the GPU while the CPU queues the timed launches, so launch latency never shows between two GEMMs.
_HOLD_PER_CALL_S = 20e-6
_HOLD_MAX_S = 0.5

# A GPU that idled runs at its boost clock for a moment, then settles at the clock training runs at
# (docs/benchmark-methodology.md): so before a burst an idle GPU is loaded for HEAT_PER_BURST times
# the burst's expected time, at most HEAT_MAX_S (the boost's length).
HEAT_MAX_S = 0.15
HEAT_PER_BURST = 4.0
# GPU seconds queued to spend the boost (heat_s) and to cover the host's queuing (hold_s), for the timeline.
HEAT_LOG = {"heat_s": 0.0, "hold_s": 0.0, "idle_holds": 0, "holds": 0}


def heat_seconds(hold_s: float, idle: bool, burst_s: float | None = None) -> float:
    """Seconds to load the GPU before a burst: the hold, and on an idle GPU enough to spend the boost."""
    if not idle:
        return hold_s
    heat = HEAT_MAX_S if burst_s is None else min(HEAT_MAX_S, HEAT_PER_BURST * burst_s)
    return max(hold_s, heat)


class _Heater:
    """Dense BF16 GEMMs (n x n times n x n/4) that keep the GPU at sustained load (one per device)."""

    def __init__(self, n: int = 8192) -> None:
        self.a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        self.b = torch.randn(n, n // 4, device="cuda", dtype=torch.bfloat16)
        self.c = torch.empty(n, n // 4, device="cuda", dtype=torch.bfloat16)
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self.mm()
        s.record()
        for _ in range(4):
            self.mm()
        e.record()
        e.synchronize()  # once per process: the heater's own call time, to size holds in calls
        self.call_s = max(s.elapsed_time(e) / 4e3, 1e-5)

    def mm(self) -> None:
        torch.mm(self.a, self.b, out=self.c)

    def load(self, seconds: float) -> None:
        for _ in range(max(1, math.ceil(seconds / self.call_s))):
            self.mm()


class _Spin:
    """A spin kernel where no heater fits in GPU memory (no gaps, but maybe the boost clock)."""

    call_s = 1e-3

    def mm(self) -> None:
        torch.cuda._sleep(2_000_000)  # ~1 ms at ~2 GHz

    def load(self, seconds: float) -> None:
        torch.cuda._sleep(int(seconds * 2e9))


_HEATERS: dict[int, _Heater | _Spin] = {}


def _heater() -> _Heater | _Spin:
    dev = torch.cuda.current_device()
    if dev not in _HEATERS:
        for n in (8192, 4096, 2048):  # 192, 48, 12 MiB
            try:
                _HEATERS[dev] = _Heater(n)
                break
            except torch.cuda.OutOfMemoryError:
                torch.cuda.empty_cache()
        else:
            warnings.warn("te-gemm bench: no GPU memory for the heater (12 MiB); timed bursts may run at the "
                          "boost clock, 5-15% faster than in training", stacklevel=2)
            _HEATERS[dev] = _Spin()
    return _HEATERS[dev]


def hold_gpu(hold_s: float, burst_s: float | None = None) -> None:
    """Queue dense GEMMs ahead of the caller's next launches, without waiting (:func:`heat_seconds`)."""
    idle = torch.cuda.current_stream().query()  # True when nothing is queued
    seconds = heat_seconds(hold_s, idle, burst_s)
    HEAT_LOG["holds"] += 1
    HEAT_LOG["idle_holds"] += int(idle)
    HEAT_LOG["heat_s"] += seconds - hold_s
    HEAT_LOG["hold_s"] += hold_s
    if seconds > 0:  # a busy GPU and nothing to hold: queue nothing
        _heater().load(seconds)


class StreamClock:
    """When the GPU reached points of the stream, in host time (on CPU a mark is the host time itself),
    read after one synchronize against an anchor event recorded on an empty stream."""

    def __init__(self) -> None:
        self.cuda = torch.cuda.is_available()
        self.anchor: Any = None
        self.t0 = time.perf_counter()
        if self.cuda:
            torch.cuda.synchronize()  # an empty stream: the anchor runs as soon as it is recorded
            self.anchor = torch.cuda.Event(enable_timing=True)
            self.anchor.record()
            self.t0 = time.perf_counter()

    def mark(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def wait(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def wait_for(self, mark: Any) -> None:
        """Wait until the GPU has reached ``mark`` (work queued after it keeps it busy meanwhile)."""
        if self.cuda:
            mark.synchronize()

    def at(self, mark: Any) -> float:
        """Host time at which the GPU reached ``mark`` (after :meth:`wait`)."""
        return mark if not self.cuda else self.t0 + self.anchor.elapsed_time(mark) / 1e3


# The timed GEMMs' default share of GPU time: in a training step other kernels draw less power, so
# under the power limit GEMMs clock higher than back to back (docs/benchmark-methodology.md).
GEMM_DUTY = 0.75
# Spin-kernel cycles per second at a power-limited GPU's sustained clock: about right is enough.
_SPIN_HZ = 1.5e9


def between_calls(flush: Callable[[], None] | None, gemm_duty: float,
                  call_s: float) -> Callable[[], None] | None:
    """What runs between two timed calls, outside their events: the L2 flush if asked, then a low-power
    spin of ``call_s * (1 / gemm_duty - 1)``, so the timed GEMMs get ``gemm_duty`` of the GPU's time."""
    if not 0.0 < gemm_duty <= 1.0:
        raise ValueError(f"gemm_duty must be in (0, 1], got {gemm_duty}")
    cycles = int(call_s * (1.0 / gemm_duty - 1.0) * _SPIN_HZ)
    if cycles <= 0:
        return flush
    if flush is None:
        return lambda: torch.cuda._sleep(cycles)
    return lambda: (flush(), torch.cuda._sleep(cycles))[0]


class L2Flush:
    """Overwrite a buffer twice the L2 size between timed calls (outside the event pair)."""

    def __init__(self) -> None:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        size = max(getattr(props, "L2_cache_size", 50 * 2**20), 2**20) * 2
        self.buf = torch.empty(size, dtype=torch.uint8, device="cuda")

    def __call__(self) -> None:
        self.buf.zero_()


Pairs = list[tuple[Any, Any]]  # (start, end) CUDA events of one call each


def launch_timed(fn: Callable[[], Any], n: int, flush: Callable[[], None] | None = None,
                 burst_s: float | None = None) -> Pairs:
    """Queue ``n`` calls of ``fn`` between CUDA event pairs, without waiting (read with :func:`elapsed`);
    an untimed first call sizes the hold that covers the host's queuing."""
    t = time.perf_counter()
    fn()
    host_s = time.perf_counter() - t
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    hold_gpu(min(1.5 * n * (host_s + _HOLD_PER_CALL_S), _HOLD_MAX_S), burst_s)
    for start, end in pairs:
        if flush is not None:
            flush()
        start.record()
        fn()
        end.record()
    return pairs


def elapsed(pairs: Pairs) -> list[float]:
    """Per-call GPU times (ms) of event pairs whose work has completed."""
    return [s.elapsed_time(e) for s, e in pairs]


def time_cuda(fn: Callable[[], Any], n: int, flush: Callable[[], None] | None = None,
              burst_s: float | None = None) -> list[float]:
    """Per-call GPU times (ms) of ``n`` back-to-back calls of ``fn`` (:func:`launch_timed`)."""
    pairs = launch_timed(fn, n, flush, burst_s)
    torch.cuda.synchronize()  # read back after the last call: nothing timed waits on the host
    return elapsed(pairs)


def time_cpu(fn: Callable[[], Any], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e3)
    return out


def adaptive_iters(estimate_ms: float, target_ms: float = 40.0, lo: int = 7, hi: int = 60) -> int:
    """Enough calls for ~target_ms of measurement, within [lo, hi]."""
    if estimate_ms <= 0:
        return hi
    return int(min(hi, max(lo, target_ms / estimate_ms)))


WARM_UP_S = 0.3


def spend_boost(seconds: float = WARM_UP_S) -> None:
    """Queue ``seconds`` of dense load without waiting, so the timed calls find the clock settled."""
    HEAT_LOG["heat_s"] += seconds
    _heater().load(seconds)


def warm_up_gpu(seconds: float = WARM_UP_S) -> None:
    """Load the GPU for ``seconds`` before the first cell (initialisation, idle boost spent) and wait."""
    _heater().load(seconds)
    torch.cuda.synchronize()


def device_conditions() -> dict[str, Any]:
    """Device name, clocks and versions: every result carries them."""
    out: dict[str, Any] = {"torch": torch.__version__, "transformer_engine": te_version()}
    if not torch.cuda.is_available():
        # The model and torch's intra-op threads set a CPU matmul's time (the cache key names them).
        out.update(device=f"CPU ({platform.machine()})", cpu_model=cpu_model(), cpu_threads=torch.get_num_threads())
        return out
    out["device"] = torch.cuda.get_device_name()
    out["compute_capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
    out["cuda"] = torch.version.cuda
    if shutil.which("nvidia-smi"):
        try:
            q = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.max.sm,clocks.mem,power.limit",
                                "--format=csv,noheader,nounits", f"--id={torch.cuda.current_device()}"],
                               capture_output=True, text=True, timeout=5).stdout.strip().split(", ")
            out.update({"sm_clock_mhz": q[0], "sm_clock_max_mhz": q[1], "mem_clock_mhz": q[2],
                        "power_limit_w": q[3]})
        except (OSError, subprocess.SubprocessError, IndexError):
            pass
    return out


def cpu_model() -> str:
    """/proc/cpuinfo's "model name" (Linux x86), else what the platform module says."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name") and ":" in line:
                    return " ".join(line.split(":", 1)[1].split())  # one space, as the kernel pads
    except OSError:  # not Linux, or /proc hidden: the fallback names the architecture at least
        pass
    return platform.processor() or platform.machine() or "unknown CPU model"


def measure_peaks(cache: dict[str, Any], device: str) -> dict[str, float]:
    """Dense 8192^3 GEMM ceilings of this device (TFLOP/s) in BF16 and FP8 E4M3, cached per device."""
    if device in cache:
        return cache[device]
    n = 8192
    flops = 2 * n**3

    def tflops(fn: Callable[[], Any], precision: str) -> float:
        return flops / (stats(time_cuda(fn, 10, burst_s=10 * gemm_seconds(flops, precision)))[0] * 1e-3) / 1e12

    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    peaks = {"bf16": tflops(lambda: a @ b, "BF16")}
    if torch.cuda.get_device_capability() >= (8, 9) and hasattr(torch, "_scaled_mm"):
        try:
            a8 = a.to(torch.float8_e4m3fn)
            b8 = b.to(torch.float8_e4m3fn).t().contiguous().t()  # column-major second operand
            one = torch.ones((), device="cuda")
            # An FP8 recipe's rate sizes the burst.
            peaks["fp8"] = tflops(lambda: torch._scaled_mm(a8, b8, one, one, out_dtype=torch.bfloat16),
                                  "DelayedScaling")
        except (RuntimeError, TypeError):
            pass
    cache[device] = peaks
    return peaks
