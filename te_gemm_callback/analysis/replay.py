"""A what-if replay of one training step as the host launches it and the GPU runs it (trace-driven
simulation: Zhu et al., "Daydream", USENIX ATC 2020). Copies of the step run back to back, since the host
runs ahead into the next step; the step time is the period of the last copy."""

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
    """One host call of the step, in host order: ``gap`` µs of the job's own host work since the previous
    call returned, ``cost`` µs the call took on the host, ``ops`` the GPU work it started."""
    gap: float
    cost: float
    kind: str
    ops: list[Op] = field(default_factory=list)
    stream: int | None = None  # the stream a stream sync waits for
    name: str = ""


@dataclass
class StepTrace:
    """A step as recorded: ``tail`` host µs after the last call; ``latency`` µs from a launch to its kernel
    on an idle GPU; ``kernel_gap`` µs between queued kernels of one stream (docs/results/h200.md, facts the
    code relies on: kernel gap)."""
    calls: list[Call]
    tail: float = 0.0
    latency: float = 5.0
    kernel_gap: float = 0.0

    def with_ops(self, fn: Any) -> StepTrace:
        """A copy whose every op is ``fn(op)`` (an Op, or a list of Ops to put in its place)."""
        def each(op: Op) -> list[Op]:
            new = fn(op)
            return new if isinstance(new, list) else [new]

        return replace(self, calls=[replace(c, ops=[o for op in c.ops for o in each(op)]) for c in self.calls])


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


def replay(trace: StepTrace, copies: int = 4) -> ReplayResult:
    """The step of ``trace`` in steady state: ``copies`` steps back to back, the last one's period."""
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
            if c.kind == "sync_device" or (c.kind == "sync_stream" and c.stream not in stream_free):
                host = max(host, max(stream_free.values(), default=0.0))
            elif c.kind == "sync_stream":
                host = max(host, stream_free[c.stream])
            elif c.ops:
                ready = host + trace.latency
                for op in c.ops:
                    start = max(ready, stream_free[op.stream] + trace.kernel_gap if op.stream in stream_free else 0.0)
                    stream_free[op.stream] = start + op.dur
                    busy += op.dur
            host += c.cost
        host += trace.tail
        # A step ends once the host started the next and the GPU ran this one's work.
        ends.append(max(host, max(stream_free.values(), default=0.0)))
    step = ends[-1] - ends[-2]
    own = sum(c.gap + c.cost for c in trace.calls) + trace.tail
    return ReplayResult(step_us=step, gpu_busy_us=busy, host_us=own, bound="host" if own >= 0.98 * step else "gpu")
