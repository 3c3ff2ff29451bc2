"""The host cost of each captured TE module in each recipe, and the GPU time it adds beside its GEMMs:
what the replay (analysis.whatif) changes besides the GEMM kernels.

One module per kind and recipe is rebuilt and run on the captured input: first the GPU kernels of all
of them in one CUPTI session, then host time per kind in rounds over its recipes (so a drift of the
host's speed falls on all recipes alike).
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from typing import Any

from te_gemm_callback.capture.kernel_profile import kernel_records
from te_gemm_callback.capture.kernels import is_gemm_kernel, kernel_key
from te_gemm_callback.capture.module_specs import spec_key
from te_gemm_callback.precisions import autocast

MODULE_COST_SCHEMA = 7
# None: host passes run on the captured input, whose first calls the GPU rows have already paid; a
# number (a multiple of every FP8 recipe's block) cuts the input to that many tokens.
HOST_TOKENS: int | None = None
HOST_ROUNDS = 4  # rounds over a kind's recipes at least; a multiple of the recipes
HOST_PASSES = 2  # timed forward+backward passes per module in a round
# A module whose kernels outlast its launches this many times over hides its host time behind the GPU:
# one pass per round times it, so its kernels (the bench's wall time) run less often.
GPU_HEAVY = 2.0
GPU_ITERS = 2  # profiled passes on the captured input: kernel times vary far less than the host's
KEEP_GPU_BUSY = True  # host rounds timed behind a sleeping kernel (False: onto an idle GPU)
# Each round's sleeping kernel lasts this share of the last round's host time: busy, yet never still asleep.
BUSY_SHARE = 0.9
OPENER_SIZE = 128  # a multiple of every recipe's scaling block
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
        m, h, _ = g["fc1"]
        if "activation" in spec:
            kw["activation"] = spec["activation"]
        return te.LayerNormMLP(h, g["fc2"][1], **kw), m, h
    (m, k, n), = g.values()
    return getattr(te, cls)(k, n, **kw), m, k


def _opener(te: Any, torch: Any, dtype: Any) -> Any:
    """A small TE Linear's forward: the first module of an autocast, run before the measured passes."""
    lin = te.Linear(OPENER_SIZE, OPENER_SIZE, params_dtype=dtype, device="cuda")
    x = torch.randn(OPENER_SIZE, OPENER_SIZE, device="cuda", dtype=dtype)

    def forward() -> None:
        try:
            lin(x)  # with grad (its weight's): TE takes the first-module flag only where a backward may follow
        except Exception as err:  # the row says it was the opener, not the module measured
            raise RuntimeError(f"the autocast's opener (te.Linear {OPENER_SIZE}x{OPENER_SIZE}): {err}") from err

    return forward


def _error(err: Exception) -> dict[str, str]:
    return {"error": f"{type(err).__name__}: {str(err)[:200]}"}


class _Run:
    """One module in one recipe, with its inputs (host-timed and captured) and output gradients."""

    def __init__(self, mod: Any, recipe: str, x_host: Any, x_full: Any, opener: Any = None) -> None:
        self.mod, self.recipe, self.autocast, self.opener = mod, recipe, autocast, opener
        self.x = {"host": x_host, "full": x_full}
        self.grad: dict[str, Any] = {}

    def passes(self, n: int, which: str = "host", mark: Any = None) -> tuple[list[float], list[float]]:
        """Host µs of ``n`` forwards and backwards, in one autocast as a step enters it once; ``mark()`` runs
        inside it before the first pass and after the last."""
        x = self.x[which]
        key = "full" if x is self.x["full"] else which  # one gradient per input, made untimed on its first pass
        fwd, bwd = [], []
        with self.autocast(self.recipe):
            if self.opener is not None:
                # TE runs an autocast's amax reduction and scale update (DelayedScaling's buffers, which keep
                # every module that ever ran it) once per step, in its first module's backward and at its
                # exit: the opener is that first module and the exit comes after the last mark, so the
                # measured passes hold a module's own work only, as a job's later modules do.
                self.opener()
            if mark is not None:
                mark()
            for _ in range(n):
                t0 = time.perf_counter()
                y = self.mod(x)
                t1 = time.perf_counter()
                if key not in self.grad:
                    self.grad[key] = y.detach().clone().normal_()
                y.backward(self.grad[key])
                t2 = time.perf_counter()
                fwd.append((t1 - t0) * 1e6)
                bwd.append((t2 - t1) * 1e6)
            if mark is not None:
                mark()
        return fwd, bwd


