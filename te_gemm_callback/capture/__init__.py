"""Live capture: which GEMMs a model runs, in what precision, and how long they take."""

from te_gemm_callback.capture.capture_file import GemmCapture, GemmEvent, GemmRecord, StepTime

__all__ = ["GemmProfiler", "GemmCapture", "GemmEvent", "GemmRecord", "StepTime"]


def __getattr__(name: str):
    if name == "GemmProfiler":  # needs torch; the capture file types do not
        from te_gemm_callback.capture.profiler import GemmProfiler

        return GemmProfiler
    raise AttributeError(name)
