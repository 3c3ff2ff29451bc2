"""A gate that holds the GPU ahead of a timed GEMM until the host has launched it.

A CUDA-event pair brackets a GEMM's GPU time only if the GPU reaches the start event once the GEMM
is already queued behind it. Where the host is slower than the GPU (Python dispatch on every aten op,
a profiler's API trace, a small GEMM) the GPU runs dry between the two, stamps the start event early,
and the pair holds the host's time to launch the GEMM. A spin kernel ahead of the start event covers
a host gap only as long as the spin (docs/results/h200.md, facts the code relies on: GPU gate), and
a longer spin is idle time that lets a power-capped GPU clock its big GEMMs faster than in the job.

The gate waits exactly as long as the host: a one-program Triton kernel goes ahead of the start
event and polls a slot in pinned host memory until it holds the gate's number, which the host
writes once the GEMM and the end event are launched (:meth:`HostGate.open`). Each gate has its own
slot (its number modulo ``FLAG_SLOTS``), so gates closed on two threads (autograd's backward thread
and the main one) never open each other. Behind the gate a pair reads its GEMM's kernel time
whatever the host does before the launch; bare, it does not (docs/results/h200.md, facts the code
relies on: GPU gate).

Never a deadlock: the gate gives up after ``TIMEOUT_NS`` of the GPU's global timer (a host that
synchronizes inside the bracket, say a cudaFree under memory pressure or a lazily loaded kernel,
waits that long once), and writes whether it opened on the host's word, so the pair of a gate that
gave up is dropped (:meth:`HostGate.held`). No gate without Triton (a CPU build of torch, a host
where it cannot build its launcher; the event timer's spin stands in) or under
``CUDA_LAUNCH_BLOCKING=1`` (each launch returns once its kernel is done: the host could never open
a gate before the gate gives up, and the start event cannot run ahead of the launch anyway).
"""

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
    """Pinned host memory as Triton takes a pointer argument: with unified addressing the host
    address is the device address."""

    dtype = torch.int32

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr

    def data_ptr(self) -> int:
        return self.ptr


class HostGate:
    """Holds the current stream until the host says the GEMM is queued: ``close()`` before the start
    event, ``open(n)`` after the end event; ``held(n)``, after a synchronize, whether gate ``n``
    opened on the host's word (its pair is the GEMM's) rather than by giving up.

    ``kernel(flag, flag_slot, want, seen, seen_slot, timeout_ns)`` launches the gate (default: the
    Triton kernel of :mod:`.gate_kernel`); ``pinned``/``device``: where the slots live (tests run
    the host side on a CPU with a stand-in kernel)."""

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
        """Whether gate ``n`` opened on the host's word. Call after a synchronize. False too where a
        later gate took its slot (more than SEEN_SLOTS gates before the read): dropped, not guessed."""
        if self._seen_host is None:
            self._seen_host = self.seen.cpu()
        return int(self._seen_host[n % SEEN_SLOTS]) == n


_GATES: dict[int, HostGate | None] = {}  # one per device and process: the kernel compiles once


def host_gate(device: int) -> HostGate | None:
    """Device ``device``'s gate, built on first use; None where none can be built (no Triton, no
    compiler for its launcher: said once) or none is wanted (blocking launches)."""
    if os.environ.get("CUDA_LAUNCH_BLOCKING", "0") not in ("", "0"):
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


__all__ = ["HostGate", "host_gate", "TIMEOUT_NS", "FLAG_SLOTS", "SEEN_SLOTS"]

