"""The private CUDA entry points behind te_gemm_callback.torch_cuda, on both kinds of torch a
machine without a GPU can have: a CPU build (no private functions) and the CUDA build pip gives it
(the functions there, raising RuntimeError). Both must take the public path, and a whole capture
must run on either."""

import pytest
import torch
from helpers import driverless
from helpers.models import Net, step

from te_gemm_callback import GemmProfiler, torch_cuda


@pytest.fixture(params=["cpu_build", "driverless_cuda_build"])
def torch_kind(request, monkeypatch):
    """This torch as a CPU build (private calls absent) or as a CUDA build without a driver."""
    if request.param == "cpu_build":
        for name in ("_cuda_getDevice", "_cuda_getCurrentStream"):
            monkeypatch.delattr(torch._C, name, raising=False)
        monkeypatch.setattr(torch.version, "cuda", None)  # the driverless mode's CUDA version taken back too
    else:
        for name in ("_cuda_getDevice", "_cuda_getCurrentStream"):
            monkeypatch.delattr(torch._C, name, raising=False)  # a CUDA build here: its own calls replaced
        driverless.install(lambda obj, name, value: monkeypatch.setattr(obj, name, value, raising=False))
    return request.param


def test_the_private_calls_fall_back_to_the_public_ones(torch_kind, monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)  # the public call, stood in
    assert torch_cuda.current_device() == 3
    assert torch_cuda.current_stream() is None  # Event.record(None): torch's own lookup
    assert torch_cuda.usable() is False
    assert torch_cuda.driverless() is (torch_kind == "driverless_cuda_build")


def test_a_driver_error_is_not_taken_for_a_device(monkeypatch):
    # Where the public call raises too (a CUDA build without a driver), its error reaches the
    # caller: no device number is made up.
    driverless.install(lambda obj, name, value: monkeypatch.setattr(obj, name, value, raising=False))
    with pytest.raises(RuntimeError, match="NVIDIA driver"):
        torch_cuda.current_device()


def test_is_available_that_raises_means_no_cuda(monkeypatch):
    def broken():
        raise RuntimeError("NVML: driver/library version mismatch")

    monkeypatch.setattr(torch.cuda, "is_available", broken)
    assert torch_cuda.usable() is False


def test_a_capture_runs_on_either_torch(torch_kind):
    model, x = Net(), torch.randn(4, 16, requires_grad=True)
    with GemmProfiler(model) as prof:
        for _ in range(3):
            step(model, x)
            prof.step()
    cap = prof.capture
    assert cap.records and all(r.times_ms for r in cap.records if r.op == "fprop")
    assert cap.gemm_clock() == "host_clock" and cap.step_clock() == "host_clock"  # no CUDA: said as such
