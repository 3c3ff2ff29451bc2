"""The job's own step replayed in another recipe (or on another GPU): the predicted column.

The kernels step's GEMMs are scaled by their microbenchmarked ratio R / job recipe, and each TE module's
host and non-GEMM kernel difference (:mod:`te_gemm_callback.microbench.module_cost`) is added per pass. The
band replays the GEMM quartiles against module differences at 1 -+ MODULE_BAND, widened by the own recipe's miss.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from te_gemm_callback.analysis.replay import Call, Op, StepTrace, replay
from te_gemm_callback.capture.kernels import classify_kernel

# A recipe this GPU cannot run borrows the host side of the nearest one that runs.
NEAREST = {"MXFP8BlockScaling": "Float8BlockScaling", "NVFP4BlockScaling": "Float8BlockScaling"}
MODULE_BAND = 0.5  # module differences at (1 - x) and (1 + x) for the band
GEMM_RATIO_BAND = 0.05  # job vs bench GEMM ratios (docs/results/h200.md, facts the code relies on: GEMM ratio band)
CALIBRATE_BEYOND = 0.03  # the own replay's miss of the clean step that calibrates the host
BACKLOG_GAP_US = 3.0  # a gap between two kernels of one stream shorter than this: the GPU's own
MIN_GAPS = 20
_SHRINKABLE = ("quantization/cast", "other", "norm")  # kernels a recipe's quantization may be among


def step_trace(cap: Any, call_tax_us: float = 0.0, op_tax_us: float = 0.0) -> StepTrace | None:
    """The kernels step of ``cap`` as a trace (None without host calls), less the recording's cost:
    ``call_tax_us`` per runtime call (CUPTI) and ``op_tax_us`` before each launch (the profiler)."""
    tl = cap.kernel_timeline
    if tl is None or not tl.calls:
        return None
    ops = [Op(dur=row[2], stream=row[3], name=tl.names[row[0]], category=classify_kernel(tl.names[row[0]]),
              gemm=row[4]) for row in tl.kernels]
    launch_costs = sorted(c[1] for c in tl.calls if c[2] == "launch")
    # A launch into a full queue waits inside the call, and a sync's record is its wait; the replay
    # makes both waits itself, so a call's own cost is capped at a typical launch's.
    typical = launch_costs[int(0.9 * (len(launch_costs) - 1))] if launch_costs else 0.0
    calls = []
    for j, (gap, cost, kind, rows) in enumerate(tl.calls):
        gap = 0.0 if j == 0 else max(gap - (op_tax_us if kind == "launch" else 0.0), 0.0)
        if kind.startswith("sync") or kind == "launch":
            cost = min(cost, typical)
        calls.append(Call(gap=gap, cost=max(cost - call_tax_us, 0.0), kind=kind, ops=[ops[i] for i in rows]))
    return StepTrace(calls, tail=0.0, latency=tl.latency_us or 5.0, kernel_gap=kernel_gap_us(tl.kernels))


def kernel_gap_us(kernels: list[list[Any]]) -> float:
    """The median gap under BACKLOG_GAP_US between back-to-back kernels of one stream; 0 under MIN_GAPS gaps."""
    rows = sorted(kernels, key=lambda r: (str(r[3]), r[1]))
    gaps = sorted(b[1] - (a[1] + a[2]) for a, b in zip(rows, rows[1:])
                  if a[3] == b[3] and 0.0 <= b[1] - (a[1] + a[2]) < BACKLOG_GAP_US)
    return gaps[len(gaps) // 2] if len(gaps) >= MIN_GAPS else 0.0


def host_scaled(trace: StepTrace, f: float) -> StepTrace:
    """``trace`` with every host time (gaps, call costs, tail) times ``f``."""
    return replace(trace, tail=trace.tail * f, calls=[replace(c, gap=c.gap * f, cost=c.cost * f) for c in trace.calls])


def calibrate_host(trace: StepTrace, clean_ms: float | None) -> float:
    """The factor on the host times that makes a host-bound replay missing the clean step by over
    CALIBRATE_BEYOND hit it, else 1 (docs/results/h200.md, facts the code relies on: recording taxes)."""
    own = replay(trace)
    if not clean_ms or own.bound != "host" or abs(own.step_ms / clean_ms - 1) <= CALIBRATE_BEYOND:
        return 1.0
    lo, hi = 0.2, 2.0
    for _ in range(25):
        mid = (lo + hi) / 2
        if replay(host_scaled(trace, mid)).step_ms > clean_ms:
            hi = mid
        else:
            lo = mid
    return (lo + hi) / 2


@dataclass
class RecipeReplay:
    """The replay's prediction for one recipe."""
    recipe: str
    step_ms: float
    low_ms: float
    high_ms: float
    bound: str  # "host" or "gpu"
    host_ms: float
    gpu_busy_ms: float
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"recipe": self.recipe, "step_ms": self.step_ms, "band_ms": [self.low_ms, self.high_ms],
                "bound": self.bound, "host_ms": self.host_ms, "gpu_busy_ms": self.gpu_busy_ms, "notes": self.notes}


