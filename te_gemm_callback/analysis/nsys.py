"""The capture's GEMM times beside Nsight Systems' projection of the same NVTX ranges onto the GPU
(``nsys stats -r nvtx_gpu_proj_trace``), per step range of the capture's own process. Needs a ``.nsys-rep``
(docs/results/h200.md, facts the code relies on: nsys importer)."""

from __future__ import annotations

import contextlib
import csv
import functools
import glob
import os
import re
import shutil
import signal
import statistics
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from te_gemm_callback.capture.instruments import NVTX_DOMAIN, range_name


class UsageError(ValueError):
    """The command line must change (which process to compare): te-gemm exits 2 for it."""


STEP = re.compile(r"step (\d+) \(([^)]+)\)$")
PREFIX = f"{NVTX_DOMAIN}:"
NSYS_SCHEMA = "te-gemm-nsys/1"  # te-gemm nsys --json
MAX_FIELD = 16 * 2**20  # bytes in one CSV field
NSYS_TIMEOUT_S = 600
TAIL_BYTES = 4096  # of nsys's output: what a failure is said with


def find_nsys(given: str | None = None) -> str | None:
    """nsys from ``given``, PATH, or an Nsight install under /opt (docs/results/h200.md, facts the code relies
    on: nsys location)."""
    if given:
        return given
    return shutil.which("nsys") or next(iter(sorted(
        glob.glob("/opt/nvidia/nsight-systems*/**/bin/nsys", recursive=True)
        + glob.glob("/opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys"))), None)


def projection_rows(nsys: str, rep: Path) -> list[dict[str, str]]:
    """The ``nvtx_gpu_proj_trace`` rows of ``rep``: one ``nsys stats`` run per recording as it is now."""
    st = rep.stat()
    return _rows(nsys, rep.resolve(), st.st_mtime_ns, st.st_size)


def csv_path(rep: Path) -> Path:
    """Where ``nsys stats -o PREFIX`` writes the rows (docs/results/h200.md, facts the code relies on: nsys names)."""
    return rep.with_suffix("").with_name(f"{rep.with_suffix('').name}_nvtx_gpu_proj_trace.csv")


@functools.cache
def _rows(nsys: str, rep: Path, mtime_ns: int, size: int) -> list[dict[str, str]]:
    out = csv_path(rep)
    _check_ours(out, rep.with_suffix(".sqlite"))
    out.unlink(missing_ok=True)  # never read an earlier recording's rows (nsys's own: checked)
    _run_nsys([nsys, "stats", "-q", "-r", "nvtx_gpu_proj_trace", "-f", "csv", "--force-export=true",
               "--force-overwrite=true", "-o", str(rep.with_suffix("")), str(rep)])
    if not out.exists():
        raise FileNotFoundError(f"nsys stats wrote no {out.name} beside {rep}")
    limit = csv.field_size_limit()
    try:
        csv.field_size_limit(MAX_FIELD)  # a range name can be long (a C++ kernel name in it)
        with open(out, newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))
    except (csv.Error, UnicodeDecodeError) as err:
        raise ValueError(f"{out} is not the CSV nsys stats writes ({type(err).__name__}: {str(err)[:120]})") from None
    finally:
        csv.field_size_limit(limit)


def _check_ours(csv_file: Path, sqlite_file: Path) -> None:
    """Refuse a user's file where nsys stats would overwrite its CSV or SQLite export."""
    if csv_file.exists():
        with open(csv_file, "rb") as f:
            head = f.read(4096).split(b"\n", 1)[0].lower()
        if not all(w in head for w in (b"name", b"projected", b"duration")):  # the columns _projections reads
            raise ValueError(f"{csv_file} is not a CSV nsys stats wrote (no projected duration in its header), "
                             "and nsys would replace it: move it, or give the report another name")
    if sqlite_file.exists():
        with open(sqlite_file, "rb") as f:
            if f.read(16) != b"SQLite format 3\x00":
                raise ValueError(f"{sqlite_file} is not an SQLite export, and nsys would replace it: move it, or give "
                                 "the report another name")


def _run_nsys(cmd: list[str]) -> None:
    """Run nsys in a process group of its own, killed whole on the timeout; its output (it can print
    gigabytes) goes to a file whose tail a failure carries. Raises as subprocess.run."""
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=NSYS_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        if code != 0:
            size = log.seek(0, os.SEEK_END)
            log.seek(max(size - TAIL_BYTES, 0))
            raise subprocess.CalledProcessError(code, cmd, output=log.read())


def _column(row: dict[str, str], *words: str) -> str:
    """The first column whose header holds every word (nsys's headers carry units, e.g. '(ns)')."""
    for key in row:
        if all(w.lower() in key.lower() for w in words):
            return key
    raise KeyError(f"no column with {words} among {list(row)}")


def _ours(name: str) -> str | None:
    """A range name of ours without its ``te_gemm:`` domain, None for anyone else's (docs/results/h200.md,
    facts the code relies on: nsys names)."""
    return name[len(PREFIX):].lstrip() if name.startswith(PREFIX) else None


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value else None
    except ValueError:
        return None


def processes(rows: list[dict[str, str]]) -> list[str]:
    """The PIDs whose ranges include a step range of ours (one per rank of a multi-process job)."""
    if not rows:
        return []
    name, pid = _column(rows[0], "name"), _column(rows[0], "pid")
    return sorted({r[pid] for r in rows if (n := _ours(r[name])) is not None and STEP.match(n)})


