"""The statistics the benchmark scripts publish (benchmarks/_timing.py)."""

import json
import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from _timing import median_ci


def test_median_ci_brackets_the_median_and_narrows_with_more_windows():
    import random

    rng = random.Random(1)
    few = [rng.gauss(2.0, 10.0) for _ in range(10)]
    many = few + [rng.gauss(2.0, 10.0) for _ in range(190)]
    m, lo, hi = median_ci(few)
    assert m == statistics.median(few) and lo <= m <= hi
    m2, lo2, hi2 = median_ci(many)
    assert hi2 - lo2 < hi - lo
    assert lo2 < 2.0 < hi2  # the true median, with 200 windows
    assert median_ci(many) == (m2, lo2, hi2)  # fixed seed: reproducible


def test_median_ci_tells_a_real_cost_from_noise():
    # Twelve windows each +10% +- 3: the interval excludes zero; centred on zero it does not.
    cost = [10 + d for d in (-3, -2, -1, 0, 1, 2, 3, -2.5, 2.5, 0.5, -0.5, 1.5)]
    assert median_ci(cost)[1] > 5
    noise = [d for d in (-3, -2, -1, 0, 1, 2, 3, -2.5, 2.5, 0.5, -0.5, 1.5)]
    _, lo, hi = median_ci(noise)
    assert lo < 0 < hi
    assert median_ci([4.0]) == (4.0, 4.0, 4.0)
    with pytest.raises(ValueError):
        median_ci([])


def test_window_stats_reads_each_step_kind_against_the_plain_blocks_around_it():
    # benchmarks/undisturbed.py interleaved: windows of 6 steps between plain blocks of 6. Plain
    # steps 50 ms; in a window the dispatch step +100%, instrumented +10%, the first clean step
    # (kernel-records session end) +80%, clean +2%. Each kind must come back exactly, clean-first
    # kept apart from clean, and instrumented against the same window's clean steps 1.10 / 1.02.
    from undisturbed import window_stats

    kinds = ["dispatch", "instrumented", "instrumented", "clean-first", "clean", "clean"]
    factor = {"dispatch": 2.0, "instrumented": 1.10, "clean-first": 1.8, "clean": 1.02}
    start, block, windows = 3, 6, []
    t = [50.0] * start
    for b in range(9):
        if b % 2:
            windows.append(len(t))
            t += [50.0 * factor[k] for k in kinds]
        else:
            t += [50.0] * block
    res = window_stats(t, windows, kinds, block)
    for kind, f in factor.items():
        assert res[kind]["pct_window_median"] == pytest.approx(100 * (f - 1))
        assert res[kind]["pct_ci95"] == [pytest.approx(100 * (f - 1))] * 2
    assert res["clean"]["steps"] == 2 * len(windows) and res["clean-first"]["steps"] == len(windows)
    assert res["instrumented_vs_window_clean"]["pct_window_median"] == pytest.approx(100 * (1.10 / 1.02 - 1))


def test_median_ratio_ci_brackets_the_ratio_and_tells_a_shift_from_run_to_run_noise():
    from _timing import median_ratio_ci

    plain = [1.00, 1.04, 0.97, 1.02]
    ratio, lo, hi = median_ratio_ci([1.01, 0.99, 1.03], plain)
    assert ratio == pytest.approx(1.01 / 1.01) and lo < 1.0 < hi  # no shift: the interval holds 1
    ratio, lo, hi = median_ratio_ci([1.30, 1.28, 1.33], plain)
    assert lo > 1.2 and ratio == pytest.approx(1.30 / 1.01)  # a 29% shift: far outside the noise
    assert median_ratio_ci([2.0], [1.0]) == (2.0, 2.0, 2.0)
    with pytest.raises(ValueError):
        median_ratio_ci([], [1.0])


