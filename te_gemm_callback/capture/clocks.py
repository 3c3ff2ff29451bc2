"""SM clock and board power while something runs, sampled through NVML on a background thread: a power-capped GPU
clocks sustained GEMMs lower (docs/results/h200.md: SM clock), so a bench-vs-job difference may be the clock."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from typing import Any, cast

Reading = tuple[float, float]  # (SM clock MHz, board power W)


def nvml_reader(device: int | None = None) -> Callable[[], Reading] | None:
    """A reader for the current CUDA device, or None where NVML (nvidia-ml-py) is unavailable."""
    try:
        import pynvml
        import torch

        pynvml.nvmlInit()
        idx = torch.cuda.current_device() if device is None else device
        uuid = getattr(torch.cuda.get_device_properties(idx), "uuid", None)
        # CUDA and NVML may number GPUs differently (CUDA_VISIBLE_DEVICES): match by UUID.
        handle = (pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}") if uuid is not None
                  else pynvml.nvmlDeviceGetHandleByIndex(idx))
    except Exception:  # no NVML, no GPU, or an old driver: nothing to sample
        return None

    def read() -> Reading:
        return (float(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)),
                pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0)

    return read


class ClockSampler:
    """``with ClockSampler() as s: ...`` then ``s.summary()``. Never raises into the caller."""

    def __init__(self, reader: Callable[[], Reading] | None = None, period_s: float = 0.02) -> None:
        self.reader = reader if reader is not None else nvml_reader()
        self.period_s = period_s
        self.samples: list[Reading] = []
        self.times: list[float] = []  # time.perf_counter() of each sample
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                clock, power = cast(Callable[[], Reading], self.reader)()  # started only with a reader
                self.samples.append((float(clock), float(power)))
                self.times.append(time.perf_counter())
            except Exception:  # a failing read ends sampling, never the measured work
                return
            self._stop.wait(self.period_s)

    def __enter__(self) -> ClockSampler:
        if self.reader is not None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    @property
    def running(self) -> bool:
        return self._thread is not None and not self._stop.is_set()

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)

    def summary(self, since: float | None = None, until: float | None = None) -> dict[str, float] | None:
        """Median and extremes of the samples between ``since`` and ``until`` (perf_counter; default all)."""
        picked = [r for r, t in zip(self.samples, self.times)
                  if (since is None or t >= since) and (until is None or t <= until)]
        if not picked:
            return None
        clocks = [c for c, _ in picked]
        power = [p for _, p in picked]
        return {"sm_clock_mhz_median": statistics.median(clocks), "sm_clock_mhz_min": min(clocks),
                "power_w_median": statistics.median(power), "power_w_max": max(power), "samples": len(picked)}
