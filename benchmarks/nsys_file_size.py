#!/usr/bin/env python
"""What makes an Nsight Systems recording of a captured job large: the same small job under
``nsys profile -t cuda,nvtx -c cudaProfilerApi`` with each of nsys's CPU-side collectors on or off.

The job is two ``nn.Linear(2048, 2048)`` layers in BF16 with ``GemmProfiler(nsys_capture=True)``
for six steps (three instrumented, three clean), after ``--before`` steps outside the capture range
(a longer job before the range shows whether what nsys records is bounded by the range). Each run:
its wall time, the time the capture range was open (from the job), the recorded file's size, and
whether our range names are in it (benchmarks/nsys_check.py reads the file), and how many ELF
headers it holds (copies of the process's shared libraries). One run takes the same loop without
the profiler, its range opened and closed by hand.

    python benchmarks/nsys_file_size.py --out runs/nsys-size
    python benchmarks/nsys_file_size.py --out runs/nsys-size --runs "default:;no-sampling:-s none"
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from nsys_check import find_nsys, lz4_expand

ROOT = Path(__file__).resolve().parents[1]

# The loop both jobs run: two linear layers, one step before anything (and --before more).
_LOOP = """
import json, os, sys, time, torch
out, before = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 0
m = torch.nn.Sequential(torch.nn.Linear(2048, 2048), torch.nn.Linear(2048, 2048)).cuda().bfloat16()
x = torch.randn(4096, 2048, device="cuda", dtype=torch.bfloat16)
def step():
    m(x).float().pow(2).mean().backward()
for _ in range(1 + before):
    step()
torch.cuda.synchronize()
t0 = time.perf_counter()
"""

# The job under nsys: what the GPU test runs too (tests/test_gpu.py).
JOB = _LOOP + """
from te_gemm_callback import GemmProfiler
from te_gemm_callback.capture.instruments import range_name
with GemmProfiler(m, nsys_capture=True) as prof:
    for i in range(6):
        step()
        if i < 5:
            prof.step()
range_s = time.perf_counter() - t0
c = prof.capture
c.save(os.path.join(os.path.dirname(os.path.abspath(out)), "gemm_capture.json"))
json.dump({"meta": c.meta, "kinds": [s.kind for s in c.steps], "range_s": range_s, "before": before,
           "times": {f"{r.module} {r.op}": r.times_ms for r in c.records},
           "names": [f"step {s.index} ({s.kind})" for s in c.steps]
           + [range_name(r.module, r.gemm, r.op, r.shape.mkn, r.precision, r.recompute) for r in c.records]},
          open(out, "w"))
"""

# The same loop without te-gemm-callback: the range opened and closed by hand around six steps.
PLAIN_JOB = _LOOP + """
torch.cuda.profiler.start()
for _ in range(6):
    step()
torch.cuda.synchronize()
torch.cuda.profiler.stop()
json.dump({"range_s": time.perf_counter() - t0, "before": before, "names": []}, open(out, "w"))
"""

# name:flags[:steps before the range[:plain]]; nsys's defaults collect CPU samples and context
# switches; "plain" runs PLAIN_JOB instead of JOB.
DEFAULT_RUNS = ("neither:-s none --cpuctxsw=none;default:;no-sampling:-s none;no-ctxsw:--cpuctxsw=none;"
                "plain-default::0:plain;default-long-before::300")


def elf_images(path: Path) -> int:
    """ELF headers in the file: images of the process's shared libraries that nsys copied in."""
    n, tail = 0, b""
    with open(path, "rb") as f:
        while chunk := f.read(64 << 20):
            n += (tail + chunk).count(b"\x7fELF")
            tail = chunk[-3:]
    return n


def run_one(nsys: str, out: Path, name: str, flags: str, before: int, timeout: float, plain: bool = False) -> dict:
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    script, cap = folder / "job.py", folder / "job.json"
    script.write_text(PLAIN_JOB if plain else JOB)
    # --capture-range-end=stop: the job goes on after the range and writes what it measured.
    cmd = [nsys, "profile", "-t", "cuda,nvtx", "-c", "cudaProfilerApi", "--capture-range-end=stop",
           *shlex.split(flags), "-f", "true", "-o", str(folder / "rep"), sys.executable, str(script), str(cap),
           str(before)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    t0 = time.perf_counter()
    with open(folder / "nsys.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:  # a GB-sized file can take minutes to write: size so far
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = "timeout"
    wall = time.perf_counter() - t0
    files = sorted(p for p in folder.glob("rep.*") if p.suffix in (".qdstrm", ".nsys-rep"))
    job = json.loads(cap.read_text()) if cap.exists() else {}
    row = {"run": name, "job": "plain" if plain else "capture", "flags": flags, "before": before, "rc": rc,
           "wall_s": round(wall, 1),
           "range_s": round(job["range_s"], 2) if "range_s" in job else None,
           "files": {p.name: p.stat().st_size for p in files}, "command": shlex.join(cmd),
           "time_source": job.get("meta", {}).get("gemm_time_source"),
           "elf_images": {p.name: elf_images(p) for p in files}}
    if files and job.get("names") and files[0].stat().st_size < 2**30:  # reading a GB file back is no use here
        names = job["names"]
        data = lz4_expand(files[0].read_bytes())
        row["names_in_file"] = f"{sum(n.encode() in data for n in names)} of {len(names)}"
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="a folder per run (job, nsys log, recorded file) and sizes.json")
    p.add_argument("--nsys", default=None, help="the nsys binary (default: PATH, then /opt/nvidia)")
    p.add_argument("--runs", default=DEFAULT_RUNS, help="name:nsys flags[:steps before the range], ';'-separated")
    p.add_argument("--timeout", type=float, default=150, help="seconds each run may take")
    p.add_argument("--budget", type=float, default=540, help="seconds for all runs: later runs are skipped")
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    nsys = find_nsys(a.nsys)
    rows, t0 = [], time.perf_counter()
    for spec in filter(None, a.runs.split(";")):
        name, flags, *rest = spec.split(":")
        left = a.budget - (time.perf_counter() - t0)
        if left < 30:
            rows.append({"run": name, "flags": flags, "skipped": "no time left"})
            continue
        before = int(rest[0]) if rest and rest[0] else 0
        rows.append(run_one(nsys, out, name, flags, before, min(a.timeout, left), plain=rest[1:] == ["plain"]))
        r = rows[-1]
        print(f"{name:20} {flags or '(nsys defaults)':28} before={r['before']:<4} rc={r['rc']!s:8} "
              f"wall {r['wall_s']:6.1f} s range {r['range_s']} s files "
              f"{ {k: f'{v / 2**20:.2f} MiB' for k, v in r['files'].items()} } ELF images {r['elf_images']} "
              f"names {r.get('names_in_file')}",
              flush=True)
        (out / "sizes.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
