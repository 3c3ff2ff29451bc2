"""The host's cost of each captured TE module in each recipe, and the GPU time it adds beside its
GEMMs: what the replay (analysis.whatif) changes besides the GEMM kernels. Per module kind one
module per recipe is rebuilt and run on the captured input: host time in rounds over the recipes
(a drift of the host's speed falls on all alike), then GPU kernels from CUPTI.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from te_gemm_callback.capture.kernel_profile import kernel_records
from te_gemm_callback.capture.kernels import is_gemm_kernel
from te_gemm_callback.capture.module_specs import spec_key
from te_gemm_callback.precisions import autocast

MODULE_COST_SCHEMA = 3
# None: the host-timed passes run on the captured input, whose first calls (TE's workspaces, its
# torch.compile'd fusions) the job has already paid and the GPU rows then share; a number (a multiple of
# every FP8 recipe's block) cuts them to that many tokens, each new shape then paying its own.
HOST_TOKENS: int | None = None
HOST_ROUNDS = 3  # rounds over the recipes
HOST_PASSES = 2  # timed forward+backward passes per recipe in a round
GPU_ITERS = 2  # profiled passes on the captured input: kernel times vary far less than the host's
KEEP_GPU_BUSY = True  # host rounds timed behind a sleeping kernel (False: onto an idle GPU)
# Each round's sleeping kernel lasts this share of the last round's host time: busy, never still asleep.
BUSY_SHARE = 0.9
_CYCLES_PER_S: list[float] = []  # torch.cuda._sleep's cycles per second on this GPU, once measured


def _build(spec: dict[str, Any], te: Any, dtype: Any) -> tuple[Any, int, int]:
    """The TE module of ``spec`` on the GPU, and its input's (tokens, features)."""
    cls, g = spec["class"], spec["gemms"]
    kw: dict[str, Any] = {"params_dtype": dtype, "device": "cuda"}
    if "use_bias" in spec:
        kw["bias"] = bool(spec["use_bias"])
    if "normalization" in spec and cls != "Linear":
        kw["normalization"] = spec["normalization"]
    if cls == "LayerNormMLP":
        m, h, n1 = g["fc1"]
        ffn = g["fc2"][1]
        if "activation" in spec:
            kw["activation"] = spec["activation"]
        return te.LayerNormMLP(h, ffn, **kw), m, h
    (m, k, n), = g.values()
    return getattr(te, cls)(k, n, **kw), m, k


def _error(err: Exception) -> dict[str, str]:
    """A row that could not be measured, and why (one line, bounded)."""
    return {"error": f"{type(err).__name__}: {str(err)[:200]}"}


class _Run:
    """One module, its inputs (host-timed, captured) and output gradients, run in one recipe."""

    def __init__(self, mod: Any, recipe: str, x_host: Any, x_full: Any) -> None:
        self.mod, self.recipe, self.autocast = mod, recipe, autocast
        self.x = {"host": x_host, "full": x_full}
        self.grad: dict[str, Any] = {}

    def passes(self, n: int, which: str = "host") -> tuple[list[float], list[float]]:
        """Host µs of ``n`` forwards and backwards, in one autocast as a step enters it once."""
        x = self.x[which]
        fwd, bwd = [], []
        with self.autocast(self.recipe):
            for _ in range(n):
                t0 = time.perf_counter()
                y = self.mod(x)
                t1 = time.perf_counter()
                if which not in self.grad:
                    self.grad[which] = y.detach().clone().normal_()
                y.backward(self.grad[which])
                t2 = time.perf_counter()
                fwd.append((t1 - t0) * 1e6)
                bwd.append((t2 - t1) * 1e6)
        return fwd, bwd


def _cycles_per_s(torch: Any) -> float:
    """Cycles of ``torch.cuda._sleep`` per second on this GPU, from one timed sleep, once per process."""
    if not _CYCLES_PER_S:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        cycles = 20_000_000
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        _CYCLES_PER_S.append(cycles / max(start.elapsed_time(end) / 1e3, 1e-6))
    return _CYCLES_PER_S[0]


