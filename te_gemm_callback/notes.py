"""One-line notes a report prints beside its tables: the clock the job ran at against the
microbenchmark's, the GPU share the microbenchmark gave its GEMMs against the job's, and what the
capture's own instruments cost the job. Pure: they read captures and bench results."""

from __future__ import annotations

from .bench.results import BenchResults
from .capture.record import GemmCapture


def clock_note(cap: GemmCapture, bench: BenchResults | None) -> str | None:
    """The SM clock the job's captured steps ran at against the microbenchmark's (NVML medians).
    GEMM times scale with it: on the H200 a bench at the idle boost clock read 5-15% fast against
    training (docs/results/h200.md), so a difference over 5% is called out."""
    job = cap.meta.get("clocks_during_capture")
    ran = bench.meta.get("clocks_during_run") if bench is not None else None
    if not job or not ran:
        return None
    j, b = job["sm_clock_mhz_median"], ran["sm_clock_mhz_median"]
    text = f"SM clock median: job {j:.0f} MHz over the captured steps, microbenchmark {b:.0f} MHz"
    if abs(b / j - 1) > 0.05:
        text += (f" ({100 * (b / j - 1):+.0f}%): the microbenchmark's absolute GEMM times are off by about as much; "
                 "its speedups between recipes much less")
    return text


def duty_note(gemm_share: float | None, bench: BenchResults | None) -> str | None:
    """The share of GPU time the microbenchmark gave its GEMMs against this job's GEMM share of the
    step (``Report.gemm_share``: the report's baseline run, the figure its table shows). Under a
    power limit it sets the clock: on the H200 the CodonFM-layer stack's GEMMs were 0.81 of a BF16 step and
    0.63-0.68 of an FP8 one, and the default 0.75 put all 48 GEMMs within 5-8% of their in-job time,
    where back-to-back GEMMs read 8-12% slow (docs/results/h200.md). Beyond 0.15 apart the
    user is told how to bench at the job's own share."""
    duty = bench.meta.get("gemm_duty") if bench is not None else None
    if duty is None or bench.meta.get("backend") != "te" or not gemm_share:
        return None
    share = min(gemm_share, 1.0)
    text = (f"microbenchmark GEMMs ran at {duty:g} of the GPU's time (--gemm-duty); this job's GEMMs are "
            f"{share:.2f} of its step")
    if abs(share - duty) > 0.15:
        text += (f": under a power limit that moves the clock they run at; to bench at the job's share, "
                 f"te-gemm bench --capture gemm_capture.json --gemm-duty {max(share, 0.05):.2f} "
                 "--json bench.json in the run folder, then te-gemm report")
    return text


INSTRUMENT_WARN_PCT = 5.0  # instrumented steps this much slower than clean ones: a host-bound job
GPU_BUSY_HOST_BOUND = 0.5  # kernels for less than this share of a clean step: the GPU waits on the host


def instrument_note(cap: GemmCapture) -> str | None:
    """What the capture instruments cost this job: instrumented against clean step time. Step
    times, shares and verdicts come from the clean steps either way; a large cost says the job is
    host-bound (the host, not the GPU, sets its pace)."""
    cost = cap.instrument_cost()
    if cost is None:
        if cap.steps and not cap.steps_of("clean"):
            return ("no clean step was captured: the step time includes the capture instruments "
                    "(give the capture more active steps)")
        return None
    parts = []
    if "instrumented_pct" in cost:
        parts.append(f"instrumented steps {cost['instrumented_ms']:.2f} ms ({cost['instrumented_pct']:+.1f}%)")
    if "dispatch_pct" in cost:
        parts.append(f"the shape-discovery step (torch dispatch mode) {cost['dispatch_ms']:.2f} ms "
                     f"({cost['dispatch_pct']:+.1f}%)")
    if "kernels_pct" in cost:  # CUPTI's per-launch cost: a host-bound job shows it (+15-22% on the H200)
        parts.append(f"the kernels steps (kernel records on) {cost['kernels_ms']:.2f} ms ({cost['kernels_pct']:+.1f}%)")
    session = cap.meta.get("kernel_session_ms") or {}
    if "stop" in session:
        # Between steps, so in no step's time, but the job waits for it once per capture.
        # The stop's sync waits for kernels the host had queued ahead: the job would wait for
        # them anyway, so that part is said apart from the records' read.
        sync = session.get("stop_sync")
        waited = f", {sync:.0f} ms of it waiting for the GPU's queued kernels" if sync is not None else ""
        parts.append(f"the kernel-records session: {session.get('start', 0.0):.0f} ms to start, "
                     f"{session['stop']:.0f} ms to stop and read{waited} (once, between steps)")
    text = f"step times from clean steps ({cost['clean_ms']:.2f} ms, nothing attached); " + ", ".join(parts)
    # The kernels step says it without any instrument: the GPU ran kernels for this share of a
    # clean step (per-category kernel time summed; overlapping streams can only raise it).
    kernel_ms = sum((cap.meta.get("kernel_breakdown_ms") or {}).values())
    busy = min(kernel_ms / cost["clean_ms"], 1.0) if kernel_ms else None
    if busy is not None:
        text += f"; the GPU ran kernels for {100 * busy:.0f}% of a clean step"
    if cost.get("instrumented_pct", 0.0) > INSTRUMENT_WARN_PCT or (busy is not None and busy < GPU_BUSY_HOST_BOUND):
        text += (": the job is host-bound (the host's Python and launch time, not the GPU, sets the step), so every "
                 "microsecond of host work shows in its step time")
    return text
