"""The module benchmark's host times against the job's own, per te.Linear kind of an HF model
trained through Lightning's TE plugin (its ``convert_module`` and ``forward_context``): the host
time of each module's forward and backward inside the training step (forward hooks and autograd
node hooks, every Hopper recipe in alternating rounds, AdamW and clipping in every step), beside
microbench/module_cost.py's rows for the same kinds timed onto an idle GPU, behind a busy one, and
under the plugin's forward context. Prints per kind and recipe the difference to BF16 both ways,
and their sums beside the steps' own difference. Needs a GPU, TE and transformers.

    python benchmarks/module_host_check.py gpt_neox        # or phi3; JSON to $OUT or /tmp
"""
import contextlib
import json
import os
import statistics
import sys
import time
from collections import defaultdict

import torch

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
import replay_check

from te_gemm_callback.microbench import module_cost as mc
from te_gemm_callback.precisions import autocast, import_te

RECIPES = ["BF16", "DelayedScaling", "Float8CurrentScaling", "Float8BlockScaling"]
family = sys.argv[1] if len(sys.argv) > 1 else "gpt_neox"
out = {"family": family}
te = import_te()
import transformers  # noqa: E402
from pytorch_lightning.plugins.precision import TransformerEnginePrecision  # noqa: E402

cfg = replay_check.config(family, "host")
_, _, _, _, seq, mb = replay_check.SIZES["host"]
plugin = TransformerEnginePrecision(weights_dtype=torch.bfloat16, replace_layers=True)
model = transformers.AutoModelForCausalLM.from_config(cfg)
model = plugin.convert_module(model).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
batch = torch.randint(0, cfg.vocab_size, (mb, seq), device="cuda")

clock = time.perf_counter
times = defaultdict(list)  # (name, recipe, side) -> us
cur = {"recipe": None, "on": False}
fwd_t0 = {}
bwd_t0 = {}


def pre(name):
    def f(mod, args):
        fwd_t0[name] = clock()
    return f


def post(name):
    def f(mod, args, out_):
        t1 = clock()
        if cur["on"]:
            times[(name, cur["recipe"], "fwd")].append((t1 - fwd_t0[name]) * 1e6)
        x = args[0]
        if cur["on"] and isinstance(out_, torch.Tensor) and out_.requires_grad and x.requires_grad:
            rec = cur["recipe"]

            def gout(g):
                bwd_t0[name] = clock()

            def gin(g):
                times[(name, rec, "bwd")].append((clock() - bwd_t0[name]) * 1e6)
            out_.register_hook(gout)
            x.register_hook(gin)
    return f


kinds = {}
for name, mod in model.named_modules():
    if type(mod).__name__ == "Linear" and type(mod).__module__.startswith("transformer_engine"):
        mod.register_forward_pre_hook(pre(name))
        mod.register_forward_hook(post(name))
        kinds[name] = (mod.in_features, mod.out_features, mod.use_bias)


def step(recipe):
    opt.zero_grad(set_to_none=True)
    with plugin.forward_context(), autocast(recipe):
        loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    loss.item()


step_ms = defaultdict(list)
for r in RECIPES:
    for _ in range(3):
        step(r)
torch.cuda.synchronize()
for rnd in range(6):
    for r in (RECIPES if rnd % 2 == 0 else RECIPES[::-1]):
        cur["recipe"] = r
        step(r)  # first step after a switch not counted
        for _ in range(2):
            cur["on"] = True
            t0 = clock()
            step(r)
            torch.cuda.synchronize()
            step_ms[r].append((clock() - t0) * 1e3)
            cur["on"] = False
job = {}
for (name, r, side), v in times.items():
    job.setdefault(kinds[name], {}).setdefault(r, {}).setdefault(side, []).append(statistics.median(v))
out["step_ms"] = {r: statistics.median(v) for r, v in step_ms.items()}
print("clean step ms (hooks on):", out["step_ms"], flush=True)

# The module benchmark's rows, per kind, in three contexts.
counts = defaultdict(int)
for k in kinds.values():
    counts[k] += 1
M = mb * seq
conds = {"idle": contextlib.nullcontext, "busy": contextlib.nullcontext, "busy_plugin": plugin.forward_context,
         "idle2": contextlib.nullcontext, "busy2": contextlib.nullcontext}
bench = {}
phase = {}
for cname, ctx in conds.items():
    ph = {}
    for (k, n, bias) in counts:
        spec = {"class": "Linear", "gemms": {"": [M, k, n]}, "use_bias": bias, "dtype": "bfloat16"}
        mc.KEEP_GPU_BUSY = cname.startswith("busy")
        with ctx():
            row = mc._measure({"k": (spec, RECIPES)}, te, torch, ph)["k"]
        bench.setdefault(cname, {})[str((k, n, bias))] = row
    phase[cname] = ph
out["phases"] = phase
print("phases", phase, flush=True)

rows = []
tot = defaultdict(float)
for kind, per in job.items():
    c = counts[kind]
    for r in RECIPES[1:]:
        for side in ("fwd", "bwd"):
            j = (statistics.median(per[r][side]) - statistics.median(per["BF16"][side])
                 if side in per[r] else float("nan"))
            line = {"kind": str(kind), "n": c, "recipe": r, "side": side, "job_diff_us": round(j, 1),
                    "job_abs_us": round(statistics.median(per[r][side]), 1),
                    "job_bf16_us": round(statistics.median(per["BF16"][side]), 1)}
            tot[(r, "job")] += c * j
            for cname in conds:
                b = bench[cname][str(kind)]
                d = b[r][f"host_{side}_us"] - b["BF16"][f"host_{side}_us"]
                line[cname] = round(d, 1)
                line[cname + "_abs"] = round(b[r][f"host_{side}_us"], 1)
                tot[(r, cname)] += c * d
            rows.append(line)
            print(line, flush=True)
out["rows"] = rows
out["totals_ms"] = {f"{r}|{w}": round(v / 1e3, 2) for (r, w), v in tot.items()}
for r in RECIPES[1:]:
    print(r, "step diff", round(out["step_ms"][r] - out["step_ms"]["BF16"], 2), "ms;",
          {w: out["totals_ms"][f"{r}|{w}"] for w in ["job", *conds]}, flush=True)
os.makedirs(os.environ.get("OUT", "/tmp"), exist_ok=True)
with open(os.path.join(os.environ.get("OUT", "/tmp"), f"module_host_{family}.json"), "w") as f:
    json.dump(out, f, indent=1)
