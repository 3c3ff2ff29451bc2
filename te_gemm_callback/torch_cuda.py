"""The private torch CUDA entry points the package touches, each behind one function.

A CPU build of torch has no ``torch._C._cuda_*`` functions (AttributeError). The CUDA build that
``pip install torch`` gives a machine without a GPU has them, and they raise RuntimeError ("Found
no NVIDIA driver on your system") when called. Both mean the same here: the private fast path is
not there, so take the public one. Tests that stand in for CUDA stub these functions, not
``torch._C``.
"""

from __future__ import annotations

from typing import Any

import torch

# What a private CUDA call raises where it cannot run: a CPU build (no such attribute), a CUDA
# build without a usable driver or device (RuntimeError), another torch's signature (TypeError).
UNAVAILABLE = (AttributeError, RuntimeError, TypeError, ValueError)


def current_device() -> int:
    """The current CUDA device, without ``torch.cuda.current_device()``'s lazy-init check (the
    private call is the cheap one on a hot path: once per timed GEMM)."""
    try:
        return torch._C._cuda_getDevice()
    except UNAVAILABLE:
        return torch.cuda.current_device()


def current_stream() -> Any:
    """The current stream of the current device, read without ``torch.cuda.current_stream()``'s
    device lookup (an ``is_available()`` and an environment read per call); None where the
    private calls are not there, so that ``Event.record(None)`` takes the public path."""
    try:
        sid, dev, typ = torch._C._cuda_getCurrentStream(torch._C._cuda_getDevice())
        return torch.cuda.Stream(stream_id=sid, device_index=dev, device_type=typ)
    except UNAVAILABLE:
        return None


def usable() -> bool:
    """Whether CUDA can run here: False on a CPU build and on a CUDA build without a driver or a
    device (``is_available()`` answers False there rather than raising; anything it raises, an
    NVML or driver error included, means no)."""
    try:
        return bool(torch.cuda.is_available())
    except Exception:  # a broken driver install: no CUDA, never an error in the job
        return False


def driverless() -> bool:
    """Whether this is a CUDA build of torch on a host where CUDA cannot run."""
    return torch.version.cuda is not None and not usable()