def _gemm_ratio(cap: Any, bench: Any, recipe: str, base: str, q: str = "median_ms",
                source: Any = None, keep: frozenset[str] = frozenset()) -> dict[int, float]:
    """Per capture record index: its GEMM's ``q`` time in ``recipe`` on ``bench`` over its median in ``base``
    on ``source`` (default ``bench``); plain torch GEMMs run BF16 in every recipe, and so do ``keep``'s modules
    (a precision plan's)."""
    source = source if source is not None else bench
    mode = "prequantized" if "prequantized" in source.meta.get("modes", ["autocast"]) else "autocast"
    out = {}
    for j, r in enumerate(cap.records):
        splits = tuple(r.m_splits) if getattr(r, "m_splits", None) else None
        want, had = ("BF16" if r.module in keep else recipe, base) if r.source == "te" else ("BF16", "BF16")
        if want == had and bench is source:
            continue
        a, b = bench.get(r.shape, want, mode, splits), source.get(r.shape, had, mode, splits)
        ta = getattr(a, q, None) if a is not None and a.ok else None
        tb = getattr(b, "median_ms", None) if b is not None and b.ok else None
        if ta and tb:
            out[j] = ta / tb
    return out


def module_host(cap: Any, costs: dict[str, Any] | None, base: str) -> dict[str, float] | None:
    """The TE modules' host time per step in the job beside the module benchmark's in ``base``; reported only
    (docs/results/h200.md, facts the code relies on: module host time)."""
    host = (getattr(cap, "meta", None) or {}).get("module_host_us") or {}
    if not costs or not host:
        return None
    job, bench, n = 0.0, 0.0, 0
    for name, key in costs.get("modules", {}).items():
        mine, row = host.get(name) or {}, costs.get("kinds", {}).get(key, {}).get(base) or {}
        if "fwd" in mine and "bwd" in mine and "host_fwd_us" in row:
            job += mine["fwd"] + mine["bwd"]
            bench += row["host_fwd_us"] + row["host_bwd_us"]
            n += 1
    return {"modules": n, "job_ms": round(job / 1e3, 3), "bench_ms": round(bench / 1e3, 3)} if n else None


def _module_deltas(cap: Any, costs: dict[str, Any] | None, recipe: str, base: str,
                   keep: frozenset[str] = frozenset()) -> dict[str, dict[str, float]]:
    """{module: host_fwd, host_bwd, gpu_fwd, gpu_bwd (µs), kernels per pass}: ``recipe`` (BF16 for ``keep``'s
    modules) less ``base``."""
    if not costs:
        return {}
    out = {}
    for name, key in costs.get("modules", {}).items():
        mine = "BF16" if name in keep else recipe
        if mine == base:
            continue
        row = costs.get("kinds", {}).get(key, {})
        r, b = row.get(mine), row.get(base)
        if not r or not b or "error" in r or "error" in b:
            continue
        # The non-GEMM kernels' split between the passes is not measured: half each.
        gpu = (r["gpu_other_us"] - b["gpu_other_us"]) / 2
        kernels = (r.get("kernels", 0) - b.get("kernels", 0)) / 2
        out[name] = {"host_fwd": r["host_fwd_us"] - b["host_fwd_us"], "host_bwd": r["host_bwd_us"] - b["host_bwd_us"],
                     "gpu_fwd": gpu, "gpu_bwd": gpu, "kernels": kernels}
    return out


