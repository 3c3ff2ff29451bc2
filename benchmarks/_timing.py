"""What the benchmark scripts share: step timing, the bootstrap interval they quote, and the jobs
more than one of them times (the host-bound TE stack, the CPU stand-in for TE, the CodonFM-layer
stack under torch.profiler). The only module one benchmark script imports from another."""

from __future__ import annotations

import statistics
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from te_gemm_callback.capture.instruments import boundary_times
from te_gemm_callback.recipes.models import DemoConfig

# The host-bound stack: 12 te.TransformerLayer, hidden 1024; the GPU works a few ms of a 40-75 ms
# step on the H200, so every microsecond of host work shows in the step time.
HOSTBOUND = DemoConfig(hidden_size=1024, intermediate_size=4096, num_attention_heads=16, num_key_value_heads=16,
                       num_hidden_layers=12, vocab_size=128, sequence_length=256, micro_batch_size=2,
                       gated_mlp=False, normalization="LayerNorm")


def event_times(step: Callable[[], Any], n: int) -> list[float]:
    """GPU ms of each of ``n`` back-to-back calls of ``step``: a CUDA event at every boundary and no
    sync inside the block (what the profiler's step boundaries read); one sync after the last.
    Without CUDA, the host clock at the same boundaries."""
    return [gpu if gpu is not None else host for host, gpu in boundary_times(step, n)]


def med(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def median_ci(xs: list[float], level: float = 0.95, n: int = 4000, seed: int = 0) -> tuple[float, float, float]:
    """(median, low, high): the median of ``xs`` and a bootstrap percentile interval for it
    (Efron & Tibshirani, An Introduction to the Bootstrap, 1993, ch. 13), resampling the units
    given (windows, rounds): each already compares steps taken seconds apart, so the host's drift
    over a run does not enter the interval. Fixed seed: the same data gives the same interval."""
    import random

    if not xs:
        raise ValueError("median_ci needs at least one value")
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(n))
    tail = (1 - level) / 2
    return statistics.median(xs), meds[int(tail * n)], meds[min(n - 1, int((1 - tail) * n))]


def median_ratio_ci(num: list[float], den: list[float], level: float = 0.95, n: int = 4000,
                    seed: int = 0) -> tuple[float, float, float]:
    """(ratio, low, high): median(num) / median(den) and a bootstrap percentile interval for it,
    each sample resampled on its own (two groups of runs: each run is one unit). Fixed seed."""
    import random

    if not num or not den:
        raise ValueError("median_ratio_ci needs at least one value on each side")
    rng = random.Random(seed)
    ratios = sorted(statistics.median(rng.choices(num, k=len(num))) / statistics.median(rng.choices(den, k=len(den)))
                    for _ in range(n))
    tail = (1 - level) / 2
    lo, hi = ratios[int(tail * n)], ratios[min(n - 1, int((1 - tail) * n))]
    return statistics.median(num) / statistics.median(den), lo, hi


def hostbound_job(recipe: str) -> tuple[Any, Callable[[], None]]:
    """The host-bound stack in a plain loop with fused AdamW, warmed up: (model, train_step)."""
    import torch

    from te_gemm_callback.recipes.demo import DemoLM, next_token_loss

    torch.manual_seed(0)
    c = HOSTBOUND
    model = DemoLM(c, use_te=True, recipe=recipe).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    batch = torch.randint(0, c.vocab_size, (c.micro_batch_size, c.sequence_length + 1), device="cuda")

    def train_step() -> None:
        next_token_loss(model, batch).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(5):  # TE/cuBLAS initialisation and the FP8 amax history stay out
        train_step()
    torch.cuda.synchronize()
    return model, train_step


def stand_in_job(layers: int = 36) -> tuple[Any, Callable[[], None]]:
    """A CPU job with the TE stand-in of tests/capture/test_te_adapter_mock.py (TE's module layout and
    GEMM call conventions; Transformer Engine cannot be installed without a GPU): ``layers`` stand-in
    te.Linear of width 16 behind LayerNorms, all host work. (model, train_step)."""
    import torch
    from torch import nn

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "capture"))
    import test_te_adapter_mock as stand_in

    gemm = types.ModuleType("transformer_engine.pytorch.cpp_extensions.gemm")
    gemm.general_gemm, gemm.general_grouped_gemm = stand_in._general_gemm, stand_in._general_grouped_gemm
    linear = types.ModuleType("transformer_engine.pytorch.module.linear")
    linear.general_gemm = gemm.general_gemm
    for mod in (types.ModuleType("transformer_engine"), types.ModuleType("transformer_engine.pytorch"), gemm, linear):
        sys.modules[mod.__name__] = mod
    torch.set_num_threads(1)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin, self.norm = stand_in.make_linear(linear, 16, 16), nn.LayerNorm(16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.lin(self.norm(x))

    model = nn.Sequential(*[Block() for _ in range(layers)])
    x = torch.randn(4, 16, requires_grad=True)

    def train_step() -> None:
        model(x).sum().backward()

    return model, train_step


def profiled_steps(recipe: str, c: DemoConfig, steps: int, warmup: int = 3, bias: bool = True) -> tuple[Any, Any]:
    """(capture, torch.profiler trace) of ``steps`` training steps of the te.TransformerLayer stack,
    every step instrumented with a CUDA-event pair and a torch.profiler range per GEMM (no kernels
    step: its own torch.profiler session cannot run inside this one)."""
    import torch

    from te_gemm_callback import GemmProfiler
    from te_gemm_callback.capture.instruments import ProfilerRanges
    from te_gemm_callback.recipes.models import stack_input, te_stack, train_step_fn

    torch.manual_seed(0)
    model = te_stack(c, bias=bias)
    step = train_step_fn(model, stack_input(c), recipe)
    for _ in range(warmup):  # TE/cuBLAS initialisation and FP8 amax history stay out
        step()
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as tp:
        prof = GemmProfiler(model, instrumented_steps="all", dispatch_steps=0, kernel_steps=0, timing="events",
                            nvtx_backend=ProfilerRanges()).start()
        for _ in range(steps):
            step()
            prof.step()
        cap = prof.stop()
        torch.cuda.synchronize()
    del model
    torch.cuda.empty_cache()
    return cap, tp