def per_step(rows: list[dict[str, str]], only_pid: str | None = None
             ) -> tuple[dict[str, dict[int, list[float]]], dict[int, str], int]:
    """{GEMM range: {step: [projected ms]}}, {step: kind}, and how many GEMMs fell in no step range of their
    process; ``only_pid`` keeps one process's ranges."""
    if not rows:
        return {}, {}, 0
    name, pid = _column(rows[0], "name"), _column(rows[0], "pid")
    start, length = _column(rows[0], "orig", "start"), _column(rows[0], "orig", "duration")
    dur = _column(rows[0], "projected", "duration")
    steps, gemms = [], []
    for r in rows:
        n = _ours(r[name])
        t0, t = _int(r[start]), _int(r[length])
        if n is None or t0 is None or (only_pid is not None and r[pid] != only_pid):
            continue
        if m := STEP.match(n):
            if t is not None:
                steps.append((r[pid], t0, t0 + t, int(m.group(1)), m.group(2)))
        elif (ns := _int(r[dur])) is not None and ns >= 0:  # a negative duration is no time: left out
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
    """Per GEMM the capture timed: nsys's median projection over the capture's steps against the capture's."""
    rows = []
    for name, ours in captured.items():
        by_step = proj.get(name) or {}
        light = {s: v for s, v in by_step.items() if s not in dispatch_steps}
        xs = [x for v in (light or by_step).values() for x in v]
        theirs = statistics.median(xs) if xs else None
        rows.append({"gemm": name, "nsys_proj_ms": theirs, "capture_ms": ours, "instances": len(xs),
                     "capture_vs_nsys": ours / theirs - 1 if theirs else None})
    return sorted(rows, key=lambda r: -(r["nsys_proj_ms"] or 0.0))


def capture_times(cap: Any) -> dict[str, float]:
    """{range name: the capture's median GEMM time (ms)}, for every GEMM it timed."""
    return {range_name(r.module, r.gemm, r.op, r.shape.mkn, r.precision, r.recompute): r.median_ms
            for r in cap.records if r.median_ms is not None}


@dataclass
class NsysComparison:
    """A capture's GEMM times beside nsys's projection of the same ranges in the same run."""
    rows: list[dict]
    outside_steps: int  # GEMM ranges in no step range of their process: left out
    steps: dict[int, str]  # step index -> kind, as nsys recorded the step ranges

    @property
    def differences(self) -> list[float]:
        return sorted(abs(r["capture_vs_nsys"]) for r in self.rows if r["capture_vs_nsys"] is not None)

    def to_dict(self) -> dict:
        return {"schema": NSYS_SCHEMA, "rows": self.rows, "outside_steps": self.outside_steps,
                "steps": {str(i): k for i, k in self.steps.items()}}


def against_capture(cap: Any, rep: Path, nsys: str, pid: str | None = None) -> NsysComparison:
    """The capture against nsys's projection of its ranges in ``rep`` (``pid``: its process, of several);
    ValueError with what to do where they do not fit."""
    if rep.suffix == ".qdstrm":
        raise ValueError(f"{rep} is a .qdstrm: nsys could not import it (its QdstrmImporter did not start; "
                         "docs/nsight-systems.md says how to find why), and nsys stats reads only a .nsys-rep")
    if rep.suffix != ".nsys-rep":
        raise ValueError(f"{rep}: the report must be the .nsys-rep nsys wrote (nsys profile -o NAME)")
    try:
        rows = projection_rows(nsys, rep)
    except subprocess.CalledProcessError as err:
        said = (err.stdout or b"").decode(errors="replace").strip().splitlines()
        raise ValueError(f"nsys stats failed on {rep}: {said[-1] if said else f'exit {err.returncode}'}") from None
    except subprocess.TimeoutExpired:
        raise ValueError(f"nsys stats took over {NSYS_TIMEOUT_S // 60} minutes on {rep}: stopped, with the "
                         "processes it started") from None
    try:
        pids = processes(rows)
        if pid is None and len(pids) > 1:
            raise UsageError(f"{rep} holds {len(pids)} processes with te-gemm-callback's steps (PID "
                             f"{', '.join(pids)}): pass --pid with the one that wrote this capture")
        if pid is not None and pid not in pids:
            raise UsageError(f"--pid {pid}: no step range of te-gemm-callback in that process (PIDs with them: "
                             f"{', '.join(pids) or 'none'})")
        proj, steps, outside = per_step(rows, pid)
    except UsageError:
        raise
    except (KeyError, ValueError) as err:
        raise ValueError(f"nsys stats' nvtx_gpu_proj_trace CSV for {rep} is not in a form this tool reads: "
                         f"{err}") from None
    if not steps:
        raise ValueError(f"{rep} holds no step range of te-gemm-callback: was the job profiled with GemmProfiler "
                         "(or a callback) inside nsys's capture range, with NVTX traced (-t cuda,nvtx)?")
    dispatch = {s.index for s in cap.steps if getattr(s, "dispatch", False)}
    cmp = NsysComparison(compare(proj, capture_times(cap), dispatch), outside, steps)
    if not cmp.differences:
        raise ValueError(f"no GEMM of this capture has a range in {rep}: is the capture from the job that wrote "
                         "the report (and its steps inside nsys's capture range)?")
    return cmp


__all__ = ["NSYS_SCHEMA", "NsysComparison", "UsageError", "against_capture", "capture_times", "compare", "csv_path",
           "find_nsys", "per_step", "processes", "projection_rows"]
