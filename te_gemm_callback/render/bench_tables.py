"""Benchmark tables in the sections of TE's benchmarks/gemm/benchmark_gemm.py: per pass, per item totals,
full model, speedups."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from ..bench.cells import WorkItem
from ..bench.results import BenchResults, item_ms, step_ms
from ..shapes import GemmOp, gemm_passes

PASS_TITLES = {GemmOp.FPROP: "Fprop", GemmOp.DGRAD: "Dgrad", GemmOp.WGRAD: "Wgrad"}


def _fmt(ms: float | None, base: float | None, measured: bool = True) -> str:
    if ms is None:
        return "failed" if measured else "[dim]not measured[/dim]"
    sp = f" ({base / ms:.2f}x)" if base and ms else ""
    return f"{ms:.3f}{sp}"


def pass_table(res: BenchResults, items: list[WorkItem], op: GemmOp, mode: str) -> Table:
    precs = res.precisions
    t = Table(title=f"{PASS_TITLES[op]} GEMMs ({mode}): ms per call, speedup over BF16")
    t.add_column("GEMM")
    t.add_column("M x K x N", no_wrap=True)
    for p in precs:
        t.add_column(p, justify="right", no_wrap=True)
    t.add_column("spread (IQR/median)", justify="right")
    seen = set()
    for it in items:
        s = gemm_passes(it.fprop)[list(GemmOp).index(op)]
        if (s, it.m_splits) in seen:
            continue
        seen.add((s, it.m_splits))
        cells, spread = [], 0.0
        base = res.get(s, "BF16", mode, it.m_splits)
        base_ms = base.median_ms if base is not None and base.ok else None
        for p in precs:
            r = res.get(s, p, mode, it.m_splits)
            cells.append(_fmt(r.median_ms if r is not None and r.ok else None, base_ms, r is not None))
            if r is not None and r.ok and r.median_ms:
                spread = max(spread, (r.q3_ms - r.q1_ms) / r.median_ms)
        label = s.mkn + (f" [{len(it.m_splits)} groups]" if it.m_splits else "")
        t.add_row(it.name, label, *cells, f"{100 * spread:.1f}%")
    return t


def totals_table(res: BenchResults, items: list[WorkItem], mode: str) -> Table:
    """Per work item (fprop+dgrad+wgrad), then the whole step and the estimated GEMM speedup."""
    precs = res.precisions
    t = Table(title=f"GEMM time per item and per step ({mode}), ms")
    t.add_column("GEMM")
    t.add_column("calls/step", justify="right")
    for p in precs:
        t.add_column(p, justify="right", no_wrap=True)
    for it in items:
        base = item_ms(res, it, "BF16", mode)
        t.add_row(it.name, f"{it.count:g}", *[_fmt(item_ms(res, it, p, mode), base, _measured(res, it, p, mode))
                                               for p in precs])
    t.add_section()
    base = step_ms(res, items, "BF16", mode)
    t.add_row("[b]full step[/b]", "", *[_fmt(step_ms(res, items, p, mode), base,
                                             any(_measured(res, it, p, mode) for it in items)) for p in precs])
    if res.skipped:
        t.caption = escape("not run: " + "; ".join(f"{p}: {why}" for p, why in res.skipped.items()))
    return t


def _measured(res: BenchResults, it: WorkItem, precision: str, mode: str) -> bool:
    """Whether the bench holds any cell of this item (a bench of other shapes holds none)."""
    return any(res.get(s, precision, mode, it.m_splits) is not None for s in gemm_passes(it.fprop))


def speedup_summary(res: BenchResults, items: list[WorkItem], mode: str) -> dict[str, float | None]:
    base = step_ms(res, items, "BF16", mode)
    out = {}
    for p in res.precisions:
        ms = step_ms(res, items, p, mode)
        out[p] = base / ms if base and ms else None
    return out


def swapped_items(items: list[WorkItem]) -> list[WorkItem]:
    """What TE's benchmark_gemm.py times for dgrad and wgrad: a forward GEMM with the pass's
    written sizes (M x N x K for dgrad, K x M x N for wgrad)."""
    out = []
    for it in items:
        if it.m_splits:
            continue
        _, d, w = gemm_passes(it.fprop)
        out += [WorkItem(f"{it.name} dgrad-as-fprop", d.__class__(d.m, d.k, d.n)),
                WorkItem(f"{it.name} wgrad-as-fprop", w.__class__(w.m, w.k, w.n))]
    return out


def swapped_table(real: BenchResults, swapped: BenchResults, items: list[WorkItem], mode: str) -> Table:
    """Real backward GEMMs against the swapped-forward stand-in, per shape and precision."""
    t = Table(title=f"Real dgrad/wgrad vs. a forward GEMM with swapped sizes ({mode}), ms")
    for c in ("GEMM", "pass", "M x K x N", "precision", "real", "swapped fwd", "swapped/real"):
        t.add_column(c, justify="right" if c in ("real", "swapped fwd", "swapped/real") else "left", no_wrap=True)
    for it in items:
        if it.m_splits:
            continue
        for s in gemm_passes(it.fprop)[1:]:
            fwd = s.__class__(s.m, s.k, s.n)
            for p in real.precisions:
                a, b = real.get(s, p, mode), swapped.get(fwd, p, mode)
                if a is None or b is None or not (a.ok and b.ok):
                    continue
                t.add_row(it.name, str(s.op), s.mkn, p, f"{a.median_ms:.3f}", f"{b.median_ms:.3f}",
                          f"{b.median_ms / a.median_ms:.3f}")
    return t


def run_summary(res: BenchResults) -> str:
    """One line: how many cells, where, how long, and at what SM clock (the number a reader needs
    to compare runs: at the power limit the clock, and with it every time, moves by up to 25%)."""
    m = res.meta
    line = f"{len(res.results)} cells on {m.get('device')}, measured in {m.get('wall_s', 0):.1f} s"
    if len(m.get("visits_per_device") or []) > 1:
        line += (f" over {len(m['visits_per_device'])} devices (visits {'+'.join(map(str, m['visits_per_device']))}, "
                 "samples pooled)")
    for d, why in (m.get("failed_devices") or {}).items():
        line += f"; [red]GPU {d}'s worker failed ({escape(why)}): its visits are missing[/red]"
    if m.get("mixed_devices"):
        line += f"; [yellow]{escape(', '.join(dict.fromkeys(m['devices'])))}: {m['mixed_devices']}[/yellow]"
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
    return line
