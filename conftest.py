"""Collection for the doctests of the package (pyproject.toml: ``--doctest-modules``)."""

import importlib.util

# The GPU gate's Triton kernel: its module imports Triton, which a CPU build of torch lacks; the
# module has no doctest, and tests/test_gpu.py runs the kernel where Triton is.
collect_ignore = [] if importlib.util.find_spec("triton") else ["te_gemm_callback/capture/gate_kernel.py"]
