"""The private torch CUDA entry points the package touches, each behind one function that falls back
to the public path where they are missing or fail. Tests that stand in for CUDA stub these functions."""

from __future__ import annotations

from typing import Any

import torch

# A CPU build (no such attribute), no usable driver or device (RuntimeError), another torch's signature.
UNAVAILABLE = (AttributeError, RuntimeError, TypeError, ValueError)


def current_device() -> int:
    """The current CUDA device, without ``torch.cuda.current_device()``'s lazy-init check (once per timed GEMM)."""
    try:
        return torch._C._cuda_getDevice()
    except UNAVAILABLE:
        return torch.cuda.current_device()


def current_stream() -> Any:
    """The current stream, without ``torch.cuda.current_stream()``'s per-call device lookup; None where
    the private calls are missing (``Event.record(None)`` then takes the public path)."""
    try:
        sid, dev, typ = torch._C._cuda_getCurrentStream(torch._C._cuda_getDevice())
        return torch.cuda.Stream(stream_id=sid, device_index=dev, device_type=typ)
    except UNAVAILABLE:
        return None


def usable() -> bool:
    """Whether CUDA can run here (False on a CPU build, or without a driver or device)."""
    try:
        return bool(torch.cuda.is_available())
    except Exception:  # a broken driver install: no CUDA, never an error in the job
        return False


def driverless() -> bool:
    """Whether this is a CUDA build of torch on a host where CUDA cannot run."""
    return torch.version.cuda is not None and not usable()
