"""A CPU build of torch made to answer as the CUDA build that ``pip install torch`` gives a host
without a driver: the private ``torch._C._cuda_*`` functions present, and raising RuntimeError
where that build raises (the calls and answers were read off torch 2.14.1+cu130 on a CPU host);
``torch.cuda``'s lazy init raising RuntimeError, not a CPU build's AssertionError. The root
conftest.py installs it for the whole run under ``TE_GEMM_TEST_DRIVERLESS=1``; tests install it
with monkeypatch."""

from collections.abc import Callable
from typing import Any

import torch

NO_DRIVER = "Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and installed a driver"
# Private calls that answer without a driver (torch 2.14.1+cu130 on a CPU host).
ANSWERS = {"_cuda_getDeviceCount": 0, "_cuda_isInBadFork": False, "_cuda_getCompiledVersion": 13000,
           "_cuda_getArchFlags": "sm_75 sm_80 sm_86 sm_90 sm_100 sm_120", "_cuda_emptyCache": None}
# Private calls that raise RuntimeError without a driver (the rest of those a CUDA build has and
# this package or torch's public torch.cuda functions reach).
RAISING = ["_cuda_getDevice", "_cuda_setDevice", "_cuda_exchangeDevice", "_cuda_maybeExchangeDevice", "_cuda_init",
           "_cuda_getCurrentStream", "_cuda_getCurrentRawStream", "_cuda_getDefaultStream",
           "_cuda_isCurrentStreamCapturing", "_cuda_synchronize", "_cuda_sleep", "_cuda_setStream",
           "_cuda_memoryStats", "_cuda_resetPeakMemoryStats", "_cuda_hasPrimaryContext"]


def install(put: Callable[[Any, str, Any], None] = setattr) -> None:
    """Install the stand-ins with ``put(obj, name, value)`` (setattr, or a monkeypatch's)."""

    def answer(value):
        return lambda *a, **k: value

    def raising(*a, **k):
        raise RuntimeError(NO_DRIVER)

    for name, value in ANSWERS.items():
        if not hasattr(torch._C, name):
            put(torch._C, name, answer(value))
    for name in RAISING:
        if not hasattr(torch._C, name):
            put(torch._C, name, raising)
    put(torch.version, "cuda", "13.0")
    put(torch.backends.cuda, "is_built", lambda: True)
    put(torch.cuda, "_lazy_init", raising)  # a CPU build raises AssertionError ("not compiled with CUDA") here
