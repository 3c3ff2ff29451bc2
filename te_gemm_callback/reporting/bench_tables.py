"""Benchmark tables in the sections of TE's benchmarks/gemm/benchmark_gemm.py: per pass, per item, per step."""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

from rich.table import Table

from te_gemm_callback.microbench.cells import SPREAD_LIMIT, BenchResult
from te_gemm_callback.microbench.items import WorkItem, passes_of
from te_gemm_callback.microbench.results import BenchResults, fallback_items, item_ms, step_ms
from te_gemm_callback.precisions import skipped_lines
from te_gemm_callback.printable import safe
from te_gemm_callback.reporting.console import make_table
from te_gemm_callback.shapes import GemmOp, gemm_passes

PASS_TITLES = {GemmOp.FPROP: "Fprop", GemmOp.DGRAD: "Dgrad", GemmOp.WGRAD: "Wgrad",
               GemmOp.DGRAD_A: "Dgrad (left input, no weight)", GemmOp.DGRAD_B: "Dgrad (right input, no weight)"}

# Marks after a time, explained in the caption of a table showing one.
CACHED_MARK = "*"
NOISY_MARK = "!"
FALLBACK_MARK = "†"
FOOTNOTES = {
    CACHED_MARK: "from the cache: measured by an earlier run under the same conditions (--no-cache measures again)",
    NOISY_MARK: f"noisy: spread (IQR/median) still above {100 * SPREAD_LIMIT:.0f}% after re-measuring; not cached, "
                "the time may be far off",
    FALLBACK_MARK: "the GEMMs that failed in that recipe counted at their BF16 time (the job keeps them in BF16), "
                   "as the speedup table counts them",
}
MAX_NAMED = 3  # failed GEMMs named under a table; the speedup table's evidence names them all


def _fmt(ms: float | None, base: float | None, cells: list[BenchResult | None]) -> str:
    """A time made of ``cells``, its speedup over ``base`` and its marks; "not measured" where no cell is."""
    if ms is None:
        return "failed" if any(c is not None for c in cells) else "[dim]not measured[/dim]"
    sp, marks = f" ({base / ms:.2f}x)" if base and ms else "", _marks(cells)
    return (f"{ms:.3f}{sp}" + (f"[dim]{CACHED_MARK}[/dim]" if CACHED_MARK in marks else "")
            + (f"[bold red]{NOISY_MARK}[/bold red]" if NOISY_MARK in marks else ""))


def _marks(cells: Iterable[BenchResult | None]) -> str:
    """The marks of a time made of ``cells``: a cached or noisy one marks the total too."""
    ok = [r for r in cells if r is not None and r.ok]
    return (CACHED_MARK if any(r.cached for r in ok) else "") + (NOISY_MARK if any(r.noisy for r in ok) else "")


def _caption(marks: str, *lines: str) -> str | None:
    """A table's footnotes: each mark in ``marks`` explained, then ``lines``."""
    notes = [f"{m} {FOOTNOTES[m]}" for m in FOOTNOTES if m in marks] + [ln for ln in lines if ln]
    # Each note on its own: safe() shows a line break as "?".
    return "\n".join(safe(n) for n in notes) if notes else None


def _item_cells(res: BenchResults, it: WorkItem, precision: str, mode: str) -> list[BenchResult | None]:
    return [res.get(s, precision, mode, it.m_splits) for s in passes_of(it)]


def pass_table(res: BenchResults, items: list[WorkItem], op: GemmOp, mode: str) -> Table:
    precs = res.precisions
    t = make_table(f"{PASS_TITLES[op]} GEMMs ({safe(mode)}): ms per call, speedup over BF16",
                   ["GEMM", "M x K x N", *map(safe, precs), "spread (IQR/median)"], left=("GEMM", "M x K x N"),
                   wrap=("GEMM", "spread (IQR/median)"))
    seen, shown = set(), ""
    for it in items:
        s = next((s for s in passes_of(it) if s.op is op), None)
        if s is None or (s, it.m_splits) in seen:
            continue
        seen.add((s, it.m_splits))
        base = res.get(s, "BF16", mode, it.m_splits)
        base_ms = base.median_ms if base is not None and base.ok else None
        found = [res.get(s, p, mode, it.m_splits) for p in precs]
        shown += _marks(found)
        cells = [_fmt(r.median_ms if r is not None and r.ok else None, base_ms, [r]) for r in found]
        spread = max([0.0] + [r.spread for r in found if r is not None and r.spread is not None])
        label = s.mkn + (f" [{len(it.m_splits)} groups]" if it.m_splits else "")
        sp = f"{100 * spread:.1f}%"
        t.add_row(safe(it.name), label, *cells, f"[bold red]{sp}[/bold red]" if spread > SPREAD_LIMIT else sp)
    t.caption, t.caption_justify = _caption(shown), "left"
    return t


