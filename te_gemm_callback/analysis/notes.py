"""One-line notes a report prints beside its tables: clocks, GEMM duty and what the instruments cost."""

from __future__ import annotations

import statistics
from typing import cast

from te_gemm_callback.analysis.prediction import capture_recipe, observe
from te_gemm_callback.capture.capture_file import GemmCapture
from te_gemm_callback.microbench.results import BenchResults

STEP_CLOCK_WORDS = {"cuda_events": "CUDA events between step boundaries",
                    "host_clock": "host clock (time.perf_counter) between step boundaries"}
GEMM_CLOCK_WORDS = {
    "kernel_records": "kernel durations (torch.profiler kernel records of a kernels step)",
    "cuda_events": "CUDA-event pair per GEMM",
    "host_clock": "host clock (time.perf_counter) around each GEMM call of the instrumented steps (CPU)",
    None: "not timed",
}
GEMM_CLOCK_SHORT = {"kernel_records": "kernel records", "cuda_events": "CUDA events", "host_clock": "host clock",
                    None: "not timed"}
STEP_KIND_WORDS = {"clean": "median of clean steps (nothing attached)",
                   "settle": "median of settle steps (nothing attached; no clean step)",
                   "kernels": "median of kernels steps (kernel records on; no clean step)",
                   "instrumented": "median of instrumented steps (capture instruments on; no clean step)"}


def step_timing(cap: GemmCapture) -> str:
    """Which steps the step time is the median of, and on which clock."""
    kind = cap.step_kind()  # a step kind means a step clock
    return f"{STEP_KIND_WORDS[kind]}, {STEP_CLOCK_WORDS[cast(str, cap.step_clock())]}" if kind else "no step times"


def gemm_timing(cap: GemmCapture) -> str:
    text = GEMM_CLOCK_WORDS[cap.gemm_clock()]
    if owner := cap.meta.get("cupti_owner"):  # capture/cupti.py: why no kernel records
        text += f"; no kernel records: {owner} held CUPTI during the capture"
    return text


def clock_note(cap: GemmCapture, bench: BenchResults | None) -> str | None:
    """The job's SM clock against the microbenchmark's (NVML medians); a difference over 5% is called out
    (docs/results/h200.md, facts the code relies on: SM clock)."""
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


def duty_note(gemm_share: float | None, bench: BenchResults | None, run: str | None = None) -> str | None:
    """The microbenchmark's GEMM duty against the job's GEMM share; beyond 0.15 apart, how to bench at the
    job's share (docs/results/h200.md, facts the code relies on: GEMM duty). ``run``: the run the share is
    of, where it is not the job's own steps (its run in a sweep), so the note does not pass it off as those."""
    duty = bench.meta.get("gemm_duty") if bench is not None else None
    if duty is None or bench is None or bench.meta.get("backend") != "te" or not gemm_share:
        return None
    share = min(gemm_share, 1.0)
    whose = f"the GEMMs of {run} are {share:.2f} of that run's step" if run else \
        f"this job's GEMMs are {share:.2f} of its step"
    text = f"microbenchmark GEMMs ran at {duty:g} of the GPU's time (--gemm-duty); {whose}"
    if abs(share - duty) > 0.15:
        text += (f": under a power limit that moves the clock they run at; to bench at the job's share, "
                 f"te-gemm bench --capture gemm_capture.json --gemm-duty {max(share, 0.05):.2f} "
                 "--json bench.json in the run folder, then te-gemm report")
    return text


INSTRUMENT_WARN_PCT = 5.0  # instrumented steps this much slower than clean ones: a host-bound job
GPU_BUSY_HOST_BOUND = 0.5  # kernels for less than this share of a clean step: the GPU waits on the host
# A negative cost this close to zero is noise (docs/results/h200.md, facts the code relies on: instrument cost).
NOISE_FLOOR_PCT = 2.0
_COST_LABELS = (("instrumented", "instrumented steps"),
                ("dispatch", "the shape-discovery step (torch dispatch mode)"),
                ("kernels", "the kernels steps (kernel records on)"))


def clean_noise(cap: GemmCapture) -> tuple[int, float | None, float]:
    """(number of clean steps, half their range as a percent of their median or None under two, the noise
    a cost must exceed)."""
    clean = [s.ms for s in cap.steps_of("clean")]
    med = statistics.median(clean) if clean else 0.0
    spread = 100 * (max(clean) - min(clean)) / 2 / med if len(clean) >= 2 and med > 0 else None
    return len(clean), spread, max(spread or 0.0, NOISE_FLOOR_PCT)


