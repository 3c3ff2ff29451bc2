"""te-gemm-callback: the GEMMs your training job really runs, and what each precision does to them."""

from .shapes import GemmOp, GemmShape, ModelConfig, backward_shapes, config_gemms

__version__ = "0.1.0"

__all__ = [
    "GemmCapture", "GemmProfiler", "GemmRecord", "GemmOp", "GemmShape", "ModelConfig",
    "backward_shapes", "config_gemms", "GemmProfilerCallback",
]


def __getattr__(name: str):
    # Imported on demand: the Lightning adapter (the core never imports Lightning) and the capture
    # (torch: `te-gemm bench --devices N` starts its GPU workers before this process pays for it).
    if name == "GemmProfilerCallback":
        from .callback import GemmProfilerCallback

        return GemmProfilerCallback
    if name in ("GemmCapture", "GemmProfiler", "GemmRecord"):
        from . import capture

        return getattr(capture, name)
    raise AttributeError(name)
