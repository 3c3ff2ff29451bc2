"""A gate that holds the GPU ahead of a timed GEMM until the host has launched it.

A CUDA-event pair brackets a GEMM's GPU time only if the GPU reaches the start event once the GEMM
is already queued behind it. Where the host is slower than the GPU (Python dispatch on every aten op,
a profiler's API trace, a small GEMM) the GPU runs dry between the two, stamps the start event early,
and the pair holds the host's time to launch the GEMM. A spin kernel ahead of the start event covers
a host gap only as long as the spin (H200, a job of two nn.Linear(2048, 2048) under nsys with the
dispatch mode: 46 us GEMMs read 93-201 us behind a 50 us spin), and a longer spin is idle time that
lets a power-capped GPU clock its big GEMMs faster than in the job.

The gate waits exactly as long as the host: a one-program Triton kernel goes ahead of the start
event and polls a counter in pinned host memory until it reaches the gate's number, which the host
writes once the GEMM and the end event are launched (:meth:`HostGate.open`). H200, 2048^3 BF16 GEMM
(24 us kernel): 26.0 us behind the gate with or without 100 us of host work between the start event
and the launch, against 26.8 and 115 us behind the spin (``benchmarks/event_floor.py --gate``).

Never a deadlock: the gate gives up after ``MAX_POLLS`` reads of host memory (about 2 ms; a host
that synchronizes inside the bracket, say a cudaFree under memory pressure or a lazily loaded kernel,
waits that long once), and writes what it saw, so a pair whose gate gave up is dropped
(:meth:`HostGate.held`). Without Triton (a CPU build of torch, or a host where it cannot build its
launcher) there is no gate, and the event timer falls back to the spin.
"""

from __future__ import annotations

import ctypes
import logging

import torch

log = logging.getLogger("te_gemm_callback")

# Reads of host memory before a gate lets the stream go without the host's word: ~4.4 us each on
# the H200 (4000 reads took 17.4 ms), so ~2 ms: far above the host's time to launch a GEMM, short
# enough that a host which synchronizes inside the bracket loses little.
MAX_POLLS = 460
SLOTS = 1 << 16  # what each gate saw, by its number modulo SLOTS: read once per capture


class _HostPointer:
    """Pinned host memory as Triton takes a pointer argument: with unified addressing the host
    address is the device address."""

    dtype = torch.int32

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr

    def data_ptr(self) -> int:
        return self.ptr


class HostGate:
    """Holds the current stream until the host says the GEMM is queued. ``close()`` before the start
    event, ``open(n)`` after the end event; ``held(n)`` after a synchronize: whether gate ``n`` opened
    on the host's word (its pair is the GEMM's) rather than by giving up."""

    def __init__(self, device: int | None = None) -> None:
        from te_gemm_callback.capture import gate_kernel  # Triton: only where a gate is built

        self._kernel = gate_kernel.gate
        self.flag = torch.zeros(1, dtype=torch.int32, pin_memory=True)
        self._cell = ctypes.c_int32.from_address(self.flag.data_ptr())
        self._ptr = _HostPointer(self.flag.data_ptr())
        self.seen = torch.zeros(SLOTS, dtype=torch.int32, device=device if device is not None else "cuda")
        self.n = 0
        self._seen_host: list[int] | None = None
        n = self.close()  # compiles and loads the kernel now, not inside a timed bracket
        self.open(n)
        torch.cuda.synchronize()
        if not self.held(n):
            raise RuntimeError("the gate kernel did not see the host's counter")

    def close(self) -> int:
        self.n += 1
        self._seen_host = None
        self._kernel[(1,)](self._ptr, self.n, self.seen, self.n % SLOTS, MAX_POLLS)
        return self.n

    def open(self, n: int) -> None:
        # A plain store to pinned memory, after the launches it vouches for have returned.
        self._cell.value = n

    def held(self, n: int) -> bool:
        """Whether gate ``n`` opened on the host's word. Call after a synchronize."""
        if self._seen_host is None:
            self._seen_host = self.seen.tolist()
        return self._seen_host[n % SLOTS] >= n


_GATES: dict[int, HostGate | None] = {}  # one per device and process: the kernel compiles once


def host_gate() -> HostGate | None:
    """The current device's gate, built on first use; None where one cannot be built (no Triton,
    no compiler for its launcher), said once."""
    try:
        dev = torch.cuda.current_device()
    except Exception:  # no CUDA device to gate
        return None
    if dev not in _GATES:
        try:
            _GATES[dev] = HostGate(dev)
        except Exception as err:  # the spin stands in: never break the job for a gate
            _GATES[dev] = None
            log.warning("te-gemm: no GPU gate ahead of the timed GEMMs (%s: %s): a 50 us spin stands in, and a "
                        "host slower than it adds its launch time to small GEMMs' times; the gate needs Triton "
                        "(pip install triton) and a C compiler for its launcher",
                        type(err).__name__, str(err).splitlines()[0] if str(err) else "")
    return _GATES[dev]


__all__ = ["HostGate", "host_gate", "MAX_POLLS", "SLOTS"]
