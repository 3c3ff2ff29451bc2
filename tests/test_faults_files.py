"""Fault injection on the files the tool reads and writes, and on a multi-process bench's workers:
a hostile-but-fair user's inputs end in one line that says what to fix (exit 1; 2 for a usage error),
never a traceback, a wrong number or a lost file. CPU only."""

import json
import os
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
from helpers.cli import one_line_error
from helpers.procs import start_bench_with_workers
from helpers.three_modules import bench, capture

from te_gemm_callback.capture.capture_file import GemmCapture
from te_gemm_callback.cli import main
from te_gemm_callback.files import jsonio, png
from te_gemm_callback.microbench.cache import ResultCache
from te_gemm_callback.microbench.results import BenchResults

REPO = Path(__file__).resolve().parents[1]
BENCH = ["bench", "--shapes", "8x8x8", "--precisions", "BF16"]


def run_folder(tmp_path):
    run = tmp_path / "run"
    capture().save(run / "gemm_capture.json")
    bench().save(run / "bench.json")
    return run


# 1. A file that is not a cache is never replaced by one, whatever its bytes: decided by content.
def _not_ours(tmp_path, name):
    path = tmp_path / name
    if name.endswith(".ckpt"):
        torch.save({"w": torch.randn(10)}, path)  # zip bytes: not UTF-8
    elif name.endswith(".png"):
        path.write_bytes(png.PNG_SIGNATURE + bytes(range(256)))
    else:
        path.write_bytes("café, notes\n".encode("latin-1"))
    return path


@pytest.mark.parametrize("name", ["model.ckpt", "figure.png", "latin1.txt"])
@pytest.mark.parametrize("via", ["--cache", "TE_GEMM_CACHE"])
def test_cache_never_replaces_a_file_that_does_not_decode(tmp_path, monkeypatch, capsys, no_measuring, name, via):
    victim = _not_ours(tmp_path, name)
    before = victim.read_bytes()
    if via == "--cache":
        code = main(BENCH + ["--cache", str(victim)])
    else:
        monkeypatch.setenv("TE_GEMM_CACHE", str(victim))
        code = main(BENCH)
    assert code == 1
    one_line_error(capsys, f"{victim} is not a te-gemm cache", "give --cache a new path")
    assert victim.read_bytes() == before


def test_writers_decide_the_kind_by_content(tmp_path):
    ours = tmp_path / "notes.txt"  # any name: a file of our schema is ours to replace
    jsonio.write_json(ours, {"schema": "te-gemm-bench/1", "results": []})
    jsonio.write_json(ours, {"schema": "te-gemm-bench/1", "results": [], "again": True})
    assert json.loads(ours.read_text())["again"]
    for name in ("model.ckpt", "latin1.txt"):
        victim = _not_ours(tmp_path, name)
        before = victim.read_bytes()
        with pytest.raises(ValueError, match=f"refusing to overwrite {victim}: it holds something that is not JSON"):
            jsonio.write_json(victim, {"schema": "te-gemm-bench/1", "results": []})
        assert victim.read_bytes() == before


# 2. Every file read is validated: one line naming the file and the field, never a wrong total.
@pytest.mark.parametrize("field,value", [
    ("median_ms", -1), ("median_ms", float("nan")), ("median_ms", float("inf")), ("median_ms", True),
    ("median_ms", [1]), ("m_splits", 5), ("meta", [1]), ("op", "sideways"), ("k", 0),
])
def test_bench_json_values_are_refused(tmp_path, capsys, field, value):
    run = run_folder(tmp_path)
    d = json.loads((run / "bench.json").read_text())
    if field == "meta":
        d["meta"] = value
    else:
        for r in d["results"]:
            r[field] = value
    (run / "bench.json").write_text(json.dumps(d))  # NaN / Infinity as Python writes (and reads) them
    with pytest.raises(ValueError) as e:
        BenchResults.load(run / "bench.json")
    msg = str(e.value)
    assert msg.startswith(f"{run / 'bench.json'}: ") and field in msg and "\n" not in msg
    for cmd in ("report", "plan"):
        assert main([cmd, str(run)]) == 1
        one_line_error(capsys, "bench.json: ", field)


BIG = "1" + "0" * 400  # 10**400: parses as a Python int, overflows every float conversion


