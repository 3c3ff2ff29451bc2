"""The bundled default job: a small Llama-style model trained for a few steps with the callback.

On CPU it is a plain-torch model in BF16 autocast. On a GPU host with Transformer Engine it is a
``te.TransformerLayer`` stack, run once per precision this GPU supports. This module is an adapter
(it uses Lightning); the capture core does not import it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from te_gemm_callback.adapters.lightning import GemmProfilerCallback
from te_gemm_callback.precisions import autocast, import_te
from te_gemm_callback.recipes.models import CODONFM_4L, TINY, DemoConfig, te_layers

__all__ = ["CODONFM_4L", "TINY", "DemoConfig", "DemoLM", "HFLlama", "RandomTokens", "TorchBlock", "run_demo"]


class TorchBlock(nn.Module):
    """Pre-norm block: fused GQA qkv projection, SDPA, and (unless ``mlp=False``, for blocks whose
    MLP is an MoE) an MLP: SwiGLU with fused gate+up, or GELU."""

    def __init__(self, c: DemoConfig, mlp: bool = True) -> None:
        super().__init__()
        self.c = c
        hd = c.hidden_size // c.num_attention_heads
        norm = nn.RMSNorm if c.normalization == "RMSNorm" else nn.LayerNorm
        self.norm1 = norm(c.hidden_size)
        self.qkv = nn.Linear(c.hidden_size, (c.num_attention_heads + 2 * c.num_key_value_heads) * hd, bias=False)
        self.proj = nn.Linear(c.num_attention_heads * hd, c.hidden_size, bias=False)
        self.mlp = mlp
        if mlp:
            self.norm2 = norm(c.hidden_size)
            self.fc1 = nn.Linear(c.hidden_size, (2 if c.gated_mlp else 1) * c.intermediate_size, bias=False)
            self.fc2 = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, T, H)
        x = self.attend(x)
        return self.feed_forward(x) if self.mlp else x

    def attend(self, x: torch.Tensor) -> torch.Tensor:
        c, (b, t, _) = self.c, x.shape
        hd = c.hidden_size // c.num_attention_heads
        q, k, v = self.qkv(self.norm1(x)).split(
            [c.num_attention_heads * hd, c.num_key_value_heads * hd, c.num_key_value_heads * hd], dim=-1)
        q = q.view(b, t, c.num_attention_heads, hd).transpose(1, 2)  # (B, nh, T, hd)
        k = k.view(b, t, c.num_key_value_heads, hd).transpose(1, 2)
        v = v.view(b, t, c.num_key_value_heads, hd).transpose(1, 2)
        rep = c.num_attention_heads // c.num_key_value_heads
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, -1)
        return x + self.proj(a)

    def feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(self.norm2(x))
        if self.c.gated_mlp:
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        else:
            h = F.gelu(h)
        return x + self.fc2(h)


def next_token_loss(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of ``model``'s logits on ``batch[:, :-1]`` against ``batch[:, 1:]`` (fp32)."""
    logits = model(batch[:, :-1])
    return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))