def test_the_nsys_check_compares_each_gemm_across_alternating_runs():
    # benchmarks/nsys_check.py: per GEMM, the median under nsys against the median of the runs
    # without it, the interval over runs, and how far those runs spread; GEMMs a run lacks are left out.
    from helpers.scripts import benchmark

    nc = benchmark("nsys_check")
    plain = [{"a": 1.00, "b": 0.050, "c": 2.0}, {"a": 1.06, "b": 0.052}, {"a": 0.98, "b": 0.049}]
    nsys = [{"a": 1.02, "b": 0.060}, {"a": 1.01, "b": 0.058}]
    rows = {r["gemm"]: r for r in nc.compare(nsys, plain, tolerance=0.05)}
    assert set(rows) == {"a", "b"}  # "c" was timed in one run only
    a, b = rows["a"], rows["b"]
    assert a["nsys_vs_plain"] == pytest.approx(1.015 / 1.00 - 1) and a["within"]
    assert a["plain_spread"] == pytest.approx(0.06) and a["ci95"][0] <= a["nsys_vs_plain"] <= a["ci95"][1]
    assert b["nsys_vs_plain"] == pytest.approx(0.059 / 0.050 - 1) and not b["within"] and b["ci95"][0] > 0.05
    assert [r["gemm"] for r in nc.compare(nsys, plain, 0.05)] == ["a", "b"]  # slowest first


@pytest.mark.parametrize("run, block", [("replay/main", "Float8BlockScaling     dgrad 1.026  fprop 1.046  wgrad 1.017"),
                                        ("dense", "Float8BlockScaling     dgrad 1.029  fprop 1.085  wgrad 1.064")])
def test_replay_parts_gives_the_per_pass_ratios_the_results_page_quotes(run, block):
    """docs/results/h200.md quotes these from the committed runs, offline."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, str(root / "benchmarks" / "replay_parts.py"),
                          str(root / "docs" / "results" / "h200" / run)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert block in out.stdout, out.stdout
    page = (root / "docs" / "results" / "h200.md").read_text()
    fprop, dgrad, wgrad = (block.split()[i] for i in (4, 2, 6))
    assert f"{fprop} / {dgrad} /" in page.replace("\n  ", " ")


@pytest.mark.parametrize("run, line", [
    ("demo", "Float8BlockScaling     predicted 1.194 (band 1.104-1.305, GEMMs alone 1.307) observed 1.250 "
             "(1.228-1.270) miss -4.5%, in interval False, band covers True, gpu-bound"),
    ("dense_host", "DelayedScaling         predicted 0.899 (band 0.844-0.961, GEMMs alone 1.006) observed 0.866 "
                   "(0.830-0.887) miss +3.8%, in interval False, band covers True, host-bound")])
def test_replay_summary_gives_the_rows_the_h100_page_quotes(run, line):
    """docs/results/h100.md's replay table and module-benchmark shares, from the committed runs, offline."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, str(root / "benchmarks" / "replay_summary.py"),
                          str(root / "docs" / "results" / "h100" / run)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert line in out.stdout, out.stdout
    share = out.stdout.split("module benchmark ")[1].split("(")[1].split(")")[0]
    page = (root / "docs" / "results" / "h100.md").read_text()
    assert share in page, share
    recipe, pred = line.split()[:3:2]
    assert f"| {recipe} | {pred} (" in page, (recipe, pred)


@pytest.mark.parametrize("family", ["gpt_neox", "phi3"])
@pytest.mark.parametrize("size", ["gpu", "host"])
def test_h100_page_quotes_the_committed_replay_checks(family, size):
    """docs/results/h100.md's external-model rows are the committed replay_check JSONs' figures."""
    root = Path(__file__).resolve().parents[1]
    res = json.loads((root / "docs" / "results" / "h100" / "replay" / f"{family}_{size}.json").read_text())
    page = (root / "docs" / "results" / "h100.md").read_text()
    for recipe, x in res["recipes"].items():
        if recipe == "BF16":
            continue
        p, o, (lo, hi), (b0, b1) = x["predicted"], x["observed"], x["ci95"], x["band"]
        row = (f"| {recipe} | {p:.3f} ({b0:.3f}-{b1:.3f}) | {x['gemms_alone']:.3f} | {o:.3f} ({lo:.3f}-{hi:.3f}) | "
               f"{100 * (p / o - 1):+.1f}% | {'yes' if lo <= p <= hi else 'no'} | {'yes' if b0 <= o <= b1 else 'no'} |")
        assert row in page, row
        assert x["predicted_without_sweep"] == pytest.approx(p, rel=1e-9)  # the sweep read by no prediction