@pytest.mark.parametrize("where,field,raw", [
    ("records", "m", BIG), ("records", "flops", BIG), ("records", "times_ms", "5"), ("records", "module", '["a"]'),
    ("records", "precision", "5"), ("records", "gemm", "5"), ("records", "m_splits", "5"),
    ("records", "m_splits", "[5]"), ("records", "operands", "5"), ("records", "recompute", '"yes"'),
    ("records", "flops", '"x"'), ("steps", "micro_batches", '"x"'), ("steps", "kind", "5"),
    ("top", "meta", "[]"), ("top", "meta", "[1]"), ("top", "coverage", "[1]"), ("top", "records", "[5]"),
])
def test_hand_edited_capture_fields_are_refused(tmp_path, capsys, where, field, raw):
    path = capture().save(tmp_path / "c.json")
    d = json.loads(path.read_text())
    target = d if where == "top" else d[where][0]
    target[field] = "@@"
    path.write_text(json.dumps(d).replace('"@@"', raw))
    with pytest.raises(ValueError) as e:
        GemmCapture.load(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}: ") and field in msg and "\n" not in msg
    for args in (["show", str(path)], ["bench", "--capture", str(path), "--no-cache"]):
        assert main(args) == 1
        one_line_error(capsys, str(path), field)


def test_in_memory_captures_are_checked_too():
    d = capture().to_dict()
    d["records"][0]["module"] = ["a"]
    with pytest.raises(ValueError, match=r"records\[0\]\.module: expected a string"):
        GemmCapture.from_dict(d)


@pytest.mark.parametrize("depth", [100, 100_000])
def test_deep_nesting_is_a_one_line_error(tmp_path, capsys, depth):
    path = capture().save(tmp_path / "c.json")
    d = json.loads(path.read_text())
    d["meta"]["x"] = "@@"
    path.write_text(json.dumps(d).replace('"@@"', "[" * depth + "]" * depth))
    assert main(["show", str(path)]) == 1
    one_line_error(capsys, str(path), f"nested more than {jsonio.MAX_DEPTH} levels deep")


def test_reads_are_bounded(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(jsonio, "MAX_READ_BYTES", 2**20)
    path = capture().save(tmp_path / "c.json")
    d = json.loads(path.read_text())
    d["meta"]["padding"] = "x" * 2**21
    path.write_text(json.dumps(d))
    assert main(["show", str(path)]) == 1
    one_line_error(capsys, str(path), "over the 1 MiB limit")


def test_show_dev_zero_stops_at_once():
    # A subprocess with an address-space limit: the old reader filled memory until the OOM killer.
    import resource

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (4 * 2**30, 4 * 2**30))

    t = time.time()
    proc = subprocess.run([sys.executable, "-m", "te_gemm_callback.cli", "show", "/dev/zero"], cwd=REPO,
                          capture_output=True, text=True, timeout=120, preexec_fn=limit)
    assert proc.returncode == 1 and proc.stderr.strip() == \
        "te-gemm show: error: /dev/zero is a device, not a file: give the path of a JSON file"
    assert time.time() - t < 60


def test_a_damaged_cache_entry_is_measured_again_and_dropped(tmp_path):
    from te_gemm_callback.microbench.cells import BenchResult

    path = tmp_path / "cache.json"
    c = ResultCache(path)
    c.put("k", BenchResult(8, 8, 8, "fprop", "BF16", "autocast", median_ms=1.0, iters=3))
    c.put("j", BenchResult(8, 8, 8, "dgrad", "BF16", "autocast", median_ms=1.0, iters=3))
    assert c.save() is None
    d = json.loads(path.read_text())
    d["results"]["k"]["median_ms"] = -1  # edited by hand
    path.write_text(json.dumps(d))
    again = ResultCache(path)
    assert again.get("k") is None and again.get("j").median_ms == 1.0
    assert again.save() is None
    assert set(json.loads(path.read_text())["results"]) == {"j"}  # the bad entry is gone, the good one kept


