"""A capture: GEMM records (:mod:`.capture_items`, re-exported here), step times and the run's
conditions, and its JSON file (schema ``te-gemm-capture/1``, docs/capture-format.md)."""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from te_gemm_callback.capture.capture_items import (  # noqa: F401  (re-exported: the capture's parts)
    MAX_CALLS,
    GemmEvent,
    GemmRecord,
    KernelTimeline,
    StepTime,
    aggregate,
)
from te_gemm_callback.capture.step_plan import STEP_KINDS
from te_gemm_callback.files.jsonio import CAPTURE_FILE, check, from_fields, read_schema, write_json
from te_gemm_callback.shapes import PASS_NAMES, GemmShape

SCHEMA = "te-gemm-capture/1"


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


@dataclass
class GemmCapture:
    """Every GEMM recorded inside a profiled region, grouped into records.

    Example:
        >>> cap = GemmCapture.load("gemm_capture.json")       # doctest: +SKIP
        >>> sum(r.flops_per_step for r in cap.records)         # doctest: +SKIP
    """

    records: list[GemmRecord]
    steps: list[StepTime]
    meta: dict[str, Any] = field(default_factory=dict)
    coverage: dict[str, Any] = field(default_factory=dict)
    kernel_timeline: KernelTimeline | None = None

    @property
    def num_steps(self) -> int:
        return max(len(self.steps), 1)

    @property
    def flops_per_step(self) -> float:
        return sum(r.flops_per_step for r in self.records)

    def steps_of(self, kind: str) -> list[StepTime]:
        return [s for s in self.steps if s.kind == kind]

    @property
    def full_micro_batches(self) -> int:
        """Micro-batches of a full step (the fullest one captured): a step with fewer is partial."""
        return max((s.micro_batches for s in self.steps), default=1)

    def full_steps_of(self, kind: str) -> list[StepTime]:
        """:meth:`steps_of` without partial steps (fewer micro-batches), unless all are."""
        steps = self.steps_of(kind)
        full = [s for s in steps if s.micro_batches >= self.full_micro_batches]
        return full or steps

    def gemm_ms_per_step(self) -> float | None:
        """GEMM GPU time per step: kernels steps', else instrumented steps' (a partial one scaled to a full step)."""
        full = self.full_micro_batches
        for kind in ("kernels", "instrumented"):
            times = [s.gemm_ms * full / s.micro_batches for s in self.steps_of(kind) if s.gemm_ms is not None]
            if times:
                return statistics.median(times)
        return None

    def step_ms(self) -> float | None:
        """Median time of the full clean steps, else of the settle, kernels, then instrumented ones."""
        kind = self.step_kind()
        return statistics.median(s.ms for s in self.full_steps_of(kind)) if kind is not None else None

    def instrument_cost(self) -> dict[str, float] | None:
        """Instrumented against clean step time (medians, full steps); dispatch-mode steps apart."""
        full = [s for s in self.steps if s.micro_batches >= self.full_micro_batches]
        clean = _median([s.ms for s in full if s.kind == "clean"])
        parts = {"instrumented": _median([s.ms for s in full if s.kind == "instrumented" and not s.dispatch]),
                 "dispatch": _median([s.ms for s in full if s.kind == "instrumented" and s.dispatch]),
                 # CUPTI's per-launch cost: shown, though no step time comes from it
                 "kernels": _median([s.ms for s in full if s.kind == "kernels"])}
        if not clean or (parts["instrumented"] is None and parts["dispatch"] is None):
            return None
        out = {"clean_ms": clean}
        for kind, ms in parts.items():
            if ms is not None:
                out.update({f"{kind}_ms": ms, f"{kind}_pct": 100 * (ms / clean - 1)})
        return out

    def step_kind(self) -> str | None:
        """The kind of step :meth:`step_ms` draws from."""
        return next((k for k in ("clean", "settle", "kernels", "instrumented") if self.steps_of(k)), None)

    def step_clock(self) -> str | None:
        """The clock behind :meth:`step_ms`: "cuda_events" where those steps carry a GPU time, else "host_clock"."""
        kind = self.step_kind()
        if kind is None:
            return None
        return "cuda_events" if any(s.gpu_ms is not None for s in self.steps_of(kind)) else "host_clock"

    def step_spread(self) -> dict[str, Any] | None:
        """The count of the steps :meth:`step_ms` draws from and half their range in % of their median: the noise
        of any figure made from the step time."""
        kind = self.step_kind()
        if kind is None:
            return None
        times = [s.ms for s in self.full_steps_of(kind)]
        med = statistics.median(times)
        spread = 100 * (max(times) - min(times)) / 2 / med if len(times) > 1 and med > 0 else None
        return {"kind": kind, "steps": len(times), "spread_pct": spread}

    def gemm_clock(self) -> str | None:
        """The clock behind :meth:`gemm_ms_per_step`, None when no GEMM was timed; inferred for older files."""
        if not any(s.gemm_ms is not None for s in self.steps):
            return None
        if any(s.kind == "kernels" and s.gemm_ms is not None for s in self.steps):
            return "kernel_records"
        known = ("kernel_records", "cuda_events", "host_clock")
        for key in ("gemm_time_source", "timing"):
            if self.meta.get(key) in known:
                return self.meta[key]
        if str(self.meta.get("device") or "").startswith("CPU"):
            return "host_clock"
        return "cuda_events" if any(s.gpu_ms is not None for s in self.steps) else "host_clock"

    def gemm_share_in_timed_steps(self) -> tuple[float, float] | None:
        """(GEMM share, step ms), medians over the steps whose GEMMs were timed, each against its own time."""
        for kind in ("kernels", "instrumented"):
            timed = [(s.gemm_ms, s.ms) for s in self.full_steps_of(kind) if s.gemm_ms is not None and s.ms > 0]
            if timed:
                return (statistics.median(g / ms for g, ms in timed),
                        statistics.median(ms for _, ms in timed))
        return None

    def by_module(self) -> dict[str, list[GemmRecord]]:
        out: dict[str, list[GemmRecord]] = {}
        for r in self.records:
            out.setdefault(r.module, []).append(r)
        return out

    def shapes(self) -> list[GemmShape]:
        return [r.shape for r in self.records]

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "meta": self.meta,
            "summary": {
                "num_steps": len(self.steps),
                "gemm_flops_per_step": self.flops_per_step,
                "step_ms_median": self.step_ms(),
                "gemm_ms_per_step_median": self.gemm_ms_per_step(),
                "instrument_cost": self.instrument_cost(),
            },
            "steps": [asdict(s) for s in self.steps],
            "records": [asdict(r) for r in self.records],
            "coverage": self.coverage,
            **({"kernel_timeline": asdict(self.kernel_timeline)} if self.kernel_timeline is not None else {}),
        }

    def save(self, path: str | Path, root: str | Path | None = None) -> Path:
        """Write atomically; never over a file that is not a capture, nor through a linked folder below ``root``."""
        return write_json(path, self.to_dict(), schema=SCHEMA, root=root)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GemmCapture:
        if not isinstance(d, dict) or d.get("schema") != SCHEMA:
            got = d.get("schema") if isinstance(d, dict) else type(d).__name__
            raise ValueError(f"not a te-gemm capture (schema {got!r}, want {SCHEMA!r})")
        try:
            cap = cls(records=[from_fields(GemmRecord, r) for r in d["records"]],
                      steps=[from_fields(StepTime, s) for s in d["steps"]],
                      meta=d.get("meta") or {}, coverage=d.get("coverage") or {})
        except (KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"malformed te-gemm capture: {type(err).__name__}: {err}") from None
        cap.validate()
        cap.kernel_timeline = KernelTimeline.read(d.get("kernel_timeline"), len(cap.records), len(cap.steps))
        return cap

    def validate(self) -> None:
        """Raise ValueError where the file is damaged: a record or step no run can have."""
        def bad(x: Any, least: float) -> bool:
            return isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < least

        tl = self.kernel_timeline
        # Field types first: the range checks below assume numbers where numbers belong.
        check({"records": [vars(r) for r in self.records], "steps": [vars(s) for s in self.steps],
               "meta": self.meta, "coverage": self.coverage,
               "kernel_timeline": vars(tl) if tl is not None else None}, CAPTURE_FILE)
        for r in self.records:
            if bad(r.m, 0) or bad(r.k, 1) or bad(r.n, 1) or bad(r.batch, 1):
                raise ValueError(f"GEMM {r.name} {r.op} has impossible dimensions {r.m}x{r.k}x{r.n} (batch {r.batch})")
            if r.op not in PASS_NAMES:
                raise ValueError(f"GEMM {r.name} has an unknown pass {r.op!r}")
            if bad(r.calls, 0) or bad(r.calls_per_step, 0):
                raise ValueError(f"GEMM {r.name} {r.op} has an impossible call count "
                                 f"({r.calls}, {r.calls_per_step} per step)")
            if r.calls > MAX_CALLS or r.calls_per_step > MAX_CALLS:  # else FLOPs per step overflow to inf
                raise ValueError(f"GEMM {r.name} {r.op} has an impossible call count ({r.calls}, {r.calls_per_step} "
                                 f"per step; at most {MAX_CALLS:.0e})")
            if r.flops != 2 * r.batch * r.m * r.k * r.n:  # what the tables and TFLOP/s are computed from
                raise ValueError(f"GEMM {r.name} {r.op} has {r.flops} FLOPs per call, but its shape "
                                 f"{r.batch}x{r.m}x{r.k}x{r.n} has {2 * r.batch * r.m * r.k * r.n}")
            # A grouped GEMM's token rows are its experts' rows: m, or k for wgrad.
            rows = r.k if r.op == "wgrad" else r.m
            if any(sum(sp) != rows for sp in r.m_splits):
                raise ValueError(f"GEMM {r.name} {r.op} has m_splits that do not add up to its "
                                 f"{'k' if r.op == 'wgrad' else 'm'} ({rows})")
            if any(bad(t, 0) for t in r.times_ms):
                raise ValueError(f"GEMM {r.name} {r.op} has negative or non-finite times")
        for s in self.steps:
            if s.kind not in STEP_KINDS:
                raise ValueError(f"step {s.index} has an unknown kind {s.kind!r}: expected one of "
                                 f"{', '.join(STEP_KINDS)}; the file is damaged")
            if bad(s.wall_ms, 0) or any(v is not None and bad(v, 0) for v in (s.gpu_ms, s.gemm_ms)):
                raise ValueError(f"step {s.index} has negative or non-finite times")
            if s.wall_ms == 0 or s.gpu_ms == 0:  # no step takes no time; every speedup and share divides by it
                raise ValueError(f"step {s.index} has a {'wall' if s.wall_ms == 0 else 'GPU'} time of 0 ms: "
                                 "the file is damaged")

    @classmethod
    def load(cls, path: str | Path) -> GemmCapture:
        data = read_schema(path, SCHEMA, "te-gemm capture")
        try:
            return cls.from_dict(data)
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from None