def _cycles_per_s(torch: Any) -> float:
    """Cycles of ``torch.cuda._sleep`` per second on this GPU, timed once per process."""
    if not _CYCLES_PER_S:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        cycles = 20_000_000
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        _CYCLES_PER_S.append(cycles / max(start.elapsed_time(end) / 1e3, 1e-6))
    return _CYCLES_PER_S[0]


def _host_rows(runs: list[_Run], torch: Any, round_s: float, passes: list[int]) -> list[dict[str, float]]:
    """Median host µs of one forward and one backward per run, over rounds that visit every run
    (``passes[i]`` passes of run i); ``round_s`` is a guess of the first round's host time."""
    for run in runs:
        if run.x["host"] is not run.x["full"]:
            run.passes(2)  # a shape of its own: TE's first calls on it
    times: list[tuple[list[float], list[float]]] = [([], []) for _ in runs]
    for k in range(len(runs) * math.ceil(HOST_ROUNDS / max(len(runs), 1))):
        # An empty queue at each round's start: its launches never wait for room behind the last's.
        torch.cuda.synchronize()
        if KEEP_GPU_BUSY:  # one kernel holds the GPU: only the host's side of the passes is timed
            torch.cuda._sleep(max(int(round_s * BUSY_SHARE * _cycles_per_s(torch)), 1))
        t0 = time.perf_counter()
        # Each round starts at the next run, so every run takes every place after the sync equally often.
        for i in [(k + j) % len(runs) for j in range(len(runs))]:
            fwd, bwd = runs[i].passes(passes[i])
            times[i][0].extend(fwd)
            times[i][1].extend(bwd)
        round_s = time.perf_counter() - t0
    torch.cuda.synchronize()
    return [{"host_fwd_us": round(statistics.median(f), 2), "host_bwd_us": round(statistics.median(b), 2)}
            for f, b in times]


def _segments(records: list[tuple[Any, ...]], runs: int, after: int = 0) -> list[list[tuple[Any, ...]]]:
    """Each run's measured kernels in a profile laid out by _gpu_rows.

    Layout: a marker (the first kernel), then per run its warm-up, a marker, its measured passes, a
    marker; then ``after`` launches of the marker's kernel (the recording-tax calls). Any other count
    of markers is refused: cuts at the wrong markers would give runs each other's kernels."""
    recs = sorted(records, key=lambda r: r[1])
    if not recs:
        return []
    marker = recs[0][0]
    cuts = [i for i, r in enumerate(recs) if r[0] == marker]
    if len(cuts) != 2 * runs + 1 + after:
        raise RuntimeError(f"{len(cuts)} marker kernels in the profile for {runs} modules and {after} calls after")
    return [recs[cuts[i] + 1:cuts[i + 1]] for i in range(1, 2 * runs, 2)]


GpuRow = tuple[float, float, int, float, dict[str, list[float]]]


def _gpu_rows(runs: list[_Run], torch: Any, tax: _Tax | None) -> list[GpuRow]:
    """Per run, (GEMM kernel µs, other kernel µs, kernels, host µs while recorded, {kernel_key: [launches, µs]}
    of the other kernels) per forward+backward on the captured input, from one profiler session that ends
    with ``tax``'s recorded calls."""
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
    host: list[float] = []
    prof.__enter__()
    try:
        def mark() -> None:
            torch.cuda.synchronize()
            torch.cuda._sleep(1)

        torch.cuda._sleep(1)  # the marker: the first kernel of the profile
        for run in runs:
            run.passes(1, "full")  # first calls: TE's workspaces and quantizers, this module's
            fwd, bwd = run.passes(GPU_ITERS, "full", mark)
            host.append((sum(fwd) + sum(bwd)) / GPU_ITERS)
        after = 0
        if tax is not None:
            before = tax.recorded_sleeps
            tax.sample(True, 3)
            after = tax.recorded_sleeps - before  # the marker's kernel, launched by the tax's calls
        torch.cuda.synchronize()
    finally:
        prof.__exit__(None, None, None)
    rows = []
    for seg, host_us in zip(_segments(kernel_records(prof), len(runs), after), host):
        gemm = sum(e - s for name, s, e, *_ in seg if is_gemm_kernel(name))
        by_kernel: dict[str, list[float]] = {}  # kernel key: [launches, µs] per forward+backward
        for name, s, e, *_ in seg:
            if not is_gemm_kernel(name):
                n_us = by_kernel.setdefault(kernel_key(name), [0.0, 0.0])
                n_us[0] += 1 / GPU_ITERS
                n_us[1] += (e - s) / GPU_ITERS
        rows.append((gemm / GPU_ITERS, sum(us for _, us in by_kernel.values()), round(len(seg) / GPU_ITERS), host_us,
                     {k: [round(n, 2), round(us, 2)] for k, (n, us) in sorted(by_kernel.items())}))
    if len(rows) != len(runs):
        raise RuntimeError(f"{len(rows)} marked kernel segments for {len(runs)} modules")
    return rows