# 3. Writes: the umask's permissions, atomic, never through a symbolic link, never over another kind.
@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_outputs_get_the_umasks_permissions(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        paths = [bench().save(tmp_path / "b.json"), capture().save(tmp_path / "c.json"),
                 jsonio.write_text(tmp_path / "t.yaml", "x: 1\n")]
    finally:
        os.umask(old)
    assert [stat.S_IMODE(p.stat().st_mode) for p in paths] == [mode] * 3


def test_no_write_through_a_symbolic_link(tmp_path, capsys, no_measuring):
    outside = bench().save(tmp_path / "elsewhere" / "b.json")  # even of our own kind
    before = outside.read_bytes()
    link = tmp_path / "run" / "b.json"
    link.parent.mkdir()
    link.symlink_to(outside)
    with pytest.raises(ValueError, match="it is a symbolic link"):
        bench().save(link)
    assert main(BENCH + ["--no-cache", "--json", str(link)]) == 1
    one_line_error(capsys, f"refusing to write {link}: it is a symbolic link")
    assert link.is_symlink() and outside.read_bytes() == before


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = bench().save(tmp_path / "b.json")
    before = path.read_bytes()

    def fail(*a):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(jsonio.os, "replace", fail)
    with pytest.raises(OSError):
        capture().save(tmp_path / "b2.json")
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["b.json"]


def test_bench_refuses_outputs_of_another_kind_before_measuring(tmp_path, capsys, no_measuring):
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    for flag, needle in (("--json", "not a te-gemm-bench/1 file"), ("-o", "not a PNG figure")):
        assert main(BENCH + ["--no-cache", flag, str(notes)]) == 1
        one_line_error(capsys, f"refusing to overwrite {notes}", needle)
    assert notes.read_text() == "my notes\n" and no_measuring == []


def test_plan_yaml_replaces_only_its_own_kind(tmp_path, capsys):
    from te_gemm_callback.analysis.plan import YAML_MARKER

    run = run_folder(tmp_path)
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    assert main(["plan", str(run), "--yaml", str(notes)]) == 1
    one_line_error(capsys, f"refusing to overwrite {notes}", "te-gemm plan YAML")
    assert notes.read_text() == "my notes\n"
    assert not (run / "precision_plan.json").exists()  # both targets checked before either is written
    yaml = tmp_path / "plan.yaml"
    yaml.write_text("te_gemm_plan_keep_bf16:\n  enabled: False\n")  # written before the marker existed
    for _ in range(2):  # then its own file again
        assert main(["plan", str(run), "--yaml", str(yaml)]) == 0
        assert yaml.read_text().splitlines()[0] == YAML_MARKER and "DisableFP8Layer" in yaml.read_text()


def test_figures_are_written_atomically_and_only_over_pngs(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure()
    path = png.write_figure_atomic(fig, tmp_path / "f.png", dpi=50)
    assert path.read_bytes().startswith(png.PNG_SIGNATURE)
    png.write_figure_atomic(fig, path)  # a PNG: replaced
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    link = tmp_path / "link.png"
    link.symlink_to(path)
    for target, needle in ((notes, "not a PNG figure"), (link, "symbolic link")):
        with pytest.raises(ValueError, match=needle):
            png.write_figure_atomic(fig, target)
    plt.close(fig)
    assert notes.read_text() == "my notes\n" and link.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.png", "link.png", "notes.txt"]  # no temporaries


# 5. Limits and parsing.
def test_visits_are_bounded(capsys, no_measuring):
    with pytest.raises(SystemExit) as e:
        main(BENCH + ["--no-cache", "--visits", "100000000000"])
    assert e.value.code == 2
    one_line_error(capsys, "--visits: expected at most 1000 visits")
    from te_gemm_callback.microbench.parallel import run_bench_parallel

    with pytest.raises(ValueError, match="visits must be an integer from 1 to 1000"):  # the Python API too
        run_bench_parallel([], ["BF16"], ["autocast"], 2, visits=10**11)


def test_a_quoted_tilde_in_the_cache_path_is_the_home_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("TE_GEMM_CACHE", "~/c.json")
    assert ResultCache().path == tmp_path / "c.json"
    assert ResultCache("~/d.json").path == tmp_path / "d.json"


def test_shapes_take_ascii_digits_only(capsys, no_measuring):
    from te_gemm_callback.shapes import parse_shapes

    for text in ("８x８x８", "8x8x٨"):
        with pytest.raises(ValueError, match="ASCII digits"):
            parse_shapes(text)
        assert main(["bench", "--shapes", text, "--precisions", "BF16", "--no-cache"]) == 2
        one_line_error(capsys, "bad shape", "ASCII digits")


@pytest.mark.parametrize("args", [BENCH + ["--json", ""], BENCH + ["-o", " "], BENCH + ["--cache", ""],
                                  ["plan", "run", "--yaml", ""], ["plan", "run", "--json", ""], ["show", ""]])
def test_empty_paths_are_refused(capsys, no_measuring, args):
    with pytest.raises(SystemExit) as e:
        main(args)
    assert e.value.code == 2
    one_line_error(capsys, "expected a file path, got an empty string")


# 4. A multi-process bench's workers die with the parent whatever the signal; no folder is left.
def test_stale_bench_folders_of_dead_owners_are_removed(tmp_path, monkeypatch):
    import socket

    from te_gemm_callback.microbench.parallel import _remove_stale_folders

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    folders = {name: tmp_path / name for name in (f"te_gemm_bench_{dead.pid}_a", f"te_gemm_bench_{os.getpid()}_b",
                                                  f"te_gemm_bench_{dead.pid}_c", "te_gemm_bench_old")}
    for f in folders.values():
        f.mkdir()
        (f / "spec1.json").write_text("{}")
    (folders[f"te_gemm_bench_{dead.pid}_a"] / "owner").write_text(f"{socket.gethostname()} {dead.pid}")
    (folders[f"te_gemm_bench_{dead.pid}_c"] / "owner").write_text(f"another-host {dead.pid}")
    _remove_stale_folders()
    # Gone: the dead owner's on this host. Kept: a live owner's, another host's, an unnamed owner's.
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"te_gemm_bench_{os.getpid()}_b", f"te_gemm_bench_{dead.pid}_c", "te_gemm_bench_old"])


