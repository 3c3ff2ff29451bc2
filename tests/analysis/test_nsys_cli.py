"""``te-gemm nsys``: a capture set beside Nsight Systems' projection of its GEMM ranges. nsys cannot
run on a CPU machine: a stand-in binary answers ``nsys stats`` with rows made from the capture, in
the CSV header nsys 2025.3.1 wrote on the H200 host (the real comparison: docs/results/h200.md and
tests/test_gpu.py)."""

import csv
import json
import stat
import sys

import pytest
import torch
from helpers.cli import one_line_error
from helpers.models import Net, step

from te_gemm_callback import GemmProfiler
from te_gemm_callback.analysis.nsys import capture_times
from te_gemm_callback.cli import main

HEADER = ("Name,Projected Start (ns),Projected Duration (ns),Orig Start (ns),Orig Duration (ns),Style,PID,TID,"
          "NumGPUOps,Lvl,NumChild,RangeId,ParentId,RangeStack").split(",")
FAKE_NSYS = f"""#!{sys.executable}
import os, shutil, sys
args = sys.argv[1:]
assert args[0] == "stats" and "nvtx_gpu_proj_trace" in args, args
shutil.copy(os.environ["FAKE_CSV"], args[args.index("-o") + 1] + "_nvtx_gpu_proj_trace.csv")
"""


def recorded(tmp_path, cap, offset, pids=(42,), name="rows.csv"):
    """A CSV as nsys writes it for this capture's job: a range per step, one per GEMM per timed
    step, each GEMM's projection ``offset`` longer than the capture's time (ns); for each process
    in ``pids`` (the ranks of a job, each its own steps: the second one's GEMMs twice as long)."""
    times = capture_times(cap)
    rows = []
    for rank, pid in enumerate(pids):
        t = 1_000_000
        for s in cap.steps:
            rows.append({"Name": f"te_gemm:step {s.index} ({s.kind})", "Orig Start (ns)": t,
                         "Orig Duration (ns)": 900_000, "Projected Duration (ns)": 800_000, "PID": pid})
            if s.kind == "instrumented":
                for i, (gemm, ms) in enumerate(times.items()):
                    rows.append({"Name": f"te_gemm:{gemm}", "Orig Start (ns)": t + 10 + i, "Orig Duration (ns)": 5,
                                 "Projected Duration (ns)": round(ms * 1e6 * (1 + offset) * (1 + rank)), "PID": pid})
                rows.append({"Name": ":nvte_cublas_gemm_v2", "Orig Start (ns)": t + 50, "Orig Duration (ns)": 3,
                             "Projected Duration (ns)": 7, "PID": pid})  # TE's own range: not ours
            t += 1_000_000
    path = tmp_path / name
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, HEADER)
        w.writeheader()
        w.writerows(rows)
    return path


@pytest.fixture
def job(tmp_path, monkeypatch):
    model, x = Net(), torch.randn(4, 16, requires_grad=True)
    with GemmProfiler(model) as prof:
        for _ in range(2):
            step(model, x)
            prof.step()
    # Fixed GEMM times in place of the CPU's: a live time of a few microseconds, rounded to the
    # whole nanoseconds of nsys's CSV, moves a ratio by more than any tolerance a test can hold.
    for i, r in enumerate(prof.capture.records):
        r.times_ms = [0.25 + 0.125 * i] * len(r.times_ms)
    prof.capture.save(tmp_path / "gemm_capture.json")
    nsys = tmp_path / "nsys"
    nsys.write_text(FAKE_NSYS)
    nsys.chmod(nsys.stat().st_mode | stat.S_IEXEC)
    (tmp_path / "prof.nsys-rep").write_bytes(b"stand-in")
    monkeypatch.setenv("FAKE_CSV", str(recorded(tmp_path, prof.capture, 0.01)))
    return tmp_path, prof.capture