Todo = dict[str, tuple[dict[str, Any], list[str]]]  # kind key: (its spec, recipes to measure)


def _build_runs(todo: Todo, te: Any, torch: Any) -> tuple[list[tuple[str, _Run]], dict[str, dict[str, Any]]]:
    """The module of each (kind, recipe) of ``todo`` built with its captured-size input, and the
    errors of the cells that failed to build."""
    runs: list[tuple[str, _Run]] = []
    failed: dict[str, dict[str, Any]] = {key: {} for key in todo}
    openers: dict[tuple[str, Any], Any] = {}
    for key, (spec, recipes) in todo.items():
        dtype = getattr(torch, spec.get("dtype", "bfloat16"))
        for recipe in recipes:
            try:
                mod, m, k = _build(spec, te, dtype)
                x = torch.randn(m, k, device="cuda", dtype=dtype, requires_grad=True)
                x_host = x if HOST_TOKENS is None or m <= HOST_TOKENS else x[:HOST_TOKENS].detach().requires_grad_()
                if recipe != "BF16" and (recipe, dtype) not in openers:
                    openers[recipe, dtype] = _opener(te, torch, dtype)
                runs.append((key, _Run(mod, recipe, x_host, x, openers.get((recipe, dtype)))))
            except Exception as err:  # one cell's failure is its row's, never the bench's
                failed[key][recipe] = _error(err)
    return runs, failed


def _measure(todo: Todo, te: Any, torch: Any, phases: dict[str, float],
             tax: _Tax | None = None) -> dict[str, dict[str, Any]]:
    """{kind key: {recipe: {host_fwd_us, host_bwd_us, gpu_gemm_us, gpu_other_us, kernels, other_by_kernel} or
    {"error"}}}.

    GPU rows of every cell in one profiler session, then host rounds per kind (so a round's launches
    never wait for room in the launch queue); each phase's seconds are added to ``phases``. After a
    failure each kind is measured alone, then each recipe alone (the others' modules freed first), so
    only the failing cell's row is an error."""
    t0 = time.perf_counter()
    runs, rows = _build_runs(todo, te, torch)
    cells = sum(len(recipes) for _, recipes in todo.values())
    failed: dict[str, str] | None = None  # the error alone: its traceback would hold the modules
    if runs and len(runs) == cells:
        try:
            t1 = time.perf_counter()
            gpus = _gpu_rows([run for _, run in runs], torch, tax)
            t2 = time.perf_counter()
            for key in todo:
                mine = [i for i, (k, _) in enumerate(runs) if k == key]
                passes = [1 if gpus[i][0] + gpus[i][1] > GPU_HEAVY * gpus[i][3] else HOST_PASSES for i in mine]
                guess_s = sum(n * gpus[i][3] for n, i in zip(passes, mine)) / 1e6  # recorded: over the bare time
                hosts = _host_rows([runs[i][1] for i in mine], torch, guess_s, passes)
                for i, host_row in zip(mine, hosts):
                    gemm, other, n, _, by_kernel = gpus[i]
                    rows[key][runs[i][1].recipe] = {**host_row, "gpu_gemm_us": round(gemm, 2),
                                                    "gpu_other_us": round(other, 2), "kernels": n,
                                                    "other_by_kernel": by_kernel}
            for name, dt in (("build_s", t1 - t0), ("gpu_s", t2 - t1), ("host_s", time.perf_counter() - t2)):
                phases[name] = round(phases.get(name, 0.0) + dt, 3)
            return rows
        except Exception as err:
            failed = _error(err)
    if cells == 1:  # nothing left to split: the cell's own error
        if runs and failed is not None:
            rows[runs[0][0]][runs[0][1].recipe] = failed
        return rows
    runs.clear()  # every module of this attempt freed before they are built again apart
    gc.collect()
    torch.cuda.empty_cache()
    parts: list[Todo] = ([{key: part} for key, part in todo.items()] if len(todo) > 1 else
                         [{key: (spec, [r])} for key, (spec, recipes) in todo.items() for r in recipes])
    out: dict[str, dict[str, Any]] = {key: {} for key in todo}
    for part in parts:
        for key, got in _measure(part, te, torch, phases).items():
            out[key].update(got)
    return out