def totals_table(res: BenchResults, items: list[WorkItem], mode: str) -> Table:
    """Per work item (fprop+dgrad+wgrad), then the whole step, with speedups over BF16."""
    precs = res.precisions
    t = make_table(f"GEMM time per item and per step ({safe(mode)}), ms", ["GEMM", "calls/step", *map(safe, precs)],
                   left=("GEMM",), wrap=("GEMM", "calls/step"))
    shown = ""
    for it in items:
        base = item_ms(res, it, "BF16", mode)
        cells = {p: _item_cells(res, it, p, mode) for p in precs}
        shown += "".join(_marks(c) for c in cells.values())
        t.add_row(safe(it.name), f"{it.count:g}", *[_fmt(item_ms(res, it, p, mode), base, cells[p]) for p in precs])
    t.add_section()
    base = step_ms(res, items, "BF16", mode)
    totals, kept = [], {}
    for p in precs:
        ms = step_ms(res, items, p, mode, fallback="BF16")
        text = _fmt(ms, base, [r for it in items for r in _item_cells(res, it, p, mode)])
        if ms is not None and (fell := kept_in_bf16(res, items, p, mode)):
            text, kept[p] = text + FALLBACK_MARK, fell
        totals.append(text)
    t.add_row("[b]full step[/b]", "", *totals)
    t.caption, t.caption_justify = _caption(shown + (FALLBACK_MARK if kept else ""), _kept_line(kept),
                                            "; ".join(skipped_lines(res.skipped))), "left"
    return t


def kept_in_bf16(res: BenchResults, items: list[WorkItem], precision: str, mode: str) -> list[str]:
    """The items that failed in ``precision`` and ran in BF16: a step total counts them at their BF16 time."""
    return [] if precision == "BF16" else [f"{it.name} ({it.fprop.mkn})" for it, _ in
                                           fallback_items(res, items, precision, mode)]


def _kept_line(kept: dict[str, list[str]]) -> str:
    """Which GEMMs the marked totals hold at BF16 time, per recipe; recipes that kept the same ones once."""
    by: dict[tuple[str, ...], list[str]] = {}
    for p, names in kept.items():
        by.setdefault(tuple(names), []).append(p)
    return "; ".join(f"{FALLBACK_MARK} {', '.join(ps)}: {', '.join(names[:MAX_NAMED])}"
                     + (f" and {len(names) - MAX_NAMED} more" if len(names) > MAX_NAMED else "")
                     for names, ps in by.items())


def speedup_summary(res: BenchResults, items: list[WorkItem], mode: str) -> dict[str, float | None]:
    """The full step's GEMM speedup over BF16 per recipe, failed GEMMs at their BF16 time as the table's total."""
    base = step_ms(res, items, "BF16", mode)
    return {p: base / ms if base and (ms := step_ms(res, items, p, mode, fallback="BF16")) else None
            for p in res.precisions}


def swapped_items(items: list[WorkItem]) -> list[WorkItem]:
    """What TE's benchmark_gemm.py times for dgrad and wgrad: a forward GEMM of the pass's written sizes."""
    out = []
    for it in items:
        if it.m_splits or not it.runs_recipe:  # TE's tool times linear layers' passes only
            continue
        _, d, w = gemm_passes(it.fprop)
        out += [WorkItem(f"{it.name} dgrad-as-fprop", d.__class__(d.m, d.k, d.n)),
                WorkItem(f"{it.name} wgrad-as-fprop", w.__class__(w.m, w.k, w.n))]
    return out