def test_an_ignored_sighup_stays_ignored():
    from te_gemm_callback.microbench.parallel import _sigterm_as_interrupt

    old = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup
    try:
        with _sigterm_as_interrupt(lambda: None):
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    finally:
        signal.signal(signal.SIGHUP, old)


def _alive(pid):
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
    except OSError:
        return False


@pytest.mark.multiprocess
@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU workers; the GPU path is covered on the GPU host")
@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGKILL])
def test_workers_die_with_the_parent_and_leave_no_folder(tmp_path, monkeypatch, sig):
    from te_gemm_callback.microbench.parallel import _remove_stale_folders

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    # SIGHUP at its default, as in a terminal (the test itself may run under nohup).
    launcher = ("import signal, sys; signal.signal(signal.SIGHUP, signal.SIG_DFL); "
                "from te_gemm_callback.cli import main; sys.exit(main(sys.argv[1:]))")
    proc, workers = start_bench_with_workers(tmp, [sys.executable, "-c", launcher])
    assert workers, "no worker started"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == (130 if sig == signal.SIGHUP else -signal.SIGKILL), err[-2000:]
    deadline = time.time() + 20
    while any(map(_alive, workers)) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(map(_alive, workers))
    if sig == signal.SIGKILL:  # nothing of the parent ran: the next run removes its folder
        monkeypatch.setattr(tempfile, "tempdir", str(tmp))
        _remove_stale_folders()
    assert list(tmp.iterdir()) == []


# Probe faults 5, 15: refused before anything is launched or measured.
def test_more_devices_than_gpus_are_refused_before_launch(capsys, no_measuring, monkeypatch):
    from te_gemm_callback.microbench import parallel

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")  # no nvidia-smi: a host without GPUs, whatever runs the tests
    launched = []
    monkeypatch.setattr(parallel, "_launch", lambda *a: launched.append(a) or pytest.fail("launched"))
    assert main(BENCH + ["--no-cache", "--devices", "5000"]) == 2
    one_line_error(capsys, "--devices 5000", "1 visible GPU")
    with pytest.raises(ValueError, match="--devices 5000"):  # the Python API too
        parallel.run_bench_parallel([], ["BF16"], ["autocast"], 5000, visits=2)
    assert launched == []


def test_a_tiny_gemm_duty_is_refused(capsys, no_measuring):
    with pytest.raises(SystemExit) as e:
        main(BENCH + ["--no-cache", "--gemm-duty", "0.000001"])
    assert e.value.code == 2
    one_line_error(capsys, "--gemm-duty", "from 0.05 to 1")
    from te_gemm_callback.microbench.parallel import run_bench_parallel

    with pytest.raises(ValueError, match="gemm_duty must be in"):  # the Python API, before any worker starts
        run_bench_parallel([], ["BF16"], ["autocast"], 2, gemm_duty=1e-6)


