"""The capture a stopped :class:`~te_gemm_callback.GemmProfiler` hands back (:func:`build_capture`):
step times and final kinds, GEMM records, kernel-time join, coverage and the run's conditions.
``prof`` is that profiler, typed Any: this module is imported by the profiler's."""

from __future__ import annotations

import logging
import platform
from datetime import datetime, timezone
from typing import Any

import torch

from te_gemm_callback.capture.capture_file import GemmCapture, KernelTimeline, StepTime, aggregate
from te_gemm_callback.capture.coverage import coverage
from te_gemm_callback.capture.kernel_profile import (
    MAX_TIMELINE_KERNELS,
    breakdown_meta,
    join_records,
    kernel_calls,
    kernel_timeline,
)
from te_gemm_callback.capture.module_specs import module_specs
from te_gemm_callback.capture.steady import assess, graphs_compiled
from te_gemm_callback.capture.step_plan import CLEAN, INSTRUMENTED, KERNELS, PARTIAL, SETTLE
from te_gemm_callback.precisions import te_version

log = logging.getLogger("te_gemm_callback")


def build_capture(prof: Any) -> GemmCapture:
    rec = prof.recorder
    steps = []
    for i, s in enumerate(prof._steps):
        (t0, e0), (t1, e1) = s.start, s.end  # stop() closed every step
        gemm_ms = None
        if s.kind == KERNELS and s.kernels is not None:
            gemm_ms = s.kernels.gemm_ms()
        elif s.kind == INSTRUMENTED:
            times = [e.time_ms for e in rec.events if e.step == i and e.time_ms is not None]
            # A pair dropped (its gate gave up): the sum would fall short, so the step has none.
            gemm_ms = sum(times) if times and i not in rec.dropped else None
        steps.append(StepTime(
            index=i, wall_ms=(t1 - t0) * 1e3,
            gpu_ms=float(e0.elapsed_time(e1)) if e0 is not None and e1 is not None else None,
            gemm_ms=gemm_ms, micro_batches=s.micro_batches, kind=s.kind, dispatch=s.dispatch))
    # A step with fewer micro-batches than the fullest is never clean (tagged before the outlier test).
    full = max((s.micro_batches for s in prof._steps), default=1)
    kinds = [PARTIAL if s.kind in (CLEAN, SETTLE) and s.micro_batches < full else s.kind for s in prof._steps]
    steady = assess(kinds, [s.moved for s in prof._steps], [t.ms for t in steps], prof._wait,
                    [s.paused_s * 1e3 for s in prof._steps])
    for t, s, kind in zip(steps, prof._steps, steady.kinds):
        t.kind = s.kind = kind
    if steady.reached is False:
        log.warning("te-gemm: steady state %s", steady.verdict)
    # Steps recorded per source, in full steps (a step of 2 micro-batches where others run 5 is 2/5).
    te_steps = [s.micro_batches for s in prof._steps if s.kind == INSTRUMENTED and not s.order_failed]
    per_source = {"te": sum(te_steps) / full or 1,
                  "torch": sum(s.micro_batches for s in prof._steps if s.dispatch) / full or 1}
    failed = prof._step_ids(lambda s: s.order_failed)  # their TE GEMMs' owners are unknown
    kept = [e for e in rec.events if e.source != "te" or e.step not in failed]
    dispatch_only: list[str] = []
    if rec.timer.kind == "cuda_events":
        dispatch_only = _prefer_light_steps(kept, set(prof._step_ids(lambda s: s.dispatch)))
    records = aggregate(kept, per_source)
    meta = _meta(prof)
    meta["event_pairs"] = _event_pairs(rec, dispatch_only)
    meta["steady_state"] = steady.verdict
    partial = prof._step_ids(lambda s: s.kind == PARTIAL)
    if partial:
        meta["partial_steps"] = (f"steps {', '.join(map(str, partial))} ran fewer micro-batches than a full "
                                 f"step's {full} (gradient accumulation does not divide the epoch): not clean; "
                                 "GEMM counts and times are per full step")
    meta["unsteady_steps"] = steady.unsteady
    meta["owners_by_launch_order"] = {"steps": prof._step_ids(lambda s: s.by_order), "failed": failed}
    meta.update(_join_kernels(prof, records))
    if prof._session_ms:
        meta["kernel_session_ms"] = dict(prof._session_ms)
    if kernel_steps := prof._kernel_steps():
        meta.update(breakdown_meta(list(kernel_steps.values())))
    try:  # what the host-cost bench rebuilds; a model it cannot read costs only that
        meta["te_modules"] = module_specs(prof.model, records)
    except Exception as err:  # a model's own attribute access may raise anything
        meta["te_modules"] = {}
        log.debug("te-gemm: TE module specs not read: %s", err)
    if host := next((s.module_host_us for s in prof._steps if s.module_host_us), None):
        meta["module_host_us"] = host  # the settle step's host time per TE module (host_clock.py)
    timeline = _timeline(prof, records)
    if timeline is not None and timeline.total > len(timeline.kernels):
        meta["kernel_timeline_cut"] = (f"the kernels step ran {timeline.total} kernels; its timeline keeps the "
                                       f"first {len(timeline.kernels)} by start")
    return GemmCapture(records=records, steps=steps, meta=meta, coverage=_coverage(prof, records),
                       kernel_timeline=timeline)


def _join_ref(prof: Any) -> tuple[list, list[tuple[int, ...]] | None]:
    """The reference step's GEMM calls in launch order (the last dispatch step: it saw every GEMM),
    and the kernel counts each may have launched."""
    ref_ids = prof._step_ids(lambda s: s.dispatch) or prof._step_ids(
        lambda s: s.kind == INSTRUMENTED and not s.order_failed)
    if not ref_ids:
        return [], None
    return prof.recorder.sequences.get(ref_ids[-1], []), prof.recorder.kernel_counts.get(ref_ids[-1])


