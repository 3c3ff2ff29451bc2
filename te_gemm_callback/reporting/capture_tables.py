"""Tables of what a model runs (a config's GEMMs, a capture's, each rank's) and a capture's logger scalars."""

from __future__ import annotations

from typing import Any, cast

from rich.table import Table

from te_gemm_callback.capture.capture_file import GemmCapture, GemmRecord
from te_gemm_callback.capture.graphs import in_graphed
from te_gemm_callback.printable import safe
from te_gemm_callback.reporting.console import make_table
from te_gemm_callback.shapes import ConfigGemm, ModelConfig, gemm_passes

# The analysis loads torch: imported where used, so that `import te_gemm_callback.cli` does not.

SLOW_FACTOR = 10.0  # a GEMM this many times slower per FLOP than its neighbours' median is flagged
NEIGHBOUR_FLOPS = 4.0  # neighbours: GEMMs within this factor of its FLOPs
MIN_NEIGHBOURS = 3


def human_flops(x: float) -> str:
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.2f} {unit}"
    return f"{x:.0f} "


def ms_text(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def shapes_table(cfg: ModelConfig, gemms: list[ConfigGemm]) -> Table:
    """Per-layer GEMMs of a config (fprop, dgrad, wgrad), with FLOPs per layer and per model."""
    cols = ("GEMM", "pass", "M x K x N", "calls", "FLOPs/call", "FLOPs/model", "note")
    t = make_table(f"GEMMs per micro-batch: M = {cfg.micro_batch_size} x {cfg.sequence_length} tokens"
                   + (f", TP={cfg.tensor_parallel}" if cfg.tensor_parallel > 1 else ""), cols,
                   left=("GEMM", "pass", "M x K x N", "note"), wrap=("note",))
    layer_total = model_total = 0.0
    for g in gemms:
        for s in gemm_passes(g.fprop):
            total = s.flops * g.count(cfg)
            model_total += total
            layer_total += s.flops if g.per_layer else 0
            note = g.notes
            if g.m_splits:  # one grouped GEMM over all experts; M is the routed token count
                note = f"grouped: {len(g.m_splits)} experts x ~{g.m_splits[0]} tokens" + (f"; {note}" if note else "")
            first = s.op == "fprop"
            t.add_row(g.name if first else "", str(s.op), s.mkn, str(g.count(cfg)),
                      human_flops(s.flops), human_flops(total), note if first else "")
        t.add_section()
    t.caption = (f"per layer {human_flops(layer_total)}FLOP, full model ({cfg.num_hidden_layers} layers"
                 f"{' + lm_head' if cfg.vocab_size else ''}) {human_flops(model_total)}FLOP per micro-batch")
    return t


def _op_shape(r: GemmRecord, graphed: list[str]) -> tuple[str, str]:
    """A record's pass (recomputed, graphed) and shape (its groups) as the tables show them."""
    op = r.op + (" (recompute)" if r.recompute else "") + (" (graphed)" if in_graphed(r.module, graphed) else "")
    return op, r.shape.mkn + (f" [{len(r.m_splits[0])} groups]" if r.m_splits else "")


def capture_table(cap: GemmCapture, limit: int | None = None) -> Table:
    """One row per captured GEMM record."""
    timed = any(r.times_ms for r in cap.records)
    cols = ["module", "pass", "M x K x N", "precision", "calls/step", "GFLOP/step"]
    cols += ["ms/call (median)", "ms/step", "TFLOP/s"] if timed else []
    t = make_table(f"GEMMs captured on {safe(cap.meta.get('device', '?'))} ({len(cap.steps)} step(s))", cols,
                   left=cols[:4], wrap=("module",))
    graphed = cap.meta.get("graphed_modules") or []
    for r in cap.records[:limit]:
        op, shape = _op_shape(r, graphed)
        row = [safe(r.name), safe(op), shape, safe(r.precision), f"{r.calls_per_step:g}",
               f"{r.flops_per_step / 1e9:.3f}"]
        if timed:
            med = r.median_ms
            tflops = f"{r.flops / (med * 1e-3) / 1e12:.1f}" if med else "-"
            row += [ms_text(med), ms_text(r.ms_per_step), tflops]
        t.add_row(*row)
    if limit is not None and len(cap.records) > limit:
        t.add_row(f"... {len(cap.records) - limit} more", *[""] * (len(cols) - 1))
    from te_gemm_callback.analysis.notes import instrument_note
    share, note = capture_share(cap), instrument_note(cap)
    t.caption = safe(f"{human_flops(cap.flops_per_step)}FLOP of GEMMs per step" + (f"; {share}" if share else "")
                     + (f". {note}" if note else ""))
    return t


def capture_share(cap: GemmCapture) -> str | None:
    """The capture's GEMM time and share in words, on its clocks, never above 100% (analysis.checks.share_check)."""
    from te_gemm_callback.analysis.checks import share_check
    from te_gemm_callback.analysis.notes import GEMM_CLOCK_SHORT, STEP_CLOCK_WORDS
    gemm_ms, step_ms = cap.gemm_ms_per_step(), cap.step_ms()
    if gemm_ms is None or not step_ms:
        return None
    chk = share_check(cap, step_ms, gemm_ms)
    # A step time means a step clock: step_clock() is None only without one.
    clocks = f"GEMM: {GEMM_CLOCK_SHORT[chk['clock']]}, step: {STEP_CLOCK_WORDS[cast(str, cap.step_clock())]}"
    if chk["share"] is None:
        return f"GEMM time {gemm_ms:.2f} ms, GEMM share n/a ({chk['why']}; {clocks})"
    if chk["basis"] == "timed steps":
        kind = cap.step_kind()  # the steps the step time is of: clean ones where the window had them
        return (f"GEMM time {100 * chk['share']:.1f}% of the instrumented step it was timed in ({chk['of_ms']:.2f} ms; "
                f"a {step_ms:.2f} ms {kind} step; {clocks})")
    return f"GEMM time {gemm_ms:.2f} ms of a {step_ms:.2f} ms step ({100 * chk['share']:.1f}%, {clocks})"


def summary_metrics(cap: GemmCapture, prefix: str = "te_gemm/") -> dict[str, Any]:
    """Scalars for a logger (TensorBoard, CSV): what a training dashboard should show."""
    gemm_ms, step_ms = cap.gemm_ms_per_step(), cap.step_ms()
    out: dict[str, Any] = {"gemm_tflop_per_step": cap.flops_per_step / 1e12, "num_gemm_records": len(cap.records),
                           "step_ms": step_ms}
    if gemm_ms is not None and step_ms:
        from te_gemm_callback.analysis.checks import share_check
        # The share the report states; the GEMM time beside step_ms only where it is of the same steps.
        share = share_check(cap, step_ms, gemm_ms)
        out["gemm_share"] = share["share"]
        out["gemm_ms_per_step" if share.get("basis") == "step" else "gemm_ms_timed_steps"] = gemm_ms
    elif gemm_ms is not None:
        out["gemm_ms_timed_steps"] = gemm_ms
    return {prefix + k: v for k, v in out.items() if v is not None}


def ranks_table(rows: list[dict[str, Any]]) -> Table:
    """Per-rank step and GEMM time, communication (total and exposed), FLOPs, grouped-GEMM rows, errors."""
    cols = ("rank", "step ms", "vs median", "GEMM ms", "NCCL ms", "NCCL exposed ms", "GEMM TFLOP/step",
            "grouped rows/step", "error")
    window = next((r.get("comm_window") for r in rows if r.get("comm_window")), None) or "a profiled step"
    t = make_table("Per-rank capture (rank 0 gathered)", cols, left=("rank", "error"), wrap=cols,
                   caption=f"NCCL: kernel time of {window} (torch.profiler), including waits for other ranks; exposed "
                           "= not overlapped by any compute kernel. Grouped rows: rows of all grouped-GEMM forwards "
                           "(fc1 + fc2 count twice)")
    for r in rows:
        vs_median = "-" if r["step_vs_median"] is None else f"{r['step_vs_median']:.3f}"
        rows_per_step = "-" if r["grouped_rows_per_step"] is None else f"{r['grouped_rows_per_step']:.0f}"
        t.add_row(str(r["rank"]), ms_text(r["step_ms"]), vs_median, ms_text(r["gemm_ms"]), ms_text(r.get("comm_ms")),
                  ms_text(r.get("comm_exposed_ms")), f"{r['gemm_tflop_per_step']:.4f}", rows_per_step,
                  safe(r["error"] or ""))
    return t


def slower_than_neighbours(rec: Any, records: list[Any]) -> float | None:
    """How many times slower per FLOP ``rec`` ran than GEMMs of about its FLOPs, if above SLOW_FACTOR; else None."""
    if not rec.median_ms or not rec.flops:
        return None
    per = sorted(r.median_ms / r.flops for r in records if r is not rec and r.median_ms and r.flops
                 and rec.flops / NEIGHBOUR_FLOPS <= r.flops <= rec.flops * NEIGHBOUR_FLOPS)
    if len(per) < MIN_NEIGHBOURS:
        return None
    k = (rec.median_ms / rec.flops) / per[len(per) // 2]
    return k if k > SLOW_FACTOR else None


def top_gemm_rows(cap: GemmCapture, limit: int = 10) -> tuple[list[str], list[list[str]], int]:
    """The GEMMs with the most time per step (untimed: FLOPs) as text: (columns, rows, how many more)."""
    timed = any(r.times_ms for r in cap.records)
    total = sum(r.ms_per_step or 0.0 for r in cap.records)
    graphed = cap.meta.get("graphed_modules") or []
    ranked = sorted(cap.records, key=lambda r: -(r.ms_per_step or 0.0) if timed else -r.flops_per_step)
    rows = []
    for r in ranked[:limit]:
        ms = r.ms_per_step
        share = f"{100 * ms / total:.1f}%" if ms is not None and total > 0 else "-"
        slow = slower_than_neighbours(r, cap.records)
        if slow is not None:
            share += f" (slow: {slow:.0f}x the time per FLOP of GEMMs its size: a noisy timing?)"
        rows.append([r.name, *_op_shape(r, graphed), r.precision, ms_text(ms), share])
    cols = ["module", "pass", "M x K x N", "precision", "ms/step", "share of GEMM time"]
    return cols, rows, max(len(ranked) - limit, 0)