@pytest.mark.parametrize("which", ["job", "sweep"])
def test_zero_step_times_are_one_line_errors(tmp_path, capsys, which):  # probe fault 7
    run = run_folder(tmp_path)
    if which == "sweep":
        cap = capture()
        cap.meta.update(sweep=True, recipe="BF16")
        cap.save(run / "sweep" / "BF16" / "gemm_capture.json")
    path = run / ("gemm_capture.json" if which == "job" else "sweep/BF16/gemm_capture.json")
    d = json.loads(path.read_text())
    for s in d["steps"]:
        s["wall_ms"] = 0
    path.write_text(json.dumps(d))
    for args in (["report", str(run)], ["plan", str(run)]):
        assert main(args) == 1
        one_line_error(capsys, "wall time of 0 ms")


def test_a_fifo_is_refused_not_waited_on(tmp_path, capsys, no_measuring):  # probe fault 16
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    run = run_folder(tmp_path)
    (run / "bench.json").unlink()
    os.mkfifo(run / "bench.json")

    def hung(*a):  # not an OSError (TimeoutError is one): main() must not turn it into a clean exit 2
        raise RuntimeError("blocked on a FIFO")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)  # before the fix, open() waited for a writer forever
    try:
        assert main(["show", str(fifo)]) == 1
        one_line_error(capsys, "FIFO")
        assert main(["report", str(run)]) == 1
        one_line_error(capsys, "FIFO")
        assert main(BENCH + ["--cache", str(fifo)]) == 1
        one_line_error(capsys, "FIFO")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("field,value,needle", [("flops", 1, "FLOPs per call"), ("calls_per_step", 1e308, "call count"),
                                                ("calls", 10**15, "call count"), ("m_splits", [[1, 2]], "m_splits")])
def test_capture_fields_are_cross_checked(tmp_path, capsys, field, value, needle):  # probe fault 9
    path = capture().save(tmp_path / "c.json")
    d = json.loads(path.read_text())
    d["records"][0][field] = value
    path.write_text(json.dumps(d))
    with pytest.raises(ValueError, match=needle):
        GemmCapture.load(path)
    assert main(["show", str(path)]) == 1
    one_line_error(capsys, needle)


def test_bench_outputs_are_checked_before_measuring(tmp_path, capsys, no_measuring, monkeypatch):  # probe fault 13
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    if os.access(ro, os.W_OK):  # root writes anywhere: os.access stands in for a read-only folder
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == ro else real(p, mode))
    assert main(BENCH + ["--no-cache", "--json", str(ro / "sub" / "b.json")]) == 1
    one_line_error(capsys, "--json", "not a writable folder")
    ro.chmod(0o755)
    same = str(tmp_path / "x.json")
    assert main(BENCH + ["--no-cache", "--json", same, "-o", same]) == 2
    one_line_error(capsys, "-o and --json name the same file")
    assert main(BENCH + ["--cache", same, "--json", same]) == 2
    one_line_error(capsys, "name the same file")


def test_error_lines_never_echo_escape_sequences(tmp_path, capsys):  # probe fault 22
    bad = tmp_path / "\x1b[31mred\x1b]0;title\x07.json"
    assert main(["show", str(bad)]) == 1
    err = one_line_error(capsys, "?[31mred")
    assert "\x1b" not in err and "\x07" not in err


@pytest.mark.parametrize("steps", ["1000000000000000000000", "9" * 5000])
def test_run_steps_are_bounded(capsys, steps):  # probe fault 17
    with pytest.raises(SystemExit) as e:
        main(["run", "--steps", steps])
    assert e.value.code == 2
    one_line_error(capsys, "--steps")


def test_a_zero_gpu_step_time_is_refused(tmp_path):  # probe fault 7: the step time is gpu_ms where there is one
    path = capture().save(tmp_path / "c.json")
    d = json.loads(path.read_text())
    for s in d["steps"]:
        s["gpu_ms"] = 0
    path.write_text(json.dumps(d))
    with pytest.raises(ValueError, match="GPU time of 0 ms"):
        GemmCapture.load(path)