def _timeline(prof: Any, records: list) -> KernelTimeline | None:
    """The first kernels step whose kernels joined the captured GEMMs, as a timeline, or None."""
    ref, counts = _join_ref(prof)
    if not ref or prof.instruments.eager_compiled.modules:  # nothing to name GEMMs by, or no launch-order join
        return None
    record_of = {r.key(): j for j, r in enumerate(records)}
    for i, ks in sorted(prof._kernel_steps().items()):
        calls = kernel_calls(ref, ks, counts)
        if calls is not None:
            return kernel_timeline(i, ks, calls, ref, record_of, MAX_TIMELINE_KERNELS)
    return None


def _join_kernels(prof: Any, records: list) -> dict[str, Any]:
    """Per-GEMM kernel times from the kernels steps, joined by launch order to the reference step."""
    ref, counts = _join_ref(prof)
    source = prof.recorder.timer.kind if any(r.times_ms for r in records) else "none"
    out: dict[str, Any] = {"gemm_time_source": source}
    if not ref:
        return out  # nothing captured to join kernels to (no instrumented step, or no GEMM)
    kernel_steps = prof._kernel_steps()
    if kernel_steps and prof.instruments.eager_compiled.modules:
        # Captured from the eager forward, while the kernels step runs fused or reordered compiled kernels.
        out["kernel_join"] = ("not joined: a torch.compile model runs its compiled kernels on the kernels step, "
                              "its eager ones while instrumented; per-step GEMM kernel time is kept")
        return out
    if not kernel_steps:
        if prof.cupti is not None and prof._base_plan.kernels:
            out["kernel_join"] = (f"no kernel records: {prof.cupti.name} holds CUPTI's activity records in this "
                                  "process; " + ("no GEMM is timed under it" if prof.timing == "none" else
                                                 "per-GEMM times from CUDA events on the instrumented steps"))
        elif prof.plan.kernels:
            out["kernel_join"] = f"no kernel records ({prof.kernel_profile.error or 'no kernels step ran'})"
        return out
    out.update(join_records(records, ref, counts, kernel_steps, source))
    return out


def _coverage(prof: Any, records: list) -> dict[str, Any]:
    warn = prof.recorder.error is None and any(s.kind == INSTRUMENTED for s in prof._steps)
    dispatch = prof._step_ids(lambda s: s.dispatch)
    return {
        **coverage(prof.model, prof.scope.ran | prof.scope.weights_used, te_watched=prof.te is not None,
                   torch_watched=bool(dispatch), warn=warn),
        "captured_flops_per_step": sum(r.flops_per_step for r in records),
        "dispatch_steps": dispatch,
        "step_kinds": [s.kind for s in prof._steps],
        "error": prof.recorder.error,
    }


def _meta(prof: Any) -> dict[str, Any]:
    cuda = torch.cuda.is_available() and not prof.on_meta
    compiled = sorted(prof.instruments.eager_compiled.modules)
    return {
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": "meta device" if prof.on_meta else
                  torch.cuda.get_device_name() if cuda else f"CPU ({platform.machine()})",
        "compute_capability": ".".join(map(str, torch.cuda.get_device_capability())) if cuda else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformer_engine": te_version() if prof.te is not None and prof.te.te_loaded() else None,
        "python": platform.python_version(),
        "adapters": list(prof.adapters),
        "timing": prof.recorder.timer.kind,
        "step_time": "clean steps (nothing attached)" if any(s.kind == CLEAN for s in prof._steps) else
                     "no clean step: step times include the capture instruments",
        "model": type(prof.model).__name__,
        "compiled": bool(compiled),
        "compiled_modules": compiled,
        # 0 with a compiled model: it runs eagerly (dynamo disabled, or its frames skipped before).
        "dynamo_graphs": graphs_compiled() if compiled else None,
        "graphed_modules": sorted(prof.scope.shown.get(n, n) for n in prof.instruments.eager.graphed),  # as owners read
        "clocks_during_capture": prof._clocks.summary() if prof._clocks is not None else None,
        "cupti_owner": prof.cupti.meta() if prof.cupti is not None else None,
    }


def _event_pairs(rec: Any, dispatch_only: list[str]) -> dict[str, Any] | None:
    """What led the event pairs, their floor (us, by device), how many were dropped (gate gave up) and below floor."""
    if rec.timer.kind != "cuda_events":
        return None
    return {"lead": "+".join(sorted(rec.timer.leads)) or None,
            "floor_us": {str(d): round(ms * 1e3, 2) for d, ms in sorted(rec.timer.floors.items())},
            "dropped": sum(rec.dropped.values()), "below_floor": rec.below_floor,
            "dispatch_steps_only": dispatch_only}


def _prefer_light_steps(events: list, dispatch_steps: set[int]) -> list[str]:
    """Drop dispatch-mode times of GEMMs lighter steps timed too (that mode's Python cost per aten op
    leaves the GPU less loaded than the job's). Returns the GEMMs (``module[.gemm] pass``) timed on
    dispatch-mode steps only while lighter steps timed others."""
    light = {e.key() for e in events if e.time_ms is not None and e.step not in dispatch_steps}
    only = set()
    for e in events:
        if e.step in dispatch_steps and e.time_ms is not None:
            if e.key() in light:
                e.time_ms = None
            elif light:
                only.add(f"{e.module or '<top>'}{'.' + e.gemm if e.gemm else ''} {e.op}")
    return sorted(only)