def test_each_gemm_beside_nsys_projection(job, capsys):
    d, cap = job
    rc = main(["nsys", str(d / "gemm_capture.json"), str(d / "prof.nsys-rep"), "--nsys", str(d / "nsys"),
               "--json", str(d / "cmp.json")])
    assert rc == 0
    out = capsys.readouterr().out
    got = json.loads((d / "cmp.json").read_text())
    assert got["schema"] == "te-gemm-nsys/1" and got["outside_steps"] == 0
    assert {r["gemm"] for r in got["rows"]} == set(capture_times(cap)) and len(got["rows"]) == 12
    timed = sum(s.kind == "instrumented" for s in cap.steps)  # a GEMM range per instrumented step
    for r in got["rows"]:  # the capture reads 1% under a projection 1% longer, every GEMM
        assert r["instances"] == timed and abs(r["capture_vs_nsys"] - (1 / 1.01 - 1)) < 1e-4, r
    assert "12 of 12 GEMMs" in out and "-0.99%" in out
    assert "not taken under nsys" in out  # a CPU capture here: said, since its times are another run's
    assert (d / "prof_nvtx_gpu_proj_trace.csv").exists()  # where nsys stats writes it, kept


def test_a_recording_of_several_processes_needs_the_one_that_wrote_the_capture(job, capsys, monkeypatch):
    d, cap = job
    monkeypatch.setenv("FAKE_CSV", str(recorded(d, cap, 0.01, pids=(42, 43), name="ranks.csv")))
    (d / "prof_1_nvtx_gpu_proj_trace.csv").write_text("another report's rows")  # beside it: left alone
    args = ["nsys", str(d / "gemm_capture.json"), str(d / "prof.nsys-rep"), "--nsys", str(d / "nsys")]
    assert main(args) == 2
    one_line_error(capsys, "2 processes", "42, 43", "--pid")
    for pid, want in (("42", 1 / 1.01 - 1), ("43", 1 / 2.02 - 1)):  # each rank's ranges alone, never pooled
        assert main([*args, "--pid", pid, "--json", str(d / f"cmp{pid}.json")]) == 0
        rows = json.loads((d / f"cmp{pid}.json").read_text())["rows"]
        assert all(abs(r["capture_vs_nsys"] - want) < 1e-4 for r in rows), (pid, rows[0])
    assert main([*args, "--pid", "7"]) == 2
    one_line_error(capsys, "--pid 7", "42, 43")
    assert (d / "prof_1_nvtx_gpu_proj_trace.csv").read_text() == "another report's rows"


def test_what_nsys_cannot_read_is_one_line(job, capsys, monkeypatch):
    d, _ = job
    cap, nsys = str(d / "gemm_capture.json"), ["--nsys", str(d / "nsys")]
    (d / "prof.qdstrm").write_bytes(b"")
    assert main(["nsys", cap, str(d / "prof.qdstrm"), *nsys]) == 1
    one_line_error(capsys, "could not import", ".nsys-rep")
    assert main(["nsys", cap, str(d / "absent.nsys-rep"), *nsys]) == 1
    one_line_error(capsys, "absent.nsys-rep")
    assert main(["nsys", cap, cap, *nsys]) == 1  # the capture given twice
    one_line_error(capsys, "must be the .nsys-rep")
    assert main(["nsys", cap, str(d / "prof.nsys-rep"), "--nsys", str(d)]) == 2
    one_line_error(capsys, "--nsys", "a folder")
    # The capture of another job: none of its GEMMs has a range in the report.
    other_cap = d / "other_capture.json"
    got = json.loads((d / "gemm_capture.json").read_text())
    for r in got["records"]:
        r["module"] = "elsewhere." + r["module"]
    other_cap.write_text(json.dumps(got))
    assert main(["nsys", str(other_cap), str(d / "prof.nsys-rep"), *nsys]) == 1
    one_line_error(capsys, "the job that wrote the report")
    monkeypatch.setenv("PATH", str(d / "empty"))
    monkeypatch.setattr("te_gemm_callback.analysis.nsys.glob.glob", lambda *a, **k: [])
    assert main(["nsys", cap, str(d / "prof.nsys-rep")]) == 1
    one_line_error(capsys, "--nsys PATH")
    # A recording without our step ranges (the job ran without the profiler in nsys's range).
    other = d / "other.csv"
    other.write_text(",".join(HEADER) + "\n" + ",".join(["job step", "0", "5", "0", "9", "PushPop", "1", "1"]
                                                        + [""] * 6) + "\n")
    monkeypatch.setenv("FAKE_CSV", str(other))
    (d / "other.nsys-rep").write_bytes(b"another")
    assert main(["nsys", cap, str(d / "other.nsys-rep"), *nsys]) == 1
    one_line_error(capsys, "no step range of te-gemm-callback")
    # An output of another kind is refused before nsys runs.
    assert main(["nsys", cap, str(d / "prof.nsys-rep"), *nsys, "--json", cap]) == 1
    one_line_error(capsys, "refusing to overwrite")


