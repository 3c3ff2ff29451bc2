"""Live capture: which GEMMs a model runs, in what precision, and how long they take."""

from .profiler import GemmProfiler
from .record import GemmCapture, GemmEvent, GemmRecord, StepTime

__all__ = ["GemmProfiler", "GemmCapture", "GemmEvent", "GemmRecord", "StepTime"]
