"""The host's cost of each captured TE module in each recipe, and the GPU time it adds beside its
GEMMs: what the replay (te_gemm_callback.analysis.whatif) changes besides the GEMM kernels.

Per module kind (:func:`~te_gemm_callback.capture.module_specs.spec_key`) and recipe, one module
is rebuilt with the captured class, features and GEMM shapes and run forward and backward:

- host: the time each pass keeps the host, measured while the GPU is held busy by one long
  kernel queued first, so that no launch waits for the GPU and only the launch side is timed;
- GPU: the module's kernels per iteration from CUPTI's records, split into GEMM kernels and the
  rest (quantization, amax, casts, norms, activations).

Also the host's extra cost per CUDA call and per ATen op while torch.profiler records CUDA
activity (``cupti_call_tax_us``, ``profiler_op_tax_us``): the kernels step, where the replay's
trace comes from, ran with it, the job's clean steps not.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from te_gemm_callback.capture.kernels import is_gemm_kernel
from te_gemm_callback.capture.module_specs import spec_key

MODULE_COST_SCHEMA = 1
ITERS = 12  # timed forward+backward passes per module and recipe
# A busy kernel long enough to cover every timed pass's host time (cycles of the SM clock, ~50 ms
# at 2 GHz); the passes queue behind it, so the host never waits for the GPU while timed.
HOLD_CYCLES = 100_000_000


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


def _host_us(run: Any, torch: Any) -> tuple[float, float]:
    """Median host µs of one forward and of one backward, with the GPU held busy."""
    fwd, bwd = [], []
    torch.cuda.synchronize()
    torch.cuda._sleep(HOLD_CYCLES)
    # One autocast around every pass, as a training step enters it once around its forward: TE's
    # recipe state (DelayedScaling's amax reduction, scale update) runs at its exit, once a step,
    # not once a module.
    with run.autocast():
        for _ in range(ITERS):
            t0 = time.perf_counter()
            y = run.mod(run.x)
            t1 = time.perf_counter()
            run.backward(y)
            t2 = time.perf_counter()
            fwd.append((t1 - t0) * 1e6)
            bwd.append((t2 - t1) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(fwd), statistics.median(bwd)


def _gpu_us(run: Any, torch: Any) -> tuple[float, float, int]:
    """(GEMM kernel µs, other kernel µs, kernels) per forward+backward, from CUPTI's records."""
    from te_gemm_callback.capture.kernel_profile import kernel_records

    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
    prof.__enter__()
    try:
        with run.autocast():  # once around the passes, as in _host_us
            for _ in range(ITERS):
                run.backward(run.mod(run.x))
        torch.cuda.synchronize()
    finally:
        prof.__exit__(None, None, None)
    gemm = other = 0.0
    n = 0
    for name, s, e, *_ in kernel_records(prof):
        n += 1
        if is_gemm_kernel(name):
            gemm += e - s
        else:
            other += e - s
    return gemm / ITERS, other / ITERS, round(n / ITERS)


class _Run:
    def __init__(self, mod: Any, x: Any, autocast: Any) -> None:
        self.mod, self.x, self.autocast = mod, x, autocast

    def forward(self) -> Any:
        with self.autocast():
            return self.mod(self.x)

    def backward(self, y: Any) -> None:
        y.backward(self.grad if hasattr(self, "grad") else None)


def recording_tax_us(torch: Any, calls: int = 2000) -> tuple[float, float]:
    """Host µs more that a bare CUDA launch, and an ATen op that launches one kernel, cost while
    torch.profiler records CUDA activity (a kernels step) than without it: medians over three
    alternations of ``calls`` of each (``torch.cuda._sleep(0)``; an in-place add on one element).
    The op pays the launch's tax and the profiler's per-op callback."""
    x = torch.zeros(1, device="cuda")

    def per_call(recording: bool, fn: Any) -> float:
        prof = None
        if recording:
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
            prof.__enter__()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        dt = (time.perf_counter() - t0) / calls * 1e6
        torch.cuda.synchronize()
        if prof is not None:
            prof.__exit__(None, None, None)
        return dt

    def tax(fn: Any) -> float:
        return statistics.median(per_call(True, fn) - per_call(False, fn) for _ in range(3))

    return tax(lambda: torch.cuda._sleep(0)), tax(lambda: x.add_(1))


def measure_module_costs(specs: dict[str, dict[str, Any]], recipes: list[str]) -> dict[str, Any]:
    """{"schema", "cupti_call_tax_us", "kinds": {key: {recipe: {host_fwd_us, host_bwd_us, gpu_gemm_us,
    gpu_other_us, kernels} or {"error"}}}, "modules": {name: key}} for the modules of ``specs``
    (:func:`~te_gemm_callback.capture.module_specs.module_specs`) in each runnable ``recipes``."""
    import torch

    from te_gemm_callback.precisions import autocast, import_te

    te = import_te()
    out: dict[str, Any] = {"schema": MODULE_COST_SCHEMA, "kinds": {}, "modules": {}, "iters": ITERS}
    t_start = time.perf_counter()
    kinds: dict[str, dict[str, Any]] = {}
    for name, spec in specs.items():
        key = spec_key(spec)
        out["modules"][name] = key
        kinds.setdefault(key, spec)
    for key, spec in kinds.items():
        row: dict[str, Any] = {}
        for recipe in recipes:
            try:
                mod, m, k = _build(spec, te, getattr(torch, spec.get("dtype", "bfloat16")))
                x = torch.randn(m, k, device="cuda", dtype=getattr(torch, spec.get("dtype", "bfloat16")),
                                requires_grad=True)
                run = _Run(mod, x, lambda r=recipe: autocast(r))
                y = run.forward()
                run.grad = torch.randn_like(y)
                with run.autocast():  # warm-up: TE's first calls build workspaces and quantizers
                    for _ in range(3):
                        run.backward(run.mod(run.x))
                fwd, bwd = _host_us(run, torch)
                gemm, other, n = _gpu_us(run, torch)
                row[recipe] = {"host_fwd_us": round(fwd, 2), "host_bwd_us": round(bwd, 2),
                               "gpu_gemm_us": round(gemm, 2), "gpu_other_us": round(other, 2), "kernels": n}
                del mod, x, run, y
            except Exception as err:  # one cell's failure is its row's, never the bench's
                row[recipe] = {"error": f"{type(err).__name__}: {str(err)[:200]}"}
        out["kinds"][key] = row
    call, op = recording_tax_us(torch)
    out["cupti_call_tax_us"], out["profiler_op_tax_us"] = round(call, 3), round(op, 3)
    out["wall_s"] = round(time.perf_counter() - t_start, 2)
    return out
