"""Field types and ranges of every file kind this tool reads (:func:`~te_gemm_callback.files.jsonio.check`)."""

from __future__ import annotations

import dataclasses
import functools

MAX_INT = 2**63 - 1  # what any consumer (numpy, torch, C) can hold
MAX_DIM = 2**40  # a GEMM dimension beyond this is not a GEMM any GPU runs; also keeps FLOPs finite


@dataclasses.dataclass(frozen=True)
class S:
    kind: str  # "int", "num", "str", "bool", "list", "dict", "any"
    least: float | None = None  # inclusive
    above: float | None = None  # exclusive
    most: float | None = None
    null: bool = False  # None allowed
    finite: bool = True  # "num": NaN / Infinity refused (False: left to a later, more specific check)
    choices: tuple = ()
    item: S | None = None  # list items, or every value of a dict
    fields: tuple = ()  # dict: (name, S) pairs checked when present
    required: tuple = ()  # dict: names that must be present


# Each takes S's keywords.
Int = functools.partial(S, "int", most=MAX_INT)
Num = functools.partial(S, "num")
Str = functools.partial(S, "str")
Bool = functools.partial(S, "bool")
ANY = S("any")


def List(item: S, null: bool = False) -> S:
    return S("list", item=item, null=null)


def Dict(fields: dict[str, S] | None = None, values: S | None = None, required: tuple = (), null: bool = False) -> S:
    return S("dict", fields=tuple((fields or {}).items()), item=values, required=required, null=null)


_STR_LIST = List(Str())
_MS = Num(least=0, null=True)

# A capture (capture/record.py). Types only where GemmCapture.validate checks the range: its messages stay.
CAPTURE_RECORD = Dict({
    "module": Str(), "gemm": Str(), "op": Str(), "m": Int(most=MAX_DIM), "k": Int(most=MAX_DIM),
    "n": Int(most=MAX_DIM), "batch": Int(most=MAX_DIM), "precision": Str(), "operands": _STR_LIST,
    "source": Str(), "kernel": Str(), "recompute": Bool(), "module_type": Str(), "calls": Num(finite=False),
    "calls_per_step": Num(finite=False), "flops": Num(least=0), "times_ms": List(Num(finite=False)),
    "m_splits": List(List(Int(least=0, most=MAX_DIM)))})
CAPTURE_STEP = Dict({
    "index": Int(), "wall_ms": Num(finite=False), "gpu_ms": Num(null=True, finite=False),
    "gemm_ms": Num(null=True, finite=False), "micro_batches": Int(least=1), "kind": Str(), "dispatch": Bool(),
    "round": Int(null=True), "fwd_bwd_ms": Num(least=0, null=True)})
_BY_NAME_MS = Dict(values=Num(least=0, null=True), null=True)
CAPTURE_META = Dict({
    "device": Str(null=True), "recipe": Str(null=True), "job_recipe": Str(null=True), "sweep": Bool(null=True),
    "timing": Str(null=True), "gemm_time_source": Str(null=True), "step_time": Str(null=True),
    "kernel_breakdown_ms": Dict(values=ANY, null=True), "comm_ms": Num(least=0, null=True),
    "comm_exposed_ms": Num(least=0, null=True), "kernel_session_ms": _BY_NAME_MS,
    "graphed_modules": List(Str(), null=True), "adapters": List(Str(), null=True), "rank": Int(null=True),
    "world_size": Int(least=1, null=True), "accumulate_grad_batches": Int(least=1, null=True),
    "sweep_rounds": Dict({"rounds": Int(least=0), "stopped": Str(), "min_rounds": Int(least=0),
                          "budget_s": Num(least=0), "target": Num(least=0)}, null=True),
    "sweep_step": Str(null=True), "warnings": List(Str(), null=True), "run_id": Str(null=True),
    "kernel_timeline_cut": Str(null=True), "cupti_owner": Str(null=True),
    # capture/results.py _event_pairs: CUDA-event pairs' lead, floor by device, pairs left out.
    "event_pairs": Dict({"lead": Str(null=True), "floor_us": Dict(values=Num(least=0)), "dropped": Int(least=0),
                         "below_floor": Int(least=0), "dispatch_steps_only": List(Str())}, null=True)}, null=True)
