"""Nsight Systems' own GPU time for each of our GEMM ranges, beside the capture's time for it.

``nsys stats -r nvtx_gpu_proj_trace`` projects every NVTX range onto the GPU work launched inside
it, from nsys's own kernel records (CUPTI, which nsys owns while it profiles): one row per range
instance. A GEMM range opens after the gate and the start event and closes after the end event, so
its projection is that GEMM's kernels alone: the measurement our CUDA-event pair stands in for, in
the same run. Each GEMM instance is put in the step whose range holds its start (host times: a
step range is pushed on the main thread, which waits for autograd's threads inside it), so the
median here is over the same steps as the capture's (dispatch-mode steps left out where a step
without that mode timed the GEMM too).

Needs a report nsys could import (a ``.nsys-rep``): nsys runs its QdstrmImporter for that, which on
the H200 host needs ``libdw.so.1`` (elfutils) on ``LD_LIBRARY_PATH``; without it nsys keeps only the
``.qdstrm`` ("Unable to retrieve the importer version") and there is nothing to project.
"""

from __future__ import annotations

import csv
import functools
import re
import statistics
import subprocess
from pathlib import Path

STEP = re.compile(r"step (\d+) \(([^)]+)\)$")


def projection_rows(nsys: str, rep: Path) -> list[dict[str, str]]:
    """The ``nvtx_gpu_proj_trace`` rows of ``rep`` (the CSV nsys writes beside it is kept); one
    ``nsys stats`` run per recording as it is now (it exports to SQLite first: seconds)."""
    st = rep.stat()
    return _rows(nsys, rep.resolve(), st.st_mtime_ns, st.st_size)


@functools.cache
def _rows(nsys: str, rep: Path, mtime_ns: int, size: int) -> list[dict[str, str]]:
    prefix = rep.with_suffix("")
    for old in rep.parent.glob(f"{prefix.name}*nvtx_gpu_proj_trace*.csv"):
        old.unlink()  # never read an earlier recording's rows
    subprocess.run([nsys, "stats", "-q", "-r", "nvtx_gpu_proj_trace", "-f", "csv", "--force-export=true",
                    "--force-overwrite=true", "-o", str(prefix), str(rep)],
                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=True, timeout=600)
    found = sorted(rep.parent.glob(f"{prefix.name}*nvtx_gpu_proj_trace*.csv"))
    if not found:
        raise FileNotFoundError(f"nsys stats wrote no nvtx_gpu_proj_trace CSV beside {rep}")
    with open(found[0], newline="") as f:
        return list(csv.DictReader(f))


def _column(row: dict[str, str], *words: str) -> str:
    """The first column whose header holds every word (nsys's headers carry units, e.g. '(ns)')."""
    for key in row:
        if all(w.lower() in key.lower() for w in words):
            return key
    raise KeyError(f"no column with {words} among {list(row)}")


def _ours(name: str) -> str | None:
    """A range name of ours without its domain, None for anyone else's (TE's own ``:nvte_*`` ranges,
    the job's): nsys writes a domain's ranges as ``te_gemm:<name>`` (nsys 2025.3), and
    torch.cuda.nvtx's (no domains) carry ``te_gemm: `` in the name itself."""
    return name[len("te_gemm:"):].lstrip() if name.startswith("te_gemm:") else None


def _int(value: str | None) -> int | None:
    return int(value) if value not in ("", None) else None


def per_step(rows: list[dict[str, str]]) -> tuple[dict[str, dict[int, list[float]]], dict[int, str], int]:
    """{GEMM range name: {step index: [projected ms, ...]}}, {step index: kind}, and how many GEMM
    instances fell in no step range of their process (left out). A range with no GPU work or an
    unfinished one (empty fields) counts nowhere; steps are matched within one process (PID), so
    the ranks of a multi-process job do not mix."""
    if not rows:
        return {}, {}, 0
    name, pid = _column(rows[0], "name"), _column(rows[0], "pid")
    start, length = _column(rows[0], "orig", "start"), _column(rows[0], "orig", "duration")
    dur = _column(rows[0], "projected", "duration")
    steps, gemms = [], []
    for r in rows:
        n = _ours(r[name])
        t0, t = _int(r[start]), _int(r[length])
        if n is None or t0 is None:
            continue
        if m := STEP.match(n):
            if t is not None:
                steps.append((r[pid], t0, t0 + t, int(m.group(1)), m.group(2)))
        elif (ns := _int(r[dur])) is not None:
            gemms.append((n, r[pid], t0, ns / 1e6))
    out: dict[str, dict[int, list[float]]] = {}
    outside = 0
    for n, p, t0, ms in gemms:
        step = next((i for q, s, e, i, _ in steps if q == p and s <= t0 <= e), None)
        if step is None:
            outside += 1
        else:
            out.setdefault(n, {}).setdefault(step, []).append(ms)
    return out, {i: kind for _, _, _, i, kind in steps}, outside


def compare(proj: dict[str, dict[int, list[float]]], captured: dict[str, float],
            dispatch_steps: set[int]) -> list[dict]:
    """Per GEMM the capture timed: nsys's median projection over the steps the capture used (those
    without the dispatch mode where any timed it, else all) against the capture's median; a GEMM
    nsys has no projection for keeps a row with ``nsys_proj_ms`` None."""
    rows = []
    for name, ours in captured.items():
        by_step = proj.get(name)
        if not by_step:
            rows.append({"gemm": name, "nsys_proj_ms": None, "capture_ms": ours, "instances": 0,
                         "capture_vs_nsys": None})
            continue
        light = {s: v for s, v in by_step.items() if s not in dispatch_steps}
        xs = [x for v in (light or by_step).values() for x in v]
        theirs = statistics.median(xs)
        rows.append({"gemm": name, "nsys_proj_ms": theirs, "capture_ms": ours, "instances": len(xs),
                     "capture_vs_nsys": ours / theirs - 1 if theirs else None})
    return sorted(rows, key=lambda r: -(r["nsys_proj_ms"] or 0.0))
