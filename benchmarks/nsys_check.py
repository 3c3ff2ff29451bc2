#!/usr/bin/env python
"""The capture under Nsight Systems: per-GEMM times against the same job without nsys, and what
the recorded file holds.

Runs the dense example (TE layers, 2 by default) three times, one after another: without nsys, under
``nsys profile -t cuda,nvtx -c cudaProfilerApi [NSYS_FLAGS] ... --nsys-capture``, and without nsys
again (the two runs without it show how far per-GEMM times move between runs anyway). Then, per
captured GEMM, the time under nsys against the median of the two runs without it; and the recorded
file's size and which of the capture's NVTX range names it holds (the file's own bytes: a .qdstrm
where nsys could not import it into a report, a .nsys-rep where it could).

    python benchmarks/nsys_check.py --out runs/nsys                       # nsys found on PATH or /opt
    python benchmarks/nsys_check.py --out runs/nsys --nsys-flags "-s none --cpuctxsw=none"
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from te_gemm_callback import GemmCapture  # noqa: E402
from te_gemm_callback.capture.instruments import range_name  # noqa: E402


def find_nsys(given: str | None) -> str:
    """nsys from --nsys, PATH, or an Nsight Systems / Nsight Compute install under /opt."""
    if given:
        return given
    found = shutil.which("nsys") or next(iter(sorted(
        glob.glob("/opt/nvidia/nsight-systems*/**/bin/nsys", recursive=True)
        + glob.glob("/opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys"))), None)
    if not found:
        sys.exit("error: no nsys found: pass --nsys PATH")
    return found


def dense(out: Path, layers: int, steps: int, extra: list[str]) -> list[str]:
    return [sys.executable, str(ROOT / "examples" / "dense.py"), "--layers", str(layers), "--steps", str(steps),
            "--sweep", "none", "--no-bench", "--out", str(out), *extra]


def small(out: Path, layers: int, steps: int, extra: list[str]) -> list[str]:
    """The job of benchmarks/nsys_file_size.py: two plain nn.Linear(2048, 2048), every GEMM timed on
    the dispatch-mode steps (no TE module), ~25 us each; ``--nsys-capture`` is always on in it (the
    range calls do nothing without nsys)."""
    from nsys_file_size import JOB  # its sibling: it imports this script's helpers at its top

    out.mkdir(parents=True, exist_ok=True)
    (out / "job.py").write_text(JOB)
    return [sys.executable, str(out / "job.py"), str(out / "job.json")]


def run(cmd: list[str], log: Path, must_pass: bool = True) -> float:
    t0 = time.perf_counter()
    with open(log, "w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
    if rc != 0 and must_pass:
        sys.exit(f"error: {shlex.join(cmd)} exited {rc}; see {log}")
    return time.perf_counter() - t0


def per_gemm(cap: GemmCapture) -> dict[str, float]:
    return {range_name(r.module, r.gemm, r.op, r.shape.mkn, r.precision, r.recompute): r.median_ms
            for r in cap.records if r.median_ms is not None}


def lz4_expand(src: bytes) -> bytes:
    """The file's bytes with its LZ4-compressed stretches expanded. A .qdstrm (nsys 2025.3) stores
    its event stream as LZ4 block sequences (token, literals, 2-byte offset, match: the LZ4 block
    format, github.com/lz4/lz4 doc/lz4_Block_format.md): NVTX strings that share a prefix with an
    earlier one appear only as back-references, so the raw bytes hold few of our range names whole
    (3 of 31 for the dense example). Decoding runs from each offset until a sequence is impossible;
    runs shorter than 4 KiB are noise and skipped byte by byte."""
    parts, s, n = [], 0, len(src)
    while s < n:
        out, e = _lz4_run(src, s, n)
        if e - s > 4096:
            parts.append(bytes(out))
            s = e
        else:
            s += 1
    return b"".join(parts) or src


def _lz4_run(src: bytes, p: int, n: int) -> tuple[bytearray, int]:
    out = bytearray()
    try:
        while p < n:
            tok, q = src[p], p + 1
            lit = tok >> 4
            if lit == 15:  # longer literal run: 255-bytes until one is less
                while True:
                    c, q = src[q], q + 1
                    lit += c
                    if c != 255:
                        break
            lits, q = src[q:q + lit], q + lit
            off, q = src[q] | (src[q + 1] << 8), q + 2
            ml = (tok & 15) + 4
            if tok & 15 == 15:
                while True:
                    c, q = src[q], q + 1
                    ml += c
                    if c != 255:
                        break
            out += lits
            if off == 0 or off > len(out):
                return out, q
            start = len(out) - off
            if off >= ml:
                out += out[start:start + ml]
            else:  # the match overlaps what it writes: byte by byte
                for k in range(ml):
                    out.append(out[start + k])
            p = q
    except IndexError:  # the file ends inside a sequence
        pass
    return out, p


def names_in(path: Path, names: list[str]) -> dict[str, bool]:
    """Which names occur in the recorded file, its compressed stretches expanded (NVTX strings are
    stored as they were given)."""
    text = lz4_expand(path.read_bytes())
    return {n: n.encode() in text for n in names}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="folder for the three run folders, logs and nsys_check.json")
    p.add_argument("--nsys", default=None, help="the nsys binary (default: PATH, then /opt/nvidia)")
    p.add_argument("--nsys-flags", default="", help="more nsys profile flags, e.g. '-s none --cpuctxsw=none'")
    p.add_argument("--job", choices=("dense", "small"), default="dense",
                   help="dense: examples/dense.py (TE layers, lm_head); small: two plain nn.Linear layers")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--steps", type=int, default=9)
    p.add_argument("--plain-runs", type=int, choices=(1, 2), default=2,
                   help="runs without nsys: 2 (before and after) also show the run-to-run spread")
    p.add_argument("--tolerance", type=float, default=0.05, help="largest relative difference accepted per GEMM")
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    nsys = find_nsys(a.nsys)
    report = out / "nsys" / "profile"
    report.parent.mkdir(parents=True, exist_ok=True)
    job = dense if a.job == "dense" else small
    flags = shlex.split(a.nsys_flags)
    if a.job == "small" and not any(f.startswith("--capture-range-end") for f in flags):
        # The small job saves its capture after GemmProfiler.stop(), whose cudaProfilerStop ends the
        # job under nsys's default range end (stop-shutdown): it must go on after the range.
        flags.append("--capture-range-end=stop")
    nsys_cmd = [nsys, "profile", "-t", "cuda,nvtx", "-c", "cudaProfilerApi", *flags, "-f", "true", "-o", str(report)]
    wall = {"plain1": run(job(out / "plain1", a.layers, a.steps, []), out / "plain1.log"),
            # nsys's default --capture-range-end=stop-shutdown ends the job at cudaProfilerStop, which
            # comes once the capture file is written: the run may exit by SIGTERM, its capture kept.
            "nsys": run(nsys_cmd + job(out / "nsys", a.layers, a.steps, ["--nsys-capture"]), out / "nsys.log",
                        must_pass=False),
            **({"plain2": run(job(out / "plain2", a.layers, a.steps, []), out / "plain2.log")}
               if a.plain_runs == 2 else {})}
    caps = {k: GemmCapture.load(out / k / "gemm_capture.json") for k in wall}
    times = {k: per_gemm(c) for k, c in caps.items()}
    rows, worst, worst_plain = [], 0.0, 0.0
    for name, t in sorted(times["nsys"].items(), key=lambda kv: -kv[1]):
        ref = [times[k][name] for k in ("plain1", "plain2") if k in times and name in times[k]]
        if len(ref) < a.plain_runs:
            continue
        base = statistics.median(ref)
        diff, between = t / base - 1, (ref[1] / ref[0] - 1 if len(ref) == 2 else 0.0)
        worst, worst_plain = max(worst, abs(diff)), max(worst_plain, abs(between))
        rows.append({"gemm": name, "nsys_ms": t, "plain_ms": base, "nsys_vs_plain": diff, "plain2_vs_plain1": between})
    files = sorted(p for p in report.parent.glob("profile.*") if p.suffix in (".qdstrm", ".nsys-rep"))
    # The range holds the capture window: every step's range and every GEMM's.
    names = list(times["nsys"]) + [f"step {s.index} ({s.kind})" for s in caps["nsys"].steps]
    held = {str(f): names_in(f, names) for f in files}
    result = {
        "command": shlex.join(nsys_cmd + job(out / "nsys", a.layers, a.steps, ["--nsys-capture"])),
        "wall_s": wall, "gemms": len(rows), "worst_nsys_vs_plain": worst, "worst_plain_vs_plain": worst_plain,
        "within_tolerance": bool(rows) and worst <= a.tolerance,
        "time_source": {k: c.meta.get("gemm_time_source") for k, c in caps.items()},
        "cupti_owner": caps["nsys"].meta.get("cupti_owner"), "kernel_join": caps["nsys"].meta.get("kernel_join"),
        "step_kinds": {k: [s.kind for s in c.steps] for k, c in caps.items()},
        "files": {str(f): os.path.getsize(f) for f in files},
        "names_in_file": {f: f"{sum(h.values())} of {len(h)}" for f, h in held.items()},
        "names_missing": {f: [n for n, ok in h.items() if not ok] for f, h in held.items()},
        "rows": rows}
    (out / "nsys_check.json").write_text(json.dumps(result, indent=1))
    print(f"{'GEMM':58} {'nsys ms':>9} {'plain ms':>9} {'nsys/plain':>10} {'plain2/plain1':>13}")
    for r in rows:
        print(f"{r['gemm'][:58]:58} {r['nsys_ms']:9.3f} {r['plain_ms']:9.3f} {100 * r['nsys_vs_plain']:+9.1f}% "
              f"{100 * r['plain2_vs_plain1']:+12.1f}%")
    print(f"{len(rows)} GEMMs; worst nsys vs plain {100 * worst:.1f}% (tolerance {100 * a.tolerance:.0f}%), "
          f"worst plain vs plain {100 * worst_plain:.1f}%")
    print(f"time source: {result['time_source']}; under nsys: {result['cupti_owner']}")
    for f, size in result["files"].items():
        print(f"{f}: {size / 2**20:.1f} MiB, our range names in it: {result['names_in_file'][f]}")
    return 0 if result["within_tolerance"] and all(not m for m in result["names_missing"].values()) and files else 1


if __name__ == "__main__":
    sys.exit(main())
