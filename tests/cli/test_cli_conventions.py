"""What `te-gemm` promises every command: help that says what each command does and every option's
default, --version, exit codes (0 done, 1 the run or its inputs failed, 2 a usage error, 130
interrupted), a cause said once, outputs refused before anything is measured, the result cache
listed and cleared, and tables that say how to see the rows they leave out. CPU only."""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers.cli import one_line_error
from helpers.three_modules import bench, capture

import te_gemm_callback
from te_gemm_callback.cli import build_parser, main
from te_gemm_callback.microbench.cache import ResultCache
from te_gemm_callback.microbench.cells import result_key
from te_gemm_callback.precisions import FP8_RECIPES, parse_recipes, skipped_lines, warn_once
from te_gemm_callback.shapes import GemmShape

REPO = Path(__file__).resolve().parents[2]
BENCH = ["bench", "--shapes", "8x8x8", "--precisions", "BF16", "--no-cache"]


def cli(*args, env=None, timeout=300):
    """``te-gemm ARGS`` in a fresh process, as a user runs it; wide output so lines do not wrap."""
    env = {**os.environ, "COLUMNS": "200", **(env or {})}
    return subprocess.run([sys.executable, "-m", "te_gemm_callback.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def exit_code(args):
    """main()'s return, or the code of the SystemExit argparse raises."""
    try:
        return main(args)
    except SystemExit as e:
        return e.code


def subcommands():
    """(name, parser) of every command, ``cache list`` and ``cache clear`` included."""
    def children(p):
        acts = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        return acts[0].choices.items() if acts else []

    out = []
    for name, p in children(build_parser()):
        out.append((name, p))
        out += [(f"{name} {sub}", sp) for sub, sp in children(p)]
    return out


# 1. Help and version.
def test_version():
    proc = cli("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"te-gemm {te_gemm_callback.__version__}"


def test_every_command_has_a_description_and_every_option_its_default(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "200")
    names = [n for n, _ in subcommands()]
    assert {"shapes", "bench", "compare", "report", "plan", "show", "run", "cache", "cache list",
            "cache clear"} <= set(names)
    for name, p in subcommands():
        assert p.description and len(p.description) > 40, name
        with pytest.raises(SystemExit) as e:
            main([*name.split(), "--help"])
        assert e.value.code == 0
        text = " ".join(capsys.readouterr().out.split())
        assert " ".join(p.description.split())[:60] in text, name
        assert "exit codes: 0 done" in text and "2 a usage error" in text and "130 interrupted" in text, name
        options = [a for a in p._actions if a.option_strings and a.default is not argparse.SUPPRESS]
        said = text.count("(default") + text.count("(required)")
        assert said == len(options), (name, said, [a.option_strings for a in options])


def test_top_level_help_lists_the_exit_codes():
    proc = cli("--help")
    assert proc.returncode == 0
    for line in ("0    done", "1    the run or its inputs failed", "2    a usage error", "130  interrupted"):
        assert line in proc.stdout, line


# 2. Exit codes: 2 for the command line, 1 for the run or its inputs.
@pytest.mark.parametrize("args,needle", [
    (["bench", "--precisions", "BF16"], "exactly one of"),
    (["bench", "--shapes", "8x8", "--precisions", "BF16"], "bad shape"),
    (["bench", "--shapes", "8x8x8", "--precisions", "fp9"], "unknown precision"),
    (["bench", "--shapes", "8x8x8", "--pre-quantize", "--modes", "autocast"], "not both"),
    (["bench", "--shapes", "8x8x8", "--modes", "fast"], "--modes"),
    (["run", "--steps", "2"], "at least 3 steps"),
    (["show", "c.json", "--limit", "-1"], "--limit"),
])
def test_usage_errors_exit_2(tmp_path, monkeypatch, capsys, no_measuring, args, needle):
    monkeypatch.chdir(tmp_path)
    assert exit_code(args) == 2
    one_line_error(capsys, needle)
    assert list(tmp_path.iterdir()) == [] and no_measuring == []


def test_failures_of_the_run_or_its_inputs_exit_1(tmp_path, capsys, no_measuring):
    run = tmp_path / "run"
    capture().save(run / "gemm_capture.json")
    notes = tmp_path / "notes.json"
    notes.write_text("my notes\n")
    cases = [(["report", str(tmp_path / "missing")], "missing"),  # a run folder that is not there
             (["report", str(tmp_path / "empty")], "empty"),
             (["plan", str(run)], "has no bench.json"),  # a run folder without what the command needs
             (["show", str(notes)], "not valid JSON"),  # an input file of another kind
             (BENCH + ["--json", str(notes)], "refusing to overwrite")]  # an output that would replace one
    (tmp_path / "empty").mkdir()
    for args, needle in cases:
        assert main(args) == 1, args
        one_line_error(capsys, needle)
    assert notes.read_text() == "my notes\n" and no_measuring == []


# 3. run --precisions is checked as bench checks it.
@pytest.mark.parametrize("value", ["FP8", "fp9", "BF16,,DelayedScaling"])
def test_run_precisions_refused_like_bench(tmp_path, capsys, no_measuring, value):
    errors = {}
    for cmd in (["bench", "--shapes", "8x8x8"], ["run", "--out", str(tmp_path / "out"), "--steps", "3"]):
        t = time.perf_counter()
        assert main([*cmd, "--precisions", value]) == 2
        assert time.perf_counter() - t < 10  # refused before the demo trains (or anything is measured)
        errors[cmd[0]] = one_line_error(capsys, "--precisions").split(": error: ", 1)[1]
    assert errors["bench"] == errors["run"]
    assert not (tmp_path / "out").exists() and no_measuring == []


def test_recipe_lists():
    assert parse_recipes("bf16, Float8CurrentScaling,current") == ["BF16", "Float8CurrentScaling"]
    with pytest.raises(ValueError, match="names 4 recipes"):
        parse_recipes("BF16,FP8")  # four recipes time differently: one of them must not stand for "FP8"
    assert len(FP8_RECIPES) == 4


# 4. One cause, said once.
@pytest.mark.skipif(torch.cuda.is_available(), reason="a host without CUDA skips every TE recipe")
def test_a_cpu_bench_says_why_the_fp8_recipes_did_not_run_once(tmp_path):
    proc = cli("bench", "--shapes", "8x8x8", "--no-cache", env={"TE_GEMM_CACHE": str(tmp_path / "c.json")})
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = " ".join((proc.stdout + proc.stderr).split())  # a wrapped line joined again
    assert text.count("no CUDA device") == 1, text
    assert text.count("not installed") <= 1  # with TE installed its reason is not this one, still said once
    line = next(ln for ln in proc.stdout.splitlines() if "not run:" in ln)
    assert all(r in line for r in (*FP8_RECIPES, "NVFP4BlockScaling")), line


def test_skipped_recipes_are_grouped_by_cause_and_warnings_said_once(caplog):
    lines = skipped_lines({"DelayedScaling": "no CUDA device", "Float8BlockScaling": "no CUDA device",
                           "NVFP4BlockScaling": "compute capability 10.0 or higher required for NVFP4 execution."})
    # TE's own reasons end in a full stop, which the lines joined with "; " doubled ("execution.;").
    assert lines == ["DelayedScaling, Float8BlockScaling not run: no CUDA device",
                     "NVFP4BlockScaling not run: compute capability 10.0 or higher required for NVFP4 execution"]
    with caplog.at_level("WARNING", logger="te_gemm_callback"):
        said = [warn_once("te-gemm: test cause said once") for _ in range(3)]
    assert said == [True, False, False]
    assert [r.getMessage() for r in caplog.records].count("te-gemm: test cause said once") == 1


# 5. Outputs are checked before anything is measured; a run's bench keeps its modes.
@pytest.mark.parametrize("content", ['{"schema": "te-gemm-capture/1", "records": []}', "my notes\n"])
def test_bench_json_onto_a_foreign_file_is_refused_before_measuring(tmp_path, capsys, no_measuring, content):
    target = tmp_path / "bench.json"
    target.write_text(content)
    t = time.perf_counter()
    assert main(["bench", *["--hidden-size", "4096", "--intermediate-size", "16384", "--num-attention-heads", "32",
                            "--num-hidden-layers", "24", "--micro-batch-size", "31", "--sequence-length", "512"],
                 "--no-cache", "--json", str(target)]) == 1
    assert time.perf_counter() - t < 10 and no_measuring == []
    one_line_error(capsys, f"refusing to overwrite {target}")
    assert target.read_text() == content


def test_bench_onto_a_run_folders_bench_json_keeps_its_modes(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    js = run / "bench.json"
    assert main(BENCH + ["--modes", "autocast,prequantized", "--json", str(js)]) == 0
    assert json.loads(js.read_text())["meta"]["modes"] == ["autocast", "prequantized"]
    capsys.readouterr()
    assert main(BENCH + ["--json", str(js)]) == 0  # as the README's re-bench of a run folder
    out = " ".join(capsys.readouterr().out.split())
    assert "modes autocast, prequantized: those of the existing" in out and "--modes" in out
    assert "(prequantized)" in out and "(autocast)" in out  # both modes' tables
    assert json.loads(js.read_text())["meta"]["modes"] == ["autocast", "prequantized"]
    assert main(BENCH + ["--pre-quantize", "--json", str(js)]) == 0  # asked for: what is asked
    assert json.loads(js.read_text())["meta"]["modes"] == ["prequantized"]
    assert main(BENCH + ["--json", str(tmp_path / "new.json")]) == 0  # a new file: autocast, as before
    assert json.loads((tmp_path / "new.json").read_text())["meta"]["modes"] == ["autocast"]


# 6. The result cache, listed and cleared.
def _cache(path):
    c = ResultCache(path)
    from te_gemm_callback.microbench.cells import BenchResult

    for device, recipe, shape in (("NVIDIA H200", "BF16", "8x8x8"), ("NVIDIA H200", "DelayedScaling", "8x8x8"),
                                  ("NVIDIA H200", "BF16", "16x8x8"), ("CPU (x86_64)", "BF16", "8x8x8")):
        m, k, n = map(int, shape.split("x"))
        versions = "torch 2.9, TE None" if device.startswith("CPU") else "torch 2.9, TE 2.8"  # a bench without TE
        key = result_key(device, versions, GemmShape(m, k, n), None, recipe, "autocast", False)
        c.put(key, BenchResult(m, k, n, "fprop", recipe, "autocast", median_ms=1.0, iters=3))
    assert c.save() is None
    return path


@pytest.mark.parametrize("via", ["--cache", "TE_GEMM_CACHE"])
def test_cache_list_and_clear(tmp_path, monkeypatch, capsys, via):
    path = _cache(tmp_path / "cache.json")
    monkeypatch.setenv("COLUMNS", "200")
    where = ["--cache", str(path)] if via == "--cache" else []
    if via == "TE_GEMM_CACHE":
        monkeypatch.setenv("TE_GEMM_CACHE", str(path))
    assert main(["cache", "list", *where]) == 0
    out = capsys.readouterr().out
    assert f"cache: {path}" in out and "4 cell(s)" in out and f"size: {path.stat().st_size / 1024:.1f} KiB" in out
    rows = {tuple(c.strip() for c in ln.strip("│ ").split("│")) for ln in out.splitlines() if ln.startswith("│")}
    assert ("NVIDIA H200", "torch 2.9, TE 2.8", "BF16", "2") in rows
    assert ("NVIDIA H200", "torch 2.9, TE 2.8", "DelayedScaling", "1") in rows
    assert ("CPU (x86_64)", "torch 2.9, no TE", "BF16", "1") in rows
    assert main(["cache", "clear", *where]) == 2  # not on a terminal: --yes, or nothing happens
    one_line_error(capsys, "pass --yes")
    assert path.exists()
    assert main(["cache", "clear", "--yes", *where]) == 0
    assert "removed" in capsys.readouterr().out and not path.exists()
    assert main(["cache", "list", *where]) == 0
    assert "no cache yet" in capsys.readouterr().out
    assert main(["cache", "clear", "--yes", *where]) == 0
    assert "nothing to clear" in capsys.readouterr().out


def test_cache_commands_refuse_a_file_that_is_not_a_cache(tmp_path, capsys):
    notes = tmp_path / "notes.json"
    content = '{"schema": "te-gemm-bench/1", "results": []}'
    notes.write_text(content)
    for args in (["list"], ["clear", "--yes"]):
        assert main(["cache", *args, "--cache", str(notes)]) == 1
        one_line_error(capsys, f"{notes} is not a te-gemm cache")
    assert notes.read_text() == content


def test_cache_commands_find_the_cache_where_bench_does(tmp_path, monkeypatch):
    monkeypatch.delenv("TE_GEMM_CACHE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    from te_gemm_callback.cli.cache import cache_path

    assert cache_path(None) == tmp_path / ".cache" / "te_gemm_callback" / "bench.json" == ResultCache().path
    assert cache_path("~/c.json") == tmp_path / "c.json"
    monkeypatch.setenv("TE_GEMM_CACHE", str(tmp_path / "env.json"))
    assert cache_path(None) == tmp_path / "env.json"


# 7. A table cut short says how to see the rest.
def test_truncated_tables_name_the_flag_that_shows_every_row(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "200")
    run = tmp_path / "run"
    cap = capture().save(run / "gemm_capture.json")
    bench().save(run / "bench.json")
    rows = len(capture().records)
    assert main(["show", str(cap), "--limit", "2"]) == 0
    out = capsys.readouterr().out
    assert f"{rows - 2} more row(s) not shown: --limit 0 shows every row" in out
    assert main(["show", str(cap), "--limit", "0"]) == 0
    assert "not shown" not in capsys.readouterr().out
    assert main(["plan", str(run), "--limit", "1"]) == 0
    assert "2 more row(s) not shown: --limit 0 shows every row" in capsys.readouterr().out
    assert main(["plan", str(run)]) == 0  # 3 modules, under the default 40: nothing left out
    assert "not shown" not in capsys.readouterr().out


def test_json_dash_is_standard_output_on_every_command_that_writes_json(tmp_path, capsys, monkeypatch):
    """`--json -` wrote a file named "-"; show and report could not print JSON at all. Now "-" is
    standard output, the JSON alone there (the tables go to standard error), and no file is made."""
    import json
    import shutil

    from te_gemm_callback.cli import main

    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    shutil.copytree(Path(__file__).resolve().parents[2] / "docs/results/h200/replay/main", run,
                    ignore=shutil.ignore_patterns("sweep"))
    capsys.readouterr()
    for argv, schema in ((["show", str(run / "gemm_capture.json"), "--json"], "te-gemm-capture/1"),
                         (["show", str(run / "gemm_capture.json"), "--json", "-"], "te-gemm-capture/1"),
                         (["report", str(run), "--json", "-"], "te-gemm-report/1"),
                         (["plan", str(run), "--json", "-"], "te-gemm-plan/1"),
                         (["bench", "--shapes", "32x32x32", "--precisions", "BF16", "--no-cache", "--visits", "2",
                           "--json", "-"], "te-gemm-bench/1")):
        assert main(argv) == 0, argv
        out, err = capsys.readouterr()
        assert json.loads(out)["schema"] == schema, (argv, out[:200])
        assert err.strip(), argv  # the table went to standard error
        assert not (tmp_path / "-").exists() and not (run / "-").exists(), argv


def test_an_unknown_flag_before_the_command_is_named(capsys):
    from te_gemm_callback.cli import main

    with pytest.raises(SystemExit) as e:
        main(["--bogus"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--bogus" in err and err.count("\n") == 1, err


def test_show_takes_a_run_folder_as_report_plan_and_project_do(tmp_path, capsys):
    """`te-gemm show RUN_DIR` failed with "Is a directory" where the other commands take a folder."""
    import json
    import shutil

    from te_gemm_callback.cli import main

    run = tmp_path / "run"
    shutil.copytree(Path(__file__).resolve().parents[2] / "docs/results/h200/replay/main", run,
                    ignore=shutil.ignore_patterns("sweep"))
    capsys.readouterr()
    assert main(["show", str(run), "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["schema"] == "te-gemm-capture/1"
    (run / "gemm_capture.json").unlink()
    assert main(["show", str(run)]) == 1
    err = capsys.readouterr().err
    assert "is a folder with no gemm_capture.json" in err and err.count("\n") == 1


def test_run_ends_with_the_lines_a_fits_log_gets(tmp_path, capsys):
    """`te-gemm run` prints its tables, then, last, the summary the README quotes (no hint to print
    the tables it has just printed)."""
    assert main(["run", "--out", str(tmp_path / "out"), "--steps", "3"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip()]
    assert lines[-1].startswith("te-gemm: the full report: ") and "verbose=True" not in lines[-1], lines[-3:]
    assert any(ln.startswith("te-gemm: BF16 job, step ") for ln in lines[-12:]), lines[-12:]


def test_report_says_when_a_folder_without_sweep_loses_its_observed_speedups(tmp_path, capsys):
    """A run folder copied without sweep/: its report.json's observed speedups cannot be made again;
    te-gemm report says which are gone and keeps the earlier report.json beside the new one (a second
    report leaves that copy as it is), and says nothing where sweep/ is there."""
    import shutil

    root = Path(__file__).resolve().parents[2]
    run = tmp_path / "demo"
    shutil.copytree(root / "docs" / "results" / "h100" / "demo", run)
    # Observed speedups without an interval (fewer rounds than one needs) are observed speedups all the same,
    # and a file of that name already there is not written over.
    report = json.loads((run / "report.json").read_text())
    for row in report["recipes"]:
        row["observed_ci"] = None
    (run / "report.json").write_text(json.dumps(report))
    (run / "report-before.json").write_text('{"hello": 1}')
    earlier = (run / "report.json").read_bytes()
    observed = lambda: {s["recipe"]: s["observed_speedup"]  # noqa: E731
                        for s in json.loads((run / "projection-B300.json").read_text())["steps"]}
    assert main(["project", str(run), "--gpu", "B300"]) == 0
    projected = observed()
    capsys.readouterr()
    assert main(["report", str(run)]) == 0
    err = capsys.readouterr().err
    assert "has no sweep/ captures" in err and "DelayedScaling" in err and err.count("te-gemm report: warning") == 1
    assert f"kept as {run / 'report-before-2.json'}" in err
    assert (run / "report-before.json").read_text() == '{"hello": 1}'
    assert main(["report", str(run)]) == 0
    kept = json.loads((run / "report-before-2.json").read_text())
    run_id = json.loads((run / "gemm_capture.json").read_text())["meta"]["run_id"]
    assert kept["recipes"] == json.loads(earlier)["recipes"] and kept["meta"]["run_id"] == run_id  # marked its run's
    # te-gemm project finds them there: the same observed column as before the report.
    assert main(["project", str(run), "--gpu", "B300"]) == 0
    assert "from report-before-2.json" in " ".join(capsys.readouterr().out.split())
    assert observed() == projected and projected["DelayedScaling"] > 1
    # Another run written into the same folder does not take them for its own.
    capture = json.loads((run / "gemm_capture.json").read_text())
    capture["meta"]["run_id"] = "another run"
    (run / "gemm_capture.json").write_text(json.dumps(capture))
    assert main(["project", str(run), "--gpu", "B300"]) == 0
    assert "report-before-2.json is of another run" in " ".join(capsys.readouterr().out.split())
    assert observed()["DelayedScaling"] is None
    kept = tmp_path / "main"
    shutil.copytree(root / "docs" / "results" / "h200" / "replay" / "main", kept)
    assert main(["report", str(kept)]) == 0 and main(["report", str(kept)]) == 0  # the second over a full report.json
    assert "has no sweep/" not in capsys.readouterr().err


@pytest.mark.parametrize("json_out", [True, False])
def test_a_reader_that_leaves_early_is_no_error(json_out):
    """`te-gemm shapes ... | head`: the pipe closes before the output is out; no "error: Broken pipe"
    line and no traceback at exit, and 141 for tables and JSON alike, as a shell gives a tool the pipe
    ended (rich's own default ends a table's with 1)."""
    args = ["shapes", "--hidden-size", "64", "--intermediate-size", "128", "--num-attention-heads", "4",
            "--num-hidden-layers", "2", "--micro-batch-size", "1", "--sequence-length", "8"]
    args += ["--json", "-"] if json_out else []
    script = ("import os, sys\n"
              "r, w = os.pipe(); os.close(r); os.dup2(w, 1)  # a reader that already left\n"
              "from te_gemm_callback.cli import main\n"
              f"sys.exit(main({args!r}))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 141 and out.stderr == "", (out.returncode, out.stderr)


def test_no_cache_and_a_cache_path_together_is_a_usage_error(tmp_path, capsys):
    assert main(["bench", "--shapes", "8x8x8", "--precisions", "BF16", "--no-cache", "--cache",
                 str(tmp_path / "c.json")]) == 2
    err = capsys.readouterr().err
    assert "--no-cache and --cache" in err and err.count("\n") == 1 and not (tmp_path / "c.json").exists()
