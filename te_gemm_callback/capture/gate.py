"""A gate that holds the GPU ahead of a timed GEMM until the host has launched it: an event pair holds a GEMM's
GPU time only if the GEMM is queued when the GPU reaches the start event (docs/results/h200.md: GPU gate). A
one-program Triton kernel ahead of the start event polls a pinned host slot until the host writes the gate's number
there, once GEMM and end event are launched. Never a deadlock: the gate gives up after ``TIMEOUT_NS`` and its pair
is dropped (:meth:`HostGate.held`)."""

from __future__ import annotations

import ctypes
import itertools
import logging
import os
from collections.abc import Callable

import torch

log = logging.getLogger("te_gemm_callback")

TIMEOUT_NS = 2_000_000  # far above the host's time to launch a GEMM, little lost if it comes
FLAG_SLOTS = 256  # host slots: gate n polls slot n % FLAG_SLOTS
SEEN_SLOTS = 1 << 18  # what gate n saw, at n % SEEN_SLOTS (1 MiB): read once per capture


class _HostPointer:
    """Pinned host memory as a Triton pointer argument (with unified addressing, the same address)."""

    dtype = torch.int32

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr

    def data_ptr(self) -> int:
        return self.ptr


class HostGate:
    """Holds the current stream: ``close()`` before the start event, ``open(n)`` after the end event.
    ``kernel``: the gate launch (default :mod:`.gate_kernel`'s); ``pinned``/``device``: where the slots live."""

    def __init__(self, device: int | str = "cuda", kernel: Callable[..., None] | None = None,
                 pinned: bool = True) -> None:
        if kernel is None:
            from te_gemm_callback.capture import gate_kernel  # Triton: only where a gate is built

            kernel = gate_kernel.launch
        self._kernel = kernel
        self.flag = torch.zeros(FLAG_SLOTS, dtype=torch.int32, pin_memory=pinned)
        self._slots = (ctypes.c_int32 * FLAG_SLOTS).from_address(self.flag.data_ptr())
        self._ptr = _HostPointer(self.flag.data_ptr())
        self.seen = torch.zeros(SEEN_SLOTS, dtype=torch.int32, device=device)
        self._numbers = itertools.count(1)  # next() is atomic under the GIL: no two gates share one
        self._seen_host: torch.Tensor | None = None
        for _ in range(2):  # compile and load the kernel now, never inside a timed bracket
            n = self.close()
            self.open(n)
        if self.seen.is_cuda:
            torch.cuda.synchronize(self.seen.device)
        if not self.held(n):
            raise RuntimeError("the gate kernel did not see the host's word")

    def close(self) -> int:
        n = next(self._numbers)
        self._seen_host = None
        self._kernel(self._ptr, n % FLAG_SLOTS, n, self.seen, n % SEEN_SLOTS, TIMEOUT_NS)
        return n

    def open(self, n: int) -> None:
        # A plain store to pinned memory, after the launches it vouches for have returned.
        self._slots[n % FLAG_SLOTS] = n

    def held(self, n: int) -> bool:
        """Whether gate ``n`` opened on the host's word (after a synchronize; False once its slot is reused)."""
        if self._seen_host is None:
            self._seen_host = self.seen.cpu()
        return int(self._seen_host[n % SEEN_SLOTS]) == n


_GATES: dict[int, HostGate | None] = {}  # one per device and process: the kernel compiles once


def host_gate(device: int) -> HostGate | None:
    """Device ``device``'s gate, built on first use; None where none can be built (said once) or launches block."""
    if os.environ.get("CUDA_LAUNCH_BLOCKING", "0") not in ("", "0"):  # the host could never open it in time
        return None
    if device not in _GATES:
        try:
            with torch.cuda.device(device):
                _GATES[device] = HostGate(device)
        except Exception as err:  # the spin stands in: never break the job for a gate
            _GATES[device] = None
            log.warning("te-gemm: no GPU gate ahead of the timed GEMMs (%s: %s): a 50 us spin stands in, and a "
                        "host slower than it adds its launch time to small GEMMs' times; the gate needs Triton "
                        "(pip install triton) and a C compiler for its launcher",
                        type(err).__name__, str(err).splitlines()[0] if str(err) else "")
    return _GATES[device]