def swapped_table(real: BenchResults, swapped: BenchResults, items: list[WorkItem], mode: str) -> Table:
    """Real backward GEMMs against the swapped-forward stand-in, per shape and precision."""
    cols = ("GEMM", "pass", "M x K x N", "precision", "real", "swapped fwd", "swapped/real")
    t = make_table(f"Real dgrad/wgrad vs. a forward GEMM with swapped sizes ({safe(mode)}), ms", cols, left=cols[:4])
    for it in items:
        if it.m_splits:
            continue
        for s in (s for s in passes_of(it) if s.op in (GemmOp.DGRAD, GemmOp.WGRAD)):
            fwd = s.__class__(s.m, s.k, s.n)
            for p in real.precisions:
                a, b = real.get(s, p, mode), swapped.get(fwd, p, mode)
                if a is None or b is None or not (a.ok and b.ok):
                    continue
                t.add_row(safe(it.name), str(s.op), s.mkn, safe(p), f"{a.median_ms:.3f}", f"{b.median_ms:.3f}",
                          f"{cast(float, b.median_ms) / cast(float, a.median_ms):.3f}")  # ok: both timed
    return t


def run_summary(res: BenchResults) -> str:
    """One line: how many cells, where, how long, and at what SM clock (at the power limit it moves)."""
    m = res.meta
    line = f"{len(res.results)} cells on {safe(m.get('device'))}, measured in {m.get('wall_s', 0):.1f} s"
    if len(m.get("visits_per_device") or []) > 1:
        line += (f" over {len(m['visits_per_device'])} devices (visits {'+'.join(map(str, m['visits_per_device']))}, "
                 "samples pooled)")
    for d, why in (m.get("failed_devices") or {}).items():
        line += f"; [red]GPU {safe(d)}'s worker failed ({safe(why)}): its visits are missing[/red]"
    if m.get("mixed_devices"):
        devices = ", ".join(map(str, dict.fromkeys(m["devices"])))
        line += f"; [yellow]{safe(devices)}: {safe(m['mixed_devices'])}[/yellow]"
    per_gpu = [c for c in m.get("clocks_per_device") or [] if c]
    if len(per_gpu) > 1:  # each GPU's own: two GPUs of one model can hold different clocks at one power limit
        clocks = " / ".join(f"{c['sm_clock_mhz_median']:.0f}" for c in per_gpu)
        gpus = " / ".join(str(i) for i in (m.get("device_indices") or range(len(per_gpu))))
        power = " / ".join(f"{c['power_w_median']:.0f}" for c in per_gpu)
        line += f"; SM clock median {clocks} MHz (GPU {gpus}), board power median {power} W (NVML)"
    elif ck := m.get("clocks_during_run"):
        line += (f"; SM clock median {ck['sm_clock_mhz_median']:.0f} MHz (min {ck['sm_clock_mhz_min']:.0f}), "
                 f"board power median {ck['power_w_median']:.0f} W (NVML)")
    if m.get("gemm_duty") is not None and m.get("backend") == "te":
        line += f"; timed GEMMs at {m['gemm_duty']:g} of the GPU's time (--gemm-duty)"
    heat = (m.get("timeline_s") or {}).get("heat")
    if heat and heat.get("holds"):
        line += (f"; {heat['heat_s']:.1f} s of dense load to keep every burst at the sustained clock "
                 f"({heat['idle_holds']} of {heat['holds']} holds found the GPU idle)")
    return line + _quality(res)


def _quality(res: BenchResults) -> str:
    """Where the cells came from and which to doubt (the marks the tables show)."""
    ok = [r for r in res.results if r.ok]
    cached = sum(r.cached for r in ok)
    again = sum(r.attempts > 1 and not (r.cached or r.noisy) for r in ok)
    noisy = [r for r in ok if r.noisy]
    refused = res.meta.get("cache_refused_noisy") or 0
    limit = 100 * (res.meta.get("spread_limit") or SPREAD_LIMIT)
    out = ""
    if cached:
        out += f"; {cached} of {len(res.results)} cells reused from the cache ({CACHED_MARK})"
    if refused:
        out += f"; {refused} cached cells refused (spread above {limit:.0f}%) and measured again"
    if again:
        out += f"; {again} cells measured again (their job had a spread above {limit:.0f}%), the quieter kept"
    if noisy:
        out += (f"; [bold red]{len(noisy)} noisy cells ({NOISY_MARK}): spread still above {limit:.0f}% after "
                f"{max(r.attempts for r in noisy)} measurements, not cached[/bold red]")
    return out
