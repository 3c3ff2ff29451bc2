#!/usr/bin/env python
"""The capture under Nsight Systems: per-GEMM times against the same job without nsys, and what
the recorded file holds.

Runs the dense example (TE layers, 2 by default), alternating: without nsys, under
``nsys profile -t cuda,nvtx -c cudaProfilerApi [NSYS_FLAGS] ... --nsys-capture``, without nsys
again, and so on for ``--rounds`` runs under nsys (the runs without it show how far per-GEMM times
move between runs anyway: on the H200 host, 6.5-6.9% between two runs). Then, per captured GEMM,
the median time under nsys against the median of the runs without it, with a bootstrap interval
over the runs (each run one unit), and how far the runs without nsys spread around their median;
the recorded file's size and which of the capture's NVTX range names it holds (a .qdstrm's own
bytes where nsys could not import it into a report; nsys's reading of a .nsys-rep where it could);
and, where there is a .nsys-rep, each GEMM's time in the capture against nsys's own projection of
its range onto the GPU in the same run (te_gemm_callback.analysis.nsys, as `te-gemm nsys` does).

    python benchmarks/nsys_check.py --out runs/nsys                       # nsys found on PATH or /opt
    python benchmarks/nsys_check.py --out runs/nsys --nsys-flags "-s none --cpuctxsw=none" --rounds 3
    LD_LIBRARY_PATH=ELFUTILS_LIB:$LD_LIBRARY_PATH python benchmarks/nsys_check.py ...  # where nsys's
        # QdstrmImporter lacks libdw.so.1 (the H200 host): the recording becomes a .nsys-rep
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _timing import median_ratio_ci  # noqa: E402

from te_gemm_callback import GemmCapture  # noqa: E402
from te_gemm_callback.analysis.nsys import (  # noqa: E402
    against_capture,
    capture_times,
    find_nsys,
    per_step,
    projection_rows,
)
from te_gemm_callback.reporting.nsys_table import nsys_summary  # noqa: E402


def dense(out: Path, layers: int, steps: int, extra: list[str]) -> list[str]:
    return [sys.executable, str(ROOT / "recipes" / "dense.py"), "--layers", str(layers), "--steps", str(steps),
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


def compare(nsys: list[dict[str, float]], plain: list[dict[str, float]], tolerance: float) -> list[dict]:
    """Per GEMM timed in every run: the median under nsys against the median without it, the 95%
    interval of that ratio over the runs, and the runs without nsys' widest distance from their own
    median; slowest first. ``within``: the median ratio within ``tolerance``."""
    rows = []
    names = set.intersection(*(set(t) for t in nsys + plain))
    for name in names:
        ns, ps = [t[name] for t in nsys], [t[name] for t in plain]
        ratio, lo, hi = median_ratio_ci(ns, ps)
        base = statistics.median(ps)
        rows.append({"gemm": name, "nsys_ms": statistics.median(ns), "plain_ms": base, "nsys_vs_plain": ratio - 1,
                     "ci95": [lo - 1, hi - 1], "plain_spread": max(abs(p / base - 1) for p in ps),
                     "within": abs(ratio - 1) <= tolerance})
    return sorted(rows, key=lambda r: -r["nsys_ms"])


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


def names_in(path: Path, names: list[str], nsys: str) -> dict[str, bool]:
    """Which names the recording holds. A .nsys-rep (nsys could import): the ranges nsys itself
    reads from it (``nsys stats``; its own compression is not the .qdstrm's). A .qdstrm: its bytes,
    compressed stretches expanded (NVTX strings are stored as they were given)."""
    if path.suffix == ".nsys-rep":
        try:
            proj, kinds, _ = per_step(projection_rows(nsys, path))
        except (subprocess.SubprocessError, OSError, KeyError, ValueError):
            return {n: False for n in names}
        seen = set(proj) | {f"step {i} ({k})" for i, k in kinds.items()}  # a range with no GPU work: unseen
        return {n: n in seen for n in names}
    text = lz4_expand(path.read_bytes())
    return {n: n.encode() in text for n in names}


def projections(nsys: str, out: Path, order: list[str], caps: dict) -> dict:
    """Per run under nsys, nsys's own projection of each GEMM range against the capture's time for
    it in that run (``te-gemm nsys``'s comparison), or the reason there is none."""
    found = {}
    for k in (k for k in order if k.startswith("nsys")):
        rep = out / k / "profile.nsys-rep"
        if not rep.exists():
            found[k] = "no .nsys-rep: nsys could not import its recording (QdstrmImporter; docs/nsight-systems.md)"
            continue
        try:
            found[k] = against_capture(caps[k], rep, nsys)
        except (ValueError, OSError) as err:
            found[k] = f"{type(err).__name__}: {err}"
    return found


def print_projection(found: dict) -> None:
    for k, got in found.items():
        if isinstance(got, str):
            print(f"{k}: nsys's projection: {got}")
            continue
        print(f"{k}: capture against nsys's own projection of each GEMM range, {nsys_summary(got)}")
        for r in got.rows:
            if r["capture_vs_nsys"] is not None:
                print(f"   {r['gemm'][:58]:58} nsys {r['nsys_proj_ms']:8.3f} ms  capture {r['capture_ms']:8.3f} ms "
                      f"{100 * r['capture_vs_nsys']:+6.2f}%  ({r['instances']} instances)")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="folder for the three run folders, logs and nsys_check.json")
    p.add_argument("--nsys", default=None, help="the nsys binary (default: PATH, then /opt/nvidia)")
    p.add_argument("--nsys-flags", default="", help="more nsys profile flags, e.g. '-s none --cpuctxsw=none'")
    p.add_argument("--job", choices=("dense", "small"), default="dense",
                   help="dense: recipes/dense.py (TE layers, lm_head); small: two plain nn.Linear layers")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--steps", type=int, default=9)
    p.add_argument("--rounds", type=int, default=1,
                   help="runs under nsys, each after one without it, and one more without it at the end")
    p.add_argument("--plain-runs", type=int, choices=(1, 2), default=2,
                   help="with one round: 2 runs without nsys (before and after) or 1 (before)")
    p.add_argument("--tolerance", type=float, default=0.05, help="largest relative difference accepted per GEMM")
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    nsys = find_nsys(a.nsys)
    if nsys is None:
        sys.exit("error: no nsys found: pass --nsys PATH")
    job = dense if a.job == "dense" else small
    flags = shlex.split(a.nsys_flags)
    if a.job == "small" and not any(f.startswith("--capture-range-end") for f in flags):
        # The small job saves its capture after GemmProfiler.stop(), whose cudaProfilerStop ends the
        # job under nsys's default range end (stop-shutdown): it must go on after the range.
        flags.append("--capture-range-end=stop")
    nsys_cmd = [nsys, "profile", "-t", "cuda,nvtx", "-c", "cudaProfilerApi", *flags, "-f", "true", "-o"]
    # plain0, nsys0, plain1, nsys1, ..., plainR: each nsys run between two without it.
    order = [f"plain{i // 2}" if i % 2 == 0 else f"nsys{i // 2}" for i in range(2 * a.rounds + 1)]
    if a.rounds == 1 and a.plain_runs == 1:
        order = order[:2]
    wall = {}
    for name in order:
        (out / name / "gemm_capture.json").unlink(missing_ok=True)  # a run that writes none must not pass
        if name.startswith("plain"):
            wall[name] = run(job(out / name, a.layers, a.steps, []), out / f"{name}.log")
        else:
            # nsys's default --capture-range-end=stop-shutdown ends the job at cudaProfilerStop, which
            # comes once the capture file is written: the run may exit by SIGTERM, its capture kept.
            rep = out / name / "profile"
            rep.parent.mkdir(parents=True, exist_ok=True)
            for old in rep.parent.glob("profile*"):  # an earlier check's recording is not this run's
                if old.is_file():
                    old.unlink()
            cmd = [*nsys_cmd, str(rep)]
            wall[name] = run(cmd + job(out / name, a.layers, a.steps, ["--nsys-capture"]), out / f"{name}.log",
                             must_pass=False)
    caps = {k: GemmCapture.load(out / k / "gemm_capture.json") for k in wall}
    times = {k: capture_times(c) for k, c in caps.items()}
    runs_nsys = [times[k] for k in order if k.startswith("nsys")]
    runs_plain = [times[k] for k in order if k.startswith("plain")]
    rows = compare(runs_nsys, runs_plain, a.tolerance)
    worst = max((abs(r["nsys_vs_plain"]) for r in rows), default=0.0)
    worst_plain = max((r["plain_spread"] for r in rows), default=0.0)
    report = out / "nsys0" / "profile"
    files = sorted(p for p in report.parent.glob("profile.*") if p.suffix in (".qdstrm", ".nsys-rep"))
    # The range holds the capture window: every step's range and every GEMM's.
    names = list(times["nsys0"]) + [f"step {s.index} ({s.kind})" for s in caps["nsys0"].steps]
    held = {str(f): names_in(f, names, nsys) for f in files}
    first = caps["nsys0"]
    result = {
        "command": shlex.join([*nsys_cmd, str(report)] + job(out / "nsys0", a.layers, a.steps, ["--nsys-capture"])),
        "order": order, "wall_s": wall, "gemms": len(rows), "worst_nsys_vs_plain": worst,
        "worst_plain_spread": worst_plain, "within_tolerance": bool(rows) and all(r["within"] for r in rows),
        "time_source": {k: c.meta.get("gemm_time_source") for k, c in caps.items()},
        "event_pairs": {k: c.meta.get("event_pairs") for k, c in caps.items() if k.startswith("nsys")},
        "cupti_owner": first.meta.get("cupti_owner"), "kernel_join": first.meta.get("kernel_join"),
        "step_kinds": {k: [s.kind for s in c.steps] for k, c in caps.items()},
        "files": {str(f): os.path.getsize(f) for f in files},
        "names_in_file": {f: f"{sum(h.values())} of {len(h)}" for f, h in held.items()},
        "names_missing": {f: [n for n, ok in h.items() if not ok] for f, h in held.items()},
        "rows": rows}
    (out / "nsys_check.json").write_text(json.dumps(result, indent=1))  # kept if what follows fails
    found = projections(nsys, out, order, caps)
    result["projection"] = {k: v if isinstance(v, str) else v.to_dict() for k, v in found.items()}
    (out / "nsys_check.json").write_text(json.dumps(result, indent=1))
    print(f"{'GEMM':58} {'nsys ms':>9} {'plain ms':>9} {'nsys/plain':>10} {'95% interval':>17} {'plain spread':>12}")
    for r in rows:
        lo, hi = r["ci95"]
        print(f"{r['gemm'][:58]:58} {r['nsys_ms']:9.3f} {r['plain_ms']:9.3f} {100 * r['nsys_vs_plain']:+9.1f}% "
              f"{100 * lo:+7.1f}..{100 * hi:+.1f}% {100 * r['plain_spread']:11.1f}%")
    print(f"{len(rows)} GEMMs, {a.rounds} run(s) under nsys, {len(runs_plain)} without; worst nsys vs plain "
          f"{100 * worst:.1f}% (tolerance {100 * a.tolerance:.0f}%), {sum(r['within'] for r in rows)} within; "
          f"the runs without nsys spread up to {100 * worst_plain:.1f}% around their median")
    print(f"time source: {result['time_source']}; under nsys: {result['cupti_owner']}")
    for f, size in result["files"].items():
        print(f"{f}: {size / 2**20:.1f} MiB, our range names in it: {result['names_in_file'][f]}")
    print_projection(found)
    return 0 if result["within_tolerance"] and all(not m for m in result["names_missing"].values()) and files else 1


if __name__ == "__main__":
    sys.exit(main())