class DemoLM(pl.LightningModule):
    """Token model; ``recipe`` is a TE recipe name ("BF16" = no FP8 autocast)."""

    def __init__(self, c: DemoConfig, use_te: bool = False, recipe: str = "BF16", lr: float = 1e-3,
                 tensor_parallel: bool = False) -> None:
        super().__init__()
        self.c, self.use_te, self.recipe, self.lr = c, use_te, recipe, lr
        if tensor_parallel and not use_te:
            raise ValueError("tensor parallelism needs TE layers: transformer-engine on a CUDA host")
        self.embed = nn.Embedding(c.vocab_size, c.hidden_size)
        # Tensor-parallel blocks need the process group: configure_model builds them.
        self.blocks = nn.ModuleList() if tensor_parallel else (
            te_layers(c, causal=True, bias=False) if use_te
            else nn.ModuleList(TorchBlock(c) for _ in range(c.num_hidden_layers)))
        self.norm = nn.RMSNorm(c.hidden_size) if c.normalization == "RMSNorm" else nn.LayerNorm(c.hidden_size)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        dev = "cuda" if x.is_cuda else "cpu"
        with torch.autocast(dev, dtype=torch.bfloat16), autocast(self.recipe):
            if self.use_te:  # TE layers take (seq, batch, hidden)
                x = x.to(torch.bfloat16).transpose(0, 1)
                for blk in self.blocks:
                    x = blk(x)
                x = x.transpose(0, 1)
            else:
                for blk in self.blocks:
                    x = blk(x)
            return self.lm_head(self.norm(x))

    def configure_model(self) -> None:
        """Under Lightning's ModelParallelStrategy: TE tensor-parallel blocks over the mesh's
        "tensor_parallel" dimension, FSDP2 (fully_shard) over its "data_parallel" dimension."""
        mesh = getattr(self, "device_mesh", None)  # None under DDP and single-device runs
        if mesh is None or getattr(self, "_parallel_done", False):
            return
        self._parallel_done = True
        tp, dp = mesh["tensor_parallel"], mesh["data_parallel"]
        if len(self.blocks) == 0:
            self.blocks = te_layers(self.c, causal=True, bias=False, tp_group=tp.get_group())
        if dp.size() > 1:
            from torch.distributed.fsdp import fully_shard

            # Every parameter in some FSDP group, so that each gets its gradient reduced.
            for m in [*self.blocks, self.embed, self.norm, self.lm_head]:
                fully_shard(m, mesh=dp)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss = next_token_loss(self, batch)
        self.log("loss", loss, prog_bar=False)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


class HFLlama(pl.LightningModule):
    """A Hugging Face transformers Llama built from a config (no download): a model nobody here wrote."""

    def __init__(self, cfg: Any) -> None:
        super().__init__()
        import transformers

        self.model = transformers.LlamaForCausalLM(cfg)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.model(input_ids=batch, labels=batch).loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


class RandomTokens(Dataset):
    """Synthetic token sequences (no download), fixed by seed."""

    def __init__(self, c: DemoConfig, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.data = torch.randint(0, c.vocab_size, (n, c.sequence_length + 1), generator=g)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.data[i]


def run_demo(out: str | Path, steps: int = 8, config: DemoConfig | None = None,
             recipes: list[str] | None = None, job_recipe: str = "BF16") -> Path | None:
    """Train the demo in ``job_recipe`` with the callback, then sweep every requested recipe on the
    live model (unsupported ones are skipped with their reason). Returns the capture path."""
    out = Path(out)
    cuda = torch.cuda.is_available()
    use_te = False
    if cuda:
        try:
            import_te()
            use_te = True
        except Exception as err:
            print(f"te-gemm: running the torch model in BF16 ({err})")
    c = config or (CODONFM_4L if cuda else TINY)
    wanted = recipes or ["BF16", "DelayedScaling", "Float8CurrentScaling", "Float8BlockScaling",
                         "MXFP8BlockScaling", "NVFP4BlockScaling"]
    torch.manual_seed(0)
    model = DemoLM(c, use_te=use_te, recipe=job_recipe)
    # The sweep's least that still gives each observed speedup a 95% interval (6 rounds of 2 steps;
    # the README's main command stays under a minute on the H200); a job's own sweep keeps the
    # callback's defaults (more rounds while the intervals are wider than +-2%, up to 20 s).
    # report=False: `te-gemm run` benchmarks the recipes it was asked for, with its own cache, after the fit.
    cb = GemmProfilerCallback(wait=1, warmup=1, active=max(steps - 2, 1), output_dir=out, sweep=wanted,
                              sweep_steps=2, sweep_warmup=1, sweep_rounds=6, sweep_budget_s=0, report=False)
    trainer = pl.Trainer(max_steps=steps, accelerator="gpu" if cuda else "cpu", devices=1,
                         callbacks=[cb], logger=pl.loggers.CSVLogger(out, name="logs"),
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0)
    n = c.micro_batch_size * steps
    trainer.fit(model, DataLoader(RandomTokens(c, n), batch_size=c.micro_batch_size))
    return cb.path