def _host_rows(runs: list[_Run], torch: Any) -> list[dict[str, float]]:
    """Median host µs of one forward and one backward per run, over rounds that visit every run."""
    for run in runs:
        run.passes(2)  # TE's first calls build workspaces and quantizers
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for run in runs:
        run.passes(1)
    # The first round's host time, guessed before the sync: the GPU's share of the pass is not the host's.
    round_s = (time.perf_counter() - t0) * HOST_PASSES
    times: list[tuple[list[float], list[float]]] = [([], []) for _ in runs]
    for _ in range(HOST_ROUNDS):
        # An empty queue at each round's start: a round's launches never wait for room behind the last's.
        torch.cuda.synchronize()
        if KEEP_GPU_BUSY:  # one kernel holds the GPU: only the host's side of the passes is timed
            torch.cuda._sleep(max(int(round_s * BUSY_SHARE * _cycles_per_s(torch)), 1))
        t0 = time.perf_counter()
        for run, (f, b) in zip(runs, times):
            fwd, bwd = run.passes(HOST_PASSES)
            f += fwd
            b += bwd
        round_s = time.perf_counter() - t0
    torch.cuda.synchronize()
    return [{"host_fwd_us": round(statistics.median(f), 2), "host_bwd_us": round(statistics.median(b), 2)}
            for f, b in times]


def _segments(records: list[tuple[Any, ...]]) -> list[list[tuple[Any, ...]]]:
    """Each run's measured kernels in a profile laid out by _gpu_rows: a marker (the first kernel),
    then per run its warm-up, a marker, its measured passes, a marker."""
    recs = sorted(records, key=lambda r: r[1])
    if not recs:
        return []
    marker = recs[0][0]
    cuts = [i for i, r in enumerate(recs) if r[0] == marker]
    return [recs[cuts[i] + 1:cuts[i + 1]] for i in range(1, len(cuts) - 1, 2)]


def _gpu_rows(runs: list[_Run], torch: Any) -> list[tuple[float, float, int]]:
    """(GEMM kernel µs, other kernel µs, kernels) per forward+backward on the captured input, per run."""
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
    prof.__enter__()
    try:
        torch.cuda._sleep(1)  # the marker: the first kernel of the profile
        for run in runs:
            run.passes(0 if run.x["host"] is run.x["full"] else 1, "full")  # the captured input's first pass
            torch.cuda.synchronize()
            torch.cuda._sleep(1)
            run.passes(GPU_ITERS, "full")
            torch.cuda.synchronize()
            torch.cuda._sleep(1)
        torch.cuda.synchronize()
    finally:
        prof.__exit__(None, None, None)
    rows = []
    for seg in _segments(kernel_records(prof)):
        gemm = sum(e - s for name, s, e, *_ in seg if is_gemm_kernel(name))
        other = sum(e - s for name, s, e, *_ in seg if not is_gemm_kernel(name))
        rows.append((gemm / GPU_ITERS, other / GPU_ITERS, round(len(seg) / GPU_ITERS)))
    if len(rows) != len(runs):
        raise RuntimeError(f"{len(rows)} marked kernel segments for {len(runs)} recipes")
    return rows


def _kind_row(spec: dict[str, Any], recipes: list[str], te: Any, torch: Any,
              phases: dict[str, float] | None = None) -> dict[str, Any]:
    """{recipe: {host_fwd_us, host_bwd_us, gpu_gemm_us, gpu_other_us, kernels} or {"error"}};
    seconds spent building, timing the host and profiling the GPU added to ``phases``."""
    phases = phases if phases is not None else {}
    t0 = time.perf_counter()
    dtype = getattr(torch, spec.get("dtype", "bfloat16"))
    row: dict[str, Any] = {}
    runs = []
    for recipe in recipes:
        try:
            mod, m, k = _build(spec, te, dtype)
            x = torch.randn(m, k, device="cuda", dtype=dtype, requires_grad=True)
            x_host = x if HOST_TOKENS is None or m <= HOST_TOKENS else x[:HOST_TOKENS].detach().requires_grad_()
            runs.append(_Run(mod, recipe, x_host, x))
        except Exception as err:  # one cell's failure is its row's, never the bench's
            row[recipe] = _error(err)
    if not runs:
        return row
    try:
        t1 = time.perf_counter()
        hosts = _host_rows(runs, torch)
        t2 = time.perf_counter()
        gpus = _gpu_rows(runs, torch)
        for key, dt in (("build_s", t1 - t0), ("host_s", t2 - t1), ("gpu_s", time.perf_counter() - t2)):
            phases[key] = round(phases.get(key, 0.0) + dt, 3)
        for run, host, (gemm, other, n) in zip(runs, hosts, gpus):
            row[run.recipe] = {**host, "gpu_gemm_us": round(gemm, 2), "gpu_other_us": round(other, 2), "kernels": n}
    except Exception as err:
        # A recipe that failed inside the rounds: each measured again alone, so the others keep theirs.
        if len(runs) == 1:
            row[runs[0].recipe] = _error(err)
        else:
            for run in runs:
                row.update(_kind_row(spec, [run.recipe], te, torch, phases))
    return {r: row[r] for r in recipes}