def test_a_long_field_a_foreign_encoding_and_negative_times(job, capsys, monkeypatch):
    d, cap = job
    args = ["nsys", str(d / "gemm_capture.json"), str(d / "prof.nsys-rep"), "--nsys", str(d / "nsys"),
            "--json", str(d / "cmp.json")]
    rows = (d / "rows.csv").read_text().splitlines()
    # Someone else's range with a 200,000-character name (csv's default limit is 131,072), and one
    # of our GEMM ranges with a negative projected duration: read, and the latter left out.
    long_row = ",".join(["x" * 200_000, "0", "5", "0", "9", "PushPop", "42", "1"] + [""] * 6)
    first_gemm = next(i for i, r in enumerate(rows) if r.startswith("te_gemm:") and "step" not in r.split(",")[0])
    neg = rows[first_gemm].split(",")
    neg[2] = "-5"
    (d / "more.csv").write_text("\n".join([*rows, long_row, ",".join(neg)]) + "\n")
    monkeypatch.setenv("FAKE_CSV", str(d / "more.csv"))
    assert main(args) == 0
    got = json.loads((d / "cmp.json").read_text())
    assert all(r["nsys_proj_ms"] is None or r["nsys_proj_ms"] > 0 for r in got["rows"])
    capsys.readouterr()
    (d / "latin.csv").write_bytes(",".join(HEADER).encode() + b"\n\xe9t\xe9,0,5,0,9,PushPop,42,1,,,,,,\n")
    monkeypatch.setenv("FAKE_CSV", str(d / "latin.csv"))
    (d / "latin.nsys-rep").write_bytes(b"another recording")
    assert main([*args[:2], str(d / "latin.nsys-rep"), *args[3:]]) == 1
    one_line_error(capsys, "latin_nvtx_gpu_proj_trace.csv", "not the CSV nsys stats writes")


def test_a_hung_nsys_is_stopped_with_the_processes_it_started(job, capsys, monkeypatch, tmp_path):
    import os
    import time

    from te_gemm_callback.analysis import nsys as nsys_mod

    d, _ = job
    hung = tmp_path / "hung_nsys"
    pidfile = tmp_path / "child.pid"
    hung.write_text(f"#!{sys.executable}\nimport subprocess, sys, time\n"
                    f"c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
                    f"open({str(pidfile)!r}, 'w').write(str(c.pid))\ntime.sleep(60)\n")
    hung.chmod(hung.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(nsys_mod, "NSYS_TIMEOUT_S", 10)  # room for the stand-in to start its child under load
    t0 = time.monotonic()
    assert main(["nsys", str(d / "gemm_capture.json"), str(d / "prof.nsys-rep"), "--nsys", str(hung)]) == 1
    assert time.monotonic() - t0 < 50  # the timeout, not the stand-in's 60 s
    one_line_error(capsys, "took over", "stopped")
    child = int(pidfile.read_text())
    for _ in range(50):  # the kill reaches the child at once; its exit status is reaped by init
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        if open(f"/proc/{child}/stat").read().split()[2] == "Z":
            break
        time.sleep(0.1)
    else:
        raise AssertionError("nsys's child outlived the timeout")


def test_a_users_file_where_nsys_writes_is_refused_not_deleted(job, capsys, monkeypatch):
    """`te-gemm nsys` deleted a user's prof_nvtx_gpu_proj_trace.csv beside the report before running
    nsys stats (whose --force-overwrite would replace prof.sqlite too), whatever it held."""
    d, cap = job
    monkeypatch.setenv("FAKE_CSV", str(recorded(d, cap, 0.01)))
    args = ["nsys", str(d / "gemm_capture.json"), str(d / "prof.nsys-rep"), "--nsys", str(d / "nsys")]
    mine = d / "prof_nvtx_gpu_proj_trace.csv"
    for path, text, said in ((mine, "name,score\nalice,3\n", "is not a CSV nsys stats wrote"),
                             (d / "prof.sqlite", "my notes", "is not an SQLite export")):
        path.write_text(text)
        assert main(args) == 1
        one_line_error(capsys, said)
        assert path.read_text() == text
        path.unlink()
    assert main(args) == 0 and mine.exists()  # nsys's own CSV: written, and replaced on the next run
    assert main(args) == 0
