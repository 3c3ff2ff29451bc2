"""Shared plumbing of the training recipes: flags, Trainer, callback, and the report at the end."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install

import pytorch_lightning as pl
import torch

from te_gemm_callback import GemmProfilerCallback
from te_gemm_callback.precisions import RECIPES, TEUnavailable, canonical, te_available
from te_gemm_callback.reporting.console import console
from te_gemm_callback.reporting.run import bench_and_report


def base_parser(description: str, te_layers: bool = True, strategies: tuple[str, ...] = ("ddp",)
                ) -> argparse.ArgumentParser:
    """The flags every recipe has; ``te_layers``: the recipe builds TE layers itself (``--no-te``);
    ``strategies``: the multi-device strategies its model supports (``--strategy``)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--tiny", action="store_true", help="a tiny configuration that runs on CPU in seconds")
    p.add_argument("--recipe", default="BF16", help="TE recipe the job trains in (BF16, DelayedScaling, ...)")
    p.add_argument("--steps", type=int, default=9, help="optimizer steps to train")
    p.add_argument("--sweep", default="all", help="recipes to sweep after capture: 'all', 'none', or a comma list")
    p.add_argument("--sweep-rounds", type=int, default=6,
                   help="the fewest alternating rounds of the swept recipes (the speedup is the median of their "
                        "ratios, with a 95%% interval from 6 rounds on; 0: no fewest, and with --sweep-budget 0 none)")
    p.add_argument("--sweep-budget", type=float, default=20.0, metavar="SECONDS",
                   help="more rounds until every observed speedup's interval is within +-2%%, for at most this long")
    p.add_argument("--sweep-plan", default=None, metavar="PLAN_JSON",
                   help="also sweep a precision plan (`te-gemm plan RUN_DIR` writes precision_plan.json)")
    p.add_argument("--no-bench", action="store_true", help="skip the microbenchmarks and report")
    p.add_argument("--out", default=None, help="output folder (default runs/<recipe name>)")
    p.add_argument("--nsys-capture", action="store_true",
                   help="cudaProfilerStart/Stop around the profiled steps, for nsys profile -c cudaProfilerApi "
                        "(docs/nsight-systems.md)")
    if te_layers:
        p.add_argument("--no-te", action="store_true", help="plain torch layers even where TE is installed")
    p.add_argument("--devices", type=int, default=1, help="GPUs (processes); rank 0 gathers every rank's "
                                                          "capture and writes the report")
    if len(strategies) > 1:
        p.add_argument("--strategy", choices=strategies, default="ddp",
                       help="with --devices > 1: ddp (Lightning DDP), fsdp (FSDP2 fully_shard under "
                            "ModelParallelStrategy), tp (TE tensor-parallel layers over all devices)")
    return p