def recording_tax_us(torch: Any, calls: int = 1000) -> tuple[float, float]:
    """Host µs more that a bare CUDA launch and a one-kernel ATen op cost while torch.profiler records
    CUDA activity than without: medians over alternations of ``calls`` of each, the recorded ones
    under one profiler (starting one costs more than all the calls)."""
    x = torch.zeros(1, device="cuda")
    fns = (lambda: torch.cuda._sleep(0), lambda: x.add_(1))

    def per_call(fn: Any) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        dt = (time.perf_counter() - t0) / calls * 1e6
        torch.cuda.synchronize()
        return dt

    bare: list[list[float]] = [[], []]
    rec: list[list[float]] = [[], []]
    for i, fn in enumerate(fns):
        per_call(fn)  # first calls
        bare[i].append(per_call(fn))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]):
        for _ in range(3):
            for i, fn in enumerate(fns):
                rec[i].append(per_call(fn))
    for _ in range(2):
        for i, fn in enumerate(fns):
            bare[i].append(per_call(fn))
    call_tax, op_tax = (statistics.median(rec[i]) - statistics.median(bare[i]) for i in range(2))
    return call_tax, op_tax


class CostCache:
    """Measured rows kept between runs in the bench's ResultCache, keyed on the GPU, CPU, torch, TE."""

    def __init__(self, store: Any = None, where: str = "") -> None:
        self.store, self.where = store, where
        self.hits = 0

    def get(self, *parts: Any) -> Any:
        got = self.store.get_module(self._key(parts)) if self.store is not None else None
        self.hits += got is not None
        return got

    def put(self, row: Any, *parts: Any) -> None:
        if self.store is not None and not (isinstance(row, dict) and "error" in row):
            self.store.put_module(self._key(parts), row)

    def _key(self, parts: tuple[Any, ...]) -> str:
        return "|".join([self.where, f"module-cost {MODULE_COST_SCHEMA}", *map(str, parts)])


def measure_module_costs(specs: dict[str, dict[str, Any]], recipes: list[str],
                         cache: CostCache | None = None) -> dict[str, Any]:
    """{"schema", "kinds": {key: {recipe: row (_kind_row)}}, "modules": {name: key}, "cupti_call_tax_us",
    "profiler_op_tax_us", "wall_s", "phases_s", "cached"} for the modules of ``specs`` in each of
    ``recipes``; rows in ``cache`` are not measured again, rows measured are stored there."""
    import torch

    from te_gemm_callback.precisions import import_te  # looked up at call time (tests stand in for it)

    cache = cache or CostCache()
    te = None  # imported only where something is measured: a cached bench needs no TE
    out: dict[str, Any] = {"schema": MODULE_COST_SCHEMA, "kinds": {}, "modules": {}, "host_tokens": HOST_TOKENS,
                           "iters": {"host": HOST_ROUNDS * HOST_PASSES, "gpu": GPU_ITERS}, "phases_s": {}}
    t_start = time.perf_counter()
    kinds: dict[str, dict[str, Any]] = {}
    for name, spec in specs.items():
        key = spec_key(spec)
        out["modules"][name] = key
        kinds.setdefault(key, spec)
    for key, spec in kinds.items():
        row = {r: got for r in recipes if (got := cache.get(key, r)) is not None}
        todo = [r for r in recipes if r not in row]
        if todo:
            te = te or import_te()
            try:
                fresh = _kind_row(spec, todo, te, torch, out["phases_s"])
            except Exception as err:  # a module that cannot be rebuilt: its rows say why
                fresh = {r: _error(err) for r in todo}
            for r, got in fresh.items():
                cache.put(got, key, r)
            row.update(fresh)
        out["kinds"][key] = {r: row[r] for r in recipes}
    tax = cache.get("recording-tax")
    if tax is None:
        t0 = time.perf_counter()
        tax = dict(zip(("cupti_call_tax_us", "profiler_op_tax_us"), (round(v, 3) for v in recording_tax_us(torch))))
        cache.put(tax, "recording-tax")
        out["phases_s"]["tax_s"] = round(time.perf_counter() - t0, 3)
    out.update(tax)
    out["cached"] = cache.hits
    out["wall_s"] = round(time.perf_counter() - t_start, 2)
    return out
