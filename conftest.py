"""Loaded before every test and doctest: collection of the package's doctests, and the
driverless-CUDA mode (``TE_GEMM_TEST_DRIVERLESS=1``).

What ``pip install torch`` gives a machine without a GPU is a CUDA build, whose private
``torch._C._cuda_*`` functions exist and raise RuntimeError when called; a CPU build (CI's pin)
has none. In driverless mode a CPU build is made to answer as that CUDA build does
(tests/helpers/driverless.py), so the whole suite runs the path a user's install takes.
``.ci/run`` runs the suite in this mode.
"""

import importlib.util
import os
from pathlib import Path

# The GPU gate's Triton kernel: its module imports Triton, which a CPU build of torch lacks; the
# module has no doctest, and tests/test_gpu.py runs the kernel where Triton is.
collect_ignore = [] if importlib.util.find_spec("triton") else ["te_gemm_callback/capture/gate_kernel.py"]


def _install_driverless_cuda() -> None:
    # Loaded by path: the tests' helpers are a package of tests/, not of the repository root.
    path = Path(__file__).parent / "tests" / "helpers" / "driverless.py"
    spec = importlib.util.spec_from_file_location("te_gemm_driverless", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.install()


if os.environ.get("TE_GEMM_TEST_DRIVERLESS") == "1":
    _install_driverless_cuda()


def pytest_report_header(config):
    if os.environ.get("TE_GEMM_TEST_DRIVERLESS") == "1":
        return "te-gemm: driverless-CUDA mode (a CPU build answering as a CUDA build without a driver)"
    return None
