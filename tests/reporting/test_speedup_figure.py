"""speedups.png says what the report's table says about each prediction: its band, as whiskers like
the observed interval's, and what bounds the replayed step (host or GPU)."""

import pytest

from te_gemm_callback.analysis.verdicts import RecipeAnalysis, Report
from te_gemm_callback.reporting import figures


def _rows(bounds):
    """A BF16 row and two FP8 rows, replayed with a band, observed with a 95% interval."""
    rows = [RecipeAnalysis("BF16", gemm_speedup=1.0, predicted_step_speedup=1.0, predicted_band=(0.98, 1.02),
                           predicted_by="replay", predicted_bound=bounds[0], observed_step_speedup=1.0,
                           observed_step_ms=50.0, observed_ci=(1.0, 1.0))]
    for (recipe, pred, band, obs, ci), bound in zip((("DelayedScaling", 0.84, (0.76, 0.93), 0.90, (0.85, 0.98)),
                                                     ("Float8CurrentScaling", 0.71, (0.61, 0.85), 0.78, (0.74, 0.83))),
                                                    bounds[1:]):
        rows.append(RecipeAnalysis(recipe, gemm_speedup=1.16, predicted_step_speedup=pred, predicted_band=band,
                                   predicted_by="replay", predicted_bound=bound, observed_step_speedup=obs,
                                   observed_step_ms=50.0 / obs, observed_ci=ci))
    return Report("BF16", 50.0, 2.0, rows, {}, {"device": "NVIDIA H200"})


def _drawn(rep, tmp_path, monkeypatch):
    """The figure speedup_figure saves, its axes, and the bars of each legend entry."""
    saved = []
    real = figures.save_figure
    monkeypatch.setattr(figures, "save_figure", lambda fig, path: (saved.append(fig), real(fig, path))[1])
    assert figures.speedup_figure(rep, tmp_path / "speedups.png").stat().st_size > 0
    ax = saved[0].axes[0]
    return ax, {c.get_label(): c for c in ax.containers if hasattr(c, "errorbar")}


def _whiskers(container):
    """(low, high) of each bar's whisker, None where the bars carry none."""
    if container.errorbar is None:
        return None
    segments = container.errorbar.lines[2][0].get_segments()
    return [(round(float(s[0][1]), 2), round(float(s[1][1]), 2)) for s in segments]


def test_a_host_bound_jobs_predicted_bars_carry_their_band_and_say_host_bound(tmp_path, monkeypatch):
    # The dense host-bound job on an H200: predicted 0.84/0.71 drawn with no band and no word of the
    # host bounding the step, beside observed bars with whiskers.
    ax, bars = _drawn(_rows(["host"] * 3), tmp_path, monkeypatch)
    predicted = [label for label in bars if label.startswith("predicted")]
    assert predicted == ["predicted step speedup (replay, host-bound, band)"], list(bars)
    assert _whiskers(bars[predicted[0]]) == [(0.98, 1.02), (0.76, 0.93), (0.61, 0.85)]
    assert _whiskers(bars["observed step speedup (95% CI)"]) == [(1.0, 1.0), (0.85, 0.98), (0.74, 0.83)]
    # One bound for every recipe: said once, in the legend, not under each recipe.
    assert [t.get_text() for t in ax.get_xticklabels()] == ["BF16", "DelayedScaling", "Float8CurrentScaling"]
    # Each value above its whisker, and inside the axes.
    labels = {t.get_text(): t.get_position()[1] for t in ax.texts}
    assert labels["0.84"] == pytest.approx(0.93) and labels["0.90"] == pytest.approx(0.98)
    assert ax.get_ylim()[1] > max(labels.values())


def test_recipes_bound_on_different_sides_say_so_under_each_recipe(tmp_path, monkeypatch):
    ax, bars = _drawn(_rows(["gpu", "gpu", "host"]), tmp_path, monkeypatch)
    assert "predicted step speedup (band; how: under each recipe)" in bars, list(bars)
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert ticks == ["BF16\n(pred. GPU-bound)", "DelayedScaling\n(pred. GPU-bound)",
                     "Float8CurrentScaling\n(pred. host-bound)"]


def test_a_prediction_without_a_replay_says_gemms_alone_and_draws_no_band(tmp_path, monkeypatch):
    rep = _rows(["host"] * 3)
    for a in rep.recipes:
        a.predicted_band, a.predicted_bound, a.predicted_by = None, None, "gemms_alone"
    ax, bars = _drawn(rep, tmp_path, monkeypatch)
    assert _whiskers(bars["predicted step speedup (GEMMs alone)"]) is None


def test_a_swept_plans_amdahl_prediction_is_not_passed_off_as_the_replays(tmp_path, monkeypatch):
    rep = _rows(["host"] * 3)
    rep.recipes.append(RecipeAnalysis("plan", predicted_step_speedup=0.95, observed_step_speedup=0.9,
                                      observed_step_ms=55.0))
    ax, bars = _drawn(rep, tmp_path, monkeypatch)
    assert "predicted step speedup (band; how: under each recipe)" in bars, list(bars)
    assert [t.get_text() for t in ax.get_xticklabels()][-2:] == ["Float8CurrentScaling\n(pred. host-bound)",
                                                                 "plan\n(pred. GEMMs alone)"]


def test_a_run_without_rounds_names_no_interval(tmp_path, monkeypatch):
    # A capture with no sweep: BF16 observed alone, no interval drawn, none named.
    rep = _rows(["gpu"] * 3)
    for a in rep.recipes:
        a.observed_ci = None
        if a.recipe != "BF16":
            a.observed_step_speedup = a.observed_step_ms = None
    _, bars = _drawn(rep, tmp_path, monkeypatch)
    assert "observed step speedup" in bars and _whiskers(bars["observed step speedup"]) is None, list(bars)


@pytest.mark.parametrize("benched", [True, False])
def test_without_a_replay_no_empty_predicted_entry_and_the_title_says_why(tmp_path, monkeypatch, benched):
    """With no predicted bar the legend still named "predicted step speedup", the title read "Predicted vs
    observed", and in-job GEMM speedups (no bench.json) were labelled "(bench)"."""
    from te_gemm_callback.reporting.markdown import _figures

    rep = _rows(["gpu"] * 3)
    for a in rep.recipes:
        a.predicted_step_speedup = a.predicted_band = a.predicted_bound = a.predicted_by = None
        a.gemm_ms_bench = 2.0 if benched else None
    ax, bars = _drawn(rep, tmp_path, monkeypatch)
    gemm = "GEMM speedup (bench)" if benched else "GEMM speedup (in job)"
    assert list(bars) == [gemm, "observed step speedup (95% CI)"]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == list(bars)
    assert ax.get_title() == "GEMM and observed step speedup — NVIDIA H200\n(no replay, so no predicted step)"
    md = "\n".join(_figures({"speedups": tmp_path / "speedups.png"}, tmp_path, rep))
    assert "**GEMM and observed step speedup (no replay, so no predicted step)**" in md and "Predicted" not in md


def test_a_replayed_run_keeps_its_predicted_bars_and_title(tmp_path, monkeypatch):
    rep = _rows(["gpu"] * 3)
    for a in rep.recipes:
        a.gemm_ms_bench = 2.0
    ax, bars = _drawn(rep, tmp_path, monkeypatch)
    assert list(bars) == ["GEMM speedup (bench)", "predicted step speedup (replay, GPU-bound, band)",
                          "observed step speedup (95% CI)"]
    assert ax.get_title() == "Predicted vs observed step speedup — NVIDIA H200"