def strategy(a: argparse.Namespace) -> Any:
    """The Lightning strategy for ``--strategy`` (None: one device)."""
    if a.devices <= 1:
        return None
    if getattr(a, "strategy", "ddp") == "ddp":
        return "ddp"
    from pytorch_lightning.strategies import ModelParallelStrategy

    tp = a.devices if a.strategy == "tp" else 1
    return ModelParallelStrategy(data_parallel_size=a.devices // tp, tensor_parallel_size=tp)


def add_shape_flags(p: argparse.ArgumentParser, *, layers: int, hidden: int, heads: int, kv_heads: int | None,
                    seq_len: int, micro_batch_size: int) -> None:
    """The model-shape flags every recipe has, with the recipe's own defaults."""
    p.add_argument("--layers", type=int, default=layers)
    p.add_argument("--hidden-size", type=int, default=hidden)
    p.add_argument("--heads", type=int, default=heads)
    p.add_argument("--kv-heads", type=int, default=kv_heads, help="GQA: key/value heads (default: = heads)")
    p.add_argument("--seq-len", type=int, default=seq_len)
    p.add_argument("--micro-batch-size", type=int, default=micro_batch_size)


def use_te(a: argparse.Namespace) -> bool:
    """TE layers only where TE runs (a CUDA host with transformer-engine) and was not declined."""
    return not a.no_te and torch.cuda.is_available() and te_available()[0]


def sweep_list(text: str) -> list[str] | None:
    if text == "none":
        return None
    return list(RECIPES) if text == "all" else [canonical(r) for r in text.split(",")]


def fit(model: pl.LightningModule, loader: Any, a: argparse.Namespace, out: Path, precision: Any = None,
        set_recipe: Callable | None = None) -> GemmProfilerCallback:
    cb = GemmProfilerCallback(wait=1, warmup=1, active=max(a.steps - 3, 1), output_dir=out,
                              sweep=sweep_list(a.sweep), set_recipe=set_recipe, verbose=not a.tiny,
                              sweep_plan=a.sweep_plan, sweep_rounds=a.sweep_rounds, sweep_budget_s=a.sweep_budget,
                              nsys_capture=a.nsys_capture,
                              report=False)  # finish() benchmarks the recipes asked for (--sweep, --recipe)
    kw = {"precision": precision} if precision else {}
    if not a.tiny and not torch.cuda.is_available():
        print("note: no GPU here: the full-size default model trains on the CPU, which takes minutes; --tiny runs "
              "in seconds", file=sys.stderr)
    if (st := strategy(a)) is not None:
        kw["strategy"] = st
    trainer = pl.Trainer(max_steps=a.steps, accelerator="gpu" if torch.cuda.is_available() else "cpu",
                         devices=a.devices, callbacks=[cb], logger=pl.loggers.CSVLogger(out, name="logs"),
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, **kw)
    trainer.fit(model, loader)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        # Lightning leaves its process group up (pytorch/pytorch#190489: one left to interpreter
        # exit can abort the process). Nothing after training communicates (rank 0 gathered the
        # captures inside the callback). Destroying it is not enough on its own: see run().
        torch.distributed.destroy_process_group()
        global _DISTRIBUTED
        _DISTRIBUTED = True
    return cb


def finish(a: argparse.Namespace, cb: GemmProfilerCallback, out: Path) -> int:
    if cb.rank != 0:
        return 0  # rank 0 gathered this rank's capture and writes the report
    if cb.path is None:
        print("no capture was written (fewer steps than the schedule?)", file=sys.stderr)
        return 1
    if not a.no_bench:
        bench_and_report(out, cb.path, sweep_list(a.sweep) or [a.recipe], console())
    print(f"capture: {cb.path}")
    return 0


_DISTRIBUTED = False  # this process ran a multi-process fit (fit() destroyed its process group)


def run(main: Callable[[], int]) -> int:
    """A recipe's entry point: bad input (an unknown recipe, a missing plan file) is one line that
    says what to fix, not a traceback."""
    try:
        rc = main()
    except (ValueError, TEUnavailable) as err:
        if os.environ.get("TE_GEMM_DEBUG"):
            raise
        print(f"error: {err}  (TE_GEMM_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 2
    except ModuleNotFoundError as err:  # Lightning's TE precision plugin without TE
        if os.environ.get("TE_GEMM_DEBUG") or "transformer_engine" not in str(err):
            raise
        print(f"error: this run needs transformer-engine on a CUDA host ({err})  (TE_GEMM_DEBUG=1 shows the "
              "traceback)", file=sys.stderr)
        return 2
    if _DISTRIBUTED:
        # Every file is written and the process group destroyed, yet about one run in ten of the
        # gloo expert-parallel recipe still aborted both ranks at interpreter finalization
        # ("terminate called without an active exception", no Python frame left; seen on CPU with
        # torch 2.13): a C++ thread torn down in static destruction. Not the profiler's: a plain
        # Lightning fit of the same model with no callback aborted in 6 of 24 runs (2026-12-01).
        # Leave without finalizing.
        import logging

        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    return rc
