#!/usr/bin/env python
"""Mixtral-style MoE transformer: a real top-k router, experts as grouped GEMMs.

Experts run as te.GroupedLinear on a GPU host with TE (token rows padded per expert to TE's
alignment under quantized recipes: 16 rows for FP8), as torch._grouped_mm elsewhere. Routing is
learned, so the per-expert token counts (m_splits) are uneven and change from step to step; the
capture records them per call and the benchmark times grouped GEMMs with them.

    python recipes/moe.py --experts 8 --top-k 2 --hidden-size 4096 --expert-intermediate 14336 --layers 1
    python recipes/moe.py --tiny
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from te_gemm_callback.precisions import autocast, canonical, import_te, padded_splits
from te_gemm_callback.recipes._common import add_shape_flags, base_parser, finish, fit, run, use_te
from te_gemm_callback.recipes.demo import DemoConfig, RandomTokens, TorchBlock, next_token_loss

AUX_LOSS_COEF = 0.01  # load balancing (Switch Transformer, Fedus et al. 2021, eq. 4); Mixtral: 0.02


class MoEMLP(nn.Module):
    """Router (H -> E), top-k softmax gating, SwiGLU experts fc1 (H -> 2I) and fc2 (I -> H).

    With ``ep_group`` (expert parallelism) this rank holds experts [rank * E/ep, (rank+1) * E/ep):
    its routed rows go to the ranks that own their experts and come back through all-to-alls
    (differentiable), so each rank's grouped GEMMs see the tokens all ranks routed to its experts.
    """

    def __init__(self, hidden: int, inter: int, experts: int, top_k: int, te_experts: bool,
                 ep_group: Any = None) -> None:
        super().__init__()
        self.ep_group = ep_group
        self.ep = dist.get_world_size(ep_group) if ep_group is not None else 1
        if experts % self.ep:
            raise ValueError(f"--experts {experts} must be a multiple of the expert-parallel size {self.ep}")
        self.e, self.k, self.inter = experts, top_k, inter
        self.local = experts // self.ep  # experts this rank holds
        self.router = nn.Linear(hidden, experts, bias=False)
        self.te_experts = te_experts
        self.recipe = "BF16"  # set per step by the model: quantized recipes need aligned expert rows
        if te_experts:
            te = import_te()
            self.fc1 = te.GroupedLinear(self.local, hidden, 2 * inter, bias=False, params_dtype=torch.bfloat16)
            self.fc2 = te.GroupedLinear(self.local, inter, hidden, bias=False, params_dtype=torch.bfloat16)
        else:  # (G, K, N) weights for torch._grouped_mm
            self.w1 = nn.Parameter(torch.randn(self.local, hidden, 2 * inter) / hidden**0.5)
            self.w2 = nn.Parameter(torch.randn(self.local, inter, hidden) / inter**0.5)
        self.aux_loss: torch.Tensor | None = None  # load-balancing loss of the last forward
        self.routed: list[int] = []  # rows per local expert in the last step (after the all-to-all)
        self.padded: list[int] = []

    def expert_parameter_names(self, prefix: str) -> list[str]:
        """Parameters owned by this rank alone under EP: data-parallel gradient averaging must skip them."""
        if self.ep == 1:
            return []
        return [f"{prefix}.{n}" for n, _ in self.named_parameters() if not n.startswith("router.")]

    def _experts(self, x: torch.Tensor, splits: list[int]) -> torch.Tensor:
        if self.te_experts:
            h = self.fc1(x, splits)
        else:
            offs = torch.tensor(splits, device=x.device).cumsum(0).to(torch.int32)
            h = torch._grouped_mm(x, self.w1.to(x.dtype), offs=offs)
        gate, up = h.chunk(2, dim=-1)
        h = F.silu(gate) * up
        if self.te_experts:
            return self.fc2(h, splits)
        return torch._grouped_mm(h, self.w2.to(h.dtype), offs=offs)

    def _local_experts(self, x: torch.Tensor, routed: list[int]) -> torch.Tensor:
        """Rows of x grouped by local expert (``routed`` rows each) through the experts."""
        # TE's alignment per recipe (16 rows for FP8, 32 MXFP8, 128 NVFP4), as the benchmark pads.
        splits = list(padded_splits(routed, self.recipe))
        self.routed, self.padded = routed, splits
        if not sum(routed):
            # No rows reached this rank's experts (expert parallelism). Grouped GEMMs reject empty
            # inputs in backward; stay in the graph anyway, so the all-to-alls' backward
            # (collectives) still runs here and no other rank waits forever.
            return x * 0.0
        if splits == routed:
            return self._experts(x, splits)
        # Scatter each expert's rows into its padded slot; pad rows stay zero.
        seg = torch.repeat_interleave(torch.arange(len(routed), device=x.device),
                                      torch.tensor(routed, device=x.device))
        starts = torch.tensor([0] + splits[:-1], device=x.device).cumsum(0)
        rstarts = torch.tensor([0] + routed[:-1], device=x.device).cumsum(0)
        pos = torch.arange(x.shape[0], device=x.device) - rstarts[seg] + starts[seg]
        buf = x.new_zeros(sum(splits), x.shape[-1])
        buf[pos] = x
        return self._experts(buf, splits)[pos]

    def _expert_parallel(self, xs: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """xs: rows sorted by global expert, counts: (E,) rows per global expert, on this rank."""
        # Exchange counts: recv[s * local + e] = rows rank s sends to this rank's expert e.
        recv = torch.empty_like(counts)
        dist.all_to_all_single(recv, counts, group=self.ep_group)
        send_c = counts.view(self.ep, self.local)
        recv_c = recv.view(self.ep, self.local)
        # One host sync for all split sizes (grouped GEMMs need them on the host anyway).
        sizes = torch.cat([send_c.sum(1), recv_c.sum(1), recv_c.flatten()]).tolist()
        send_rank, recv_rank, recv_ce = sizes[:self.ep], sizes[self.ep:2 * self.ep], sizes[2 * self.ep:]
        got = funcol.all_to_all_single_autograd(xs, recv_rank, send_rank, self.ep_group)
        # Arrived grouped by (source rank, local expert); the grouped GEMMs need expert-major order.
        offs = [0]
        for n in recv_ce:
            offs.append(offs[-1] + n)
        segs = [(s * self.local + e) for e in range(self.local) for s in range(self.ep)]
        perm = torch.cat([torch.arange(offs[i], offs[i + 1], device=xs.device) for i in segs])
        per_expert = [sum(recv_ce[s * self.local + e] for s in range(self.ep)) for e in range(self.local)]
        out = self._local_experts(got[perm], per_expert)
        y = out.new_empty(out.shape).index_copy(0, perm, out)  # back to arrival order
        return funcol.all_to_all_single_autograd(y, send_rank, recv_rank, self.ep_group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (T, H)
        probs = self.router(x).float().softmax(-1)
        weights, experts = probs.topk(self.k, dim=-1)  # (T, k)
        weights = (weights / weights.sum(-1, keepdim=True)).to(x.dtype)
        flat = experts.flatten()
        order = flat.argsort(stable=True)
        token = order // self.k
        counts = torch.bincount(flat, minlength=self.e)
        # Without it the learned router sends every token to the same two experts within a few
        # steps: f_e = share of routed rows, P_e = mean router probability (both per expert).
        self.aux_loss = self.e * (counts.float() / flat.numel() * probs.mean(0)).sum()
        xs = x[token]
        if self.ep > 1:
            y = self._expert_parallel(xs, counts)
        else:
            # Grouped GEMMs need the split sizes on the host: one sync per layer, as in real MoE code.
            y = self._local_experts(xs, counts.tolist())
        y = y * weights.flatten()[order, None]
        return torch.zeros_like(x).index_add_(0, token, y.to(x.dtype))


class MoEBlock(nn.Module):
    def __init__(self, c: DemoConfig, experts: int, top_k: int, te_experts: bool, ep_group: Any = None) -> None:
        super().__init__()
        self.attn = TorchBlock(c, mlp=False)  # attention half; the MLP is the MoE below
        self.norm = nn.RMSNorm(c.hidden_size)
        self.moe = MoEMLP(c.hidden_size, c.intermediate_size, experts, top_k, te_experts, ep_group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, H)
        b, t, _ = x.shape
        x = self.attn(x)
        return x + self.moe(self.norm(x).reshape(b * t, -1)).view(b, t, -1)


class MoELM(pl.LightningModule):
    """With ``expert_parallel`` the experts are split over all ranks of the job (EP = world size,
    attention and router data-parallel); the blocks are built in ``configure_model``, once the
    process group exists."""

    def __init__(self, c: DemoConfig, experts: int, top_k: int, te_experts: bool, recipe: str,
                 expert_parallel: bool = False) -> None:
        super().__init__()
        self.c, self.recipe = c, recipe
        self.moe_args = (experts, top_k, te_experts)
        self.embed = nn.Embedding(c.vocab_size, c.hidden_size)
        self.blocks = None if expert_parallel else self._blocks(None)
        self.norm = nn.RMSNorm(c.hidden_size)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)

    def _blocks(self, group: Any) -> nn.ModuleList:
        return nn.ModuleList(MoEBlock(self.c, *self.moe_args, ep_group=group) for _ in range(self.c.num_hidden_layers))

    def configure_model(self) -> None:
        if self.blocks is not None:
            return
        group = dist.group.WORLD if dist.is_initialized() and dist.get_world_size() > 1 else None
        self.blocks = self._blocks(group)
        # Each rank owns its experts: DDP must not average their gradients across ranks (read by
        # torch DistributedDataParallel when Lightning wraps this module, after configure_model).
        self._ddp_params_and_buffers_to_ignore = [
            n for i, b in enumerate(self.blocks) for n in b.moe.expert_parameter_names(f"blocks.{i}.moe")]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for blk in self.blocks:
            blk.moe.recipe = self.recipe
        dev = "cuda" if x.is_cuda else "cpu"
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=x.is_cuda), autocast(self.recipe):
            for blk in self.blocks:
                x = blk(x)
            return self.lm_head(self.norm(x))

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return next_token_loss(self, batch) + AUX_LOSS_COEF * sum(blk.moe.aux_loss for blk in self.blocks)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


def main(argv: list[str] | None = None) -> int:
    p = base_parser(__doc__.splitlines()[0])
    add_shape_flags(p, layers=1, hidden=4096, heads=32, kv_heads=8, seq_len=4096, micro_batch_size=2)
    p.add_argument("--experts", type=int, default=None, help="experts per layer (default 8; --tiny: 4)")
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--expert-intermediate", type=int, default=14336)
    p.add_argument("--expert-parallel", action="store_true",
                   help="split the experts over the --devices ranks (EP = devices), all-to-all token dispatch")
    a = p.parse_args(argv)
    experts = a.experts or (4 if a.tiny else 8)
    if a.expert_parallel and experts % a.devices:
        p.error(f"--experts {experts} must be a multiple of --devices {a.devices} for --expert-parallel")
    if a.tiny:
        c = DemoConfig(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
                       num_hidden_layers=1, vocab_size=64, sequence_length=16, micro_batch_size=2)
        top_k = 2
    else:
        c = DemoConfig(hidden_size=a.hidden_size, intermediate_size=a.expert_intermediate,
                       num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, num_hidden_layers=a.layers,
                       vocab_size=1024, sequence_length=a.seq_len, micro_batch_size=a.micro_batch_size)
        top_k = a.top_k
    recipe = canonical(a.recipe)
    if recipe != "BF16" and not use_te(a):  # said before training, not after it at the benchmark
        p.error(f"--recipe {recipe} needs TE layers: transformer-engine on a CUDA host, without --no-te")
    out = Path(a.out or f"runs/moe-{recipe}")
    model = MoELM(c, experts, top_k, use_te(a), recipe, expert_parallel=a.expert_parallel)
    loader = DataLoader(RandomTokens(c, c.micro_batch_size * a.steps * a.devices), batch_size=c.micro_batch_size)
    cb = fit(model, loader, a, out)
    moe = model.blocks[0].moe
    if sum(moe.routed):
        extra = sum(moe.padded) / sum(moe.routed) - 1
        print(f"rank {cb.rank}, last step, layer 0: rows per local expert {moe.routed}, GEMM rows {moe.padded} "
              f"(padding +{100 * extra:.1f}% rows)")
    return finish(a, cb, out)


if __name__ == "__main__":
    sys.exit(run(main))
