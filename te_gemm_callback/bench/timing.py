"""Timing a reviewer can trust: warm clocks, queued launches, per-call events, median and IQR."""

from __future__ import annotations

import math
import shutil
import statistics
import subprocess
import time
from typing import Any, Callable

import torch

# Hold the GPU long enough for the CPU to queue the timed launches ahead of it, so launch latency
# and Python overhead never show between two GEMMs (the same idea as triton's do_bench).
_SLEEP_PER_CALL_S = 20e-6
_SLEEP_MAX_S = 0.5

# The boost budget (docs/results/h200.md, "Session 4"; scripts/burst_profile.py): after idling, an
# H200 runs dense GEMMs ~17% faster for the first 30-75 ms of load, then settles at the clock that a
# sustained training job runs at (the job's GEMMs take the settled time). A burst of timed calls
# that starts after host work (a module build, a sync) would time the boost. So the hold before a
# burst is dense GEMMs, not an idle spin, and lasts at least HEAT_PER_IDLE times as long as the GPU
# idled since the last burst, up to HEAT_MAX_S: every timed call runs in the sustained regime.
HEAT_PER_IDLE = 1.0
HEAT_MAX_S = 0.1


def heat_seconds(hold_s: float, idle_s: float | None) -> float:
    """How long to load the GPU before a burst: the hold the host needs to queue it, or enough to
    spend the boost budget an idle of ``idle_s`` seconds gave back (None: unknown, assume long)."""
    idle = HEAT_MAX_S if idle_s is None else idle_s
    return max(hold_s, min(HEAT_PER_IDLE * idle, HEAT_MAX_S))


class _Heater:
    """Dense BF16 GEMMs that keep the GPU at sustained load (one per device)."""

    def __init__(self) -> None:
        self.a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        self.b = torch.randn(8192, 2048, device="cuda", dtype=torch.bfloat16)
        self.c = torch.empty(8192, 2048, device="cuda", dtype=torch.bfloat16)
        self.idle_since: float | None = None  # host time when the GPU last ran out of known work
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self._mm()
        s.record()
        for _ in range(4):
            self._mm()
        e.record()
        e.synchronize()  # once per process: the heater's own call time, to size holds in calls
        self.call_s = max(s.elapsed_time(e) / 4e3, 1e-5)

    def _mm(self) -> None:
        torch.mm(self.a, self.b, out=self.c)

    def hold(self, hold_s: float) -> None:
        idle = None if self.idle_since is None else time.perf_counter() - self.idle_since
        for _ in range(max(1, math.ceil(heat_seconds(hold_s, idle) / self.call_s))):
            self._mm()


_HEATERS: dict[int, _Heater] = {}


def _heater() -> _Heater:
    dev = torch.cuda.current_device()
    if dev not in _HEATERS:
        _HEATERS[dev] = _Heater()
    return _HEATERS[dev]


def hold_gpu(seconds: float) -> None:
    """Queue at least ``seconds`` of dense GEMMs ahead of what the caller launches next (and as long
    as the GPU idled since the last burst, see HEAT_PER_IDLE), without waiting for them."""
    _heater().hold(seconds)


def gpu_drained() -> None:
    """The caller just synchronized: the GPU has been idle since now."""
    _heater().idle_since = time.perf_counter()


def stats(times: list[float]) -> tuple[float, float, float]:
    """(median, first quartile, third quartile)."""
    if len(times) == 1:
        return times[0], times[0], times[0]
    q = statistics.quantiles(times, n=4, method="inclusive")
    return statistics.median(times), q[0], q[2]


class L2Flush:
    """Overwrite a buffer twice the L2 size between timed calls (outside the event pair)."""

    def __init__(self) -> None:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        size = max(getattr(props, "L2_cache_size", 50 * 2**20), 2**20) * 2
        self.buf = torch.empty(size, dtype=torch.uint8, device="cuda")

    def __call__(self) -> None:
        self.buf.zero_()


def time_cuda(fn: Callable[[], Any], n: int, flush: Callable[[], None] | None = None) -> list[float]:
    """Per-call GPU times (ms) of ``n`` back-to-back calls of ``fn``.

    One untimed call first measures the host time per call; dense GEMMs then hold the GPU long
    enough for the host to queue all ``n`` calls, so a CPU-bound launch (TE's Python per call)
    never leaves the GPU idle inside a timed pair, and long enough to spend the boost an idle gave
    back (:func:`hold_gpu`), so the calls run at the sustained clock.
    """
    t = time.perf_counter()
    fn()
    host_s = time.perf_counter() - t
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    hold_gpu(min(1.5 * n * (host_s + _SLEEP_PER_CALL_S), _SLEEP_MAX_S))
    for i in range(n):
        if flush is not None:
            flush()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()  # read back after the last call: nothing timed waits on the host
    gpu_drained()
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def time_cpu(fn: Callable[[], Any], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e3)
    return out


def adaptive_iters(estimate_ms: float, target_ms: float = 40.0, lo: int = 7, hi: int = 60) -> int:
    """Enough calls for ~target_ms of measurement, bounded so that small GEMMs get many samples
    and huge ones do not take seconds."""
    if estimate_ms <= 0:
        return hi
    return int(min(hi, max(lo, target_ms / estimate_ms)))


def warm_up_gpu(seconds: float = 1.0) -> None:
    """Run dense matmuls for ``seconds`` before the first cell.

    An idle H200 sits at 345 MHz; under load it first boosts to 1980 MHz and then, as its averaged
    board power reaches the 700 W limit, settles near 1500 MHz, where sustained training runs
    (NVML samples in docs/results/h200.md: cells timed in the first second of a cold run ran at
    1965 MHz, later ones at 1400-1800 MHz). A second of load puts the first cells in that regime."""
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    t = time.perf_counter()
    while time.perf_counter() - t < seconds:
        for _ in range(10):
            a @ a
        torch.cuda.synchronize()
    gpu_drained()


def device_conditions() -> dict[str, Any]:
    """Device name, clocks and versions: every result carries them."""
    from ..precisions import te_version

    out: dict[str, Any] = {"torch": torch.__version__, "transformer_engine": te_version()}
    if not torch.cuda.is_available():
        import platform

        out["device"] = f"CPU ({platform.processor() or platform.machine()})"
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


def measure_peaks(cache: dict[str, Any], device: str) -> dict[str, float]:
    """Dense-GEMM ceilings of this device (TFLOP/s), measured once and cached per device.

    8192^3 products: BF16 through torch.matmul, FP8 through torch._scaled_mm (E4M3, per-tensor
    scales). DESIGN.md measured ~790 and ~1390 TFLOP/s on an H200 SXM.
    """
    if device in cache:
        return cache[device]
    n = 8192
    flops = 2 * n**3
    peaks: dict[str, float] = {}
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    peaks["bf16"] = flops / (stats(time_cuda(lambda: a @ b, 10))[0] * 1e-3) / 1e12
    if torch.cuda.get_device_capability() >= (8, 9) and hasattr(torch, "_scaled_mm"):
        try:
            a8 = a.to(torch.float8_e4m3fn)
            b8 = b.to(torch.float8_e4m3fn).t().contiguous().t()  # column-major second operand
            one = torch.ones((), device="cuda")
            fn = lambda: torch._scaled_mm(a8, b8, one, one, out_dtype=torch.bfloat16)  # noqa: E731
            peaks["fp8"] = flops / (stats(time_cuda(fn, 10))[0] * 1e-3) / 1e12
        except (RuntimeError, TypeError):
            pass
    cache[device] = peaks
    return peaks
