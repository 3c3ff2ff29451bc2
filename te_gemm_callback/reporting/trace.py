"""The capture's kernels step as a Chrome trace (``trace.json``) for Perfetto and chrome://tracing: GEMM kernels
named after their GEMM, one track per CUDA stream, the step's span above, µs from the step's start."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any

from te_gemm_callback.capture.capture_file import GemmCapture, GemmRecord
from te_gemm_callback.capture.kernels import classify_kernel
from te_gemm_callback.files.jsonio import write_json

log = logging.getLogger("te_gemm_callback")

# Marks the file as ours: a trace.json without it (torch.profiler's) is never overwritten; viewers ignore the key.
TRACE_SCHEMA = "te-gemm-trace/1"
PID = 1  # one process: the GPU that ran the kernels step
STEP_TID = 0  # the step's span, above the kernel tracks


def no_trace_reason(cap: GemmCapture) -> str | None:
    """Why ``cap`` has no trace, in one line; None when it has one."""
    if cap.kernel_timeline is not None:
        return None
    if owner := cap.meta.get("cupti_owner"):  # capture/cupti.py: no kernels step ran under it
        return f"{owner} held CUPTI's kernel records during the capture: its own timeline has every kernel"
    if not any(s.kind == "kernels" for s in cap.steps):
        if str(cap.meta.get("device") or "").startswith("meta"):
            return "the model ran on the meta device: nothing runs there, so nothing was timed"
        if str(cap.meta.get("device") or "").startswith("CPU"):
            return "a CPU job has no GPU kernel records (the capture ran no kernels step)"
        return "the capture ran no kernels step (kernel_steps=0, or the job stopped before it)"
    join = cap.meta.get("kernel_join")
    if join and join != "joined by launch order":
        return f"the kernels step's GEMM kernels were not joined to the captured GEMMs ({join})"
    return "the capture holds no kernel timeline (no GEMM captured to name its kernels by, or an older capture file)"


def gemm_name(r: GemmRecord) -> str:
    return f"{r.name} {r.op} {r.precision}" + (" recompute" if r.recompute else "")


def _lanes(rows: list[list[Any]]) -> list[tuple[Any, int]]:
    """Each kernel's track (stream, lane): an overlap takes the first free lane (a track's events nest or are apart)."""
    ends: dict[Any, list[float]] = {}
    out = []
    for _, start, dur, stream, _, _ in rows:
        lanes = ends.setdefault(stream, [])
        lane = next((j for j, end in enumerate(lanes) if end <= start), len(lanes))
        if lane == len(lanes):
            lanes.append(0.0)
        lanes[lane] = start + dur
        out.append((stream, lane))
    return out


def _track_name(stream: Any, lane: int) -> str:
    base = f"stream {stream}" if stream is not None else "kernels (stream not recorded)"
    return base if lane == 0 else f"{base} (overlapping, {lane + 1})"


def _meta_event(name: str, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "ph": "M", "ts": 0, "pid": PID, "tid": tid, "args": args}


def trace_events(cap: GemmCapture) -> list[dict[str, Any]]:
    """The trace's events: metadata, the step span, then the kernels in start order ([] without a timeline)."""
    tl = cap.kernel_timeline
    if tl is None:
        return []
    st = cap.steps[tl.step] if 0 <= tl.step < len(cap.steps) else None
    kind = st.kind if st is not None else "kernels"
    lanes = _lanes(tl.kernels)
    # Tracks ordered by stream (the unrecorded one last), then lane; the step's span above them.
    order = sorted(set(lanes), key=lambda t: (t[0] is None, t[0] if t[0] is not None else 0, t[1]))
    tid = {t: j + 1 for j, t in enumerate(order)}
    device = cap.meta.get("device") or "GPU"
    events = [_meta_event("process_name", STEP_TID, {"name": f"{device}: kernels step {tl.step}"})]
    for n, label in [(STEP_TID, "step"), *((tid[t], _track_name(*t)) for t in order)]:
        events += [_meta_event("thread_name", n, {"name": label}),
                   _meta_event("thread_sort_index", n, {"sort_index": n})]
    step_args: dict[str, Any] = {"step": tl.step, "step_kind": kind, "kernels": tl.total,
                                 "kernels_shown": len(tl.kernels)}
    if st is not None:
        step_args.update(wall_ms=st.wall_ms, gpu_ms=st.gpu_ms, gemm_ms=st.gemm_ms, micro_batches=st.micro_batches)
    if cap.meta.get("kernel_timeline_cut"):
        step_args["cut"] = cap.meta["kernel_timeline_cut"]
    events.append({"name": f"step {tl.step} ({kind})", "cat": "step", "ph": "X", "ts": 0, "dur": tl.span_us,
                   "pid": PID, "tid": STEP_TID, "args": step_args})
    # A call of several GEMM kernels (split-K, grouped): the first is named after the GEMM, the others by part.
    parts = Counter(row[5] for row in tl.kernels if row[4] is not None and row[5] is not None)
    seen: Counter[int] = Counter()
    for row, track in zip(tl.kernels, lanes):
        at, start, dur, stream, record, call = row
        kernel = tl.names[at]
        args: dict[str, Any] = {"step_kind": kind, "stream": stream}
        if record is not None:
            r = cap.records[record]
            name, cat = gemm_name(r), "gemm"
            args.update({"kernel": kernel, "module": r.module or "<top>", "gemm": r.gemm, "pass": r.op,
                         "precision": r.precision, "shape": f"{r.m} x {r.k} x {r.n}", "batch": r.batch,
                         "flops": r.flops, "source": r.source, "call": call, "record": record})
            if parts[call] > 1:
                seen[call] += 1
                args["part"] = f"{seen[call]}/{parts[call]}"
                if seen[call] > 1:
                    name += f" (kernel {seen[call]} of {parts[call]})"
        else:
            name, cat = kernel, classify_kernel(kernel)
            if call is not None:  # an aten GEMM inside a module that another adapter's call counts
                cat = "gemm"
                args.update(call=call, counted="by the enclosing call another adapter captured")
        args["category"] = cat
        events.append({"name": name, "cat": cat, "ph": "X", "ts": start, "dur": dur, "pid": PID,
                       "tid": tid[track], "args": args})
    return events


def trace(cap: GemmCapture) -> dict[str, Any] | None:
    """The whole trace document (JSON object format), or None without a kernel timeline."""
    tl = cap.kernel_timeline
    if tl is None:
        return None
    other = {"source": "te-gemm capture", "device": cap.meta.get("device"), "created": cap.meta.get("created"),
             "step": tl.step, "kernels": tl.total, "kernels_shown": len(tl.kernels),
             "cut": cap.meta.get("kernel_timeline_cut"),
             "times": "GPU kernel records (CUPTI), µs from the step's start"}
    return {"schema": TRACE_SCHEMA, "traceEvents": trace_events(cap), "displayTimeUnit": "ms",
            "otherData": {k: v for k, v in other.items() if v is not None}}


def write_trace(cap: GemmCapture, path: str | Path, root: str | Path | None = None) -> Path | None:
    """Write ``cap``'s kernels step to ``path`` over a trace of ours only; None (reason logged) without one."""
    doc = trace(cap)
    if doc is None:
        log.info("te-gemm: no kernel trace: %s", no_trace_reason(cap))
        return None
    # Compact: a step of thousands of kernels, each event a dozen fields.
    return write_json(path, doc, indent=None, schema=TRACE_SCHEMA, root=root)
