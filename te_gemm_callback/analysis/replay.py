"""A what-if replay of one training step: the step as the host issues it and the GPU runs it.

The trace is the capture's kernels step: every CUDA runtime call the host made (when it left the
host and when it returned) and the kernel each launch started (its stream and its duration on the
GPU), joined by CUPTI's correlation id. The replay runs the host's calls again in their order, each
after the host work that preceded it in the job; a kernel starts when its launch has reached the
GPU and its stream is free; a synchronizing call returns when the GPU work it waits for is done.
Change a kernel's duration, add kernels, or add host time before a call, and the replay gives the
step that follows, bound by the host or by the GPU as the job would be (trace-driven what-if
simulation: Zhu et al., "Daydream", USENIX ATC 2020).

Several copies of the step are replayed back to back, since in a job the host runs ahead into the
next step while the GPU finishes the last; the step time is the period of the last copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any


@dataclass
class Op:
    """One GPU operation (kernel, copy, memset): its duration (µs), stream, and a label."""

    dur: float
    stream: int | None
    name: str = ""
    category: str = "other"
    gemm: int | None = None  # the capture record this GEMM kernel was joined to


@dataclass
class Call:
    """One host call of the step, in host order.

    ``gap``: host µs since the previous call returned (the job's own host work: Python, the
    framework, TE's host side); ``cost``: µs the call itself took on the host (for a sync, what it
    took beyond waiting; not knowable from the record alone, so the launch cost is used);
    ``ops``: the GPU operations it started (a launch: one; a grouped launch or a graph: several)."""

    gap: float
    cost: float
    kind: str
    ops: list[Op] = field(default_factory=list)
    stream: int | None = None  # the stream a stream sync waits for
    name: str = ""


@dataclass
class StepTrace:
    """A step as recorded: ``calls`` in host order; ``tail``: host µs after the last call until
    the step's end (the next step's start); ``latency``: µs from a launch leaving the host to its
    kernel able to start on an idle GPU (the median measured where the stream was idle);
    ``kernel_gap``: µs between one kernel's end and the next one's start on a stream that has it
    queued already (the GPU's own cost of starting a kernel: docs/results/h200.md, facts the code
    relies on: kernel gap)."""

    calls: list[Call]
    tail: float = 0.0
    latency: float = 5.0
    kernel_gap: float = 0.0

    def with_ops(self, fn: Any) -> StepTrace:
        """A copy whose every op is ``fn(op)`` (an Op, or a list of Ops to put in its place)."""
        calls = []
        for c in self.calls:
            ops: list[Op] = []
            for op in c.ops:
                new = fn(op)
                ops += new if isinstance(new, list) else [new]
            calls.append(replace(c, ops=ops))
        return replace(self, calls=calls)


@dataclass
class ReplayResult:
    """What the replay gives for one step in steady state (µs)."""

    step_us: float  # the period of the last replayed copy
    gpu_busy_us: float  # kernel time in that period
    host_us: float  # the host's own time per step (gaps + call costs, no waiting)
    bound: str  # "host" where the host's time per step is the step, else "gpu"

    @property
    def step_ms(self) -> float:
        return self.step_us / 1e3

    @property
    def gpu_idle_us(self) -> float:
        return max(self.step_us - self.gpu_busy_us, 0.0)

    def to_dict(self) -> dict[str, Any]:
        return {"step_ms": self.step_us / 1e3, "gpu_busy_ms": self.gpu_busy_us / 1e3,
                "host_ms": self.host_us / 1e3, "gpu_idle_ms": self.gpu_idle_us / 1e3, "bound": self.bound}


def replay(trace: StepTrace, copies: int = 4) -> ReplayResult:
    """The step of ``trace`` in steady state: ``copies`` steps replayed back to back (the host may
    run ahead of the GPU until a sync makes it wait), the last one's period taken."""
    if copies < 2:
        raise ValueError("copies must be at least 2: the step time is the period of the last copy")
    host = 0.0
    stream_free: dict[int | None, float] = {}
    ends: list[float] = []
    busy = 0.0
    for _ in range(copies):
        busy = 0.0
        for c in trace.calls:
            host += c.gap
            if c.kind == "sync_device":
                host = max(host, max(stream_free.values(), default=0.0))
            elif c.kind == "sync_stream":
                host = max(host, stream_free.get(c.stream, 0.0) if c.stream in stream_free
                           else max(stream_free.values(), default=0.0))
            elif c.ops:
                ready = host + trace.latency
                for op in c.ops:
                    start = max(ready, stream_free[op.stream] + trace.kernel_gap if op.stream in stream_free else 0.0)
                    stream_free[op.stream] = start + op.dur
                    busy += op.dur
            host += c.cost
        host += trace.tail
        # A step ends when the host has started the next one and the GPU has run this one's work:
        # in steady state the later of the two advances by one step period.
        ends.append(max(host, max(stream_free.values(), default=0.0)))
    step = ends[-1] - ends[-2]
    own = sum(c.gap + c.cost for c in trace.calls) + trace.tail
    return ReplayResult(step_us=step, gpu_busy_us=busy, host_us=own,
                        bound="host" if own >= 0.98 * step else "gpu")