def transform(trace: StepTrace, cap: Any, ratio: dict[int, float], deltas: dict[str, dict[str, float]],
              scale: float = 1.0, other: float = 1.0) -> StepTrace:
    """``trace`` with GEMMs at ``ratio`` of their time, other kernels at ``other`` of theirs, and each module's
    pass differences (``deltas`` x ``scale``) before the pass's first GEMM launch; a saving is taken off the
    host gaps (or quantization kernels) since the last GEMM launch."""
    side_of: dict[str, str] = {}  # module -> the pass its last GEMM belonged to
    calls: list[Call] = []
    host_debt = 0.0  # host µs still to take off the gaps that follow
    gpu_debt: dict[Any, float] = {}  # stream -> non-GEMM kernel µs still to take off before its next GEMM
    for c in trace.calls:
        ops: list[Op] = []
        take = min(c.gap, host_debt)
        gap, host_debt = c.gap - take, host_debt - take
        for op in c.ops:
            if op.gemm is not None and op.gemm < len(cap.records):
                gpu_debt.pop(op.stream, None)
                rec = cap.records[op.gemm]
                side = "fwd" if rec.op == "fprop" else "bwd"
                d = deltas.get(rec.module)
                if d is not None and side_of.get(rec.module) != side:
                    host = scale * d[f"host_{side}"]
                    if host >= 0:
                        gap += host
                    else:
                        take = min(gap, -host)
                        gap -= take
                        host_debt += _take_host_before(calls, -host - take)
                    extra = scale * other * d[f"gpu_{side}"]
                    n = d.get("kernels", 0.0)
                    if extra > 0:
                        # One op for the extra kernels: each but this one also waits the queued-kernel gap.
                        extra += max(n - 1, 0.0) * trace.kernel_gap
                        ops.append(Op(extra, op.stream, "replay: module non-GEMM difference", "quantization/cast"))
                    elif extra < 0:
                        gpu_debt[op.stream] = _shrink_before(calls, op.stream, -extra, int(round(-n)))
                side_of[rec.module] = side
                op = replace(op, dur=op.dur * ratio.get(op.gemm, 1.0))
            else:
                if other != 1.0 and op.category != "gemm":
                    op = replace(op, dur=op.dur * other)
                if gpu_debt.get(op.stream, 0.0) > 0 and op.category in _SHRINKABLE:
                    cut = min(op.dur, gpu_debt[op.stream])
                    op = replace(op, dur=op.dur - cut)
                    gpu_debt[op.stream] -= cut
            ops.append(op)
        calls.append(replace(c, gap=gap, ops=ops))
    return replace(trace, calls=calls)


def _is_gemm(op: Op) -> bool:
    return op.gemm is not None or op.category == "gemm"


def _take_host_before(calls: list[Call], us: float) -> float:
    """Take ``us`` of host gap off the calls since the last GEMM launch; what could not be taken."""
    for i in range(len(calls) - 1, -1, -1):
        c = calls[i]
        if any(_is_gemm(op) for op in c.ops) or us <= 0:
            break
        cut = min(c.gap, us)
        calls[i] = replace(c, gap=c.gap - cut)
        us -= cut
    return us


def _shrink_before(calls: list[Call], stream: Any, us: float, drop: int = 0) -> float:
    """Take ``us`` off the quantization kernels on ``stream`` since the last GEMM, dropping up to ``drop`` of
    those it empties (fewer launches); what could not be taken."""
    for j in range(len(calls) - 1, -1, -1):
        c = calls[j]
        for i in range(len(c.ops) - 1, -1, -1):
            op = c.ops[i]
            if _is_gemm(op):
                return us
            if op.stream == stream and us > 0 and op.category in _SHRINKABLE:
                cut = min(op.dur, us)
                us -= cut
                if cut >= op.dur and drop > 0:
                    del c.ops[i]
                    drop -= 1
                else:
                    c.ops[i] = replace(op, dur=op.dur - cut)
    return us


