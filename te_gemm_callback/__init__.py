"""te-gemm-callback: the GEMMs your training job really runs, and what each precision does to them."""

from .capture import GemmCapture, GemmProfiler, GemmRecord
from .shapes import GemmOp, GemmShape, ModelConfig, backward_shapes, config_gemms

__version__ = "0.1.0"

__all__ = [
    "GemmCapture", "GemmProfiler", "GemmRecord", "GemmOp", "GemmShape", "ModelConfig",
    "backward_shapes", "config_gemms", "GemmProfilerCallback",
]


def __getattr__(name: str):
    # The Lightning adapter is imported on demand: the core never imports Lightning.
    if name == "GemmProfilerCallback":
        from .callback import GemmProfilerCallback

        return GemmProfilerCallback
    raise AttributeError(name)
