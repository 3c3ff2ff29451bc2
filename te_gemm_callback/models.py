"""Reference models for validation scripts and GPU tests: the seed's TE transformer stack.

Shapes default to the seed's CodonFM-5B layer (hidden 4096, intermediate 16384, 32 heads,
sequence 512, micro-batch 31); the layer count is a parameter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from .precisions import autocast, import_te


@dataclass(frozen=True, kw_only=True)
class StackConfig:
    hidden_size: int = 4096
    intermediate_size: int = 16384
    num_attention_heads: int = 32
    num_hidden_layers: int = 4
    sequence_length: int = 512
    micro_batch_size: int = 31


def te_stack(c: StackConfig, dtype: torch.dtype = torch.bfloat16) -> nn.Module:
    """``num_hidden_layers`` te.TransformerLayer blocks: 12 weight GEMMs per layer per step."""
    te = import_te()
    layers = [te.TransformerLayer(c.hidden_size, c.intermediate_size, c.num_attention_heads,
                                  hidden_dropout=0.0, attention_dropout=0.0, params_dtype=dtype,
                                  layer_number=i + 1, self_attn_mask_type="no_mask")
              for i in range(c.num_hidden_layers)]
    return nn.Sequential(*layers).cuda()


def stack_input(c: StackConfig, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
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