def instrument_problem(cap: GemmCapture) -> str | None:
    """Why no instrument cost can be stated, or None: instrumented steps faster than the clean ones beyond
    their noise say the conditions moved, not that the instruments saved time."""
    cost = cap.instrument_cost()
    if cost is None:
        return None
    n, spread, noise = clean_noise(cap)
    faster = [label for key, label in _COST_LABELS if cost.get(f"{key}_pct", 0.0) < -noise]
    if not faster:
        return None
    why = [f"only {n} clean step{'s' * (n != 1)}"] if n < 3 else []
    if spread is not None and spread > NOISE_FLOOR_PCT:
        why.append(f"the clean steps vary ±{spread:.0f}%")
    if not why:
        why.append("the clean steps agree with each other, so the host's load or clock changed between them and the "
                   "instrumented steps")
    return (f"too noisy to state an instrument cost: {' and '.join(faster)} ran faster than the clean steps "
            f"({cost['clean_ms']:.2f} ms), which no instrument can cause; " + ", ".join(why)
            + " (more active steps, or a quieter host, settle it)")


def instrument_note(cap: GemmCapture) -> str | None:
    """What the capture instruments cost this job against clean steps; a large cost says it is host-bound."""
    cost = cap.instrument_cost()
    if cost is None:
        if cap.steps and not cap.steps_of("clean"):
            return ("no clean step was captured: the step time includes the capture instruments "
                    "(give the capture more active steps)")
        return None
    *_, noise = clean_noise(cap)
    parts = []
    for key, label in _COST_LABELS:
        if f"{key}_pct" not in cost:
            continue
        ms, pct = cost[f"{key}_ms"], cost[f"{key}_pct"]
        if pct >= 0:
            parts.append(f"{label} {ms:.2f} ms ({pct:+.1f}%)")
        elif pct >= -noise:
            parts.append(f"{label} {ms:.2f} ms ({pct:+.1f}%, within noise: no measurable cost)")
        else:
            parts.append(f"{label} {ms:.2f} ms (faster than the clean steps: no cost stated)")
    session = cap.meta.get("kernel_session_ms") or {}
    if "stop" in session:
        # Once per capture, between steps; its sync waits for queued kernels the job waits for anyway.
        sync = session.get("stop_sync")
        waited = f", {sync:.0f} ms of it waiting for the GPU's queued kernels" if sync is not None else ""
        parts.append(f"the kernel-records session: {session.get('start', 0.0):.0f} ms to start, "
                     f"{session['stop']:.0f} ms to stop and read{waited} (once, between steps)")
    text = f"step times from clean steps ({cost['clean_ms']:.2f} ms, nothing attached); " + ", ".join(parts)
    if problem := instrument_problem(cap):
        text += f"; {problem}"
    if (busy := _gpu_busy(cap, cost)) is not None:
        text += f"; the GPU ran kernels for {100 * busy:.0f}% of a clean step"
    if host_bound(cap):
        text += (": the job is host-bound (the host's Python and launch time, not the GPU, sets the step), so every "
                 "microsecond of host work shows in its step time")
    return text


def _gpu_busy(cap: GemmCapture, cost: dict[str, float]) -> float | None:
    """The share of a clean step the GPU ran kernels for, or None without kernel records."""
    kernel_ms = sum((cap.meta.get("kernel_breakdown_ms") or {}).values())
    return min(kernel_ms / cost["clean_ms"], 1.0) if kernel_ms else None


def host_bound(cap: GemmCapture) -> bool:
    """Whether the host, not the GPU, sets the job's pace: costly instruments, or a GPU mostly idle."""
    cost = cap.instrument_cost()
    if cost is None:
        return False
    busy = _gpu_busy(cap, cost)
    return cost.get("instrumented_pct", 0.0) > INSTRUMENT_WARN_PCT or (busy is not None and busy < GPU_BUSY_HOST_BOUND)


def framework_note(job: GemmCapture, sweep_base: GemmCapture, speedups: dict[str, float]) -> str | None:
    """The job's own step against the sweep's whole training step, and the observed ``speedups`` restated
    with the framework's time in every recipe's step."""
    if not str(sweep_base.meta.get("sweep_step", "")).startswith("whole") or not job.steps_of("clean"):
        return None
    job_ms, sweep_ms = cast(float, job.step_ms()), observe(sweep_base).step_ms  # a float: it has clean steps
    extra = job_ms - sweep_ms
    text = (f"the job's step {job_ms:.2f} ms (its clean steps, the framework included) against the sweep's whole "
            f"training step {sweep_ms:.2f} ms in the same recipe: {extra:+.2f} ms ({100 * extra / sweep_ms:+.1f}%)")
    own = speedups.get(capture_recipe(sweep_base), 1.0 if capture_recipe(sweep_base) == "BF16" else None)
    others = {r: v for r, v in speedups.items() if r != "BF16"}
    if extra <= 0:
        return text + ": no time outside the training step shows here"
    if own is None or not others:
        return text + " outside the training step (left out of the observed speedups)"
    bf16_ms = sweep_ms * own  # the BF16 step these speedups are over
    with_it = ", ".join(f"{r} {(bf16_ms + extra) / (bf16_ms / v + extra):.2f}x" for r, v in others.items())
    return (text + " outside the training step (left out of the observed speedups); with it in every recipe's "
            f"step: {with_it}")