def job_trace(cap: Any, costs: dict[str, Any] | None) -> tuple[StepTrace, dict[str, Any]] | None:
    """The host-calibrated trace every recipe is replayed from, and the own recipe's replay; None without calls."""
    call_tax = float((costs or {}).get("cupti_call_tax_us") or 0.0)
    op_tax = float((costs or {}).get("profiler_op_tax_us") or 0.0)
    trace, raw = step_trace(cap, call_tax, op_tax), step_trace(cap)
    if trace is None or raw is None:
        return None
    clean = cap.step_ms()
    first = replay(trace)
    f = calibrate_host(trace, clean)
    tl = cap.kernel_timeline
    own = {"clean_ms": clean, "kernels_step_ms": cap.steps[tl.step].ms if tl.step < len(cap.steps) else None,
           "replay_raw_ms": replay(raw).step_ms, "replay_ms": first.step_ms, "bound": first.bound,
           "host_ms": first.host_us / 1e3, "gpu_busy_ms": first.gpu_busy_us / 1e3, "calls": len(trace.calls),
           "cupti_call_tax_us": call_tax, "profiler_op_tax_us": op_tax, "host_scale": f,
           "taxes_measured": "cupti_call_tax_us" in (costs or {})}
    return (host_scaled(trace, f) if f != 1.0 else trace), own


def own_miss(own: dict[str, Any]) -> float:
    """How far the replay of the job's own recipe missed its clean step before the host was calibrated to it
    (``own``: :func:`job_trace`'s second half); 0 without a clean step."""
    clean, first = own.get("clean_ms"), own.get("replay_ms")
    return abs(first / clean - 1) if clean and first else 0.0


def replay_recipes(cap: Any, bench: Any, recipes: list[str], base: str, clean_ms: float | None,
                   costs: dict[str, Any] | None = None, *, source: Any = None, other: float = 1.0,
                   host_speed: float = 1.0, traced: Any = None, miss: float | None = None,
                   keep: frozenset[str] = frozenset()) -> dict[str, RecipeReplay]:
    """The replay's step per recipe; {} without a host trace. For another GPU: ``bench`` the projected cells,
    ``source`` the bench they came from, ``other`` the non-GEMM kernel factor, ``host_speed`` the other host's
    speed. ``traced``: :func:`job_trace` of ``cap`` where the caller has it. ``miss``: the band's share for the
    own recipe's miss where the caller takes another than the calibrated replay's (:func:`own_miss`). ``keep``: the
    modules a precision plan keeps in BF16 under every recipe."""
    got = (traced or job_trace(cap, costs)) if bench is not None else None
    if got is None:
        return {}
    trace, _ = got
    own = replay(trace)
    if miss is None:
        # The own recipe's miss of the job capture's clean step (else clean_ms): a band on every recipe.
        mine = cap.step_ms() if hasattr(cap, "step_ms") else None
        miss = abs(own.step_ms / ref_ms - 1) if (ref_ms := mine or clean_ms) else 0.0
    if host_speed != 1.0:
        trace = host_scaled(trace, 1 / host_speed)
    k = clean_ms / own.step_ms if clean_ms else 1.0  # anchored on the clean step: speedups do not move
    out: dict[str, RecipeReplay] = {}
    for recipe in recipes:
        if recipe not in set(bench.precisions) and recipe != base:
            continue
        notes = []
        host_recipe = recipe
        if costs and not any(recipe in row for row in costs.get("kinds", {}).values()) and recipe in NEAREST:
            host_recipe = NEAREST[recipe]
            notes.append(f"host and module costs of {host_recipe} (the measuring GPU cannot run {recipe})")
        if costs is None and recipe != base:
            notes.append("no module costs measured: host and quantization unchanged from the job's recipe")
        deltas = {m: {key: (v / host_speed if key.startswith("host") else v) for key, v in d.items()}
                  for m, d in _module_deltas(cap, costs, host_recipe, base, keep).items()}
        # The median, then the band's corners: GEMMs low or high against module differences low or high.
        cases = [(_gemm_ratio(cap, bench, recipe, base, "median_ms", source, keep), 1.0)]
        for q, f in (("q1_ms", 1 - GEMM_RATIO_BAND), ("q3_ms", 1 + GEMM_RATIO_BAND)):
            ratio = {j: v * f for j, v in _gemm_ratio(cap, bench, recipe, base, q, source, keep).items()}
            cases += [(ratio, 1 - MODULE_BAND), (ratio, 1 + MODULE_BAND)]
        steps = [replay(transform(trace, cap, ratio, deltas, sc, other)) for ratio, sc in cases]
        mid = steps[0]
        vals = sorted(x.step_ms * k for x in steps)
        out[recipe] = RecipeReplay(recipe, mid.step_ms * k, vals[0] * (1 - miss), vals[-1] * (1 + miss), mid.bound,
                                   mid.host_us / 1e3, mid.gpu_busy_us / 1e3, notes)
    return out
