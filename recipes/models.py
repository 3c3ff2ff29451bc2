"""Model shapes and the TE layer stacks built from them (no Lightning here).

One config type serves the bundled demo, the examples, the validation scripts and the GPU tests: a
:class:`~te_gemm_callback.shapes.ModelConfig` with a default and a normalization.
CODONFM_4L is the CodonFM-5B layer of TE's benchmark_gemm.py (hidden 4096, intermediate 16384, 32 heads, MHA, GELU,
LayerNorm; sequence 512, micro-batch 31), 4 layers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch import nn

from te_gemm_callback.precisions import autocast, import_te
from te_gemm_callback.shapes import ModelConfig


@dataclass(frozen=True, kw_only=True)
class DemoConfig(ModelConfig):
    """A Llama-style decoder's shape, for the models this package builds: a :class:`ModelConfig`
    (so :func:`~te_gemm_callback.shapes.config_gemms` derives its GEMMs) with a small default and
    its normalization."""

    hidden_size: int = 128
    intermediate_size: int = 352
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    num_hidden_layers: int = 2
    vocab_size: int = 512
    sequence_length: int = 64
    micro_batch_size: int = 4
    gated_mlp: bool = True  # SwiGLU (fused gate+up, 2I) or GELU (I)
    normalization: str = "RMSNorm"  # or "LayerNorm"


# The dense recipe's --tiny configuration, and what `te-gemm run` trains on a CPU.
TINY = DemoConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                  num_hidden_layers=2, vocab_size=128, sequence_length=32, micro_batch_size=2,
                  gated_mlp=True, normalization="RMSNorm")

# The dense recipe's default on a GPU: the CodonFM-5B layer (MHA, GELU MLP, LayerNorm), 4 layers.
CODONFM_4L = DemoConfig(hidden_size=4096, intermediate_size=16384, num_attention_heads=32,
                        num_key_value_heads=32, num_hidden_layers=4, vocab_size=128, sequence_length=512,
                        micro_batch_size=31, gated_mlp=False, normalization="LayerNorm")


def codonfm(layers: int = 4) -> DemoConfig:
    return replace(CODONFM_4L, num_hidden_layers=layers)


def te_layers(c: DemoConfig, *, causal: bool, bias: bool, dtype: torch.dtype = torch.bfloat16,
              tp_group: torch.distributed.ProcessGroup | None = None, sequence_parallel: bool = False) -> nn.ModuleList:
    """``num_hidden_layers`` te.TransformerLayer blocks: 12 weight GEMMs per layer per step.

    With ``tp_group`` the layers are tensor-parallel over it (TE's column-parallel qkv and fc1,
    row-parallel proj and fc2: each rank holds N / TP or K / TP of those weights)."""
    te = import_te()
    tp = {}
    if tp_group is not None:
        tp = dict(set_parallel_mode=True, tp_group=tp_group, tp_size=tp_group.size(),
                  sequence_parallel=sequence_parallel)
    return nn.ModuleList(
        te.TransformerLayer(c.hidden_size, c.intermediate_size, c.num_attention_heads,
                            num_gqa_groups=c.num_key_value_heads, normalization=c.normalization,
                            activation="swiglu" if c.gated_mlp else "gelu", bias=bias,
                            self_attn_mask_type="causal" if causal else "no_mask",
                            hidden_dropout=0.0, attention_dropout=0.0, params_dtype=dtype, layer_number=i + 1, **tp)
        for i in range(c.num_hidden_layers))


def te_stack(c: DemoConfig, dtype: torch.dtype = torch.bfloat16, bias: bool = True) -> nn.Module:
    """The validation stack: TE's defaults (biases unless ``bias=False``, no attention mask), on the GPU."""
    return nn.Sequential(*te_layers(c, causal=False, bias=bias, dtype=dtype)).cuda()


def stack_input(c: DemoConfig, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    # TE layers take (seq, batch, hidden).
    return torch.randn(c.sequence_length, c.micro_batch_size, c.hidden_size, device="cuda",
                       dtype=dtype, requires_grad=True)


def train_step_fn(model: nn.Module, x: torch.Tensor, recipe: str) -> Callable[[], None]:
    """Forward under the recipe's autocast, backward outside it (as TE requires)."""
    grad = torch.randn_like(x)

    def step() -> None:
        with autocast(recipe):
            y = model(x)
        y.backward(grad)

    return step