# capture_file.KernelTimeline, optional. Types only: the load checks the rest.
CAPTURE_TIMELINE = Dict({
    "step": Int(), "span_us": Num(finite=False), "names": List(Str()),
    "kernels": List(List(Num(null=True, finite=False))), "total": Int(),
    "calls": List(List(ANY), null=True), "latency_us": Num(null=True, finite=False)}, null=True)
CAPTURE_FILE = Dict({
    "records": List(CAPTURE_RECORD), "steps": List(CAPTURE_STEP), "meta": CAPTURE_META,
    "coverage": Dict({"never_ran": List(Str()), "not_watched": List(Str()), "error": Str(null=True)}, null=True),
    "kernel_timeline": CAPTURE_TIMELINE},
    required=("records", "steps"))

# shapes.PASS_NAMES, written out here since shapes imports this package.
PASS_NAMES = ("fprop", "dgrad", "wgrad", "dgrad_a", "dgrad_b")

# One bench cell (microbench/cells.py BenchResult), in bench.json and in the cache.
BENCH_RESULT = Dict({
    "m": Int(least=0, most=MAX_DIM), "k": Int(least=1, most=MAX_DIM), "n": Int(least=1, most=MAX_DIM),
    "batch": Int(least=1, most=MAX_DIM),
    "op": Str(choices=PASS_NAMES), "precision": Str(), "mode": Str(),
    "m_splits": List(Int(least=0, most=MAX_DIM), null=True), "median_ms": Num(above=0, null=True),
    "q1_ms": _MS, "q3_ms": _MS, "iters": Int(least=0), "tflops": _MS, "peak_fraction": _MS,
    "error": Str(null=True), "backend": Str(), "padded_m_splits": List(Int(least=0, most=MAX_DIM), null=True),
    "sm_clock_mhz": _MS, "conditions": Dict(), "attempts": Int(least=0), "noisy": Bool(), "cached": Bool()},
    required=("m", "k", "n", "op", "precision", "mode"))
BENCH_FILE = Dict({
    "results": List(BENCH_RESULT), "skipped": Dict(values=Str(), null=True),
    "meta": Dict({"modes": List(Str(choices=("autocast", "prequantized"))), "precisions": _STR_LIST,
                  "device": Str(null=True), "devices": List(Str(null=True)), "visits": Int(least=0, null=True),
                  "gemm_duty": Num(above=0, most=1, null=True), "peaks_tflops": Dict(values=Num(least=0, null=True)),
                  "wall_s": _MS, "spread_limit": _MS, "flush_l2": Bool(null=True), "backend": Str(null=True),
                  "timing": Str(null=True), "cache_refused_noisy": Int(least=0, null=True)}, null=True)},
    required=("results",))
CACHE_FILE = Dict({
    "timing_version": Int(), "results": Dict(values=Dict()),  # each entry: BENCH_RESULT, checked on use
    "peaks": Dict(values=Dict(values=Num(least=0, null=True))),
    "modules": Dict(values=Dict())})  # module cost rows: microbench/module_cost.py
PLAN_FILE = Dict({
    "recipe": Str(), "keep_bf16": _STR_LIST,
    "modules": List(Dict({"module": Str(), "bf16_ms": _MS, "fp8_ms": _MS, "keep_bf16": Bool()},
                         required=("module", "bf16_ms", "fp8_ms", "keep_bf16"))),
    "predicted_step_ms": Dict(values=Num(above=0)), "predicted_speedup": Dict(values=Num(above=0)),
    "gemm_ms": Dict(values=Num(least=0)), "meta": Dict()}, required=("recipe", "keep_bf16"))

SPECS: dict[str, S] = {"te-gemm-capture/1": CAPTURE_FILE, "te-gemm-bench/1": BENCH_FILE,
                       "te-gemm-cache/1": CACHE_FILE, "te-gemm-plan/1": PLAN_FILE,
                       "te-gemm-report/1": Dict(), "te-gemm-ranks/1": Dict({"ranks": List(Dict())})}
