"""The replay's predicted step speedups against the observed ones, on HF model families the
examples and tests do not use (GPT-NeoX, Phi-3), GPU-bound and host-bound, through Lightning's
Transformer Engine plugin (a DelayedScaling job, its nn.Linear layers swapped for te.Linear).

A fit with ``GemmProfilerCallback(sweep=<Hopper recipes>)`` writes its report: per recipe the
replay's prediction with its band, the GEMMs-alone prediction, and the sweep's observed median
with its 95% interval. Run with ``--no-sweep-prediction`` to check that the prediction reads
nothing from the sweep: the report is made again from the run folder without sweep/.

    python benchmarks/replay_check.py --family gpt_neox --size host --json OUT.json

``--from RUN`` makes the JSON again from a run folder this made (no GPU needed): the predicted
column of the code checked out now, the observed one as measured.

    python benchmarks/replay_check.py --from runs/gpt_neox_host --family gpt_neox --size host
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch

HOPPER = ["BF16", "DelayedScaling", "Float8CurrentScaling", "Float8BlockScaling"]
# (layers, hidden, intermediate, heads, seq, micro-batch)
SIZES = {"gpu": (4, 4096, 11008, 32, 2048, 2), "host": (16, 1536, 4096, 16, 1024, 2), "tiny": (2, 64, 128, 4, 16, 2)}
VOCAB = 32000


def config(family: str, size: str):
    import transformers

    layers, hidden, inter, heads, seq, _ = SIZES[size]
    vocab = VOCAB if size != "tiny" else 256
    if family == "gpt_neox":
        return transformers.GPTNeoXConfig(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                                          num_attention_heads=heads, vocab_size=vocab, max_position_embeddings=seq)
    if family == "phi3":
        return transformers.Phi3Config(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                                       num_attention_heads=heads, num_key_value_heads=heads // 4, vocab_size=vocab,
                                       max_position_embeddings=seq, pad_token_id=0)
    raise SystemExit(f"--family must be gpt_neox or phi3, got {family}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--family", default="gpt_neox")
    p.add_argument("--size", choices=sorted(SIZES), default="host")
    p.add_argument("--out", default=None, help="run folder (default: a temporary one)")
    p.add_argument("--json", default=None)
    p.add_argument("--from", dest="src", default=None, help="report this run folder again, run nothing")
    a = p.parse_args()
    if a.src:
        return summarize(Path(a.src), a.family, a.size, a.json)
    import pytorch_lightning as pl
    import transformers

    from te_gemm_callback import GemmProfilerCallback

    cuda = torch.cuda.is_available()
    cfg = config(a.family, a.size)
    _, _, _, _, seq, mb = SIZES[a.size]

    class Job(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = transformers.AutoModelForCausalLM.from_config(cfg)

        def training_step(self, batch, i):
            return self.model(input_ids=batch, labels=batch).loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-5)

    g = torch.Generator().manual_seed(0)
    data = [torch.randint(0, cfg.vocab_size, (mb, seq), generator=g) for _ in range(16)]
    out = Path(a.out or tempfile.mkdtemp(prefix="replay_check_"))
    recipes = HOPPER if cuda else ["BF16"]
    cb = GemmProfilerCallback(wait=1, warmup=1, active=6, output_dir=str(out), sweep=recipes, verbose=False)
    tr = pl.Trainer(max_steps=9, accelerator="gpu" if cuda else "cpu", devices=1,
                    precision="transformer-engine" if cuda else "32-true", callbacks=[cb], logger=False,
                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                    gradient_clip_val=1.0)
    tr.fit(Job(), torch.utils.data.DataLoader(data, batch_size=None))
    return summarize(out, a.family, a.size, a.json)


def summarize(out: Path, family: str, size: str, json_path: str | None) -> int:
    """The run folder's report per recipe, and its predictions again without sweep/."""
    from te_gemm_callback.analysis.runs import analyze_run

    if not (out / "gemm_capture.json").exists():
        raise SystemExit(f"{out} holds no gemm_capture.json: give a run folder this script made")
    rows = {}
    full = analyze_run(out).report
    # The prediction must read nothing from the sweep's runs of other recipes.
    alone_dir = Path(tempfile.mkdtemp(prefix=out.name + "_no_sweep_"))
    shutil.copytree(out, alone_dir, dirs_exist_ok=True, ignore=shutil.ignore_patterns("sweep"))
    alone = analyze_run(alone_dir).report
    shutil.rmtree(alone_dir, ignore_errors=True)
    pred_alone = {x.recipe: x.predicted_step_speedup for x in alone.recipes}
    for x in full.recipes:
        rows[x.recipe] = {"predicted": x.predicted_step_speedup, "band": x.predicted_band, "bound": x.predicted_bound,
                          "gemms_alone": x.predicted_gemms_alone, "observed": x.observed_step_speedup,
                          "ci95": x.observed_ci, "predicted_without_sweep": pred_alone.get(x.recipe)}
    res = {"family": family, "size": size, "step_ms": full.step_ms, "job_recipe": full.current_recipe,
           "own_replay": full.meta.get("replay_own"), "recipes": rows, "run": str(out)}
    print(json.dumps(res, indent=1, default=str))
    if json_path:
        Path(json_path).write_text(json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