def _per_call_us(fn: Any, calls: int, torch: Any) -> float:
    """Host µs per call of ``calls`` back-to-back calls of ``fn``, from an empty queue."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    dt = (time.perf_counter() - t0) / calls * 1e6
    torch.cuda.synchronize()
    return dt


class _Tax:
    """The host µs a CUDA launch and a one-kernel ATen op cost more while torch.profiler records CUDA
    activity: medians of ``calls`` of each, taken outside and inside a session."""

    def __init__(self, torch: Any, calls: int = 500) -> None:
        x = torch.zeros(1, device="cuda")
        self.torch, self.calls = torch, calls
        self.fns = (lambda: torch.cuda._sleep(0), lambda: x.add_(1))
        self.bare: list[list[float]] = [[], []]
        self.rec: list[list[float]] = [[], []]
        self.recorded_sleeps = 0  # torch.cuda._sleep launches made while recorded

    def start(self) -> None:
        """First calls, then one bare sample, before a session records."""
        for fn in self.fns:
            _per_call_us(fn, self.calls, self.torch)
        self.sample(False)

    def sample(self, recorded: bool, times: int = 1) -> None:
        for _ in range(times):
            for i, fn in enumerate(self.fns):
                (self.rec if recorded else self.bare)[i].append(_per_call_us(fn, self.calls, self.torch))
            self.recorded_sleeps += self.calls if recorded else 0

    def result(self) -> dict[str, float] | None:
        if not all(self.rec) or not all(self.bare):
            return None
        call, op = (statistics.median(self.rec[i]) - statistics.median(self.bare[i]) for i in range(2))
        return {"cupti_call_tax_us": round(call, 3), "profiler_op_tax_us": round(op, 3)}


def _recording_tax(torch: Any, calls: int = 1000) -> dict[str, float] | None:
    """The recording taxes (:class:`_Tax`) from a profiler session of their own."""
    tax = _Tax(torch, calls)
    tax.start()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]):
        tax.sample(True, 3)
    tax.sample(False, 2)
    return tax.result()


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
    """{"schema", "kinds": {key: {recipe: row (_measure)}}, "modules": {name: key}, "cupti_call_tax_us",
    "profiler_op_tax_us", "wall_s", "phases_s", "cached"} for ``specs`` in each of ``recipes``; rows
    found in ``cache`` are not measured again, rows measured are stored there."""
    import torch

    from te_gemm_callback.precisions import import_te  # looked up at call time (tests stand in for it)

    cache = cache or CostCache()
    out: dict[str, Any] = {"schema": MODULE_COST_SCHEMA, "kinds": {}, "modules": {}, "host_tokens": HOST_TOKENS,
                           "iters": {"host_rounds": HOST_ROUNDS, "host_passes": HOST_PASSES, "gpu": GPU_ITERS,
                                     "gpu_heavy": GPU_HEAVY}, "phases_s": {}}
    t_start = time.perf_counter()
    kinds: dict[str, dict[str, Any]] = {}
    for name, spec in specs.items():
        key = spec_key(spec)
        out["modules"][name] = key
        kinds.setdefault(key, spec)
    rows = {key: {r: got for r in recipes if (got := cache.get(key, r)) is not None} for key in kinds}
    todo = {key: (spec, missing) for key, spec in kinds.items()
            if (missing := [r for r in recipes if r not in rows[key]])}
    tax_row = cache.get("recording-tax")
    if todo:
        te = import_te()  # only where something is measured: a cached bench needs no TE
        tax = None
        if tax_row is None:  # taken in the GPU rows' session: no profiler session of its own
            tax = _Tax(torch)
            tax.start()
        try:
            fresh = _measure(todo, te, torch, out["phases_s"], tax)
        except Exception as err:  # modules that cannot be rebuilt: their rows say why
            fresh = {key: {r: _error(err) for r in part[1]} for key, part in todo.items()}
        if tax is not None:
            tax.sample(False, 2)
            tax_row = tax.result()
        for key, got in fresh.items():
            for r, row in got.items():
                cache.put(row, key, r)
            rows[key].update(got)
    if tax_row is None:
        t0 = time.perf_counter()
        tax_row = _recording_tax(torch)
        assert tax_row is not None
        out["phases_s"]["tax_s"] = round(time.perf_counter() - t0, 3)
    cache.put(tax_row, "recording-tax")
    out["kinds"] = {key: {r: rows[key][r] for r in recipes} for key in kinds}
    out.update(tax_row)
    out["cached"] = cache.hits
    out["wall_s"] = round(time.perf_counter() - t_start, 2)
    return out
