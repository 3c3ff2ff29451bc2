"""Tables of what a model runs: the GEMMs of a config, a capture's GEMMs and its top ones, each
rank's summary, and the scalars a capture gives the job's logger."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from rich.table import Table

from te_gemm_callback.capture.capture_file import GemmCapture
from te_gemm_callback.capture.graphs import in_graphed
from te_gemm_callback.printable import safe
from te_gemm_callback.shapes import ConfigGemm, ModelConfig, gemm_passes

if TYPE_CHECKING:
    pass



def human_flops(x: float) -> str:
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.2f} {unit}"
    return f"{x:.0f} "

def ms_text(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"

def shapes_table(cfg: ModelConfig, gemms: list[ConfigGemm]) -> Table:
    """Per-layer GEMMs of a config (fprop, dgrad, wgrad), with FLOPs per layer and per model."""
    t = Table(title=f"GEMMs per micro-batch: M = {cfg.micro_batch_size} x {cfg.sequence_length} tokens"
                    + (f", TP={cfg.tensor_parallel}" if cfg.tensor_parallel > 1 else ""))
    for col in ("GEMM", "pass", "M x K x N", "calls", "FLOPs/call", "FLOPs/model", "note"):
        t.add_column(col, justify="right" if col.startswith(("FLOP", "calls")) else "left",
                     no_wrap=col != "note")
    layer_total = model_total = 0.0
    for g in gemms:
        for s in gemm_passes(g.fprop):
            total = s.flops * g.count(cfg)
            model_total += total
            layer_total += s.flops if g.per_layer else 0
            note = g.notes
            if g.m_splits:  # one grouped GEMM over all experts; M is the routed token count
                note = (f"grouped: {len(g.m_splits)} experts x ~{g.m_splits[0]} tokens"
                        + (f"; {note}" if note else ""))
            first = s.op == "fprop"
            t.add_row(g.name if first else "", str(s.op), s.mkn, str(g.count(cfg)),
                      human_flops(s.flops), human_flops(total), note if first else "")
        t.add_section()
    t.caption = (f"per layer {human_flops(layer_total)}FLOP, full model ({cfg.num_hidden_layers} layers"
                 f"{' + lm_head' if cfg.vocab_size else ''}) {human_flops(model_total)}FLOP per micro-batch")
    return t

def capture_table(cap: GemmCapture, limit: int | None = None) -> Table:
    """One row per captured GEMM record."""
    timed = any(r.times_ms for r in cap.records)
    # Every string from the capture is escaped: module names come from the user's model (or a file).
    t = Table(title=f"GEMMs captured on {safe(cap.meta.get('device', '?'))} ({len(cap.steps)} step(s))")
    cols = ["module", "pass", "M x K x N", "precision", "calls/step", "GFLOP/step"]
    if timed:
        cols += ["ms/call (median)", "ms/step", "TFLOP/s"]
    for c in cols:
        t.add_column(c, justify="left" if c in ("module", "pass", "M x K x N", "precision") else "right",
                     no_wrap=c != "module")
    rows = cap.records if limit is None else cap.records[:limit]
    graphed = cap.meta.get("graphed_modules") or []
    for r in rows:
        op = r.op + (" (recompute)" if r.recompute else "") + (" (graphed)" if in_graphed(r.module, graphed) else "")
        shape = r.shape.mkn + (f" [{len(r.m_splits[0])} groups]" if r.m_splits else "")
        row = [safe(r.name), safe(op), shape, safe(r.precision), f"{r.calls_per_step:g}",
               f"{r.flops_per_step / 1e9:.3f}"]
        if timed:
            med = r.median_ms
            tflops = r.flops / (med * 1e-3) / 1e12 if med else None
            row += [ms_text(med), ms_text(r.ms_per_step), "-" if tflops is None else f"{tflops:.1f}"]
        t.add_row(*row)
    if limit is not None and len(cap.records) > limit:
        t.add_row(f"... {len(cap.records) - limit} more", *[""] * (len(cols) - 1))
    caption = f"{human_flops(cap.flops_per_step)}FLOP of GEMMs per step"
    share = capture_share(cap)
    if share is not None:
        caption += f"; {share}"
    from te_gemm_callback.analysis.notes import instrument_note

    note = instrument_note(cap)
    t.caption = safe(caption + (f". {note}" if note else ""))
    return t

def capture_share(cap: GemmCapture) -> str | None:
    """The capture's GEMM time and share in words, on the clocks it was measured with (the host
    clock on a CPU), never a share above 100% (:func:`te_gemm_callback.analysis.checks.share_check`)."""
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
        return (f"GEMM time {100 * chk['share']:.1f}% of the instrumented step it was timed in ({chk['of_ms']:.2f} ms; "
                f"a {step_ms:.2f} ms clean step; {clocks})")
    return f"GEMM time {gemm_ms:.2f} ms of a {step_ms:.2f} ms step ({100 * chk['share']:.1f}%, {clocks})"

def summary_metrics(cap: GemmCapture, prefix: str = "te_gemm/") -> dict[str, Any]:
    """Scalars for a logger (TensorBoard, CSV): what a training dashboard should show."""
    out: dict[str, Any] = {
        f"{prefix}gemm_tflop_per_step": cap.flops_per_step / 1e12,
        f"{prefix}num_gemm_records": len(cap.records),
        f"{prefix}step_ms": cap.step_ms(),
    }
    gemm_ms, step_ms = cap.gemm_ms_per_step(), cap.step_ms()
    if gemm_ms is not None and step_ms:
        from te_gemm_callback.analysis.checks import share_check

        # The share the report states (within the timed steps on a CPU); none where refused. The
        # GEMM time goes beside step_ms only where it is of the same steps' basis (then never
        # above it); else under the name of what it is: the GEMMs' time in the steps they were
        # timed in (the instrumented or kernels step, another step than the clean ones).
        share = share_check(cap, step_ms, gemm_ms)
        out[f"{prefix}gemm_share"] = share["share"]
        out[f"{prefix}gemm_ms_per_step" if share.get("basis") == "step" else f"{prefix}gemm_ms_timed_steps"] = gemm_ms
    elif gemm_ms is not None:
        out[f"{prefix}gemm_ms_timed_steps"] = gemm_ms
    return {k: v for k, v in out.items() if v is not None}

def ranks_table(rows: list[dict[str, Any]]) -> Table:
    """Per-rank differences: step and GEMM time, communication (total and exposed), FLOPs,
    grouped-GEMM rows (MoE load), errors."""
    t = Table(title="Per-rank capture (rank 0 gathered)")
    cols = ("rank", "step ms", "vs median", "GEMM ms", "NCCL ms", "NCCL exposed ms", "GEMM TFLOP/step",
            "grouped rows/step", "error")
    for c in cols:
        t.add_column(c, justify="left" if c in ("rank", "error") else "right")
    for r in rows:
        vs_median = "-" if r["step_vs_median"] is None else f"{r['step_vs_median']:.3f}"
        rows_per_step = "-" if r["grouped_rows_per_step"] is None else f"{r['grouped_rows_per_step']:.0f}"
        t.add_row(str(r["rank"]), ms_text(r["step_ms"]), vs_median, ms_text(r["gemm_ms"]), ms_text(r.get("comm_ms")),
                  ms_text(r.get("comm_exposed_ms")), f"{r['gemm_tflop_per_step']:.4f}", rows_per_step,
                  safe(r["error"] or ""))
    window = next((r.get("comm_window") for r in rows if r.get("comm_window")), None) or "a profiled step"
    t.caption = (f"NCCL: kernel time of {window} (torch.profiler), including waits for other ranks; exposed = not "
                 "overlapped by any compute kernel. Grouped rows: rows of all grouped-GEMM forwards (fc1 + fc2 count "
                 "twice)")
    return t

SLOW_FACTOR = 10.0  # a GEMM this many times slower per FLOP than its neighbours' median is flagged

NEIGHBOUR_FLOPS = 4.0  # neighbours: GEMMs within this factor of its FLOPs

MIN_NEIGHBOURS = 3

def slower_than_neighbours(rec: Any, records: list[Any]) -> float | None:
    """How many times slower per FLOP ``rec`` ran than the median of GEMMs of about its size (FLOPs
    within NEIGHBOUR_FLOPS either way), where that is above SLOW_FACTOR: a cell a CPU's noise or a
    first call inflated leads a top-GEMM table otherwise unmarked. None where it is not, or with
    fewer than MIN_NEIGHBOURS neighbours."""
    if not rec.median_ms or not rec.flops:
        return None
    per = [r.median_ms / r.flops for r in records if r is not rec and r.median_ms and r.flops
           and rec.flops / NEIGHBOUR_FLOPS <= r.flops <= rec.flops * NEIGHBOUR_FLOPS]
    if len(per) < MIN_NEIGHBOURS:
        return None
    per.sort()
    k = (rec.median_ms / rec.flops) / per[len(per) // 2]
    return k if k > SLOW_FACTOR else None

def top_gemm_rows(cap: GemmCapture, limit: int = 10) -> tuple[list[str], list[list[str]], int]:
    """The capture's GEMMs that took the most time per step, as text: (columns, rows, how many more).
    The share is of the captured GEMM time per step; an untimed capture (no per-call times) is
    ordered by FLOPs, its times "-"."""
    timed = any(r.times_ms for r in cap.records)
    total = sum(r.ms_per_step or 0.0 for r in cap.records)
    graphed = cap.meta.get("graphed_modules") or []
    key = (lambda r: -(r.ms_per_step or 0.0)) if timed else (lambda r: -r.flops_per_step)
    ranked = sorted(cap.records, key=key)
    rows = []
    for r in ranked[:limit]:
        op = r.op + (" (recompute)" if r.recompute else "") + (" (graphed)" if in_graphed(r.module, graphed) else "")
        shape = r.shape.mkn + (f" [{len(r.m_splits[0])} groups]" if r.m_splits else "")
        ms = r.ms_per_step
        share = f"{100 * ms / total:.1f}%" if ms is not None and total > 0 else "-"
        slow = slower_than_neighbours(r, cap.records)
        if slow is not None:
            share += f" (slow: {slow:.0f}x the time per FLOP of GEMMs its size: a noisy timing?)"
        rows.append([r.name, op, shape, r.precision, ms_text(ms), share])
    cols = ["module", "pass", "M x K x N", "precision", "ms/step", "share of GEMM time"]
    return cols, rows, max(len(ranked) - limit, 0)
